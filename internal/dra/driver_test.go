package dra

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

const node = "node-1"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type staticInventory []gpu.Device

func (s staticInventory) Devices() ([]gpu.Device, error) { return s, nil }

// newDriver returns a driver serving gpuA and gpuB, with run_dir and the CDI
// directory fresh and the shim library present.
func newDriver(t *testing.T) (*Driver, *config.Config) {
	t.Helper()
	cfg := draConfig()
	cfg.Paths.RunDir = filepath.Join(hoststatetest.RunDir(t), "run")
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	cfg.DRA.CDIDir = filepath.Join(t.TempDir(), "cdi")
	if err := os.WriteFile(cfg.Paths.ShimPath, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Config: cfg, Inventory: staticInventory{gpuA, gpuB}, NodeName: node, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return d, cfg
}

var (
	devA = "gpu-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"
	devB = "gpu-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"
)

// result is one allocation result of the driver on this node; memory and
// cores are quantities, "" when the scheduler recorded no consumption.
func result(request, device, memory, cores string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: config.DefaultDRADriverName, Pool: node, Device: device}
	if memory != "" || cores != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		if memory != "" {
			r.ConsumedCapacity[CapacityMemory] = resource.MustParse(memory)
		}
		if cores != "" {
			r.ConsumedCapacity[CapacityCores] = resource.MustParse(cores)
		}
	}
	return r
}

func claim(uid string, pods []string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "claim-" + uid[:4], UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}},
		},
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + p, UID: types.UID(p)})
	}
	return c
}

func prepareOne(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := res[c.UID]
	if !ok || len(res) != 1 {
		t.Fatalf("PrepareResourceClaims returned %v, want one result for %s", res, c.UID)
	}
	return r
}

func readLimits(t *testing.T, cfg *config.Config, uid string) *limits.LimitsFile {
	t.Helper()
	var lf *limits.LimitsFile
	err := hoststate.New(cfg).Scan(func(r *hoststate.Record) error {
		if r.ID != hoststate.ClaimID(uid) {
			return nil
		}
		var err error
		lf, err = r.Limits()
		return err
	})
	if err != nil || lf == nil {
		t.Fatalf("limits of claim %s: %+v, %v", uid, lf, err)
	}
	return lf
}

const (
	uid1 = "11111111-1111-4111-8111-111111111111"
	uid2 = "22222222-2222-4222-8222-222222222222"
	uid3 = "33333333-3333-4333-8333-333333333333"
)

func TestPrepare(t *testing.T) {
	tests := []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		want    []limits.GPULimit
	}{
		{
			name:    "memory and cores on one GPU",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu", devA, "10Gi", "30")},
			want:    []limits.GPULimit{{UUID: uuidA, Memory: 10 * gib, Cores: 30}},
		},
		{
			name:    "no consumed capacity: the GPU whole",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu", devB, "", "")},
			want:    []limits.GPULimit{{UUID: uuidB, Memory: 16 * gib, Cores: 100}},
		},
		{
			name:    "memory only: cores default to the whole",
			results: []resourceapi.DeviceRequestAllocationResult{result("gpu", devB, "3Gi", "")},
			want:    []limits.GPULimit{{UUID: uuidB, Memory: 3 * gib, Cores: 100}},
		},
		{
			name: "two GPUs",
			results: []resourceapi.DeviceRequestAllocationResult{
				result("a", devA, "4Gi", "10"), result("b", devB, "2Gi", "20"),
			},
			want: []limits.GPULimit{{UUID: uuidA, Memory: 4 * gib, Cores: 10}, {UUID: uuidB, Memory: 2 * gib, Cores: 20}},
		},
		{
			name: "two requests on one GPU add up, cores capped at 100",
			results: []resourceapi.DeviceRequestAllocationResult{
				result("a", devA, "4Gi", "60"), result("b", devA, "4Gi", "60"),
			},
			want: []limits.GPULimit{{UUID: uuidA, Memory: 8 * gib, Cores: 100}},
		},
		{
			// The scheduler's claim for two containers each asking for
			// nvidia.com/gpu: 1, both placed on one GPU at its default of
			// one slice: the claim's quota there is two slices.
			name: "two containers' extended resource requests on one GPU add up",
			results: []resourceapi.DeviceRequestAllocationResult{
				result("container-0-request-0", devA, "4Gi", "10"), result("container-1-request-0", devA, "4Gi", "10"),
			},
			want: []limits.GPULimit{{UUID: uuidA, Memory: 8 * gib, Cores: 20}},
		},
		{
			name: "another driver's device in the claim is not ours",
			results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "nic", Driver: "net.example.com", Pool: node, Device: "eth1"},
				result("gpu", devA, "1Gi", "5"),
			},
			want: []limits.GPULimit{{UUID: uuidA, Memory: 1 * gib, Cores: 5}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, cfg := newDriver(t)
			c := claim(uid1, []string{"pod-uid-1"}, tt.results...)
			r := prepareOne(t, d, c)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			lf := readLimits(t, cfg, uid1)
			if !slices.Equal(lf.GPUs, tt.want) {
				t.Errorf("limits file GPUs = %+v, want %+v", lf.GPUs, tt.want)
			}
			if lf.CoresPolicy != "hard" || lf.LogLevel != "warn" {
				t.Errorf("limits file policy %q level %q, want the config's hard and warn", lf.CoresPolicy, lf.LogLevel)
			}
			info, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid1))
			if err != nil {
				t.Fatal(err)
			}
			if info.Source != "dra" || info.Claim == nil || info.Claim.UID != uid1 || !slices.Equal(info.Claim.PodUIDs, []string{"pod-uid-1"}) {
				t.Errorf("claim info = %+v (claim %+v), want source dra, the claim's UID and its pod", info, info.Claim)
			}

			// One device per result of this driver, each with the CDI
			// device of its GPU, which the real CDI library resolves to
			// the marker mount and nothing else.
			var want []kubeletplugin.Device
			for _, res := range tt.results {
				if res.Driver == config.DefaultDRADriverName {
					want = append(want, kubeletplugin.Device{
						Requests: []string{res.Request}, PoolName: node, DeviceName: res.Device,
						CDIDeviceIDs: []string{"nri-vgpu.io/claim=" + uid1 + "-" + res.Device},
					})
				}
			}
			if len(r.Devices) != len(want) {
				t.Fatalf("devices = %+v, want %+v", r.Devices, want)
			}
			for i := range want {
				g, w := r.Devices[i], want[i]
				if !slices.Equal(g.Requests, w.Requests) || g.PoolName != w.PoolName || g.DeviceName != w.DeviceName || !slices.Equal(g.CDIDeviceIDs, w.CDIDeviceIDs) {
					t.Errorf("device %d = %+v, want %+v", i, g, w)
				}
				checkCDIDevice(t, cfg.DRA.CDIDir, g.CDIDeviceIDs[0], "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin/claim-"+uid1+"/"+g.DeviceName)
			}
		})
	}
}

