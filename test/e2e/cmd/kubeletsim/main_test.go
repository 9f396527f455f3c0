package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/deviceplugin"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

const (
	uuid0 = "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"
	uuid1 = "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"
)

// node is nri-vgpu's real device plugin on two simulated GPUs (16 GiB split
// in 4, 32 GiB split in 8), serving in a temporary socket directory.
type node struct {
	dir string
	sim *gpu.Simulated
}

// startDevicePlugin runs the device plugin until the test ends.
func startDevicePlugin(t *testing.T) *node {
	t.Helper()
	// A short directory: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ksim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{dir: dir}
	cfg := config.Default()
	cfg.DevicePlugin.SplitCount = 4
	cfg.DevicePlugin.SocketDir = dir
	cfg.DevicePlugin.Models = []config.ModelOverride{{Name: "NVIDIA H100 80GB HBM3", SplitCount: 8}}
	cfg.Paths.StateDir = t.TempDir()
	cfg.GPU.Backend = config.BackendSimulated
	cfg.GPU.Simulated = []config.SimulatedGPU{
		{UUID: uuid0, Name: "NVIDIA A100-SXM4-40GB", Memory: 16 << 30, Minor: 0},
		{UUID: uuid1, Name: "NVIDIA H100 80GB HBM3", Memory: 32 << 30, Minor: 1},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	n.sim, err = gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	p, err := deviceplugin.New(deviceplugin.Options{Config: cfg, Backend: n.sim})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("device plugin: %v", err)
		}
		n.sim.Close()
	})
	return n
}

// waitOutput waits until out contains want.
func waitOutput(t *testing.T, out *syncbuf.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output lacks %q after 20s:\n%s", want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchPrintsPluginsAndUpdates: the program shows the device plugin's
// registration and its slices per GPU, and the new health of a GPU's slices
// when the plugin streams an update.
func TestWatchPrintsPluginsAndUpdates(t *testing.T) {
	n := startDevicePlugin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncbuf.Buffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, []string{"--socket-dir", n.dir}, &out, &errOut) }()

	waitOutput(t, &out, "nvidia.com/gpu: ListAndWatch: 12 devices, 12 healthy")
	for _, want := range []string{
		"serving Registration on " + n.dir + "/kubelet.sock",
		"nvidia.com/gpu: device plugin registered, endpoint " + deviceplugin.SocketName("nvidia.com/gpu") + " (GetPreferredAllocation: yes)",
		uuid0 + "  4 slices  all healthy",
		uuid1 + "  8 slices  all healthy",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	if err := n.sim.SetHealthy(uuid1, false, "test"); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &out, "nvidia.com/gpu: ListAndWatch: 12 devices, 4 healthy")
	waitOutput(t, &out, uuid1+"  8 slices  all unhealthy")

	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit status %d after an interrupt, want 0; stderr: %s", c, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program did not stop when its context was cancelled")
	}
}

// TestAllocatePrintsTheAllocation: --allocate 2 gets two slices of one GPU
// (binpack) and prints the decoded, signed allocation the plugin returned.
func TestAllocatePrintsTheAllocation(t *testing.T) {
	n := startDevicePlugin(t)
	var out, errOut syncbuf.Buffer
	if c := run(context.Background(), []string{"--socket-dir", n.dir, "--allocate", "2", "--wait", "20s"}, &out, &errOut); c != 0 {
		t.Fatalf("exit status %d; stderr: %s\nstdout: %s", c, errOut.String(), out.String())
	}
	got := out.String()
	// binpack: the GPU with the fewest free slices that can hold the request.
	for _, want := range []string{
		"nvidia.com/gpu: allocating 2 to one container",
		"devices: " + uuid0 + "::0 " + uuid0 + "::1\n",
		// Only the gate (Contract 2) besides the annotation.
		"also: 1 mounts\n    mount /dev/null at /proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin (read-only)\n",
		"annotation " + allocation.AnnotationKey,
		`"slices": 2`,
		"=> " + uuid0 + " (minor 0): 2 slices, 8GiB of GPU memory, 50% of SM time",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// The decoded payload is the JSON of a whole allocation.
	start := strings.Index(got, "    {\n")
	end := strings.Index(got, "\n    }\n")
	if start < 0 || end < 0 {
		t.Fatalf("no JSON payload in the output:\n%s", got)
	}
	var printed allocation.Allocation
	if err := json.Unmarshal([]byte(got[start:end+6]), &printed); err != nil {
		t.Fatalf("printed payload: %v", err)
	}
	if printed.V != allocation.Version || len(printed.GPUs) != 1 || printed.GPUs[0].Memory != 8<<30 || printed.GPUs[0].Cores != 50 {
		t.Errorf("printed payload = %+v", printed)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"negative allocate", []string{"--allocate", "-1"}, 2, "--allocate -1"},
		{"zero wait", []string{"--allocate", "1", "--wait", "0s"}, 2, "--wait 0s"},
		{"stray argument", []string{"extra"}, 2, `unexpected arguments ["extra"]`},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined: -nope"},
		{"help", []string{"-h"}, 0, "Usage: kubeletsim"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errOut bytes.Buffer
			if c := run(context.Background(), tt.args, io.Discard, &errOut); c != tt.code || !strings.Contains(errOut.String(), tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", c, errOut.String(), tt.code, tt.wantErr)
			}
		})
	}
}

// TestAllocateWithoutPluginTimesOut: --allocate with no plugin fails after
// --wait with a message naming the resource and what was seen.
func TestAllocateWithoutPluginTimesOut(t *testing.T) {
	dir, err := os.MkdirTemp("", "ksim-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var errOut bytes.Buffer
	c := run(context.Background(), []string{"--socket-dir", dir, "--allocate", "1", "--wait", "200ms", "--resource", "example.com/dev"}, io.Discard, &errOut)
	if want := "no plugin for example.com/dev with 1 healthy devices within 200ms (registered: false, 0 devices, 0 healthy)"; c != 1 || !strings.Contains(errOut.String(), want) {
		t.Errorf("exit %d, stderr %q; want 1 and %q", c, errOut.String(), want)
	}
}

// TestRefusesALiveKubelet: the program does not take over the
// Registration socket of a kubelet that is serving it.
func TestRefusesALiveKubelet(t *testing.T) {
	dir, err := os.MkdirTemp("", "ksim-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	live, err := kubeletsim.New(kubeletsim.Options{SocketDir: dir, PodLogDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	var errOut bytes.Buffer
	if c := run(context.Background(), []string{"--socket-dir", dir}, io.Discard, &errOut); c != 1 ||
		!strings.Contains(errOut.String(), "a kubelet already serves "+live.SocketPath()) {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming %s", c, errOut.String(), live.SocketPath())
	}
	// The live kubelet's socket is untouched.
	if _, err := os.Stat(live.SocketPath()); err != nil {
		t.Errorf("the live kubelet's socket: %v", err)
	}
}

// TestDefaultSocketDirIsTheConfigDefault: the program and the device plugin
// meet in the same directory when neither is told otherwise.
func TestDefaultSocketDirIsTheConfigDefault(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := config.Default().DevicePlugin.SocketDir; o.socketDir != want || want != "/var/lib/kubelet/device-plugins" {
		t.Errorf("--socket-dir default %q, config default %q; want both /var/lib/kubelet/device-plugins", o.socketDir, want)
	}
}
