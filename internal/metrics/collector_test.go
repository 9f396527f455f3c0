package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const (
	uuidA    = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
	uuidB    = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
	uuidGone = "GPU-cccccccc-0000-4000-8000-000000000003"
)

// The families this package exports, for testutil's name filter.
var ourMetrics = []string{
	"nri_vgpu_gpu_memory_total_bytes", "nri_vgpu_gpu_memory_allocated_bytes", "nri_vgpu_gpu_memory_used_bytes",
	"nri_vgpu_gpu_sm_allocated_ratio", "nri_vgpu_container_memory_limit_bytes",
	"nri_vgpu_container_memory_used_bytes", "nri_vgpu_container_memory_peak_bytes", "nri_vgpu_container_sm_limit_ratio",
	"nri_vgpu_container_sm_throttled_seconds_total",
	"nri_vgpu_container_kernel_launches_total", "nri_vgpu_container_region_suspect", "nri_vgpu_container_processes",
	"nri_vgpu_build_info", "nri_vgpu_scrape_errors_total", "nri_vgpu_confinement_available",
	// Not exported without utilisation source or claim.
	"nri_vgpu_gpu_sm_utilization_ratio", "nri_vgpu_container_sm_utilization_ratio",
	"nri_vgpu_container_sm_share_utilization_ratio", "nri_vgpu_claim_pod_info",
}

type fakeInventory struct {
	devs []gpu.Device
	err  error
}

func (f *fakeInventory) Devices() ([]gpu.Device, error) { return f.devs, f.err }

var twoA100s = &fakeInventory{devs: []gpu.Device{
	{Index: 0, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30},
	{Index: 1, UUID: uuidB, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30},
}}

func testConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// prepare creates a container's host directory the way the NRI plugin does:
// the limits file (pkg/limits), container.json and the region directory
// with the empty region the host writes.
func prepare(t testing.TB, cfg *config.Config, id, pod, name string, gpus ...allocation.GPU) {
	t.Helper()
	info := &hoststate.Info{ID: id, Name: name, Pod: pod, GPUs: gpus, Source: "nri"}
	if _, err := hoststate.New(cfg).Provision(info, (&allocation.Allocation{GPUs: gpus}).Limits("")); err != nil {
		t.Fatal(err)
	}
}

func regionPath(cfg *config.Config, id string) string {
	return filepath.Join(hoststate.ContainerDir(cfg, id), hoststate.RegionDirName, region.FileName)
}

// header is the HELP and TYPE lines of every family, in ourMetrics order.
const header = `
# HELP nri_vgpu_gpu_memory_total_bytes Total memory of the GPU, from the GPU inventory.
# TYPE nri_vgpu_gpu_memory_total_bytes gauge
# HELP nri_vgpu_gpu_memory_allocated_bytes Sum of the memory limits of the vGPU containers on the GPU (a container without a memory limit adds 0).
# TYPE nri_vgpu_gpu_memory_allocated_bytes gauge
# HELP nri_vgpu_gpu_memory_used_bytes Sum of the memory the vGPU containers' processes hold on the GPU, from their usage regions.
# TYPE nri_vgpu_gpu_memory_used_bytes gauge
# HELP nri_vgpu_gpu_sm_allocated_ratio Sum of the SM-time shares of the vGPU containers on the GPU, as a ratio of the GPU (1 = all of it; above 1 when cores_scaling overcommits).
# TYPE nri_vgpu_gpu_sm_allocated_ratio gauge
# HELP nri_vgpu_container_memory_limit_bytes Memory limit of the container on the GPU; 0 means no memory limit.
# TYPE nri_vgpu_container_memory_limit_bytes gauge
# HELP nri_vgpu_container_memory_used_bytes Memory the container's processes hold on the GPU, from its usage region.
# TYPE nri_vgpu_container_memory_used_bytes gauge
# HELP nri_vgpu_container_memory_peak_bytes Most memory the container's processes held on the GPU at once since its usage region was made, from the region (version 2 and later).
# TYPE nri_vgpu_container_memory_peak_bytes gauge
# HELP nri_vgpu_container_sm_limit_ratio SM-time share of the container on the GPU, as a ratio of the GPU (1 = not throttled).
# TYPE nri_vgpu_container_sm_limit_ratio gauge
# HELP nri_vgpu_container_sm_throttled_seconds_total Seconds the container's processes had kernel launches waiting on the SM limiter on the GPU, summed over processes, since its usage region was made, from the region (version 2 and later).
# TYPE nri_vgpu_container_sm_throttled_seconds_total counter
# HELP nri_vgpu_container_kernel_launches_total Kernel launches of the container's processes on the GPU since this daemon first saw them.
# TYPE nri_vgpu_container_kernel_launches_total counter
# HELP nri_vgpu_container_region_suspect 1 when the container's usage region holds impossible counters for the GPU (its memory used, peak, throttled time and kernel launches are then left out), else 0.
# TYPE nri_vgpu_container_region_suspect gauge
# HELP nri_vgpu_container_processes Processes of the container registered in its usage region (processes that initialised CUDA or NVML and are alive).
# TYPE nri_vgpu_container_processes gauge
# HELP nri_vgpu_build_info Always 1; the version label is that of the running build.
# TYPE nri_vgpu_build_info gauge
# HELP nri_vgpu_scrape_errors_total Files (limits, container.json, usage regions) or sources (GPU inventory, run_dir, NVML's utilisation) that could not be read during scrapes, by source; each scrape counts each failure once.
# TYPE nri_vgpu_scrape_errors_total counter
`

