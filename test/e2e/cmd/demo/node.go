package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

const (
	resourceName = "nvidia.com/gpu"
	// nriPluginName is nri-vgpu's file name in containerd's NRI plugin
	// directory: index 10, the config default.
	nriPluginName = "10-nri-vgpu"
	// appImage is the pods' image: busybox, the shim's test program cudaprog
	// and the fake CUDA driver and NVML it runs against. Like CUDA's base
	// images it sets NVIDIA_VISIBLE_DEVICES=all.
	appImage = "nri-vgpu.demo/cuda-app:latest"
	// splitCount is the default split; overrides are per model.
	splitCount = 4
)

// simGPU is one simulated GPU of the demo node.
type simGPU struct {
	UUID   string
	Name   string
	Memory uint64
	Minor  int
	SMs    int // for the fake driver
	// Split is the [[device_plugin.model]] split count; 0 = splitCount.
	Split int
}

// demoGPUs are the node's GPUs, the two of packaging/config.toml: an A100
// split in 4 slices and an H100 split in 8 (a model override), 10 GiB each.
var demoGPUs = []simGPU{
	{UUID: "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a", Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Minor: 0, SMs: 108},
	{UUID: "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f", Name: "NVIDIA H100 80GB HBM3", Memory: 80 << 30, Minor: 1, SMs: 132, Split: 8},
}

// node is everything the demo starts: containerd with nri-vgpu
// pre-registered, the kubelet simulator, the device plugin, and the host
// directories nri-vgpu uses (fake /dev, run_dir, state_dir) under base.
type node struct {
	base       string // made by harness.MkdirTemp: swept if the demo is killed
	logDir     string
	configPath string
	devRoot    string
	runDir     string
	stateDir   string
	kubeletDir string
	nriSocket  string
	cfg        *config.Config

	c          *harness.Containerd
	kubelet    *kubeletsim.Kubelet
	kubeletLog *os.File
	dp         *harness.Process // the device plugin
}

func newNode(base, logDir string) *node {
	return &node{
		base:       base,
		logDir:     logDir,
		configPath: filepath.Join(base, "config.toml"),
		devRoot:    filepath.Join(base, "devroot"),
		runDir:     filepath.Join(base, "run"),
		stateDir:   filepath.Join(base, "state"),
		kubeletDir: filepath.Join(base, "device-plugins"),
		nriSocket:  filepath.Join(base, "nri.sock"),
	}
}

