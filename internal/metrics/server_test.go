package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// A real HTTP server on 127.0.0.1:0: /metrics serves the collector's series
// next to the Go and process ones, /healthz answers ok, /readyz the daemon's
// readiness, other methods and paths are refused, and Shutdown closes the
// port.
func TestServer(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 << 30, Cores: 20})
	notReady := func() error { return errors.New("not connected to the runtime") }
	srv, err := Start("127.0.0.1:0", NewCollector(cfg, twoA100s, nil), notReady, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr().String()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	want := `
# HELP nri_vgpu_container_memory_limit_bytes Memory limit of the container on the GPU; 0 means no memory limit.
# TYPE nri_vgpu_container_memory_limit_bytes gauge
nri_vgpu_container_memory_limit_bytes{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} 8589934592
# HELP nri_vgpu_gpu_memory_allocated_bytes Sum of the memory limits of the vGPU containers on the GPU (a container without a memory limit adds 0).
# TYPE nri_vgpu_gpu_memory_allocated_bytes gauge
nri_vgpu_gpu_memory_allocated_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 8589934592
nri_vgpu_gpu_memory_allocated_bytes{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
`
	if err := testutil.ScrapeAndCompare(base+"/metrics", strings.NewReader(want),
		"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_gpu_memory_allocated_bytes"); err != nil {
		t.Error(err)
	}

	client := &http.Client{Timeout: 10 * time.Second}
	tests := []struct {
		method, path string
		code         int
		body         string // a substring of the body
	}{
		{http.MethodGet, "/metrics", http.StatusOK, "\ngo_goroutines "},
		{http.MethodGet, "/metrics", http.StatusOK, "\nprocess_start_time_seconds "},
		{http.MethodGet, "/metrics", http.StatusOK, `nri_vgpu_build_info{version="`},
		{http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{http.MethodHead, "/healthz", http.StatusOK, ""},
		{http.MethodGet, "/readyz", http.StatusServiceUnavailable, "not connected to the runtime"},
		{http.MethodPost, "/metrics", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(tt.method, base+tt.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		rsp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tt.method, tt.path, err)
		}
		body, err := io.ReadAll(rsp.Body)
		rsp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: %v", tt.method, tt.path, err)
		}
		if rsp.StatusCode != tt.code || !strings.Contains(string(body), tt.body) {
			t.Errorf("%s %s: %d %q, want %d with %q", tt.method, tt.path, rsp.StatusCode, body, tt.code, tt.body)
		}
	}

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second); err == nil {
		conn.Close()
		t.Error("the port still accepts connections after Shutdown")
	}
}

// An address in use is reported by Start, naming the config key.
func TestStartAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv, err := Start(ln.Addr().String(), NewCollector(testConfig(t), nil, nil), nil, nil)
	if err == nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal("Start on a port in use succeeded")
	}
	if !strings.Contains(err.Error(), "metrics.listen") {
		t.Errorf("error %q does not name metrics.listen", err)
	}
}