// scrapeErrors is the nri_vgpu_scrape_errors_total block with the given
// counts (every source, 0 unless named).
func scrapeErrors(counts map[string]int) string {
	var b strings.Builder
	for _, s := range errorSources {
		fmt.Fprintf(&b, "nri_vgpu_scrape_errors_total{source=%q} %d\n", s, counts[s])
	}
	return b.String()
}

// A node with two GPUs in the inventory: c1 (pod ml/a) runs two processes
// on A, with the version 1 region of an earlier release's shim (no peak or
// throttled time, so none exported); c2 (pod ml/b) holds slices of A and of
// a GPU gone from the inventory and has run no process yet (the empty
// region the host made: nothing held or throttled); B is idle; a directory
// still being created has no limits file yet.
func TestCollect(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 << 30, Cores: 20})
	prepare(t, cfg, "c2", "ml/b", "serve",
		allocation.GPU{UUID: uuidA, Slices: 5, Memory: 20 << 30, Cores: 50},
		allocation.GPU{UUID: uuidGone, Slices: 1, Memory: 4 << 30, Cores: 10})
	if err := os.MkdirAll(hoststate.ContainerDir(cfg, "creating"), 0o755); err != nil {
		t.Fatal(err)
	}
	devA := []region.DeviceUsage{{UUID: uuidA, Limit: 8 << 30, Used: 3 << 30, Cores: 20}}
	regiontest.Write(t, regionPath(cfg, "c1"), devA, []region.ProcessUsage{
		{PID: 100, StartTime: 5, Used: []uint64{1 << 30}, Launches: []uint64{5}},
		{PID: 101, StartTime: 6, Used: []uint64{2 << 30}, Launches: []uint64{7}},
	})

	var logs bytes.Buffer
	c := NewCollector(cfg, twoA100s, slog.New(slog.NewTextHandler(&logs, nil)))
	gpuLines := `
nri_vgpu_gpu_memory_total_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 42949672960
nri_vgpu_gpu_memory_total_bytes{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 42949672960
nri_vgpu_gpu_memory_allocated_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 30064771072
nri_vgpu_gpu_memory_allocated_bytes{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
nri_vgpu_gpu_memory_allocated_bytes{UUID="` + uuidGone + `",gpu="",name=""} 4294967296
nri_vgpu_gpu_memory_used_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} %d
nri_vgpu_gpu_memory_used_bytes{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
nri_vgpu_gpu_memory_used_bytes{UUID="` + uuidGone + `",gpu="",name=""} 0
nri_vgpu_gpu_sm_allocated_ratio{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 0.7
nri_vgpu_gpu_sm_allocated_ratio{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
nri_vgpu_gpu_sm_allocated_ratio{UUID="` + uuidGone + `",gpu="",name=""} 0.1
`
	ctrLines := `
nri_vgpu_container_memory_limit_bytes{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} 8589934592
nri_vgpu_container_memory_limit_bytes{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 21474836480
nri_vgpu_container_memory_limit_bytes{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 4294967296
nri_vgpu_container_memory_used_bytes{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} %d
nri_vgpu_container_memory_used_bytes{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_memory_used_bytes{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} 0.2
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0.5
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0.1
nri_vgpu_container_memory_peak_bytes{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_memory_peak_bytes{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_sm_throttled_seconds_total{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_sm_throttled_seconds_total{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_kernel_launches_total{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} %d
nri_vgpu_container_kernel_launches_total{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_kernel_launches_total{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_region_suspect{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} 0
nri_vgpu_container_region_suspect{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_region_suspect{UUID="` + uuidGone + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_container_processes{claim="",container="train",container_id="c1",namespace="ml",pod="a"} %d
nri_vgpu_container_processes{claim="",container="serve",container_id="c2",namespace="ml",pod="b"} 0
nri_vgpu_build_info{version="` + version.Version + `"} 1
`
	want := func(used uint64, launches, procs int) string {
		return header + fmt.Sprintf(gpuLines, used) + fmt.Sprintf(ctrLines, used, launches, procs) + scrapeErrors(nil)
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(3<<30, 5+7, 2)), ourMetrics...); err != nil {
		t.Error(err)
	}

	// Process 100 exits (the shim frees its slot); 101 launches two more
	// kernels and frees 1 GiB. The counter keeps what 100 launched.
	devA[0].Used = 1 << 30
	regiontest.Write(t, regionPath(cfg, "c1"), devA, []region.ProcessUsage{
		{PID: 101, StartTime: 6, Used: []uint64{1 << 30}, Launches: []uint64{9}},
	})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(1<<30, 5+9, 1)), ourMetrics...); err != nil {
		t.Error(err)
	}

	// A new process reusing PID 101 (another start time) counts anew; the
	// old 101's 9 launches stay in the total.
	regiontest.Write(t, regionPath(cfg, "c1"), devA, []region.ProcessUsage{
		{PID: 101, StartTime: 77, Used: []uint64{1 << 30}, Launches: []uint64{1}},
	})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(1<<30, 5+9+1, 1)), ourMetrics...); err != nil {
		t.Error(err)
	}
	if logs.Len() != 0 {
		t.Errorf("a clean node logged:\n%s", logs.String())
	}

	// A scrape that cannot list run_dir forgets no launch history.
	moved := hoststate.ContainersDir(cfg) + ".moved"
	if err := os.Rename(hoststate.ContainersDir(cfg), moved); err != nil {
		t.Fatal(err)
	}
	write(t, hoststate.ContainersDir(cfg), "")
	testutil.CollectAndCount(c)
	if err := os.Remove(hoststate.ContainersDir(cfg)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, hoststate.ContainersDir(cfg)); err != nil {
		t.Fatal(err)
	}
	wantAfter := strings.Replace(want(1<<30, 5+9+1, 1), `source="run_dir"} 0`, `source="run_dir"} 1`, 1)
	if err := testutil.CollectAndCompare(c, strings.NewReader(wantAfter), ourMetrics...); err != nil {
		t.Errorf("after run_dir came back: %v", err)
	}

	// A removed container takes its launch history along.
	if err := hoststate.New(cfg).Release("c1"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c, "nri_vgpu_container_processes"); n != 1 {
		t.Errorf("after removing c1: %d nri_vgpu_container_processes series, want 1 (c2)", n)
	}
	if _, ok := c.launches["c1"]; ok {
		t.Error("the launch history of a removed container is kept")
	}
}

// A broken file costs only its own series, is counted at every scrape and
// logged once while it stays broken.
func TestCollectCountsBrokenFiles(t *testing.T) {
	gpuA := allocation.GPU{UUID: uuidA, Slices: 1, Memory: 4 << 30, Cores: 10}
	tests := []struct {
		name   string
		inv    Inventory
		breakF func(t *testing.T, cfg *config.Config)
		source string
		// Families (of c1's) that must still be there, and those left out.
		kept, lost []string
	}{
		{
			name: "garbage limits file",
			breakF: func(t *testing.T, cfg *config.Config) {
				write(t, filepath.Join(hoststate.ContainerDir(cfg, "c1"), hoststate.LimitsFileName), "\x00\xffnot=limits\n")
			},
			source: SourceLimits,
			lost:   []string{"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_container_processes"},
		},
		{
			name: "limits file of a newer version",
			breakF: func(t *testing.T, cfg *config.Config) {
				write(t, filepath.Join(hoststate.ContainerDir(cfg, "c1"), hoststate.LimitsFileName), "version=99\n")
			},
			source: SourceLimits,
			lost:   []string{"nri_vgpu_container_memory_limit_bytes"},
		},
		{
			name: "garbage container.json",
			breakF: func(t *testing.T, cfg *config.Config) {
				write(t, filepath.Join(hoststate.ContainerDir(cfg, "c1"), hoststate.InfoFileName), "{")
			},
			source: SourceContainerInfo,
			kept:   []string{"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_container_memory_used_bytes", "nri_vgpu_container_processes"},
		},
		{
			name:   "garbage region",
			breakF: func(t *testing.T, cfg *config.Config) { write(t, regionPath(cfg, "c1"), "not a region") },
			source: SourceRegion,
			kept:   []string{"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_container_sm_limit_ratio"},
			lost:   []string{"nri_vgpu_container_memory_used_bytes", "nri_vgpu_container_kernel_launches_total", "nri_vgpu_container_processes"},
		},
		{
			name: "run_dir/containers not a directory",
			breakF: func(t *testing.T, cfg *config.Config) {
				if err := mountinfo.UnmountUnder(hoststate.ContainersDir(cfg)); err != nil {
					t.Fatal(err)
				}
				if err := os.RemoveAll(hoststate.ContainersDir(cfg)); err != nil {
					t.Fatal(err)
				}
				write(t, hoststate.ContainersDir(cfg), "")
			},
			source: SourceRunDir,
			lost:   []string{"nri_vgpu_container_memory_limit_bytes"},
		},
		{
			name:   "inventory unavailable",
			inv:    &fakeInventory{err: errors.New("NVML: driver not loaded")},
			source: SourceInventory,
			kept:   []string{"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_gpu_memory_allocated_bytes"},
			lost:   []string{"nri_vgpu_gpu_memory_total_bytes"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			prepare(t, cfg, "c1", "ml/a", "train", gpuA)
			regiontest.Write(t, regionPath(cfg, "c1"), []region.DeviceUsage{{UUID: uuidA, Limit: 4 << 30, Used: 1 << 30, Cores: 10}},
				[]region.ProcessUsage{{PID: 100, StartTime: 5, Used: []uint64{1 << 30}, Launches: []uint64{5}}})
			if tt.breakF != nil {
				tt.breakF(t, cfg)
			}
			inv := tt.inv
			if inv == nil {
				inv = twoA100s
			}
			var logs bytes.Buffer
			c := NewCollector(cfg, inv, slog.New(slog.NewTextHandler(&logs, nil)))
			for scrapes := 1; scrapes <= 3; scrapes++ {
				want := header + scrapeErrors(map[string]int{tt.source: scrapes})
				if err := testutil.CollectAndCompare(c, strings.NewReader(want), "nri_vgpu_scrape_errors_total"); err != nil {
					t.Errorf("scrape %d: %v", scrapes, err)
				}
			}
			if n := strings.Count(logs.String(), "cannot read"); n != 1 {
				t.Errorf("logged %d times in 3 scrapes, want once:\n%s", n, logs.String())
			}
			for _, name := range tt.kept {
				if testutil.CollectAndCount(c, name) == 0 {
					t.Errorf("%s left out", name)
				}
			}
			for _, name := range tt.lost {
				if n := testutil.CollectAndCount(c, name); n != 0 {
					t.Errorf("%s: %d series, want none", name, n)
				}
			}
			if n := testutil.CollectAndCount(c, "nri_vgpu_build_info"); n != 1 {
				t.Errorf("build info: %d series, want 1 whatever is broken", n)
			}
		})
	}
}

// A file that is fixed is logged as readable again, and a later breakage is
// logged anew.
func TestCollectLogsRecovery(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 1, Memory: 4 << 30, Cores: 10})
	path := filepath.Join(hoststate.ContainerDir(cfg, "c1"), hoststate.LimitsFileName)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	c := NewCollector(cfg, twoA100s, slog.New(slog.NewTextHandler(&logs, nil)))
	for _, step := range []string{"version=99\n", string(good), "version=98\n"} {
		write(t, path, step)
		testutil.CollectAndCount(c)
	}
	if got := strings.Count(logs.String(), "cannot read"); got != 2 {
		t.Errorf("%d breakages logged, want 2:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "readable again") || !strings.Contains(logs.String(), path) {
		t.Errorf("recovery of %s not logged:\n%s", path, logs.String())
	}
}

func TestSplitPod(t *testing.T) {
	for _, tt := range []struct{ in, ns, name string }{
		{"ml/job", "ml", "job"},
		{"job", "", "job"},
		{"", "", ""},
	} {
		if ns, name := splitPod(tt.in); ns != tt.ns || name != tt.name {
			t.Errorf("splitPod(%q) = %q, %q; want %q, %q", tt.in, ns, name, tt.ns, tt.name)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every series the endpoint serves, ours and the Go and process collectors',
// passes the checks of `promtool check metrics` (promlint): names, units,
// counters' _total, HELP, and snake_case label names, which is why the GPU
// model is "name" and not dcgm-exporter's camelCase modelName.
func TestPromlint(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 << 30, Cores: 20})
	regiontest.Write(t, regionPath(cfg, "c1"), []region.DeviceUsage{{UUID: uuidA, Limit: 8 << 30, Used: 1 << 30, Cores: 20}},
		[]region.ProcessUsage{{PID: 100, StartTime: 5, Used: []uint64{1 << 30}, Launches: []uint64{5}}})
	reg := NewRegistry(NewCollector(cfg, twoA100s, slog.New(slog.NewTextHandler(io.Discard, nil))))
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	// The lint saw the container and GPU series, not an empty registry.
	n, err := testutil.GatherAndCount(reg, "nri_vgpu_container_memory_used_bytes", "nri_vgpu_gpu_memory_total_bytes")
	if err != nil || n != 3 {
		t.Errorf("gathered %d container/GPU series (%v), want 3", n, err)
	}
}

// The launch counter across scrapes: exits keep their counts, and processes
// that share a pid and start tick in two pid namespaces (one region, a claim
// shared by two containers) are two processes, told apart by the host pid.
func TestLaunchTotals(t *testing.T) {
	type proc struct {
		pid, hostPID int32
		start, n     uint64
	}
	tests := []struct {
		name    string
		scrapes [][]proc
		want    []uint64 // the total after each scrape
	}{
		{"exit keeps its launches",
			[][]proc{{{100, 4100, 5, 3}, {101, 4101, 6, 4}}, {{101, 4101, 6, 6}}},
			[]uint64{7, 9}},
		{"pid reused with another start counts anew",
			[][]proc{{{100, 4100, 5, 3}}, {{100, 4200, 9, 1}}},
			[]uint64{3, 4}},
		{"one pid and start tick in two namespaces",
			[][]proc{{{1, 4100, 5, 3}, {1, 4200, 5, 4}}, {{1, 4100, 5, 5}, {1, 4200, 5, 4}}, {{1, 4200, 5, 6}}},
			[]uint64{7, 9, 11}},
		{"host pid learned between scrapes",
			[][]proc{{{100, 0, 5, 2}}, {{100, 4100, 5, 3}}, {}},
			[]uint64{2, 3, 3}},
		{"host pid learned while a namesake keeps none",
			[][]proc{{{1, 0, 5, 2}, {1, 4200, 5, 4}}, {{1, 4100, 5, 3}, {1, 4200, 5, 4}}},
			[]uint64{6, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Collector{launches: map[string]*launchHistory{}}
			for i, scrape := range tt.scrapes {
				u := &region.Usage{Devices: []region.DeviceUsage{{UUID: uuidA}}}
				for _, p := range scrape {
					u.Processes = append(u.Processes, region.ProcessUsage{
						PID: p.pid, HostPID: p.hostPID, StartTime: p.start, Used: []uint64{0}, Launches: []uint64{p.n}})
				}
				if got := c.launchTotals("c1", u)[uuidA]; got != tt.want[i] {
					t.Errorf("scrape %d: %d launches, want %d", i+1, got, tt.want[i])
				}
			}
		})
	}
}

// prepareClaim creates a claim's host directory the way the DRA driver does
// (internal/dra): ID claim-<uid>, the claim and its pods' names and UIDs in
// Claim.
func prepareClaim(t testing.TB, cfg *config.Config, ns, name, uid string, pods, podUIDs []string, gpus ...allocation.GPU) string {
	t.Helper()
	id := hoststate.ClaimID(uid)
	info := &hoststate.Info{
		ID: id, AllocationID: uid, GPUs: gpus, Source: hoststate.SourceDRA,
		Claim: &hoststate.ClaimInfo{Namespace: ns, Name: name, UID: uid, PodUIDs: podUIDs, PodNames: pods},
	}
	if _, err := hoststate.New(cfg).Provision(info, (&allocation.Allocation{GPUs: gpus}).Limits("")); err != nil {
		t.Fatal(err)
	}
	return id
}

// A DRA claim's record is labelled with the claim (pod and container
// empty: its containers share it) and names its pods in
// nri_vgpu_claim_pod_info; a claim deleted and created again under the same
// name while the old record is still there gives each pod one series, not
// two (the registry would refuse the second). The second record is as the
// previous release wrote it, its pods' names in the pod field only.
func TestCollectClaim(t *testing.T) {
	cfg := testConfig(t)
	const (
		uid1 = "11111111-2222-4333-8444-555555555555"
		uid2 = "66666666-7777-4888-8999-aaaaaaaaaaaa"
	)
	id1 := prepareClaim(t, cfg, "ml", "shared", uid1, []string{"p1", "p2"}, []string{"uid-p1", "uid-p2"},
		allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 << 30, Cores: 25})
	id2 := prepareClaim(t, cfg, "ml", "shared", uid2, []string{"p2", "p3"}, []string{"uid-p2", "uid-p3"},
		allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 << 30, Cores: 10})
	hoststatetest.AsPreviousRelease(t, filepath.Join(hoststate.ContainerDir(cfg, id2), hoststate.InfoFileName))
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 1, Memory: 4 << 30, Cores: 10})
	want := `
