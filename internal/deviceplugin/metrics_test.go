package deviceplugin

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// registry is a pedantic registry (it checks each series against its
// description) holding the plugin's collector alone.
func registry(t *testing.T, p *Plugin) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(p.Collector()); err != nil {
		t.Fatal(err)
	}
	return reg
}

// waitReady waits until the plugin reports itself registered: the fake
// kubelet sees the registration before the plugin has its answer.
func (h *harness) waitReady() {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for h.plugin.Ready() != nil {
		if time.Now().After(deadline) {
			h.t.Fatalf("plugin not ready: %v", h.plugin.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func compare(t *testing.T, reg *prometheus.Registry, want string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

const refusalsHelp = `# HELP nri_vgpu_device_plugin_allocation_refusals_total Allocate and GetPreferredAllocation calls the device plugin refused, by reason (a fixed set, see docs/metrics.md).
# TYPE nri_vgpu_device_plugin_allocation_refusals_total counter
`

// A plugin registered with the fake kubelet answers one allocation and
// refuses forged ones (a GPU the node does not have, a malformed ID, a
// slice past the GPU's split, an empty request) and an over-asking
// preferred allocation: each refusal counts under its reason, the others
// stay at 0 and the answered allocation counts once.
func TestMetricsAllocations(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "NVIDIA A100", 16*gib, 0), simGPU(uuidB, "NVIDIA A100", 16*gib, 1))
	cfg.DevicePlugin.SplitCount = 2
	h := start(t, cfg)
	h.waitReady()
	reg := registry(t, h.plugin)

	compare(t, reg, `
# HELP nri_vgpu_device_plugin_allocations_total Allocate calls the device plugin answered with an allocation.
# TYPE nri_vgpu_device_plugin_allocations_total counter
nri_vgpu_device_plugin_allocations_total{resource="nvidia.com/gpu"} 0
`+refusalsHelp+`nri_vgpu_device_plugin_allocation_refusals_total{reason="duplicate_device",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="exhausted",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="internal",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="malformed_device",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="no_devices",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="unhealthy_gpu",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="unknown_gpu",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="unknown_slice",resource="nvidia.com/gpu"} 0
# HELP nri_vgpu_device_plugin_registered 1 while the device plugin is registered with the kubelet that listens on kubelet.sock now and serves its socket, else 0.
# TYPE nri_vgpu_device_plugin_registered gauge
nri_vgpu_device_plugin_registered{resource="nvidia.com/gpu"} 1
# HELP nri_vgpu_device_plugin_registrations_total Successful registrations with the kubelet, including those after a kubelet restart.
# TYPE nri_vgpu_device_plugin_registrations_total counter
nri_vgpu_device_plugin_registrations_total{resource="nvidia.com/gpu"} 1
`, "nri_vgpu_device_plugin_allocations_total", "nri_vgpu_device_plugin_allocation_refusals_total",
		"nri_vgpu_device_plugin_registered", "nri_vgpu_device_plugin_registrations_total")

	allocate := func(ids ...string) error {
		_, err := h.reg.Client.Allocate(h.ctx(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
		})
		return err
	}
	if err := allocate(uuidA + "::0"); err != nil {
		t.Fatal(err)
	}
	for _, forged := range [][]string{
		{"GPU-ffffffff-ffff-ffff-ffff-ffffffffffff::0"},
		{uuidA + "::0", "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff::1"},
		{"no-separator"},
		{uuidA + "::2"},
		{uuidB + "::1", uuidB + "::1"},
		nil,
	} {
		if err := allocate(forged...); err == nil {
			t.Errorf("Allocate(%q) succeeded", forged)
		}
	}
	if _, err := h.reg.Client.GetPreferredAllocation(h.ctx(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids(uuidA, 0, 2), AllocationSize: 5}},
	}); err == nil {
		t.Error("GetPreferredAllocation of 5 slices of 4 succeeded")
	}

	compare(t, reg, `
# HELP nri_vgpu_device_plugin_allocations_total Allocate calls the device plugin answered with an allocation.
# TYPE nri_vgpu_device_plugin_allocations_total counter
nri_vgpu_device_plugin_allocations_total{resource="nvidia.com/gpu"} 1
`+refusalsHelp+`nri_vgpu_device_plugin_allocation_refusals_total{reason="duplicate_device",resource="nvidia.com/gpu"} 1
nri_vgpu_device_plugin_allocation_refusals_total{reason="exhausted",resource="nvidia.com/gpu"} 1
nri_vgpu_device_plugin_allocation_refusals_total{reason="internal",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="malformed_device",resource="nvidia.com/gpu"} 1
nri_vgpu_device_plugin_allocation_refusals_total{reason="no_devices",resource="nvidia.com/gpu"} 1
nri_vgpu_device_plugin_allocation_refusals_total{reason="unhealthy_gpu",resource="nvidia.com/gpu"} 0
nri_vgpu_device_plugin_allocation_refusals_total{reason="unknown_gpu",resource="nvidia.com/gpu"} 2
nri_vgpu_device_plugin_allocation_refusals_total{reason="unknown_slice",resource="nvidia.com/gpu"} 1
`, "nri_vgpu_device_plugin_allocations_total", "nri_vgpu_device_plugin_allocation_refusals_total")
}

// A GPU failing and recovering, as the backend reports it: its gauge, the
// slices advertised per health and its transitions follow; an allocation
// on it meanwhile is refused as unhealthy_gpu, and a repeated event of a
// failed GPU is no transition.
func TestMetricsHealthChange(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "NVIDIA A100", 16*gib, 0), simGPU(uuidB, "NVIDIA T4", 16*gib, 1))
	cfg.DevicePlugin.SplitCount = 2
	h := start(t, cfg)
	reg := registry(t, h.plugin)
	h.nextList(h.reg)

	const names = `# HELP nri_vgpu_device_plugin_devices Slices the device plugin advertises to the kubelet, by health.
# TYPE nri_vgpu_device_plugin_devices gauge
`
	const healthyHelp = `# HELP nri_vgpu_device_plugin_gpu_healthy 1 while the GPU's slices are advertised healthy, 0 while unhealthy; GPUs served through DRA are left out.
# TYPE nri_vgpu_device_plugin_gpu_healthy gauge
`
	const changesHelp = `# HELP nri_vgpu_device_plugin_health_changes_total Health transitions of the GPU (healthy to unhealthy or back) the device plugin received from the GPU backend.
# TYPE nri_vgpu_device_plugin_health_changes_total counter
`
	series := []string{"nri_vgpu_device_plugin_devices", "nri_vgpu_device_plugin_gpu_healthy", "nri_vgpu_device_plugin_health_changes_total"}
	compare(t, reg, names+`nri_vgpu_device_plugin_devices{health="healthy",resource="nvidia.com/gpu"} 4
nri_vgpu_device_plugin_devices{health="unhealthy",resource="nvidia.com/gpu"} 0
`+healthyHelp+`nri_vgpu_device_plugin_gpu_healthy{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100"} 1
nri_vgpu_device_plugin_gpu_healthy{UUID="`+uuidB+`",gpu="1",name="NVIDIA T4"} 1
`+changesHelp+`nri_vgpu_device_plugin_health_changes_total{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100"} 0
nri_vgpu_device_plugin_health_changes_total{UUID="`+uuidB+`",gpu="1",name="NVIDIA T4"} 0
`, series...)

	if err := h.sim.SetHealthy(uuidB, false, "XID 79"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reg.WaitList(h.ctx(), func(l []*pluginapi.Device) bool { return l[3].Health == pluginapi.Unhealthy }); err != nil {
		t.Fatal(err)
	}
	// The backend reporting the failed GPU again.
	h.plugin.applyHealth(gpu.HealthEvent{UUID: uuidB, Healthy: false, Reason: "XID 79 again"})
	if _, err := h.reg.Client.Allocate(h.ctx(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{uuidB + "::0"}}},
	}); err == nil {
		t.Error("Allocate on the unhealthy GPU succeeded")
	}
	compare(t, reg, names+`nri_vgpu_device_plugin_devices{health="healthy",resource="nvidia.com/gpu"} 2
nri_vgpu_device_plugin_devices{health="unhealthy",resource="nvidia.com/gpu"} 2
`+healthyHelp+`nri_vgpu_device_plugin_gpu_healthy{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100"} 1
nri_vgpu_device_plugin_gpu_healthy{UUID="`+uuidB+`",gpu="1",name="NVIDIA T4"} 0
`+changesHelp+`nri_vgpu_device_plugin_health_changes_total{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100"} 0
nri_vgpu_device_plugin_health_changes_total{UUID="`+uuidB+`",gpu="1",name="NVIDIA T4"} 1
`, series...)
	if got := testutil.ToFloat64(h.plugin.metrics.refusals.WithLabelValues("nvidia.com/gpu", ReasonUnhealthyGPU)); got != 1 {
		t.Errorf("unhealthy_gpu refusals = %v, want 1", got)
	}

	if err := h.sim.SetHealthy(uuidB, true, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reg.WaitList(h.ctx(), func(l []*pluginapi.Device) bool { return l[3].Health == pluginapi.Healthy }); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.plugin.metrics.healthChanges.WithLabelValues(uuidB, "1", "NVIDIA T4")); got != 2 {
		t.Errorf("health changes of GPU 1 after its recovery = %v, want 2", got)
	}
}

