//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

const (
	resourceName = "nvidia.com/gpu"
	// allocationAnnotation is Contract 2's annotation.
	allocationAnnotation = "nri-vgpu.io/allocation"
	// nriPluginName is nri-vgpu's file name in containerd's NRI plugin
	// directory (index 10, the config default).
	nriPluginName = "10-nri-vgpu"
	// splitCount slices per simulated GPU.
	splitCount = 4
)

// simGPU is one simulated GPU of the test node.
type simGPU struct {
	UUID   string
	Name   string
	Memory uint64
	Minor  int
}

// testGPUs are the node's simulated GPUs: two 16 GiB GPUs, so a slice is
// 4 GiB and 25 % of SM time.
var testGPUs = []simGPU{
	{UUID: "GPU-e2e00000-0000-4000-8000-000000000000", Name: "NVIDIA A100-SXM4-40GB", Memory: 16 << 30, Minor: 0},
	{UUID: "GPU-e2e00000-0000-4000-8000-000000000001", Name: "NVIDIA A100-SXM4-40GB", Memory: 16 << 30, Minor: 1},
}

// binaries are nri-vgpu's programs, built from this tree once per run.
var binaries struct {
	nriPlugin, devicePlugin string
	// hook is cmd/nri-vgpu-hook, static as the Makefile builds it: the
	// chart's image holds it.
	hook string
	// nriErr, dpErr and hookErr say why a binary could not be built; the
	// tests that need it then fail with that.
	nriErr, dpErr, hookErr error
}

// buildBinaries builds cmd/nri-vgpu, cmd/device-plugin and
// cmd/nri-vgpu-hook into dir.
func buildBinaries(ctx context.Context, dir string) {
	binaries.nriPlugin = filepath.Join(dir, "nri-vgpu")
	binaries.devicePlugin = filepath.Join(dir, "nri-vgpu-device-plugin")
	binaries.hook = filepath.Join(dir, "nri-vgpu-hook")
	binaries.nriErr = harness.GoBuild(ctx, "./cmd/nri-vgpu", binaries.nriPlugin, false)
	binaries.dpErr = harness.GoBuild(ctx, "./cmd/device-plugin", binaries.devicePlugin, false)
	binaries.hookErr = makeHook(ctx, binaries.hook)
}

// makeHook builds cmd/nri-vgpu-hook into out with the Makefile's rule: it
// needs cgo (NVIDIA's update-ldcache hook imports go-nvml) and is linked
// statically.
func makeHook(ctx context.Context, out string) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", root, "BIN="+filepath.Dir(out), out)
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make %s: %w: %s", out, err, harness.TailLines(string(o), 20))
	}
	return nil
}

// shimPath is the shim library under test, built by `make -C shim`.
func shimPath(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "shim", "build", "libvgpu-shim.so")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the shim is not built (make -C shim): %v", err)
	}
	return p
}

// vgpu is a node running nri-vgpu: containerd with nri-vgpu pre-registered,
// the device plugin registered with the kubelet simulator, and host
// directories (dev root with fake NVIDIA nodes, run and state dirs) under
// the containerd's temporary root.
type vgpu struct {
	// base holds the node's directories.
	base       string
	c          *harness.Containerd
	kubelet    *kubeletsim.Kubelet
	configPath string
	nriSocket  string
	devRoot    string
	runDir     string
	stateDir   string
	dpLog      string
	dp         *harness.Process // the device plugin; nil when stopped
	// socketDir is the device plugin's socket_dir, where the kubelet
	// serves kubelet.sock.
	socketDir string
}

// vgpuOptions change the node's setup.
type vgpuOptions struct {
	// extraConfig is appended to the config file (after the [nri] table,
	// so it may add [nri] keys).
	extraConfig string
	// withoutNRI leaves nri-vgpu out: containerd runs no NRI plugin.
	withoutNRI bool
	// containerd adds to containerd's options (pod annotation pass-through,
	// NRI's validator, CNI).
	containerd harness.Options
	// socketDir is the kubelet's device-plugin directory (default: one in
	// the node's directory, for the kubelet simulator).
	socketDir string
	// driver is the config's [driver] table (default: no injection, the
	// fake nodes under the node's dev root); hookPath is paths.hook_path.
	driver, hookPath string
	// nriEnv is added to nri-vgpu's environment.
	nriEnv []string
}

