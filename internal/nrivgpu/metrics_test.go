package nrivgpu

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// withMetrics adds a [metrics] section to the config file at path.
func withMetrics(t *testing.T, path, listen string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("[metrics]\nlisten = \"" + listen + "\"\n"); err != nil {
		t.Fatal(err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With metrics.listen set, the plugin serves /metrics (the configured GPUs
// included) while it runs, and closes the port when it stops.
func TestMetricsEndpoint(t *testing.T) {
	path, _ := writeConfig(t)
	addr := freePort(t)
	withMetrics(t, path, addr)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() { done <- run(ctx, []string{"--config", path}, io.Discard, &errb) }()

	client := &http.Client{Timeout: 5 * time.Second}
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rsp, err := client.Get("http://" + addr + "/metrics")
		if err == nil {
			b, rerr := io.ReadAll(rsp.Body)
			rsp.Body.Close()
			if rerr == nil && rsp.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("no /metrics on %s: %v; log:\n%s", addr, err, errb.String())
		}
	}
	for _, want := range []string{
		`nri_vgpu_gpu_memory_total_bytes{UUID="` + uuid0 + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 4.294967296e+10`,
		`nri_vgpu_build_info{version="`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d after stop, want 0; log:\n%s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("plugin did not stop")
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("metrics port %s still open after the plugin stopped", addr)
	}
}

// A metrics address that cannot be bound is logged, and the plugin runs on:
// containers must not go without their limits for want of metrics.
func TestMetricsPortInUseIsNotFatal(t *testing.T) {
	path, _ := writeConfig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	withMetrics(t, path, ln.Addr().String())

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() { done <- run(ctx, []string{"--config", path}, io.Discard, &errb) }()
	select {
	case code := <-done:
		cancel()
		t.Fatalf("plugin exited with %d; log:\n%s", code, errb.String())
	case <-time.After(700 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit code %d after stop, want 0", code)
	}
	if !strings.Contains(errb.String(), "metrics endpoint unavailable") {
		t.Errorf("log does not report the metrics endpoint:\n%s", errb.String())
	}
}

// get polls url until it answers, and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var rsp *http.Response
		if rsp, err = client.Get(url); err == nil {
			b, rerr := io.ReadAll(rsp.Body)
			rsp.Body.Close()
			if rerr == nil {
				return rsp.StatusCode, string(b)
			}
		}
	}
	t.Fatalf("GET %s: %v", url, err)
	return 0, ""
}

// --metrics-listen serves metrics where the configuration has none, and
// --health-listen serves the probes: alive, but not ready while no runtime
// listens on nri.socket_path (the answer names it).
func TestListenFlags(t *testing.T) {
	path, cfg := writeConfig(t)
	metricsAddr, healthAddr := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--config", path, "--metrics-listen", metricsAddr, "--health-listen", healthAddr}, io.Discard, &errb)
	}()
	defer func() {
		cancel()
		<-done
	}()

	for _, tt := range []struct {
		url  string
		code int
		body string
	}{
		{"http://" + metricsAddr + "/metrics", http.StatusOK, `nri_vgpu_build_info{version="`},
		{"http://" + healthAddr + "/healthz", http.StatusOK, "ok"},
		{"http://" + healthAddr + "/readyz", http.StatusServiceUnavailable, cfg.NRI.SocketPath},
		{"http://" + metricsAddr + "/readyz", http.StatusServiceUnavailable, cfg.NRI.SocketPath},
		{"http://" + healthAddr + "/metrics", http.StatusNotFound, ""},
	} {
		if code, body := get(t, tt.url); code != tt.code || !strings.Contains(body, tt.body) {
			t.Errorf("GET %s: %d %q, want %d with %q; log:\n%s", tt.url, code, body, tt.code, tt.body, errb.String())
		}
	}
}