// A kubelet restart: registered drops to 0 while kubelet.sock is gone and
// the re-registration counts.
func TestMetricsReregistration(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	h := start(t, cfg)
	h.waitReady()
	reg := registry(t, h.plugin)
	registered := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "nri_vgpu_device_plugin_registered" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no nri_vgpu_device_plugin_registered")
		return 0
	}
	if got := registered(); got != 1 {
		t.Fatalf("registered = %v before the restart, want 1", got)
	}

	h.kubelet.Stop()
	deadline := time.Now().Add(waitTimeout)
	for registered() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("registered stays 1 with kubelet.sock gone")
		}
		time.Sleep(10 * time.Millisecond)
	}
	k2, err := kubelettest.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Stop)
	h.waitRegistration(k2)
	h.waitReady()
	compare(t, reg, `
# HELP nri_vgpu_device_plugin_registered 1 while the device plugin is registered with the kubelet that listens on kubelet.sock now and serves its socket, else 0.
# TYPE nri_vgpu_device_plugin_registered gauge
nri_vgpu_device_plugin_registered{resource="nvidia.com/gpu"} 1
# HELP nri_vgpu_device_plugin_registrations_total Successful registrations with the kubelet, including those after a kubelet restart.
# TYPE nri_vgpu_device_plugin_registrations_total counter
nri_vgpu_device_plugin_registrations_total{resource="nvidia.com/gpu"} 2
`, "nri_vgpu_device_plugin_registered", "nri_vgpu_device_plugin_registrations_total")
}
