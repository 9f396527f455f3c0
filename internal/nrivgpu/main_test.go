package nrivgpu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/internal/nriplugin"
	"github.com/nri-vgpu/nri-vgpu/internal/pin/pintest"
	"github.com/nri-vgpu/nri-vgpu/internal/status"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

// envRunMain makes the test binary act as nri-vgpu itself, so that an NRI
// runtime can launch it from its plugin directory like containerd does.
const envRunMain = "NRI_VGPU_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		os.Exit(Main(os.Args, os.Stdout, os.Stderr))
	}
	// One process-wide NRI logger for every test, set before any runtime or
	// plugin goroutine reads it.
	nriplugin.SetNRILogger(discardLogger())
	setNRILogger = func(*slog.Logger) {}
	os.Exit(m.Run())
}

const uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01"

// writeConfig writes a config file over fake device nodes and one simulated
// GPU, and returns its path and content.
func writeConfig(t *testing.T) (string, *config.Config) {
	t.Helper()
	root := ocitest.FakeDevRoot(t, ocitest.StandardNodes)
	dir := hoststatetest.RunDir(t) // holds run_dir
	shim := filepath.Join(dir, "libvgpu-shim.so")
	if err := os.WriteFile(shim, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	toml := fmt.Sprintf(`
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = %q
name = "NVIDIA A100-SXM4-40GB"
memory = "40GiB"
minor = 0
[driver]
injection = "nvidia-runtime"
dev_root = %q
[paths]
state_dir = %q
run_dir = %q
shim_path = %q
[nri]
socket_path = %q
`, uuid0, root, filepath.Join(dir, "state"), filepath.Join(dir, "run"), shim, filepath.Join(sockDir, "nri.sock"))
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), args, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "nri-vgpu ") || !strings.HasSuffix(out.String(), "\n") {
			t.Errorf("%v: code %d, out %q, err %q", args, code, out.String(), errb.String())
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"status", "-o", "yaml"}, {"--log-level", "loud", "status"}, {"--hook-path", "nri-vgpu-hook", "status"}} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), args, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: code %d (want 2), stderr %q", args, code, errb.String())
		}
	}
}

// SIGTERM (here: the context) stops the external plugin cleanly, also while
// it is waiting to reconnect to a runtime that is not there.
func TestStopsCleanlyWhileReconnecting(t *testing.T) {
	path, _ := writeConfig(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() { done <- run(ctx, []string{"--config", path}, &bytes.Buffer{}, &errb) }()
	time.Sleep(700 * time.Millisecond) // a failed dial and a backoff
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d after stop, want 0; log:\n%s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("plugin did not stop")
	}
	if !strings.Contains(errb.String(), "reconnecting") {
		t.Errorf("log does not show reconnection attempts:\n%s", errb.String())
	}
}

// The binary itself exits 0 on SIGTERM.
func TestSIGTERM(t *testing.T) {
	path, _ := writeConfig(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd := exec.Command(exe, "--config", path)
	cmd.Env = append(os.Environ(), envRunMain+"=1")
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("after SIGTERM: %v; log:\n%s", err, errb.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("no exit after SIGTERM")
	}
}

// containerd starts pre-registered plugins from its plugin directory with
// no arguments and a connection in NRI_PLUGIN_SOCKET; the binary must serve
// it. The runtime here is NRI's own runtime side, launching this test binary
// through a wrapper script (the runtime passes no environment of its own, so
// the script names the config file).
func TestStartedByRuntime(t *testing.T) {
	path, cfg := writeConfig(t)
	rsp := createThroughRuntime(t, path, cfg)
	found := false
	for _, e := range rsp.GetAdjust().GetEnv() {
		found = found || (e.Key == oci.EnvVisibleDevices && e.Value == uuid0)
	}
	if !found {
		t.Errorf("adjustment env %v lacks %s=%s", rsp.GetAdjust().GetEnv(), oci.EnvVisibleDevices, uuid0)
	}
	// Without paths.hook_path or --hook-path, the pin hook is this binary.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got := lastCreateHook(rsp); got == nil || got.Path != exe {
		t.Errorf("pin hook = %v, want %s", got, exe)
	}

	// And the operator sees it.
	var out bytes.Buffer
	if code := run(t.Context(), []string{"--config", path, "status", "-o", "json"}, &out, os.Stderr); code != 0 {
		t.Fatalf("status exit code %d", code)
	}
	var rep status.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, out.String())
	}
	if len(rep.GPUs) != 1 || len(rep.GPUs[0].Containers) != 1 {
		t.Fatalf("status = %s", out.String())
	}
	c := rep.GPUs[0].Containers[0]
	if c.ID != "c1" || c.Pod != "ml/job" || c.Name != "train" || c.Slices != 3 || c.MemoryLimit != 12<<30 || c.Cores != 30 {
		t.Errorf("status container = %+v", c)
	}
}