// startVGPU sets up a node on containerd version for t, with the device
// plugin registered with the kubelet simulator, and tears it down when t
// ends.
func startVGPU(t *testing.T, containerd string, opts vgpuOptions) *vgpu {
	t.Helper()
	v := setUpNode(t, containerd, opts)
	var err error
	v.kubelet, err = kubeletsim.New(kubeletsim.Options{SocketDir: v.socketDir, Logger: nil})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.kubelet.Close() })
	v.runDevicePlugin(t)
	ctx := testContext(t, 30*time.Second)
	if err := v.kubelet.WaitForDevices(ctx, resourceName, splitCount*len(testGPUs)); err != nil {
		t.Fatalf("device plugin did not advertise %d slices: %v", splitCount*len(testGPUs), err)
	}
	return v
}

// setUpNode makes a node's host directories and config and starts its
// containerd with nri-vgpu pre-registered (unless opts.withoutNRI); the
// device plugin and a kubelet are the caller's. All of it is torn down when
// t ends.
func setUpNode(t *testing.T, containerd string, opts vgpuOptions) *vgpu {
	t.Helper()
	if binaries.dpErr != nil {
		t.Fatalf("the device plugin: %v", binaries.dpErr)
	}
	if !opts.withoutNRI && binaries.nriErr != nil {
		t.Fatalf("the NRI plugin: %v", binaries.nriErr)
	}
	shim := shimPath(t)
	// The node's directories live under a directory of their own that the
	// containerd's cleanup does not know about, so they are made first and
	// removed last (after the pods that mount them).
	base, err := harness.MkdirTemp("node")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Region file systems of containers that were not removed.
		if err := mountinfo.UnmountUnder(base); err != nil {
			t.Errorf("unmounting under %s: %v", base, err)
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("removing %s: %v", base, err)
		}
	})
	v := &vgpu{
		base:       base,
		configPath: filepath.Join(base, "config.toml"),
		devRoot:    filepath.Join(base, "devroot"),
		runDir:     filepath.Join(base, "run"),
		stateDir:   filepath.Join(base, "state"),
		dpLog:      filepath.Join(base, "device-plugin.log"),
		socketDir:  cmp.Or(opts.socketDir, filepath.Join(base, "device-plugins")),
	}
	minors := make([]int, len(testGPUs))
	for i, g := range testGPUs {
		minors[i] = g.Minor
	}
	if err := harness.MakeFakeNVIDIADevRoot(v.devRoot, minors); err != nil {
		t.Fatal(err)
	}
	// nri-vgpu started by hand (TestRestarts) or from the chart connects
	// to this socket; the chart's pod mounts its directory.
	v.nriSocket = filepath.Join(base, "nri", "nri.sock")
	if err := os.MkdirAll(filepath.Dir(v.nriSocket), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v.configPath, []byte(configTOML(v, v.socketDir, shim, opts)), 0o644); err != nil {
		t.Fatal(err)
	}

	var plugins []harness.NRIPlugin
	if !opts.withoutNRI {
		plugins = append(plugins, harness.NRIPlugin{
			Name: nriPluginName,
			Path: binaries.nriPlugin,
			Env:  append([]string{"NRI_VGPU_CONFIG=" + v.configPath}, opts.nriEnv...),
		})
	}
	copts := opts.containerd
	copts.NRISocket, copts.NRIPlugins = v.nriSocket, plugins
	v.c = startContainerdWith(t, containerd, copts)
	return v
}

// runDevicePlugin starts the device plugin and stops it when t ends.
func (v *vgpu) runDevicePlugin(t *testing.T) {
	t.Helper()
	v.startDevicePlugin(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("device plugin log (tail):\n%s", harness.Tail(v.dpLog, 40))
		}
		v.stopDevicePlugin(t)
	})
}

