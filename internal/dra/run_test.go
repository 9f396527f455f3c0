package dra

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// eventBackend is a GPU backend whose health changes the test makes: it
// changes a GPU's health in the list and then sends the event, as the NVML
// backend does.
type eventBackend struct {
	mu       sync.Mutex
	devs     []gpu.Device
	watching chan chan<- gpu.HealthEvent // receives the channel of each WatchHealth call
}

func (b *eventBackend) Name() string { return "test" }

func (b *eventBackend) Devices() ([]gpu.Device, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.devs), nil
}

func (b *eventBackend) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	select {
	case b.watching <- events:
	case <-ctx.Done():
	}
	<-ctx.Done()
	return nil
}

func (b *eventBackend) Close() error { return nil }

func (b *eventBackend) setHealthy(uuid string, healthy bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.devs {
		if b.devs[i].UUID == uuid {
			b.devs[i].Healthy = healthy
		}
	}
}

// A GPU that turns unhealthy is tainted in the published ResourceSlice at
// its health event, with the event's reason, and untainted when it
// recovers, without waiting for the periodic republish.
func TestRunRepublishesOnHealthEvents(t *testing.T) {
	d, _ := newDriver(t)
	d.cfg.DRA.UnhealthyTaintEffect = "NoExecute"
	backend := &eventBackend{devs: []gpu.Device{gpuA, gpuB}, watching: make(chan chan<- gpu.HealthEvent, 1)}
	d.inv = backend
	const nodeUID = types.UID("0a1b2c3d-0000-4000-8000-000000000001")
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: nodeUID}})
	// An API server that keeps device taints.
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.37.2"}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	dir := t.TempDir()
	go func() {
		done <- d.Run(ctx, RunOptions{
			Client: client, Backend: backend, NodeUID: nodeUID,
			PluginDir: filepath.Join(dir, "plugin"), RegistryDir: dir,
			// Far longer than the test: only a health event republishes.
			Republish: time.Hour,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	// published waits until the slice lists devA and devB, each with the
	// taints want says ("key=value:effect"; none when missing).
	published := func(want map[string]string) {
		t.Helper()
		deadline := time.After(time.Minute)
		var got map[string]string
		for {
			list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got = map[string]string{}
			for _, s := range list.Items {
				for _, dev := range s.Spec.Devices {
					var taints []string
					for _, tn := range dev.Taints {
						if tn.TimeAdded == nil {
							t.Errorf("%s: taint %s without timeAdded", dev.Name, tn.Key)
						}
						taints = append(taints, tn.Key+"="+tn.Value+":"+string(tn.Effect))
					}
					got[dev.Name] = strings.Join(taints, ",")
				}
			}
			if maps.Equal(got, want) {
				return
			}
			select {
			case <-deadline:
				t.Fatalf("published devices and taints = %v, want %v", got, want)
			case err := <-done:
				t.Fatalf("Run returned %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	var events chan<- gpu.HealthEvent
	select {
	case events = <-backend.watching:
	case <-time.After(time.Minute):
		t.Fatal("Run does not watch GPU health")
	}
	published(map[string]string{devA: "", devB: ""})

	backend.setHealthy(uuidB, false)
	events <- gpu.HealthEvent{UUID: uuidB, Healthy: false, Reason: "XID 79"}
	published(map[string]string{devA: "", devB: "nri-vgpu.io/unhealthy=XID-79:NoExecute"})

	backend.setHealthy(uuidB, true)
	events <- gpu.HealthEvent{UUID: uuidB, Healthy: true, Reason: "recovered"}
	published(map[string]string{devA: "", devB: ""})
}

// Before 1.36 the API server drops a device's taints (DRADeviceTaints is off
// by default): there an unhealthy GPU is left out of the slice, as the only
// way to keep new claims off it; from 1.36 on it is published, tainted.
func TestTaintsDropped(t *testing.T) {
	for _, tt := range []struct {
		version string
		want    bool
	}{
		{"v1.34.1", true},
		{"v1.35.4-gke.100", true},
		{"v1.36.0", false},
		{"v1.37.2", false},
		{"not a version", false},
	} {
		client := fake.NewClientset()
		client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: tt.version}
		if got, _ := taintsDropped(client); got != tt.want {
			t.Errorf("taintsDropped(%s) = %v, want %v", tt.version, got, tt.want)
		}
	}

	d, _ := newDriver(t)
	sick := gpuB
	sick.Healthy = false
	d.inv = staticInventory{gpuA, sick}
	for _, leaveOut := range []bool{false, true} {
		d.leaveOutUnhealthy.Store(leaveOut)
		res, err := d.Resources()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, dev := range res.Pools[node].Slices[0].Devices {
			names = append(names, dev.Name)
		}
		want := []string{devA, devB}
		if leaveOut {
			want = []string{devA}
		}
		if !slices.Equal(names, want) {
			t.Errorf("taints dropped %v: published %v, want %v", leaveOut, names, want)
		}
	}
}