// checkCDIDevice injects the CDI device id into an empty OCI spec with the
// CDI library container runtimes use, and checks that it adds exactly one
// read-only mount of /dev/null at marker.
func checkCDIDevice(t *testing.T, dir, id, marker string) {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI specs in %s: %v", dir, errs)
	}
	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, id); err != nil {
		t.Fatalf("inject %s: %v (unresolved %v)", id, err, unresolved)
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Destination != marker || spec.Mounts[0].Source != "/dev/null" ||
		!slices.Contains(spec.Mounts[0].Options, "ro") {
		t.Errorf("CDI device %s adds mounts %+v, want only /dev/null read-only at %s", id, spec.Mounts, marker)
	}
	if len(spec.Linux.Devices) != 0 || len(spec.Process.Env) != 0 {
		t.Errorf("CDI device %s adds devices %v and env %v, want neither: the NRI plugin gives them", id, spec.Linux.Devices, spec.Process.Env)
	}
}

func TestPrepareErrors(t *testing.T) {
	other := result("gpu", devA, "1Gi", "10")
	other.Pool = "node-2"
	admin := result("gpu", devA, "", "")
	admin.AdminAccess = ptr.To(true)
	unallocated := claim(uid1, []string{"p"})
	unallocated.Status.Allocation = nil
	tests := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"another node's pool", claim(uid1, []string{"p"}, other), `not of this node's pool "node-1"`},
		{"admin access", claim(uid1, []string{"p"}, admin), "admin access"},
		{"a GPU the node does not serve", claim(uid1, []string{"p"}, result("gpu", "gpu-0000", "1Gi", "1")), `serves no GPU "gpu-0000"`},
		{"not allocated", unallocated, "not allocated"},
		{"no device of ours", claim(uid1, []string{"p"}, resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "net.example.com", Pool: node, Device: "eth1"}), "holds no device"},
		{"a UID that is not a UUID", claim("../../etc-0000", []string{"p"}, result("gpu", devA, "1Gi", "1")), "is not a UUID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, cfg := newDriver(t)
			r := prepareOne(t, d, tt.claim)
			if r.Err == nil || !errors.Is(r.Err, ErrRejected) || !strings.Contains(r.Err.Error(), tt.want) {
				t.Fatalf("Prepare: %v, want a rejection with %q", r.Err, tt.want)
			}
			if entries, _ := os.ReadDir(hoststate.ContainersDir(cfg)); len(entries) != 0 {
				t.Errorf("a rejected claim left host state: %v", entries)
			}
			if entries, _ := os.ReadDir(cfg.DRA.CDIDir); len(entries) != 0 {
				t.Errorf("a rejected claim left CDI specs: %v", entries)
			}
		})
	}
}