// configTOML is the config file both daemons read.
func configTOML(v *vgpu, kubeletDir, shim string, opts vgpuOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, `[device_plugin]
split_count = %d
socket_dir = %q
feature_file = %q

[gpu]
backend = "simulated"
`, splitCount, kubeletDir, filepath.Join(filepath.Dir(kubeletDir), "features.d", "nri-vgpu"))
	for _, g := range testGPUs {
		harness.WriteSimulatedGPU(&b, g.UUID, g.Name, g.Memory, g.Minor)
	}
	harness.WriteNodePaths(&b, harness.NodePaths{DevRoot: v.devRoot, StateDir: v.stateDir, RunDir: v.runDir, Shim: shim, NRISocket: v.nriSocket,
		Driver: opts.driver, Hook: opts.hookPath})
	b.WriteString(opts.extraConfig)
	return b.String()
}

func (v *vgpu) startDevicePlugin(t *testing.T) {
	t.Helper()
	cmd := exec.Command(binaries.devicePlugin, "--config", v.configPath, "--log-level", "debug")
	dp, err := harness.StartProcess(cmd, v.dpLog)
	if err != nil {
		t.Fatalf("starting the device plugin: %v", err)
	}
	v.dp = dp
}

func (v *vgpu) stopDevicePlugin(t *testing.T) {
	t.Helper()
	if v.dp == nil {
		return
	}
	if err := v.dp.Stop(10 * time.Second); err != nil {
		t.Errorf("the device plugin: %v", err)
	}
	v.dp = nil
}

// gpuPod is a pod of one busybox container asking for n slices.
func gpuPod(name string, n int) *kubeletsim.Pod {
	c := kubeletsim.Container{Name: "main", Image: harness.BusyboxImage}
	if n > 0 {
		c.Limits = map[string]int{resourceName: n}
	}
	return &kubeletsim.Pod{Name: name, UID: kubeletsim.NewUID(), TerminationGracePeriod: 5 * time.Second,
		Containers: []kubeletsim.Container{c}}
}

// run starts pod and removes it when t ends (if the test did not).
func (v *vgpu) run(t *testing.T, ctx context.Context, pod *kubeletsim.Pod) (*kubeletsim.RunningPod, error) {
	t.Helper()
	rp, err := v.kubelet.RunPod(ctx, v.c.Runtime, pod)
	t.Cleanup(func() {
		if rp == nil || !v.c.Alive() {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = v.kubelet.KillPod(cctx, v.c.Runtime, rp)
	})
	return rp, err
}

// mustRun is run for pods that must start.
func (v *vgpu) mustRun(t *testing.T, ctx context.Context, pod *kubeletsim.Pod) *kubeletsim.RunningPod {
	t.Helper()
	rp, err := v.run(t, ctx, pod)
	if err != nil {
		t.Fatalf("running pod %s: %v", pod.Name, err)
	}
	return rp
}

// sh runs a shell command in a container and returns its stdout; a non-zero
// exit fails the test.
func (v *vgpu) sh(t *testing.T, ctx context.Context, containerID, script string) string {
	t.Helper()
	res, err := v.c.Exec(ctx, containerID, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("in container %.12s: %q exited %d\nstdout: %s\nstderr: %s", containerID, script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// hostContainerDir is where nri-vgpu keeps a container's host state
// (Contract 3).
func (v *vgpu) hostContainerDir(containerID string) string {
	return filepath.Join(v.runDir, "containers", containerID)
}

// cudaTestImage holds the shim's test program cudaprog and the fake CUDA
// driver and NVML it runs against (shim/build, from `make -C shim`), with
// the glibc libraries they and the shim need.
const cudaTestImage = "nri-vgpu.test/cuda-test:e2e"

// buildCudaTestImage writes cudaTestImage into dir.
func buildCudaTestImage(dir string) (string, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	return harness.BuildCudaTestImage(dir, cudaTestImage, filepath.Join(root, "shim", "build"), nil)
}
