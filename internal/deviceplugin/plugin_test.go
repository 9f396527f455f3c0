package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

const (
	gib = uint64(1) << 30
	// waitTimeout bounds every wait on the plugin; the waits end as soon as
	// the condition holds.
	waitTimeout = 10 * time.Second
)

// Simulated GPU UUIDs; B sorts before A, so the allocation's sorting by UUID
// is visible.
const (
	uuidA = "GPU-b0000000-0000-0000-0000-00000000000a"
	uuidB = "GPU-a0000000-0000-0000-0000-00000000000b"
	uuidC = "GPU-c0000000-0000-0000-0000-00000000000c"
)

var fixedNow = time.Unix(1_800_000_000, 0)

func simGPU(uuid, name string, memory uint64, minor int) config.SimulatedGPU {
	return config.SimulatedGPU{UUID: uuid, Name: name, Memory: config.Bytes(memory), Minor: minor}
}

// shortDir is a temporary directory whose paths fit in a unix socket
// address (108 bytes); t.TempDir's can be too long.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// testLogger returns a logger whose output the test prints if it fails.
func testLogger(t testing.TB) *slog.Logger {
	b := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", b.String())
		}
	})
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func testConfig(dir string, gpus ...config.SimulatedGPU) *config.Config {
	cfg := config.Default()
	cfg.DevicePlugin.SocketDir = dir
	cfg.DevicePlugin.FeatureFile = filepath.Join(dir, "features.d", "nri-vgpu")
	cfg.Paths.StateDir = filepath.Join(dir, "state")
	cfg.GPU.Backend = config.BackendSimulated
	cfg.GPU.Simulated = gpus
	return cfg
}

// newPlugin builds a plugin on the simulated backend without serving it.
func newPlugin(t testing.TB, cfg *config.Config) (*Plugin, *gpu.Simulated) {
	t.Helper()
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	p, err := New(Options{Config: cfg, Backend: sim, Logger: testLogger(t), Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatal(err)
	}
	return p, sim
}

// harness is a plugin running against a fake kubelet.
type harness struct {
	t       *testing.T
	dir     string
	cfg     *config.Config
	plugin  *Plugin
	sim     *gpu.Simulated
	kubelet *kubelettest.Kubelet
	reg     *kubelettest.Registration
	cancel  context.CancelFunc
	runErr  chan error
}

// start runs a plugin with cfg against a fake kubelet in cfg's socket_dir
// and waits for it to register.
func start(t *testing.T, cfg *config.Config) *harness {
	t.Helper()
	h := &harness{t: t, dir: cfg.DevicePlugin.SocketDir, cfg: cfg, runErr: make(chan error, 1)}
	var err error
	h.kubelet, err = kubelettest.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.kubelet.Stop() })
	h.plugin, h.sim = newPlugin(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.runErr <- h.plugin.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return after cancel")
		}
	})
	h.reg = h.waitRegistration(h.kubelet)
	return h
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) waitRegistration(k *kubelettest.Kubelet) *kubelettest.Registration {
	h.t.Helper()
	r, err := k.WaitRegistration(h.ctx())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(r.Close)
	return r
}

func (h *harness) nextList(r *kubelettest.Registration) []*pluginapi.Device {
	h.t.Helper()
	l, err := r.NextList(h.ctx())
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

func deviceIDs(devs []*pluginapi.Device) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.ID
	}
	return out
}

func TestRegister(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "NVIDIA A100", 40*gib, 0))
	cfg.DevicePlugin.ResourceName = "example.com/vgpu"
	h := start(t, cfg)

	req := h.reg.Request
	if req.Version != pluginapi.Version {
		t.Errorf("Version = %q, want %q", req.Version, pluginapi.Version)
	}
	if want := "nri-vgpu-example.com_vgpu.sock"; req.Endpoint != want {
		t.Errorf("Endpoint = %q, want %q", req.Endpoint, want)
	}
	if req.ResourceName != "example.com/vgpu" {
		t.Errorf("ResourceName = %q", req.ResourceName)
	}
	if req.Options == nil || !req.Options.GetPreferredAllocationAvailable || req.Options.PreStartRequired {
		t.Errorf("registration Options = %v, want GetPreferredAllocationAvailable only", req.Options)
	}
	if o := h.reg.Options; !o.GetPreferredAllocationAvailable || o.PreStartRequired {
		t.Errorf("GetDevicePluginOptions = %v, want GetPreferredAllocationAvailable only", o)
	}
	if _, err := os.Stat(filepath.Join(h.dir, req.Endpoint)); err != nil {
		t.Errorf("plugin socket: %v", err)
	}
}