# HELP nri_vgpu_container_sm_limit_ratio SM-time share of the container on the GPU, as a ratio of the GPU (1 = not throttled).
# TYPE nri_vgpu_container_sm_limit_ratio gauge
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} 0.1
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidA + `",claim="shared",container="",container_id="` + id1 + `",namespace="ml",pod=""} 0.25
nri_vgpu_container_sm_limit_ratio{UUID="` + uuidB + `",claim="shared",container="",container_id="` + id2 + `",namespace="ml",pod=""} 0.1
# HELP nri_vgpu_container_processes Processes of the container registered in its usage region (processes that initialised CUDA or NVML and are alive).
# TYPE nri_vgpu_container_processes gauge
nri_vgpu_container_processes{claim="",container="train",container_id="c1",namespace="ml",pod="a"} 0
nri_vgpu_container_processes{claim="shared",container="",container_id="` + id1 + `",namespace="ml",pod=""} 0
nri_vgpu_container_processes{claim="shared",container="",container_id="` + id2 + `",namespace="ml",pod=""} 0
# HELP nri_vgpu_claim_pod_info Always 1: one series per pod a DRA claim's record serves (the pods the claim was reserved for when last prepared).
# TYPE nri_vgpu_claim_pod_info gauge
nri_vgpu_claim_pod_info{claim="shared",namespace="ml",pod="p1"} 1
nri_vgpu_claim_pod_info{claim="shared",namespace="ml",pod="p2"} 1
nri_vgpu_claim_pod_info{claim="shared",namespace="ml",pod="p3"} 1
`
	reg := NewRegistry(NewCollector(cfg, twoA100s, nil))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"nri_vgpu_container_sm_limit_ratio", "nri_vgpu_container_processes", "nri_vgpu_claim_pod_info"); err != nil {
		t.Error(err)
	}
}

