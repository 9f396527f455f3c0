package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
	"github.com/nri-vgpu/nri-vgpu/internal/promserver/promtooltest"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"--log-level", "loud"}, 2, `--log-level "loud"`},
		{[]string{"--log-format", "xml"}, 2, `--log-format "xml"`},
		{[]string{"extra"}, 2, `unexpected arguments ["extra"]`},
		{[]string{"--version"}, 0, ProgramName + " " + version.Version},
		{[]string{"-h"}, 0, "-log-format"},
		{[]string{"--config", "/nonexistent/config.toml"}, 1, "cannot load the configuration"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out syncbuf.Buffer
			if code := Main(context.Background(), tt.args, &out, &out, nil); code != tt.code {
				t.Errorf("exit %d, want %d; output:\n%s", code, tt.code, out.String())
			}
			if !strings.Contains(out.String(), tt.out) {
				t.Errorf("output %q does not contain %q", out.String(), tt.out)
			}
		})
	}
}

func TestNoDriver(t *testing.T) {
	dir := shortDir(t)
	cfg := config.Default()
	if b, err := gpu.New(cfg); err == nil {
		_, err = b.Devices()
		_ = b.Close()
		if !errors.Is(err, gpu.ErrNoDriver) {
			t.Skipf("this machine has an NVIDIA driver (Devices: %v)", err)
		}
	}
	path := filepath.Join(dir, "config.toml")
	writeConfig(t, path, fmt.Sprintf("[device_plugin]\nsocket_dir = %q\nfeature_file = \"\"\n[paths]\nstate_dir = %q\n[gpu]\nbackend = \"nvml\"\n", dir, dir))
	var out syncbuf.Buffer
	if code := Main(context.Background(), []string{"--config", path}, &out, &out, nil); code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "no NVIDIA driver on this node") {
		t.Errorf("output does not explain the missing driver:\n%s", out.String())
	}
}

// TestRunSimulated runs the program against a fake kubelet: it registers,
// writes the node labels to its feature file (removed when it stops),
// reports ready on --health-listen, lists the configured GPUs, applies a
// reload (SIGHUP) and stops cleanly.
func TestRunSimulated(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "config.toml")
	features := filepath.Join(dir, "features.d", "nri-vgpu")
	base := fmt.Sprintf(`[device_plugin]
socket_dir = %q
feature_file = %q
split_count = 2
[paths]
state_dir = %q
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-aaaa"
name = "Sim"
memory = "16GiB"
minor = 0
`, dir, features, filepath.Join(dir, "state"))
	writeConfig(t, path, base)

	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reload := make(chan os.Signal, 1)
	var out syncbuf.Buffer
	exit := make(chan int, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	healthAddr := ln.Addr().String()
	ln.Close()
	go func() {
		exit <- Main(ctx, []string{"--config", path, "--log-format", "json", "--health-listen", healthAddr}, &out, &out, reload)
	}()

	wctx, wcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer wcancel()
	reg, err := k.WaitRegistration(wctx)
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, out.String())
	}
	defer reg.Close()
	l, err := reg.NextList(wctx)
	if err != nil || len(l) != 2 {
		t.Fatalf("first list %v, %v", l, err)
	}
	// Registered: the readiness probe passes (it may lag the registration
	// by one turn of the plugin's loop).
	client := &http.Client{Timeout: 5 * time.Second}
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		rsp, err := client.Get("http://" + healthAddr + "/readyz")
		if err == nil {
			rsp.Body.Close()
			if rsp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz on %s: %v %v, want 200 once registered; output:\n%s", healthAddr, rsp, err, out.String())
		}
	}

	// Serving: the node's labels are in the feature file.
	wantFeatures := `# Node labels of nri-vgpu-device-plugin (Node Feature Discovery local source);
# rewritten when the GPUs change, removed when the plugin stops.
nri-vgpu.io/gpu.count=1
nri-vgpu.io/gpu.memory=16384
nri-vgpu.io/gpu.product=Sim
nri-vgpu.io/gpu.replicas=2
nri-vgpu.io/gpu.sharing-strategy=time-slicing
`
	if got, err := os.ReadFile(features); err != nil || string(got) != wantFeatures {
		t.Errorf("feature file: %v\n%s\nwant\n%s", err, got, wantFeatures)
	}

	// Mark the GPU unhealthy in the file and reload.
	writeConfig(t, path, base+"healthy = false\n")
	reload <- syscall.SIGHUP
	if _, err := reg.WaitList(wctx, func(l []*pluginapi.Device) bool {
		return len(l) == 2 && l[0].Health == pluginapi.Unhealthy && l[1].Health == pluginapi.Unhealthy
	}); err != nil {
		t.Fatalf("after reload: %v; output:\n%s", err, out.String())
	}

	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d, want 0; output:\n%s", code, out.String())
		}
	case <-time.After(waitTimeout):
		t.Fatal("run did not return after cancel")
	}
	if _, err := os.Stat(filepath.Join(dir, "nri-vgpu-nvidia.com_gpu.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after stop: %v", err)
	}
	if _, err := os.Stat(features); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("feature file after stop: %v", err)
	}
	if s := out.String(); !strings.Contains(s, `"version":"`+version.Version+`"`) || !strings.Contains(s, `"msg":"stopped"`) {
		t.Errorf("log lacks the version or the stop line:\n%s", s)
	}
}

// freeAddr is a 127.0.0.1 address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRunMetrics runs the program with --metrics-listen and --health-listen
// on one address, which then names one server: it serves the probes and
// the device plugin's series next to the Go, process and build ones, and
// the scrape passes `promtool check metrics`.
func TestRunMetrics(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "config.toml")
	writeConfig(t, path, fmt.Sprintf(`[device_plugin]
socket_dir = %q
feature_file = ""
split_count = 3
[paths]
state_dir = %q
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-aaaa"
name = "Sim"
memory = "16GiB"
minor = 0
`, dir, filepath.Join(dir, "state")))
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncbuf.Buffer
	exit := make(chan int, 1)
	addr := freeAddr(t)
	go func() {
		exit <- Main(ctx, []string{"--config", path, "--metrics-listen", addr, "--health-listen", addr}, &out, &out, nil)
	}()
	defer func() {
		cancel()
		if code := <-exit; code != 0 {
			t.Errorf("exit %d, want 0; output:\n%s", code, out.String())
		}
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer wcancel()
	reg, err := k.WaitRegistration(wctx)
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, out.String())
	}
	defer reg.Close()

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
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := get("/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz on %s never 200; output:\n%s", addr, out.String())
		}
	}
	code, body := get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	for _, want := range []string{
		"\nnri_vgpu_device_plugin_registered{resource=\"nvidia.com/gpu\"} 1\n",
		"\nnri_vgpu_device_plugin_devices{health=\"healthy\",resource=\"nvidia.com/gpu\"} 3\n",
		"\nnri_vgpu_build_info{version=\"" + version.Version + "\"} 1\n",
		"\ngo_goroutines ",
		"\nprocess_start_time_seconds ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz: %d", code)
	}
	if strings.Contains(out.String(), "unavailable") {
		t.Errorf("one address started two servers:\n%s", out.String())
	}
	promtooltest.CheckMetrics(t, []byte(body))
}