func TestListAndWatch(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "Tesla T4", 16*gib, 0),
		simGPU(uuidB, "NVIDIA A100", 40*gib, 1),
	)
	cfg.DevicePlugin.SplitCount = 3
	cfg.DevicePlugin.Models = []config.ModelOverride{{Name: "Tesla T4", SplitCount: 2}}
	h := start(t, cfg)

	devs := h.nextList(h.reg)
	want := slices.Concat(ids(uuidA, 0, 2), ids(uuidB, 0, 3))
	if got := deviceIDs(devs); !slices.Equal(got, want) {
		t.Errorf("devices = %v, want %v", got, want)
	}
	for _, d := range devs {
		if d.Health != pluginapi.Healthy || d.Topology != nil {
			t.Errorf("device %s: health %q topology %v, want Healthy and no topology (simulated)", d.ID, d.Health, d.Topology)
		}
	}
}

// A GPU in MIG mode is served elsewhere: never advertised, never allocated.
func TestListAndWatchLeavesMIGGPUs(t *testing.T) {
	mig := simGPU(uuidB, "NVIDIA A100", 40*gib, 1)
	mig.MIG = true
	cfg := testConfig(shortDir(t), simGPU(uuidA, "Tesla T4", 16*gib, 0), mig)
	cfg.DevicePlugin.SplitCount = 2
	h := start(t, cfg)
	if got, want := deviceIDs(h.nextList(h.reg)), ids(uuidA, 0, 2); !slices.Equal(got, want) {
		t.Errorf("devices = %v, want %v (the GPU in MIG mode left out)", got, want)
	}
	_, err := h.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids(uuidB, 0, 1)}},
	})
	if err == nil {
		t.Errorf("Allocate of a slice of the GPU in MIG mode %s succeeded", uuidB)
	}
}

// GPUs handed to the DRA driver are not advertised as slices: a GPU is
// served one way or the other (Contract 8).
func TestListAndWatchLeavesDRAGPUs(t *testing.T) {
	tests := []struct {
		name string
		dra  config.DRA
		want []string
	}{
		{"off", config.DRA{}, slices.Concat(ids(uuidA, 0, 2), ids(uuidB, 0, 2))},
		{"one GPU", config.DRA{Enabled: true, GPUs: []string{uuidB}}, ids(uuidA, 0, 2)},
		{"every GPU", config.DRA{Enabled: true}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(shortDir(t),
				simGPU(uuidA, "Tesla T4", 16*gib, 0),
				simGPU(uuidB, "NVIDIA A100", 40*gib, 1),
			)
			cfg.DevicePlugin.SplitCount = 2
			cfg.DRA = tt.dra
			h := start(t, cfg)
			if got := deviceIDs(h.nextList(h.reg)); !slices.Equal(got, tt.want) {
				t.Errorf("devices = %v, want %v", got, tt.want)
			}
			if tt.dra.Serves(uuidB) {
				_, err := h.plugin.Allocate(context.Background(), &pluginapi.AllocateRequest{
					ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids(uuidB, 0, 1)}},
				})
				if err == nil {
					t.Errorf("Allocate of a slice of the DRA GPU %s succeeded", uuidB)
				}
			}
		})
	}
}

func TestTopologyFromSysfs(t *testing.T) {
	dir := shortDir(t)
	sysfs := filepath.Join(dir, "sys")
	// The simulated backend places minor m at bus m+1.
	for bus, node := range map[string]string{"0000:01:00.0": "1\n", "0000:02:00.0": "-1\n"} {
		d := filepath.Join(sysfs, "bus", "pci", "devices", bus)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "numa_node"), []byte(node), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(dir, simGPU(uuidA, "A", 8*gib, 0), simGPU(uuidB, "B", 8*gib, 1), simGPU(uuidC, "C", 8*gib, 2))
	cfg.DevicePlugin.SplitCount = 1
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Config: cfg, Backend: sim, Logger: testLogger(t), SysfsRoot: sysfs})
	if err != nil {
		t.Fatal(err)
	}
	inv, _ := p.snapshot()
	want := map[string]int64{uuidA + "::0": 1, uuidB + "::0": -1, uuidC + "::0": -1}
	for _, d := range inv.devices {
		if got := numaOf(d); got != want[d.ID] {
			t.Errorf("device %s: NUMA node %d, want %d", d.ID, got, want[d.ID])
		}
	}
}