// A GPU in MIG mode has its served-elsewhere series and none of the GPU
// series of those nri-vgpu shares.
func TestCollectServedElsewhere(t *testing.T) {
	cfg := testConfig(t)
	sim, err := gpu.NewSimulated([]config.SimulatedGPU{
		{UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Minor: 0},
		{UUID: uuidB, Name: "NVIDIA H200", Memory: 141 << 30, Minor: 1, MIG: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	c := NewCollector(cfg, sim, slog.New(slog.DiscardHandler))
	want := `
# HELP nri_vgpu_gpu_served_elsewhere_info Always 1: one series per GPU of the node that nri-vgpu leaves to another plugin and never advertises; reason is "MIG mode".
# TYPE nri_vgpu_gpu_served_elsewhere_info gauge
nri_vgpu_gpu_served_elsewhere_info{UUID="` + uuidB + `",gpu="1",name="NVIDIA H200",reason="MIG mode"} 1
# HELP nri_vgpu_gpu_memory_total_bytes Total memory of the GPU, from the GPU inventory.
# TYPE nri_vgpu_gpu_memory_total_bytes gauge
nri_vgpu_gpu_memory_total_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 42949672960
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "nri_vgpu_gpu_served_elsewhere_info", "nri_vgpu_gpu_memory_total_bytes"); err != nil {
		t.Error(err)
	}
}
