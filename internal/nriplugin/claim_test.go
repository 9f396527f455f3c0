package nriplugin

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nri-vgpu/nri-vgpu/internal/dra"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

const (
	claimUID  = "11111111-1111-4111-8111-111111111111"
	claimUID2 = "22222222-2222-4222-8222-222222222222"
	draNode   = "node-1"
)

func deviceName(t testing.TB, uuid string) string {
	t.Helper()
	n, err := draclaim.DeviceName(uuid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// prepareClaim prepares, with the real DRA driver, a claim reserved for the
// pods with the given UIDs that consumed memory and cores on the GPU with
// this UUID, as the scheduler would record it.
func prepareClaim(t *testing.T, cfg *config.Config, uid, uuid, memory, cores string, pods ...string) {
	t.Helper()
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	d, err := dra.New(dra.Options{Config: cfg, Inventory: sim, NodeName: draNode, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "gpu", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: cfg.DRA.DriverName, Pool: draNode, Device: deviceName(t, uuid),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
					dra.CapacityMemory: resource.MustParse(memory), dra.CapacityCores: resource.MustParse(cores),
				},
			}},
		}}},
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + p, UID: types.UID(p)})
	}
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare claim: %v %v", err, res[c.UID].Err)
	}
}

func draNodeConfig(t *testing.T) *config.Config {
	cfg := newConfig(t)
	cfg.DRA.Enabled = true
	cfg.DRA.CDIDir = t.TempDir()
	return cfg
}

// withMarker adds the mount the claim's CDI device adds to a container.
func withMarker(c *api.Container, uid, device string) *api.Container {
	c.Mounts = append(c.Mounts, &api.Mount{Destination: draclaim.MarkerPath(uid, device), Source: "/dev/null", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "noexec", "bind"}})
	return c
}

func removesMount(adj *api.ContainerAdjustment, dest string) bool {
	for _, m := range adj.GetMounts() {
		if m.GetDestination() == "-"+dest {
			return true
		}
	}
	return false
}

// A claim prepared by the previous release has no ledger directory (and its
// limits file names no ledger shards): its containers are still created,
// with every other mount of the claim's and none at the ledger's path.
func TestClaimContainerOfPreviousRelease(t *testing.T) {
	cfg := draNodeConfig(t)
	prepareClaim(t, cfg, claimUID, uuid1, "6Gi", "30", "uid-1")
	claimDir := hoststate.ContainerDir(cfg, hoststate.ClaimID(claimUID))
	if err := os.RemoveAll(filepath.Join(claimDir, hoststate.LedgerDirName)); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cfg)
	p := pod("sb1", "uid-1")
	adj, err := h.create(p, withMarker(container("c1", p, ""), claimUID, deviceName(t, uuid1)))
	if err != nil {
		t.Fatalf("container of a claim without a ledger directory: %v", err)
	}
	s := specFor(t, adj)
	if m, ok := mountAt(s, oci.ContainerLedgerDir); ok {
		t.Errorf("mount %s = %+v, want none: the claim has no ledger directory", oci.ContainerLedgerDir, m)
	}
	if m, ok := mountAt(s, oci.ContainerLimitsPath); !ok || m.Source != filepath.Join(claimDir, "limits") {
		t.Errorf("mount %s = %+v, want the claim's limits file", oci.ContainerLimitsPath, m)
	}
}