// Preparing a claim again (a kubelet restart, a second pod sharing it) keeps
// its limits file, which running containers have mounted, and brings its
// pods up to date; an allocation that changed is refused.
func TestPrepareAgain(t *testing.T) {
	d, cfg := newDriver(t)
	first := claim(uid1, []string{"pod-1"}, result("gpu", devA, "10Gi", "30"))
	if r := prepareOne(t, d, first); r.Err != nil {
		t.Fatal(r.Err)
	}
	limitsPath := filepath.Join(hoststate.ContainerDir(cfg, hoststate.ClaimID(uid1)), hoststate.LimitsFileName)
	var before unix.Stat_t
	if err := unix.Stat(limitsPath, &before); err != nil {
		t.Fatal(err)
	}

	// A driver restarted in between: nothing kept in memory matters.
	d2, err := New(Options{Config: cfg, Inventory: staticInventory{gpuA, gpuB}, NodeName: node, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	shared := claim(uid1, []string{"pod-1", "pod-2"}, result("gpu", devA, "10Gi", "30"))
	if r := prepareOne(t, d2, shared); r.Err != nil || len(r.Devices) != 1 {
		t.Fatalf("second Prepare: %+v", r)
	}
	var after unix.Stat_t
	if err := unix.Stat(limitsPath, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino {
		t.Error("preparing again replaced the limits file that running containers mount")
	}
	info, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid1))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.Claim.PodUIDs, []string{"pod-1", "pod-2"}) {
		t.Errorf("pods after the second Prepare = %v, want pod-1, pod-2", info.Claim.PodUIDs)
	}

	changed := claim(uid1, []string{"pod-1"}, result("gpu", devA, "20Gi", "30"))
	if r := prepareOne(t, d2, changed); r.Err == nil || !strings.Contains(r.Err.Error(), "was prepared with") {
		t.Errorf("Prepare with a changed allocation: %v, want a rejection", r.Err)
	}
	if lf := readLimits(t, cfg, uid1); lf.GPUs[0].Memory != 10*gib {
		t.Errorf("limits after the refused Prepare: %+v, want the first allocation's 10 GiB", lf.GPUs)
	}
}

// The driver refuses a claim that would take a GPU past its capacity
// together with the claims already prepared: the last line of defence
// against a double allocation.
func TestPrepareCapacity(t *testing.T) {
	d, _ := newDriver(t)
	if r := prepareOne(t, d, claim(uid1, []string{"p1"}, result("gpu", devA, "30Gi", "50"))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := prepareOne(t, d, claim(uid2, []string{"p2"}, result("gpu", devA, "6Gi", "50"))); r.Err != nil {
		t.Fatal(r.Err)
	}
	tests := []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		want    string // "" = prepared
	}{
		{"memory past the capacity", []resourceapi.DeviceRequestAllocationResult{result("gpu", devA, "5Gi", "")}, "has 4GiB and 0% left"},
		{"cores past the capacity", []resourceapi.DeviceRequestAllocationResult{result("gpu", devA, "1Gi", "1")}, "has 4GiB and 0% left, the claim needs 1GiB and 1%"},
		{"another GPU has room", []resourceapi.DeviceRequestAllocationResult{result("gpu", devB, "16Gi", "100")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := prepareOne(t, d, claim(uid3, []string{"p3"}, tt.results...))
			if tt.want == "" {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				return
			}
			if r.Err == nil || !strings.Contains(r.Err.Error(), tt.want) {
				t.Errorf("Prepare: %v, want an error with %q", r.Err, tt.want)
			}
		})
	}
}

func TestUnprepare(t *testing.T) {
	d, cfg := newDriver(t)
	if r := prepareOne(t, d, claim(uid1, []string{"p1"}, result("gpu", devA, "1Gi", "10"))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := prepareOne(t, d, claim(uid2, []string{"p2"}, result("gpu", devA, "1Gi", "10"))); r.Err != nil {
		t.Fatal(r.Err)
	}
	obj := func(uid string) kubeletplugin.NamespacedObject {
		return kubeletplugin.NamespacedObject{UID: types.UID(uid), NamespacedName: types.NamespacedName{Namespace: "ml", Name: "c"}}
	}
	// Twice (a kubelet restart repeats it), and a claim never prepared here.
	for range 2 {
		res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{obj(uid1), obj(uid3)})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 2 || res[uid1] != nil || res[uid3] != nil {
			t.Fatalf("Unprepare = %v, want no error for both claims", res)
		}
	}
	if _, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid1)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("claim directory after Unprepare: %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DRA.CDIDir, specName(uid1))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CDI spec after Unprepare: %v, want it gone", err)
	}
	// The other claim is untouched.
	if _, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid2)); err != nil {
		t.Errorf("the other claim's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.DRA.CDIDir, specName(uid2))); err != nil {
		t.Errorf("the other claim's CDI spec: %v", err)
	}
}