// configTOML is the config file both daemons (and `nri-vgpu status`) read.
func (n *node) configTOML(shim string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# nri-vgpu demo node: two simulated GPUs, every path in a temporary directory.
[device_plugin]
split_count = %d
socket_dir = %q
feature_file = %q
`, splitCount, n.kubeletDir, filepath.Join(filepath.Dir(n.kubeletDir), "features.d", "nri-vgpu"))
	for _, g := range demoGPUs {
		if g.Split != 0 {
			fmt.Fprintf(&b, "\n[[device_plugin.model]]\nname = %q\nsplit_count = %d\n", g.Name, g.Split)
		}
	}
	b.WriteString("\n[gpu]\nbackend = \"simulated\"\n")
	for _, g := range demoGPUs {
		harness.WriteSimulatedGPU(&b, g.UUID, g.Name, g.Memory, g.Minor)
	}
	b.WriteString("\n# No NVIDIA driver on this machine: nothing to inject but the device nodes\n" +
		"# (fake ones, from dev_root) and the shim; the image brings a fake driver.")
	harness.WriteNodePaths(&b, harness.NodePaths{DevRoot: n.devRoot, StateDir: n.stateDir, RunDir: n.runDir, Shim: shim, NRISocket: n.nriSocket})
	return b.String()
}

// writeConfig writes the config file and reads it back the way the
// binaries do, so that a mistake in it fails here, named.
func (n *node) writeConfig(shim string) error {
	if err := os.WriteFile(n.configPath, []byte(n.configTOML(shim)), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(n.configPath)
	if err != nil {
		return err
	}
	n.cfg = cfg
	return nil
}

// makeDevRoot creates the fake /dev/nvidia* nodes of the demo GPUs.
func (n *node) makeDevRoot() error {
	minors := make([]int, len(demoGPUs))
	for i, g := range demoGPUs {
		minors[i] = g.Minor
	}
	return harness.MakeFakeNVIDIADevRoot(n.devRoot, minors)
}

// buildImages writes the pause image and the application image into dir.
func buildImages(ctx context.Context, dir, shimBuild string) ([]string, error) {
	pause, err := harness.BuildPauseImage(ctx, dir)
	if err != nil {
		return nil, err
	}
	app, err := harness.BuildCudaTestImage(dir, appImage, shimBuild,
		[]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"})
	if err != nil {
		return nil, err
	}
	return []string{pause, app}, nil
}

// startContainerd starts containerd with NRI on and nri-vgpu pre-registered
// in its plugin directory (containerd starts it, with the demo's config).
func (n *node) startContainerd(ctx context.Context, images []string, binDir, runc, nriVGPU string) error {
	c, err := harness.Start(ctx, harness.Options{
		BinDir:       binDir,
		Runc:         runc,
		Images:       images,
		SandboxImage: harness.PauseImage,
		NRIPlugins: []harness.NRIPlugin{{
			Name: nriPluginName,
			Path: nriVGPU,
			Env:  []string{"NRI_VGPU_CONFIG=" + n.configPath},
		}},
		NRISocket: n.nriSocket,
		LogDir:    n.logDir,
	})
	if err != nil {
		return err
	}
	n.c = c
	return nil
}

// startDevicePlugin runs the device plugin binary against the kubelet
// simulator, its output in the log directory.
func (n *node) startDevicePlugin(devicePlugin string) error {
	klog, err := os.OpenFile(filepath.Join(n.logDir, "kubeletsim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.kubeletLog = klog
	k, err := kubeletsim.New(kubeletsim.Options{SocketDir: n.kubeletDir, PodLogDir: filepath.Join(n.base, "pod-logs"),
		Logger: slog.New(slog.NewTextHandler(klog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		return err
	}
	n.kubelet = k
	// A process group of its own (StartProcess): a Ctrl-C stops the demo,
	// which stops it.
	cmd := exec.Command(devicePlugin, "--config", n.configPath, "--log-level", "debug")
	dp, err := harness.StartProcess(cmd, n.devicePluginLog())
	if err != nil {
		return err
	}
	n.dp = dp
	return nil
}

func (n *node) devicePluginLog() string { return filepath.Join(n.logDir, "device-plugin.log") }

// waitForSlices waits until the device plugin has registered and
// advertises every slice of every GPU.
func (n *node) waitForSlices(ctx context.Context) error {
	want := 0
	for _, g := range demoGPUs {
		want += n.cfg.DevicePlugin.SplitCountFor(g.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// A device plugin that exits (a bad config, say) ends the wait at once.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		select {
		case <-n.dp.Exited():
			stop(errors.New("the device plugin exited"))
		case <-ctx.Done():
		}
	}()
	if err := n.kubelet.WaitForDevices(ctx, resourceName, want); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, ctx.Err()) {
			return fmt.Errorf("%w: %s", cause, harness.Tail(n.devicePluginLog(), 5))
		}
		return err
	}
	return nil
}

// close stops everything the node started and removes base, going on past
// errors: containerd first (it removes the pods, and nri-vgpu their host
// state), then the device plugin and the kubelet simulator.
func (n *node) close() error {
	var errs []error
	if n.c != nil {
		if err := n.c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stopping containerd: %w", err))
		}
	}
	if n.dp != nil {
		if err := n.dp.Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stopping the device plugin: %w", err))
		}
	}
	if n.kubelet != nil {
		if err := n.kubelet.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.kubeletLog != nil {
		n.kubeletLog.Close()
	}
	// Region file systems of containers that were not removed.
	if err := mountinfo.UnmountUnder(n.base); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(n.base); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", n.base, err))
	}
	return errors.Join(errs...)
}