// A container of a pod the claim is reserved for gets the claim's GPU with
// the claim's limits file and region, which every container of the claim
// shares, and loses the marker.
func TestClaimContainer(t *testing.T) {
	cfg := draNodeConfig(t)
	prepareClaim(t, cfg, claimUID, uuid1, "6Gi", "30", "uid-1")
	h := newHarness(t, cfg)
	p := pod("sb1", "uid-1")
	dev := deviceName(t, uuid1)

	claimDir := hoststate.ContainerDir(cfg, hoststate.ClaimID(claimUID))
	for _, id := range []string{"c1", "c2"} {
		adj, err := h.create(p, withMarker(container(id, p, ""), claimUID, dev))
		if err != nil {
			t.Fatalf("container %s: %v", id, err)
		}
		if !removesMount(adj, draclaim.MarkerPath(claimUID, dev)) {
			t.Errorf("container %s keeps the claim marker: runc would refuse it", id)
		}
		if sc := adj.GetLinux().GetSeccompPolicy(); !deniedBy(sc, "chroot", tEPERM) {
			t.Errorf("container %s of a claim is not confined: seccomp %v", id, sc)
		}
		s := specFor(t, adj)
		if got := access(t, s, 195, 1); got != "rwm" {
			t.Errorf("container %s: access to the claim's GPU /dev/nvidia1 = %q, want rwm", id, got)
		}
		if got := access(t, s, 195, 0); got == "rwm" {
			t.Errorf("container %s: access to /dev/nvidia0, which the claim does not hold", id)
		}
		for dst, src := range map[string]string{
			"/run/nri-vgpu/limits": filepath.Join(claimDir, "limits"),
			"/run/nri-vgpu/region": filepath.Join(claimDir, "region"),
			"/run/nri-vgpu/ledger": filepath.Join(claimDir, "ledger"),
			"/etc/ld.so.preload":   filepath.Join(cfg.Paths.RunDir, "ld.so.preload"),
		} {
			if m, ok := mountAt(s, dst); !ok || m.Source != src {
				t.Errorf("container %s: mount %s = %+v, want the claim's %s", id, dst, m, src)
			}
		}
		// No directory of its own: its quota is the claim's.
		if _, err := hoststate.New(cfg).Info(id); err == nil {
			t.Errorf("container %s got a host directory of its own", id)
		}
	}
	lf := recordLimits(t, cfg, hoststate.ClaimID(claimUID))
	if len(lf.GPUs) != 1 || lf.GPUs[0] != (limits.GPULimit{UUID: uuid1, Memory: 6 << 30, Cores: 30}) {
		t.Errorf("the claim's limits = %+v, want 6 GiB and 30 %% of %s", lf.GPUs, uuid1)
	}

	// Removing a container leaves the claim's files to the driver.
	if err := h.remove(p, container("c1", p, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := hoststate.New(cfg).Info(hoststate.ClaimID(claimUID)); err != nil {
		t.Errorf("the claim's directory after a container went: %v", err)
	}
}

func TestClaimContainerRejected(t *testing.T) {
	dev0, dev1 := deviceName(t, uuid0), deviceName(t, uuid1)
	signed := func(h *harness) string { ann, _ := sign(t, h.key, gpu0); return ann }
	tests := []struct {
		name   string
		podUID string
		ctr    func(h *harness, p *api.PodSandbox) *api.Container
		want   string
	}{
		{"another pod", "uid-2", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(container("c", p, ""), claimUID, dev1)
		}, "is not reserved for pod uid-2"},
		{"a claim not prepared here", "uid-1", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(container("c", p, ""), claimUID2, dev1)
		}, "is not prepared on this node"},
		{"a device the claim does not hold", "uid-1", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(container("c", p, ""), claimUID, dev0)
		}, "holds no device " + dev0},
		{"two claims", "uid-1", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(withMarker(container("c", p, ""), claimUID, dev1), "33333333-3333-4333-8333-333333333333", dev1)
		}, "two claims"},
		{"a malformed marker", "uid-1", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(container("c", p, ""), "../../x", dev1)
		}, "malformed claim marker"},
		{"a claim and a device plugin allocation", "uid-1", func(h *harness, p *api.PodSandbox) *api.Container {
			return withMarker(container("c", p, signed(h)), claimUID, dev1)
		}, "of claim " + claimUID + " and of the device plugin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := draNodeConfig(t)
			prepareClaim(t, cfg, claimUID, uuid1, "6Gi", "30", "uid-1")
			h := newHarness(t, cfg)
			p := pod("sb", tt.podUID)
			_, err := h.create(p, tt.ctr(h, p))
			if err == nil || !strings.Contains(err.Error(), "claim rejected") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("create: %v, want a rejection with %q", err, tt.want)
			}
		})
	}
}

// A GPU is served one way: the NRI plugin refuses a claim on a GPU the
// node's config gives the device plugin, and a device plugin allocation of
// a GPU it gives the DRA driver.
func TestClaimAndAllocationFollowTheConfig(t *testing.T) {
	prepared := draNodeConfig(t)
	prepareClaim(t, prepared, claimUID, uuid1, "6Gi", "30", "uid-1")

	onlyGPU0 := *prepared
	onlyGPU0.DRA.GPUs = []string{uuid0}
	h := newHarness(t, &onlyGPU0)
	p := pod("sb", "uid-1")
	_, err := h.create(p, withMarker(container("c1", p, ""), claimUID, deviceName(t, uuid1)))
	if err == nil || !strings.Contains(err.Error(), "served by the device plugin here") {
		t.Errorf("claim on a device plugin GPU: %v, want a rejection", err)
	}
	ann, _ := sign(t, h.key, gpu0)
	_, err = h.create(p, container("c2", p, ann))
	if err == nil || !strings.Contains(err.Error(), "served through DRA") {
		t.Errorf("allocation of a DRA GPU: %v, want a rejection", err)
	}
	ann, _ = sign(t, h.key, gpu1)
	if _, err := h.create(p, container("c3", p, ann)); err != nil {
		t.Errorf("allocation of the device plugin's GPU: %v", err)
	}
}