func TestNUMANode(t *testing.T) {
	sysfs := shortDir(t)
	d := filepath.Join(sysfs, "bus", "pci", "devices", "0000:3b:00.0")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "numa_node"), []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		busID string
		node  int
		ok    bool
	}{
		{"0000:3b:00.0", 3, true},
		{"00000000:3B:00.0", 3, true}, // NVML's form
		{"0000:3c:00.0", 0, false},
		{"", 0, false},
		{"../../../etc", 0, false},
	}
	for _, tt := range tests {
		n, ok := numaNode(sysfs, tt.busID)
		if n != tt.node || ok != tt.ok {
			t.Errorf("numaNode(%q) = %d, %v; want %d, %v", tt.busID, n, ok, tt.node, tt.ok)
		}
	}
}

// TestPrefer covers the plugin's side of GetPreferredAllocation: what it
// offers the policy (healthy, known, offered slices) and what it adds
// (must-include IDs, the over-asking error).
func TestPrefer(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "A", 8*gib, 0),
		simGPU(uuidB, "B", 8*gib, 1),
		simGPU(uuidC, "C", 8*gib, 2),
	)
	cfg.DevicePlugin.SplitCount = 4
	p, sim := newPlugin(t, cfg)
	if err := sim.SetHealthy(uuidC, false, "XID 79"); err != nil {
		t.Fatal(err)
	}
	if err := p.Refresh(); err != nil {
		t.Fatal(err)
	}
	all := slices.Concat(ids(uuidA, 0, 4), ids(uuidB, 0, 4), ids(uuidC, 0, 4))

	tests := []struct {
		name      string
		policy    string
		available []string
		must      []string
		size      int
		want      []string
		err       string
	}{
		{
			name: "binpack onto the fuller GPU", policy: config.PolicyBinpack,
			available: slices.Concat(ids(uuidA, 0, 4), ids(uuidB, 2, 4)), size: 2,
			want: ids(uuidB, 2, 4),
		},
		{
			name: "spread over GPUs", policy: config.PolicySpread,
			available: all, size: 2,
			want: []string{uuidA + "::0", uuidB + "::0"},
		},
		{
			name: "unhealthy GPU is never preferred", policy: config.PolicyBinpack,
			available: slices.Concat(ids(uuidA, 0, 4), ids(uuidC, 0, 1)), size: 1,
			want: ids(uuidA, 0, 1),
		},
		{
			name: "offered order does not matter", policy: config.PolicyBinpack,
			available: []string{uuidB + "::3", uuidB + "::1", uuidA + "::0"}, size: 2,
			want: []string{uuidB + "::1", uuidB + "::3"},
		},
		{
			name: "must-include kept and counted", policy: config.PolicyBinpack,
			available: all, must: []string{uuidB + "::2"}, size: 3,
			want: []string{uuidB + "::2", uuidB + "::0", uuidB + "::1"},
		},
		{
			name: "must-include honoured even when unhealthy or unknown", policy: config.PolicyBinpack,
			available: all, must: []string{uuidC + "::0", "GPU-gone::1"}, size: 2,
			want: []string{uuidC + "::0", "GPU-gone::1"},
		},
		{
			name: "unknown and malformed offers are ignored", policy: config.PolicyBinpack,
			available: []string{"GPU-gone::0", "junk", uuidA + "::9", uuidA + "::1"}, size: 1,
			want: []string{uuidA + "::1"},
		},
		{
			name: "more than the node has healthy", policy: config.PolicyBinpack,
			available: all, size: 9,
			err: "asks for 9 slices, but this node has only 8 healthy",
		},
		{
			name: "more than is offered", policy: config.PolicyBinpack,
			available: ids(uuidA, 0, 2), size: 3,
			err: "3 more slices needed, only 2 free",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.policy = tt.policy
			got, err := p.prefer(mustSnapshot(p), &pluginapi.ContainerPreferredAllocationRequest{
				AvailableDeviceIDs: tt.available, MustIncludeDeviceIDs: tt.must, AllocationSize: int32(tt.size),
			})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("prefer() error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("prefer() = %v, want %v", got, tt.want)
			}
		})
	}
}

func mustSnapshot(p *Plugin) *inventory {
	inv, _ := p.snapshot()
	return inv
}

