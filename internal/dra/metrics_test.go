package dra

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

func draRegistry(t *testing.T, d *Driver) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(d.Collector()); err != nil {
		t.Fatal(err)
	}
	return reg
}

func compareMetrics(t *testing.T, reg *prometheus.Registry, want string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

// One claim prepared, then claims a tenant's forged or stale allocation
// would bring: each refusal counts once under its reason, the prepared and
// unprepared claims count, and every other reason is there at 0.
func TestMetricsPrepare(t *testing.T) {
	d, _ := newDriver(t)
	reg := draRegistry(t, d)
	const head = `
# HELP nri_vgpu_dra_prepare_refusals_total Claims the DRA driver refused to prepare, by reason (a fixed set, see docs/metrics.md).
# TYPE nri_vgpu_dra_prepare_refusals_total counter
`
	compareMetrics(t, reg, head+`nri_vgpu_dra_prepare_refusals_total{reason="admin_access"} 0
nri_vgpu_dra_prepare_refusals_total{reason="allocation_changed"} 0
nri_vgpu_dra_prepare_refusals_total{reason="foreign_pool"} 0
nri_vgpu_dra_prepare_refusals_total{reason="host_state"} 0
nri_vgpu_dra_prepare_refusals_total{reason="internal"} 0
nri_vgpu_dra_prepare_refusals_total{reason="invalid_capacity"} 0
nri_vgpu_dra_prepare_refusals_total{reason="invalid_uid"} 0
nri_vgpu_dra_prepare_refusals_total{reason="inventory"} 0
nri_vgpu_dra_prepare_refusals_total{reason="no_device"} 0
nri_vgpu_dra_prepare_refusals_total{reason="not_allocated"} 0
nri_vgpu_dra_prepare_refusals_total{reason="over_capacity"} 0
nri_vgpu_dra_prepare_refusals_total{reason="state_conflict"} 0
nri_vgpu_dra_prepare_refusals_total{reason="too_many_gpus"} 0
nri_vgpu_dra_prepare_refusals_total{reason="unaccounted_claim"} 0
nri_vgpu_dra_prepare_refusals_total{reason="unknown_device"} 0
# HELP nri_vgpu_dra_prepares_total Claims the DRA driver prepared (a claim prepared again, for another pod or after a kubelet restart, counts again).
# TYPE nri_vgpu_dra_prepares_total counter
nri_vgpu_dra_prepares_total 0
# HELP nri_vgpu_dra_registered 1 while the kubelet has registered the DRA driver, else 0.
# TYPE nri_vgpu_dra_registered gauge
nri_vgpu_dra_registered 0
# HELP nri_vgpu_dra_unprepares_total Claims the DRA driver unprepared (a claim it never prepared counts too: nothing is left of it).
# TYPE nri_vgpu_dra_unprepares_total counter
nri_vgpu_dra_unprepares_total 0
`, "nri_vgpu_dra_prepare_refusals_total", "nri_vgpu_dra_prepares_total", "nri_vgpu_dra_unprepares_total", "nri_vgpu_dra_registered")

	if r := prepareOne(t, d, claim(uid1, []string{"p"}, result("gpu", devA, "30Gi", "30"))); r.Err != nil {
		t.Fatal(r.Err)
	}
	foreign := result("gpu", devA, "1Gi", "10")
	foreign.Pool = "node-2"
	admin := result("gpu", devA, "", "")
	admin.AdminAccess = ptr.To(true)
	for _, c := range []*resourceapi.ResourceClaim{
		claim(uid2, []string{"p"}, foreign),
		claim(uid2, []string{"p"}, admin),
		claim(uid2, []string{"p"}, result("gpu", "gpu-0000", "1Gi", "1")),
		claim(uid2, []string{"p"}, result("gpu", devA, "-1", "")),
		claim("../../etc-0000", []string{"p"}, result("gpu", devA, "1Gi", "1")),
		// 30 GiB of 40 are taken.
		claim(uid2, []string{"p"}, result("gpu", devA, "20Gi", "10")),
		// Prepared with 30 GiB: another allocation is stale or forged.
		claim(uid1, []string{"p"}, result("gpu", devA, "31Gi", "30")),
	} {
		if r := prepareOne(t, d, c); r.Err == nil {
			t.Errorf("claim %s %v prepared", c.UID, c.Status.Allocation.Devices.Results)
		}
	}
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID(uid1)}}); err != nil {
		t.Fatal(err)
	}
	compareMetrics(t, reg, head+`nri_vgpu_dra_prepare_refusals_total{reason="admin_access"} 1
nri_vgpu_dra_prepare_refusals_total{reason="allocation_changed"} 1
nri_vgpu_dra_prepare_refusals_total{reason="foreign_pool"} 1
nri_vgpu_dra_prepare_refusals_total{reason="host_state"} 0
nri_vgpu_dra_prepare_refusals_total{reason="internal"} 0
nri_vgpu_dra_prepare_refusals_total{reason="invalid_capacity"} 1
nri_vgpu_dra_prepare_refusals_total{reason="invalid_uid"} 1
nri_vgpu_dra_prepare_refusals_total{reason="inventory"} 0
nri_vgpu_dra_prepare_refusals_total{reason="no_device"} 0
nri_vgpu_dra_prepare_refusals_total{reason="not_allocated"} 0
nri_vgpu_dra_prepare_refusals_total{reason="over_capacity"} 1
nri_vgpu_dra_prepare_refusals_total{reason="state_conflict"} 0
nri_vgpu_dra_prepare_refusals_total{reason="too_many_gpus"} 0
nri_vgpu_dra_prepare_refusals_total{reason="unaccounted_claim"} 0
nri_vgpu_dra_prepare_refusals_total{reason="unknown_device"} 1
# HELP nri_vgpu_dra_prepares_total Claims the DRA driver prepared (a claim prepared again, for another pod or after a kubelet restart, counts again).
# TYPE nri_vgpu_dra_prepares_total counter
nri_vgpu_dra_prepares_total 1
# HELP nri_vgpu_dra_unprepares_total Claims the DRA driver unprepared (a claim it never prepared counts too: nothing is left of it).
# TYPE nri_vgpu_dra_unprepares_total counter
nri_vgpu_dra_unprepares_total 1
`, "nri_vgpu_dra_prepare_refusals_total", "nri_vgpu_dra_prepares_total", "nri_vgpu_dra_unprepares_total")
}