// TestHookPathFlag: --hook-path (the Helm chart's copy of nri-vgpu-hook on
// the host) names the pin hook in place of paths.hook_path, which the
// release's config may set to anything or leave out.
func TestHookPathFlag(t *testing.T) {
	path, cfg := writeConfig(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.Replace(string(data), "[paths]\n", "[paths]\nhook_path = \"/usr/bin/nri-vgpu\"\n", 1))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rsp := createThroughRuntime(t, path, cfg, "--hook-path", "/usr/lib/nri-vgpu/nri-vgpu-hook")
	want := oci.PinHook("/usr/lib/nri-vgpu/nri-vgpu-hook")
	if got := lastCreateHook(rsp); got == nil || got.Path != want.Path || !slices.Equal(got.Args, want.Args) {
		t.Errorf("pin hook = %v, want %s %q", got, want.Path, want.Args)
	}
}

// lastCreateHook is the last createContainer hook of an adjustment: the pin
// hook (oci.Compute appends it after any other).
func lastCreateHook(rsp *adaptation.CreateContainerResponse) *api.Hook {
	hooks := rsp.GetAdjust().GetHooks().GetCreateContainer()
	if len(hooks) == 0 {
		return nil
	}
	return hooks[len(hooks)-1]
}

// createThroughRuntime has NRI's runtime side start this test binary as
// nri-vgpu from its plugin directory with args and the config at path, and
// create one container with a signed allocation of 3 slices of uuid0 (pod
// ml/job, container train, ID c1); it returns the plugin's answer.
func createThroughRuntime(t *testing.T, path string, cfg *config.Config, args ...string) *adaptation.CreateContainerResponse {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pluginDir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nexec env %s=1 %s=%s %s %s\n", envRunMain, config.EnvPath, path, exe, strings.Join(args, " "))
	if err := os.WriteFile(filepath.Join(pluginDir, "10-nri-vgpu"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	updateFn := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", "v2-test", syncFn, updateFn,
		adaptation.WithPluginPath(pluginDir), adaptation.WithPluginConfigPath(t.TempDir()), adaptation.WithDisabledExternalConnections())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil { // launches and synchronizes the plugin
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)

	key, err := allockey.Load(cfg.Paths.StateDir) // created by the plugin
	if err != nil {
		t.Fatal(err)
	}
	a := &allocation.Allocation{V: 1, ID: "0123456789abcdef0123456789abcdef", Issued: time.Now().Unix(),
		GPUs: []allocation.GPU{{UUID: uuid0, Minor: 0, Slices: 3, Memory: 12 << 30, Cores: 30}}}
	ann, err := allocation.Sign(key, a)
	if err != nil {
		t.Fatal(err)
	}
	pod := &api.PodSandbox{Id: "sb1", Uid: "uid-1", Name: "job", Namespace: "ml"}
	ctr := &api.Container{Id: "c1", PodSandboxId: "sb1", Name: "train", Annotations: map[string]string{allocation.AnnotationKey: ann}}
	rsp, err := r.CreateContainer(t.Context(), &adaptation.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		t.Fatal(err)
	}
	return rsp
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestHookPin runs the binary the way runc runs the pin hook ("hook pin",
// the state on stdin) for a root whose /run/nri-vgpu is a symbolic link:
// exit 1 and the message naming the path, with no configuration needed;
// other arguments are a usage error.
func TestHookPin(t *testing.T) {
	bundle := t.TempDir()
	// A clean /etc first: the link on a later path is what gets named.
	for _, d := range []string{"etc", "run"} {
		if err := os.MkdirAll(filepath.Join(bundle, "rootfs", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "etc", "ld.so.preload"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(bundle, "rootfs", "run", "nri-vgpu")); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"hook", "pin"}, 1, "nri-vgpu: /run/nri-vgpu in the image is a symbolic link; refusing\n"},
		{[]string{"hook", "pin", "extra"}, 2, "usage: nri-vgpu hook pin"},
	} {
		cmd := exec.Command(os.Args[0], tt.args...)
		cmd.Env = append(os.Environ(), envRunMain+"=1", config.EnvPath+"=/nonexistent/config.toml")
		cmd.Stdin = strings.NewReader(`{"ociVersion":"1.2.0","id":"c1","status":"creating","bundle":"` + bundle + `"}`)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != tt.code || !strings.HasPrefix(string(out), tt.want) {
			t.Errorf("nri-vgpu %q: exit %d, %q; want exit %d, %q", tt.args, code, out, tt.code, tt.want)
		}
	}
}