func TestPreferredAllocationOverGRPC(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "A", 8*gib, 0),
		simGPU(uuidB, "B", 8*gib, 1),
	)
	cfg.DevicePlugin.SplitCount = 4
	h := start(t, cfg)

	resp, err := h.reg.Client.GetPreferredAllocation(h.ctx(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			// A has 4 free, B 3: binpack takes B.
			{AvailableDeviceIDs: slices.Concat(ids(uuidA, 0, 4), ids(uuidB, 1, 4)), AllocationSize: 2},
			// Must-include on A: the rest stays on A.
			{AvailableDeviceIDs: slices.Concat(ids(uuidA, 0, 4), ids(uuidB, 0, 4)), MustIncludeDeviceIDs: []string{uuidA + "::3"}, AllocationSize: 3},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{ids(uuidB, 1, 3), {uuidA + "::3", uuidA + "::0", uuidA + "::1"}}
	if len(resp.ContainerResponses) != len(want) {
		t.Fatalf("%d container responses, want %d", len(resp.ContainerResponses), len(want))
	}
	for i, r := range resp.ContainerResponses {
		if !slices.Equal(r.DeviceIDs, want[i]) {
			t.Errorf("container %d: %v, want %v", i, r.DeviceIDs, want[i])
		}
	}
}

var allocationIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestAllocate(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "A", 16*gib, 3),
		simGPU(uuidB, "B", 40*gib, 7),
	)
	cfg.DevicePlugin.SplitCount = 4
	cfg.DevicePlugin.MemoryScaling = 1.5
	cfg.DevicePlugin.CoresScaling = 0.9
	h := start(t, cfg)

	resp, err := h.reg.Client.Allocate(h.ctx(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{uuidA + "::0", uuidB + "::2", uuidA + "::3"}},
			{DevicesIds: ids(uuidB, 0, 2)},
			{DevicesIds: ids(uuidA, 0, 4)}, // a whole GPU
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	key, err := allockey.Load(cfg.Paths.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	// Contract 1 by hand, split 4, memory_scaling 1.5, cores_scaling 0.9.
	// A: 16 GiB × 1.5 = 24 GiB; a slice is 24 GiB / 4 = 6 GiB = 6442450944 bytes.
	// B: 40 GiB × 1.5 = 60 GiB; a slice is 60 GiB / 4 = 15 GiB = 16106127360 bytes.
	// Cores: floor(100 × 0.9 / 4) = floor(22.5) = 22 % a slice, on either GPU.
	want := [][]allocation.GPU{
		{ // sorted by UUID: B's sorts first
			{UUID: uuidB, Minor: 7, Slices: 1, Memory: 16106127360, Cores: 22}, // 1 × 15 GiB, 1 × 22 %
			{UUID: uuidA, Minor: 3, Slices: 2, Memory: 12884901888, Cores: 44}, // 2 × 6 GiB = 12 GiB, 2 × 22 %
		},
		{
			{UUID: uuidB, Minor: 7, Slices: 2, Memory: 32212254720, Cores: 44}, // 2 × 15 GiB = 30 GiB, 2 × 22 %
		},
		{
			// The whole GPU: all of the scaled memory (24 GiB) and exactly
			// 100 %, not 4 × 22 = 88 %.
			{UUID: uuidA, Minor: 3, Slices: 4, Memory: 25769803776, Cores: 100},
		},
	}
	if len(resp.ContainerResponses) != len(want) {
		t.Fatalf("%d container responses, want %d", len(resp.ContainerResponses), len(want))
	}
	seenIDs := map[string]bool{}
	for i, r := range resp.ContainerResponses {
		if len(r.Envs) != 0 || len(r.Devices) != 0 || len(r.CdiDevices) != 0 {
			t.Errorf("container %d: response carries more than the annotation and the gate: %v", i, r)
		}
		// The gate (Contract 2): a read-only mount inside /proc, which
		// runc refuses unless nri-vgpu removed it.
		if len(r.Mounts) != 1 || r.Mounts[0].ContainerPath != "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin" ||
			r.Mounts[0].HostPath != "/dev/null" || !r.Mounts[0].ReadOnly {
			t.Errorf("container %d: mounts %v, want only the read-only gate mount", i, r.Mounts)
		}
		if len(r.Annotations) != 1 {
			t.Fatalf("container %d: annotations %v, want exactly %s", i, r.Annotations, allocation.AnnotationKey)
		}
		a, err := allocation.Verify(key, r.Annotations[allocation.AnnotationKey])
		if err != nil {
			t.Fatalf("container %d: Verify: %v", i, err)
		}
		if a.V != allocation.Version || a.Issued != fixedNow.Unix() || !allocationIDPattern.MatchString(a.ID) {
			t.Errorf("container %d: v=%d issued=%d id=%q", i, a.V, a.Issued, a.ID)
		}
		if seenIDs[a.ID] {
			t.Errorf("container %d: allocation ID %s reused", i, a.ID)
		}
		seenIDs[a.ID] = true
		if !slices.Equal(a.GPUs, want[i]) {
			t.Errorf("container %d: GPUs %+v, want %+v", i, a.GPUs, want[i])
		}
	}
}

func TestAllocateErrors(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "A", 16*gib, 0),
		simGPU(uuidB, "B", 16*gib, 1),
	)
	cfg.DevicePlugin.SplitCount = 2
	h := start(t, cfg)
	if err := h.sim.SetHealthy(uuidB, false, "XID 79"); err != nil {
		t.Fatal(err)
	}
	// Wait until the plugin has seen it.
	if _, err := h.reg.WaitList(h.ctx(), func(l []*pluginapi.Device) bool { return l[len(l)-1].Health == pluginapi.Unhealthy }); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		ids  []string
		code codes.Code
		msg  []string
	}{
		{"unknown GPU", []string{"GPU-ffffffff::0"}, codes.InvalidArgument,
			[]string{`"GPU-ffffffff::0"`, "which this node does not have"}},
		{"malformed ID", []string{"no-separator"}, codes.InvalidArgument,
			[]string{"malformed", `"no-separator"`}},
		{"slice out of range", []string{uuidA + "::2"}, codes.InvalidArgument,
			[]string{uuidA + "::2", "slices 0..1"}},
		{"duplicate", []string{uuidA + "::0", uuidA + "::0"}, codes.InvalidArgument,
			[]string{"requested twice"}},
		{"unhealthy GPU", []string{uuidA + "::0", uuidB + "::1"}, codes.FailedPrecondition,
			[]string{uuidB, "unhealthy", "XID 79"}},
		{"over-asking", []string{uuidA + "::0", uuidA + "::1", uuidB + "::0"}, codes.ResourceExhausted,
			[]string{"asks for 3 slices", "only 2 healthy", "1 of 2 GPUs healthy"}},
		{"nothing", nil, codes.InvalidArgument, []string{"names no devices"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.reg.Client.Allocate(h.ctx(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tt.ids}},
			})
			if status.Code(err) != tt.code {
				t.Fatalf("Allocate(%v) = %v, want code %v", tt.ids, err, tt.code)
			}
			for _, m := range tt.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
		})
	}
}