// notifyRegistered plays the kubelet's plugin watcher: it tells the
// driver's registration socket in dir that the kubelet registered it.
func notifyRegistered(t *testing.T, dir string) {
	t.Helper()
	sock := filepath.Join(dir, config.DefaultDRADriverName+"-reg.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := registerapi.NewRegistrationClient(conn)
	if _, err := client.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("GetInfo on %s: %v", sock, err)
	}
	if _, err := client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
}

// Run against a fake API server and a kubelet played by the test: the
// driver is registered once the kubelet says so, each publication counts,
// and a served GPU failing and recovering moves its gauge and counts two
// transitions; a repeated event of a failed GPU is none.
func TestMetricsRun(t *testing.T) {
	d, _ := newDriver(t)
	backend := &eventBackend{devs: []gpu.Device{gpuA, gpuB}, watching: make(chan chan<- gpu.HealthEvent, 1)}
	d.inv = backend
	reg := draRegistry(t, d)
	const nodeUID = types.UID("0a1b2c3d-0000-4000-8000-000000000001")
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: nodeUID}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	dir := t.TempDir()
	go func() {
		done <- d.Run(ctx, RunOptions{Client: client, Backend: backend, NodeUID: nodeUID,
			PluginDir: filepath.Join(dir, "plugin"), RegistryDir: dir, Republish: time.Hour})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var events chan<- gpu.HealthEvent
	select {
	case events = <-backend.watching:
	case <-time.After(time.Minute):
		t.Fatal("Run does not watch GPU health")
	}
	// waitFor polls the collector until value() is want.
	waitFor := func(what string, value func() float64, want float64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			got := value()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s = %v, want %v", what, got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	publications := func() float64 { return testutil.ToFloat64(d.metrics.publications) }
	waitFor("publications", publications, 1)
	if d.Ready() == nil {
		t.Error("ready before the kubelet registered the driver")
	}
	notifyRegistered(t, dir)
	waitFor("ready", func() float64 {
		if d.Ready() == nil {
			return 1
		}
		return 0
	}, 1)

	backend.setHealthy(uuidB, false)
	events <- gpu.HealthEvent{UUID: uuidB, Healthy: false, Reason: "XID 79"}
	events <- gpu.HealthEvent{UUID: uuidB, Healthy: false, Reason: "XID 79 again"}
	waitFor("publications", publications, 3)
	compareMetrics(t, reg, `
# HELP nri_vgpu_dra_gpu_healthy 1 while the GPU served through DRA is healthy, 0 while unhealthy (published in the ResourceSlice with the taint nri-vgpu.io/unhealthy).
# TYPE nri_vgpu_dra_gpu_healthy gauge
nri_vgpu_dra_gpu_healthy{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100-SXM4-40GB"} 1
nri_vgpu_dra_gpu_healthy{UUID="`+uuidB+`",gpu="1",name="Tesla T4"} 0
# HELP nri_vgpu_dra_health_changes_total Health transitions of the GPU served through DRA (healthy to unhealthy or back) the DRA driver received from the GPU backend.
# TYPE nri_vgpu_dra_health_changes_total counter
nri_vgpu_dra_health_changes_total{UUID="`+uuidA+`",gpu="0",name="NVIDIA A100-SXM4-40GB"} 0
nri_vgpu_dra_health_changes_total{UUID="`+uuidB+`",gpu="1",name="Tesla T4"} 1
# HELP nri_vgpu_dra_registered 1 while the kubelet has registered the DRA driver, else 0.
# TYPE nri_vgpu_dra_registered gauge
nri_vgpu_dra_registered 1
# HELP nri_vgpu_dra_resourceslice_publications_total ResourceSlice contents the DRA driver handed to its slice controller, which writes them to the API server when they differ from what it holds.
# TYPE nri_vgpu_dra_resourceslice_publications_total counter
nri_vgpu_dra_resourceslice_publications_total 3
`, "nri_vgpu_dra_gpu_healthy", "nri_vgpu_dra_health_changes_total", "nri_vgpu_dra_registered", "nri_vgpu_dra_resourceslice_publications_total")

	backend.setHealthy(uuidB, true)
	events <- gpu.HealthEvent{UUID: uuidB, Healthy: true, Reason: "recovered"}
	waitFor("publications", publications, 4)
	if got := testutil.ToFloat64(d.metrics.healthChanges.WithLabelValues(uuidB, "1", "Tesla T4")); got != 2 {
		t.Errorf("health changes of GPU 1 after its recovery = %v, want 2", got)
	}
}
