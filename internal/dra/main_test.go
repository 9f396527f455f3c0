package dra

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/promserver/promtooltest"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
)

func TestUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  string // NODE_NAME
		kube string // KUBECONFIG
		code int
		want string
	}{
		{"no node name", []string{"--kubeconfig", "/nonexistent"}, "", "", 2, "the node name is required"},
		{"stray argument", []string{"--node-name", "n", "extra"}, "", "", 2, `unexpected arguments ["extra"]`},
		{"version", []string{"--version"}, "", "", 0, "nri-vgpu-dra-driver "},
		{"bad config", []string{"--node-name", "n", "--config", "/nonexistent/config.toml"}, "", "", 1, "cannot load the configuration"},
		{"bad taint effect", []string{"--node-name", "n", "--config", "/dev/null", "--unhealthy-taint-effect", "NoExecut"}, "", "", 2, `--unhealthy-taint-effect must be NoSchedule or NoExecute, not "NoExecut"`},
		{"node name from the environment, bad kubeconfig", []string{"--config", "/dev/null", "--kubeconfig", "/nonexistent"}, "n", "", 1, "cannot configure the API server client"},
		// As the packaged unit starts it: both from the environment.
		{"kubeconfig from the environment", []string{"--config", "/dev/null"}, "n", "/nonexistent/kubelet.conf", 1, "/nonexistent/kubelet.conf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			t.Setenv("KUBECONFIG", tt.kube)
			var stderr bytes.Buffer
			code := Main(context.Background(), tt.args, &stderr, nil)
			if code != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("Main(%q) = %d, stderr %q; want %d and %q", tt.args, code, stderr.String(), tt.code, tt.want)
			}
		})
	}
}

// TestRunMetrics runs the driver with --metrics-listen against an API
// server that does not answer (so nothing is published) and no kubelet: /readyz says it is not
// registered, /healthz answers, and /metrics serves the driver's series
// (every refusal reason at 0) next to the Go, process and build ones,
// passing `promtool check metrics`.
func TestRunMetrics(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`[dra]
enabled = true
cdi_dir = %q
[paths]
state_dir = %q
run_dir = %q
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"
name = "Sim"
memory = "16GiB"
`, filepath.Join(dir, "cdi"), filepath.Join(dir, "state"), filepath.Join(dir, "run"))), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var out syncbuf.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- Main(ctx, []string{"--config", cfg, "--node-name", "n", "--kubeconfig", kubeconfig,
			"--plugin-dir", filepath.Join(dir, "plugin"), "--registry-dir", dir, "--metrics-listen", addr}, &out, nil)
	}()
	defer func() {
		cancel()
		select {
		case code := <-exit:
			if code != 0 {
				t.Errorf("exit %d, want 0; output:\n%s", code, out.String())
			}
		case <-time.After(time.Minute):
			t.Error("run did not return after cancel")
		}
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string) {
		rsp, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer rsp.Body.Close()
		body, _ := io.ReadAll(rsp.Body)
		return rsp.StatusCode, string(body)
	}
	var code int
	var body string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if code, body = get("/metrics"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /metrics: %d %s\noutput:\n%s", code, body, out.String())
		}
	}
	for _, want := range []string{
		"\nnri_vgpu_dra_registered 0\n",
		"\nnri_vgpu_dra_resourceslice_publications_total 0\n",
		"\nnri_vgpu_dra_prepare_refusals_total{reason=\"over_capacity\"} 0\n",
		"\nnri_vgpu_dra_gpu_healthy{UUID=\"GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f\",gpu=\"0\",name=\"Sim\"} 1\n",
		"\nnri_vgpu_build_info{version=\"" + version.Version + "\"} 1\n",
		"\ngo_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("GET /readyz = %d %q, want 503 saying the driver is not registered", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz: %d", code)
	}
	promtooltest.CheckMetrics(t, []byte(body))
}