// TestOverAskingSmallNode is a container asking 2 slices of a node with one
// healthy GPU split once.
func TestOverAskingSmallNode(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "Tesla T4", 16*gib, 0))
	cfg.DevicePlugin.SplitCount = 1
	h := start(t, cfg)
	_, err := h.reg.Client.GetPreferredAllocation(h.ctx(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids(uuidA, 0, 1), AllocationSize: 2}},
	})
	want := "nvidia.com/gpu: the container asks for 2 slices, but this node has only 1 healthy (1 of 1 GPUs healthy: GPU 0 (Tesla T4, 1 slice))"
	if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != want {
		t.Errorf("GetPreferredAllocation error = %v, want ResourceExhausted %q", err, want)
	}
}

func TestKubeletRestart(t *testing.T) {
	for _, removeOurs := range []bool{true, false} {
		t.Run(fmt.Sprintf("plugin socket removed=%v", removeOurs), func(t *testing.T) {
			cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
			cfg.DevicePlugin.SplitCount = 2
			h := start(t, cfg)
			h.nextList(h.reg)

			// A kubelet restart: it exits (kubelet.sock goes), clears the
			// directory and comes back with a new kubelet.sock.
			h.kubelet.Stop()
			if removeOurs {
				if err := os.Remove(h.plugin.SocketPath()); err != nil {
					t.Fatal(err)
				}
			}
			k2, err := kubelettest.Start(h.dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(k2.Stop)
			r := h.waitRegistration(k2)
			if got := deviceIDs(h.nextList(r)); !slices.Equal(got, ids(uuidA, 0, 2)) {
				t.Errorf("after re-registration: devices %v", got)
			}
			if _, err := os.Stat(h.plugin.SocketPath()); err != nil {
				t.Errorf("plugin socket after restart: %v", err)
			}
		})
	}
}

// TestKubeletRestartPolling is TestKubeletRestart without inotify: the
// once-a-second check of the sockets notices the new kubelet.
func TestKubeletRestartPolling(t *testing.T) {
	newDirWatcher = func(string) (*dirWatcher, error) { return nil, errors.New("inotify disabled by the test") }
	t.Cleanup(func() { newDirWatcher = watchDir })
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	h := start(t, cfg)
	h.kubelet.Stop()
	k2, err := kubelettest.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Stop)
	h.nextList(h.waitRegistration(k2))
	if err := os.Remove(h.plugin.SocketPath()); err != nil {
		t.Fatal(err)
	}
	h.nextList(h.waitRegistration(k2))
}

