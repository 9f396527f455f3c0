package health

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A real server on 127.0.0.1:0: /healthz answers 200 whatever the
// readiness, /readyz follows it (503 with the reason while not ready),
// other paths and methods are refused, Shutdown closes the port.
func TestServer(t *testing.T) {
	var notReady atomic.Pointer[error]
	srv, err := Start("127.0.0.1:0", "--health-listen", func() error {
		if e := notReady.Load(); e != nil {
			return *e
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	base := "http://" + srv.Addr().String()
	client := &http.Client{Timeout: 10 * time.Second}

	type probe struct {
		method, path string
		code         int
		body         string // a substring of the body
	}
	check := func(t *testing.T, probes []probe) {
		t.Helper()
		for _, p := range probes {
			req, err := http.NewRequest(p.method, base+p.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			rsp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", p.method, p.path, err)
			}
			body, err := io.ReadAll(rsp.Body)
			rsp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if rsp.StatusCode != p.code || !strings.Contains(string(body), p.body) {
				t.Errorf("%s %s: %d %q, want %d with %q", p.method, p.path, rsp.StatusCode, body, p.code, p.body)
			}
		}
	}

	t.Run("ready", func(t *testing.T) {
		check(t, []probe{
			{http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
			{http.MethodGet, "/readyz", http.StatusOK, "ok\n"},
			{http.MethodHead, "/readyz", http.StatusOK, ""},
			{http.MethodPost, "/readyz", http.StatusMethodNotAllowed, ""},
			{http.MethodGet, "/metrics", http.StatusNotFound, ""},
		})
	})
	t.Run("not ready", func(t *testing.T) {
		e := errors.New("not registered with the kubelet")
		notReady.Store(&e)
		check(t, []probe{
			{http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
			{http.MethodGet, "/readyz", http.StatusServiceUnavailable, "not registered with the kubelet"},
		})
	})
	t.Run("ready again", func(t *testing.T) {
		notReady.Store(nil)
		check(t, []probe{{http.MethodGet, "/readyz", http.StatusOK, "ok\n"}})
	})

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second); err == nil {
		conn.Close()
		t.Error("the port still accepts connections after Shutdown")
	}
}

// An address in use is reported by Start, naming the option that set it.
func TestStartAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv, err := Start(ln.Addr().String(), "--health-listen", nil, nil)
	if err == nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal("Start on a port in use succeeded")
	}
	if !strings.Contains(err.Error(), "--health-listen") {
		t.Errorf("error %q does not name --health-listen", err)
	}
}