// A claim directory the capacity check cannot account for refuses every
// claim, whatever GPU it asks for: what the directory holds is unknown, so
// it never counts as free. Once it is released, claims are prepared again.
func TestPrepareCapacityFailsClosed(t *testing.T) {
	infoPath := func(cfg *config.Config) string {
		return filepath.Join(hoststate.ContainerDir(cfg, hoststate.ClaimID(uid1)), hoststate.InfoFileName)
	}
	rewrite := func(t *testing.T, cfg *config.Config, edit func(*hoststate.Info)) {
		t.Helper()
		info, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid1))
		if err != nil {
			t.Fatal(err)
		}
		edit(info)
		data, err := json.Marshal(info)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(infoPath(cfg), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		spoil func(t *testing.T, cfg *config.Config)
		want  string
	}{
		{"garbage container.json", func(t *testing.T, cfg *config.Config) {
			if err := os.WriteFile(infoPath(cfg), []byte("{\"gpus\": [garbage"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "cannot be read"},
		{"container.json a symbolic link", func(t *testing.T, cfg *config.Config) {
			// Root reads any mode; a link is never followed below run_dir.
			copyPath := filepath.Join(t.TempDir(), "container.json")
			data, err := os.ReadFile(infoPath(cfg))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(copyPath, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(infoPath(cfg)); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(copyPath, infoPath(cfg)); err != nil {
				t.Fatal(err)
			}
		}, "cannot be read"},
		{"container.json a directory", func(t *testing.T, cfg *config.Config) {
			if err := os.Remove(infoPath(cfg)); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(infoPath(cfg), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "cannot be read"},
		{"no container.json", func(t *testing.T, cfg *config.Config) {
			if err := os.Remove(infoPath(cfg)); err != nil {
				t.Fatal(err)
			}
		}, "has no container.json"},
		{"another claim's record", func(t *testing.T, cfg *config.Config) {
			rewrite(t, cfg, func(i *hoststate.Info) { i.Claim.UID = uid3 })
		}, "does not hold claim " + uid1},
		{"not the driver's", func(t *testing.T, cfg *config.Config) {
			rewrite(t, cfg, func(i *hoststate.Info) { i.Source = "nri" })
		}, `(source "nri")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, cfg := newDriver(t)
			if r := prepareOne(t, d, claim(uid1, []string{"p1"}, result("gpu", devA, "1Gi", "10"))); r.Err != nil {
				t.Fatal(r.Err)
			}
			tt.spoil(t, cfg)
			// devB is free: only the spoiled directory can refuse it.
			second := claim(uid2, []string{"p2"}, result("gpu", devB, "1Gi", "10"))
			r := prepareOne(t, d, second)
			dir := hoststate.ContainerDir(cfg, hoststate.ClaimID(uid1))
			if r.Err == nil || !strings.Contains(r.Err.Error(), dir) || !strings.Contains(r.Err.Error(), tt.want) {
				t.Fatalf("Prepare beside a spoiled claim directory: %v, want an error naming %s with %q", r.Err, dir, tt.want)
			}
			if _, err := hoststate.New(cfg).Info(hoststate.ClaimID(uid2)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the refused claim has a directory: %v", err)
			}
			if _, err := os.Stat(filepath.Join(cfg.DRA.CDIDir, specName(uid2))); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the refused claim has a CDI spec: %v", err)
			}

			if err := hoststate.New(cfg).Release(hoststate.ClaimID(uid1)); err != nil {
				t.Fatal(err)
			}
			if r := prepareOne(t, d, second); r.Err != nil {
				t.Errorf("Prepare once the spoiled directory is gone: %v", r.Err)
			}
		})
	}
}

// A GPU in MIG mode is served elsewhere: the ResourceSlice leaves it out.
func TestResourcesLeaveMIGGPUs(t *testing.T) {
	cfg := draConfig()
	cfg.GPU.Backend = config.BackendSimulated
	cfg.GPU.Simulated = []config.SimulatedGPU{
		{UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: config.Bytes(40 * gib), Minor: 0},
		{UUID: uuidB, Name: "NVIDIA A100-SXM4-40GB", Memory: config.Bytes(40 * gib), Minor: 1, MIG: true},
	}
	sim, err := gpu.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	d, err := New(Options{Config: cfg, Inventory: sim, NodeName: node, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Resources()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range res.Pools[node].Slices {
		for _, dev := range s.Devices {
			names = append(names, dev.Name)
		}
	}
	if want := []string{devA}; !slices.Equal(names, want) {
		t.Errorf("published devices = %v, want %v (the GPU in MIG mode left out)", names, want)
	}
}