func TestWatchDir(t *testing.T) {
	dir := shortDir(t)
	w, err := watchDir(dir)
	if err != nil {
		t.Skipf("no inotify here: %v", err)
	}
	defer w.Close()
	path := filepath.Join(dir, KubeletSocketName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	want := []dirEvent{{KubeletSocketName, true}, {KubeletSocketName, false}}
	for _, ev := range want {
		select {
		case got := <-w.Events():
			if got != ev {
				t.Errorf("event %+v, want %+v", got, ev)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("no event %+v", ev)
		}
	}
	// The directory going away ends the watch; the plugin then polls.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-w.Events():
		if ok {
			t.Error("an event after the directory was removed, want the channel closed")
		}
	case <-time.After(waitTimeout):
		t.Fatal("the watch did not end when the directory was removed")
	}
}

// TestPluginSocketRemoved: with the kubelet still there, a deleted plugin
// socket is served again and registered again.
func TestPluginSocketRemoved(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	h := start(t, cfg)
	if err := os.Remove(h.plugin.SocketPath()); err != nil {
		t.Fatal(err)
	}
	r := h.waitRegistration(h.kubelet)
	if len(h.nextList(r)) != cfg.DevicePlugin.SplitCount {
		t.Error("wrong device count after re-registration")
	}
	// The old stream ended with the old server.
	select {
	case <-h.reg.Ended():
	case <-time.After(waitTimeout):
		t.Error("the old ListAndWatch stream did not end")
	}
}

func TestHealthChange(t *testing.T) {
	cfg := testConfig(shortDir(t),
		simGPU(uuidA, "A", 8*gib, 0),
		simGPU(uuidB, "B", 8*gib, 1),
	)
	cfg.DevicePlugin.SplitCount = 2
	h := start(t, cfg)
	h.nextList(h.reg)

	health := func(l []*pluginapi.Device) map[string]string {
		m := map[string]string{}
		for _, d := range l {
			m[d.ID] = d.Health
		}
		return m
	}
	if err := h.sim.SetHealthy(uuidA, false, "XID 79"); err != nil {
		t.Fatal(err)
	}
	got := health(h.nextList(h.reg))
	want := map[string]string{
		uuidA + "::0": pluginapi.Unhealthy, uuidA + "::1": pluginapi.Unhealthy,
		uuidB + "::0": pluginapi.Healthy, uuidB + "::1": pluginapi.Healthy,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after XID: %v, want %v", got, want)
	}

	if err := h.sim.SetHealthy(uuidA, true, ""); err != nil {
		t.Fatal(err)
	}
	for id, hl := range health(h.nextList(h.reg)) {
		if hl != pluginapi.Healthy {
			t.Errorf("after recovery: %s is %s", id, hl)
		}
	}

	// A configuration reload that adds a GPU.
	h.sim.Update(append(cfg.GPU.Simulated, simGPU(uuidC, "C", 8*gib, 2)))
	l, err := h.reg.WaitList(h.ctx(), func(l []*pluginapi.Device) bool { return len(l) == 6 })
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceIDs(l)[4:]; !slices.Equal(got, ids(uuidC, 0, 2)) {
		t.Errorf("added GPU's devices = %v", got)
	}
}

func eightBy64(dir string) *config.Config {
	var gpus []config.SimulatedGPU
	for i := range 8 {
		gpus = append(gpus, simGPU(fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), "NVIDIA H100", 80*gib, i))
	}
	cfg := testConfig(dir, gpus...)
	cfg.DevicePlugin.SplitCount = 64
	return cfg
}

func TestEightGPUsBy64(t *testing.T) {
	cfg := eightBy64(shortDir(t))
	h := start(t, cfg)
	devs := h.nextList(h.reg)
	if len(devs) != 512 {
		t.Fatalf("%d devices, want 512", len(devs))
	}
	// GPU 5 is the fullest with 10 slices left: binpack puts 10 there, and
	// 64 on one whole GPU (the lowest index), never splitting a container.
	var avail []string
	for _, d := range devs {
		uuid, slice, err := limits.ParseDeviceID(d.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(uuid, "GPU-00000005") || slice >= 54 {
			avail = append(avail, d.ID)
		}
	}
	resp, err := h.reg.Client.GetPreferredAllocation(h.ctx(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: avail, AllocationSize: 10},
			{AvailableDeviceIDs: avail, AllocationSize: 64},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	gpusOf := func(ids []string) map[string]int {
		m := map[string]int{}
		for _, id := range ids {
			m[id[:12]]++
		}
		return m
	}
	if got := gpusOf(resp.ContainerResponses[0].DeviceIDs); fmt.Sprint(got) != "map[GPU-00000005:10]" {
		t.Errorf("10 slices went to %v", got)
	}
	if got := gpusOf(resp.ContainerResponses[1].DeviceIDs); fmt.Sprint(got) != "map[GPU-00000000:64]" {
		t.Errorf("64 slices went to %v", got)
	}
}

func TestShutdown(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	h := start(t, cfg)
	h.nextList(h.reg)
	h.cancel()
	select {
	case err := <-h.runErr:
		if err != nil {
			t.Fatalf("Run returned %v, want nil", err)
		}
		h.runErr <- nil // for the cleanup
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(h.plugin.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after shutdown: %v, want it gone", err)
	}
	select {
	case <-h.reg.Ended():
	case <-time.After(waitTimeout):
		t.Error("ListAndWatch did not end on shutdown")
	}
}

// TestStaleSocket: a socket left by a killed plugin is replaced.
func TestStaleSocket(t *testing.T) {
	dir := shortDir(t)
	cfg := testConfig(dir, simGPU(uuidA, "A", 8*gib, 0))
	if err := os.WriteFile(filepath.Join(dir, SocketName(cfg.DevicePlugin.ResourceName)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)
}

func TestNewErrors(t *testing.T) {
	dir := shortDir(t)
	sim, err := gpu.NewSimulated(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(dir)
	cfg.DevicePlugin.AllocationPolicy = "random"
	if _, err := New(Options{Config: cfg, Backend: sim}); err == nil || !strings.Contains(err.Error(), `"random"`) {
		t.Errorf("New with a bad policy: %v", err)
	}
	if _, err := New(Options{Config: cfg}); err == nil {
		t.Error("New without a backend succeeded")
	}
	_ = sim.Close()
	cfg = testConfig(dir)
	if _, err := New(Options{Config: cfg, Backend: sim}); !errors.Is(err, gpu.ErrClosed) {
		t.Errorf("New on a closed backend: %v, want ErrClosed", err)
	}
}

func BenchmarkGetPreferredAllocation(b *testing.B) {
	cfg := eightBy64(shortDir(b))
	for _, policy := range []string{config.PolicyBinpack, config.PolicySpread} {
		cfg.DevicePlugin.AllocationPolicy = policy
		p, _ := newPlugin(b, cfg)
		inv, _ := p.snapshot()
		// Every GPU partly used, so no single GPU can take 64.
		var avail []string
		for i, d := range inv.devices {
			if i%64 >= 8*(i/64)+1 {
				avail = append(avail, d.ID)
			}
		}
		req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: avail, AllocationSize: 64},
		}}
		b.Run(policy, func(b *testing.B) {
			for b.Loop() {
				if _, err := p.GetPreferredAllocation(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// pausingBackend is a simulated backend whose next Devices call, once armed,
// reads the GPUs and then waits, so that a test can interleave two readers.
type pausingBackend struct {
	*gpu.Simulated
	mu   sync.Mutex
	read chan struct{} // closed when the armed call has read the GPUs
	hold chan struct{} // the armed call returns when this is closed
}

func (b *pausingBackend) arm() (read, hold chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.read, b.hold = make(chan struct{}), make(chan struct{})
	return b.read, b.hold
}

func (b *pausingBackend) Devices() ([]gpu.Device, error) {
	devs, err := b.Simulated.Devices()
	b.mu.Lock()
	read, hold := b.read, b.hold
	b.read, b.hold = nil, nil
	b.mu.Unlock()
	if read != nil {
		close(read)
		<-hold
	}
	return devs, err
}

// TestRefreshRacingHealthEvent: a reload that read the GPUs before a health
// event must not install its older list after the event's newer one.
func TestRefreshRacingHealthEvent(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	b := &pausingBackend{Simulated: sim}
	p, err := New(Options{Config: cfg, Backend: b, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	read, hold := b.arm()
	refreshed := make(chan error, 1)
	go func() { refreshed <- p.Refresh() }() // reads A healthy, then waits
	<-read

	ev := gpu.HealthEvent{UUID: uuidA, Healthy: false, Reason: "XID 79"}
	if err := sim.SetHealthy(uuidA, false, ev.Reason); err != nil {
		t.Fatal(err)
	}
	applied := make(chan struct{})
	go func() { p.applyHealth(ev); close(applied) }()
	// Give the event every chance to be applied before the reload
	// finishes; a correct plugin makes it wait for the reload instead.
	select {
	case <-applied:
	case <-time.After(200 * time.Millisecond):
	}
	close(hold)
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	<-applied

	inv, _ := p.snapshot()
	for _, d := range inv.devices {
		if d.Health != pluginapi.Unhealthy {
			t.Errorf("%s is %s after an XID on its GPU, want %s (a stale list won)", d.ID, d.Health, pluginapi.Unhealthy)
		}
	}
}

// TestWatchesSocketDirCreatedByPlugin: when the plugin starts before kubelet
// has created socket_dir, it creates it and still watches it rather than
// falling back to polling.
func TestWatchesSocketDirCreatedByPlugin(t *testing.T) {
	watchErr := make(chan error, 1)
	newDirWatcher = func(dir string) (*dirWatcher, error) {
		w, err := watchDir(dir)
		watchErr <- err
		return w, err
	}
	t.Cleanup(func() { newDirWatcher = watchDir })
	if w, err := watchDir(shortDir(t)); err != nil {
		t.Skipf("no inotify here: %v", err)
	} else {
		w.Close()
	}

	root := shortDir(t)
	cfg := testConfig(filepath.Join(root, "device-plugins"), simGPU(uuidA, "A", 8*gib, 0))
	cfg.Paths.StateDir = filepath.Join(root, "state") // not inside socket_dir
	p, _ := newPlugin(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case err := <-watchErr:
		if err != nil {
			t.Errorf("socket_dir is not watched: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the plugin never tried to watch socket_dir")
	}
}

// signalHandler closes seen the first time a record with message msg is
// logged.
type signalHandler struct {
	slog.Handler
	msg  string
	once *sync.Once
	seen chan struct{}
}

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return h.Handler.Handle(ctx, r)
}

// TestSecondInstanceWaitsForTheFirst: a plugin whose socket path is served
// by a live process must not unlink it (the two would take the socket from
// each other forever); it waits, and takes over once the other is gone.
func TestSecondInstanceWaitsForTheFirst(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	k, err := kubelettest.Start(cfg.DevicePlugin.SocketDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)

	// The first instance: a live listener on the plugin's socket path.
	path := filepath.Join(cfg.DevicePlugin.SocketDir, SocketName(cfg.DevicePlugin.ResourceName))
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	before, err := statID(path)
	if err != nil {
		t.Fatal(err)
	}

	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	seen := make(chan struct{})
	logger := slog.New(signalHandler{Handler: testLogger(t).Handler(),
		msg: "another instance serves this resource; waiting for it to stop", once: &sync.Once{}, seen: seen})
	p, err := New(Options{Config: cfg, Backend: sim, Logger: logger, Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	select {
	case <-seen:
	case <-time.After(waitTimeout):
		t.Fatal("the plugin did not report that another instance holds the socket")
	}
	if now, err := statID(path); err != nil || now != before {
		t.Fatalf("the live socket was replaced while its owner was serving (%v)", err)
	}

	// The first instance stops and removes its socket: the plugin takes over.
	other.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer wcancel()
	r, err := k.WaitRegistration(wctx)
	if err != nil {
		t.Fatalf("no registration after the other instance stopped: %v", err)
	}
	t.Cleanup(r.Close)
	if r.Request.Endpoint != SocketName(cfg.DevicePlugin.ResourceName) {
		t.Errorf("registered endpoint %q", r.Request.Endpoint)
	}
}

// TestCreationEventOfTheRegisteredKubelet: the once-a-second poll and the
// directory event can both report one kubelet's start. The event must not
// make the plugin register a second time: kubelet would replace the first
// connection and cancel any call it has in flight on it.
func TestCreationEventOfTheRegisteredKubelet(t *testing.T) {
	events := make(chan dirEvent) // unbuffered: a send returns once the plugin took it
	newDirWatcher = func(string) (*dirWatcher, error) {
		return &dirWatcher{events: events, done: make(chan struct{})}, nil
	}
	t.Cleanup(func() { newDirWatcher = watchDir })

	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	h := start(t, cfg)
	h.nextList(h.reg)

	// The event for the kubelet.sock already registered with, then a second
	// event: once the plugin has taken the second, it has finished handling
	// the first, registration included.
	send := func(ev dirEvent) {
		select {
		case events <- ev:
		case <-time.After(waitTimeout):
			t.Fatal("the plugin does not read its directory events")
		}
	}
	send(dirEvent{name: KubeletSocketName, created: true})
	send(dirEvent{name: "unrelated", created: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := h.kubelet.WaitRegistration(ctx); err == nil {
		r.Close()
		t.Fatal("the plugin registered again for the kubelet it was registered with")
	}

	// A kubelet that really restarted is still registered with at once.
	h.kubelet.Stop()
	k2, err := kubelettest.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Stop)
	send(dirEvent{name: KubeletSocketName, created: true})
	h.nextList(h.waitRegistration(k2))
}
