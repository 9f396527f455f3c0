package metrics

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const gib = 1 << 30

// usageOnA writes container id's region: GPU A's total used and one
// process holding held that launched launches kernels.
func usageOnA(t *testing.T, cfg *config.Config, id string, used, held, launches uint64) {
	t.Helper()
	regiontest.Write(t, regionPath(cfg, id), []region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: used, Cores: 20}},
		[]region.ProcessUsage{{PID: 100, StartTime: 5, Used: []uint64{held}, Launches: []uint64{launches}}})
}

// compare runs a scrape with a failure detector: it must not wait on any
// container (the 30 s bound a hung read, they are not a timing).
func compare(t *testing.T, c *Collector, want string, names ...string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- testutil.CollectAndCompare(c, strings.NewReader(want), names...) }()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the scrape did not return")
	}
}

const (
	usedHeader = `
# HELP nri_vgpu_container_memory_used_bytes Memory the container's processes hold on the GPU, from its usage region.
# TYPE nri_vgpu_container_memory_used_bytes gauge
`
	gpuUsedHeader = `
# HELP nri_vgpu_gpu_memory_used_bytes Sum of the memory the vGPU containers' processes hold on the GPU, from their usage regions.
# TYPE nri_vgpu_gpu_memory_used_bytes gauge
`
	suspectHeader = `
# HELP nri_vgpu_container_region_suspect 1 when the container's usage region holds impossible counters for the GPU (its memory used, peak, throttled time and kernel launches are then left out), else 0.
# TYPE nri_vgpu_container_region_suspect gauge
`
	launchesHeader = `
# HELP nri_vgpu_container_kernel_launches_total Kernel launches of the container's processes on the GPU since this daemon first saw them.
# TYPE nri_vgpu_container_kernel_launches_total counter
`
)

func series(name, id, value string) string {
	return name + `{UUID="` + uuidA + `",claim="",container="train",container_id="` + id + `",namespace="ml",pod="` + id + `"} ` + value + "\n"
}

// A tenant holding its region's lock does not stall the scrape, which
// exports the container's usage all the same.
func TestScrapeDoesNotWaitForALockedRegion(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/c1", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20})
	usageOnA(t, cfg, "c1", 3*gib, 3*gib, 0)
	holder, err := os.OpenFile(regionPath(cfg, "c1"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLKW, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	c := NewCollector(cfg, twoA100s, nil)
	compare(t, c, usedHeader+series("nri_vgpu_container_memory_used_bytes", "c1", "3.221225472e+09"),
		"nri_vgpu_container_memory_used_bytes")
}

// Counters a tenant forged are exported as suspect, not as usage: neither
// in the container's series nor in its GPU's sum. Each is logged once
// while it stays forged, and its recovery is logged too.
func TestScrapeFlagsSuspectCounters(t *testing.T) {
	cfg := testConfig(t)
	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	for _, id := range []string{"c-ok", "c-zero", "c-huge", "c-over"} {
		prepare(t, cfg, id, "ml/"+id, "train", a)
	}
	usageOnA(t, cfg, "c-ok", 3*gib, 3*gib, 4)
	usageOnA(t, cfg, "c-zero", 0, 3*gib, 0)           // 0 B shown while 3 GiB is held
	usageOnA(t, cfg, "c-huge", 1<<63-1, 1<<63-1, 0)   // 9.2e18
	usageOnA(t, cfg, "c-over", 20*gib, 20*gib, 1<<62) // past the limit, and launches no process makes

	var logs bytes.Buffer
	c := NewCollector(cfg, twoA100s, slog.New(slog.NewTextHandler(&logs, nil)))
	want := suspectHeader +
		series("nri_vgpu_container_region_suspect", "c-huge", "1") +
		series("nri_vgpu_container_region_suspect", "c-ok", "0") +
		series("nri_vgpu_container_region_suspect", "c-over", "1") +
		series("nri_vgpu_container_region_suspect", "c-zero", "1") +
		usedHeader + series("nri_vgpu_container_memory_used_bytes", "c-ok", "3.221225472e+09") +
		launchesHeader + series("nri_vgpu_container_kernel_launches_total", "c-ok", "4") +
		gpuUsedHeader + `nri_vgpu_gpu_memory_used_bytes{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} 3.221225472e+09
nri_vgpu_gpu_memory_used_bytes{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
` + header[strings.Index(header, "# HELP nri_vgpu_scrape_errors_total"):] + scrapeErrors(nil)
	names := []string{"nri_vgpu_container_region_suspect", "nri_vgpu_container_memory_used_bytes",
		"nri_vgpu_container_kernel_launches_total", "nri_vgpu_gpu_memory_used_bytes", "nri_vgpu_scrape_errors_total"}
	compare(t, c, want, names...)
	compare(t, c, want, names...)
	for _, id := range []string{"c-zero", "c-huge", "c-over"} {
		if n := strings.Count(logs.String(), filepath.Join(id, hoststate.RegionDirName)); n != 1 {
			t.Errorf("%s logged %d times in two scrapes, want once:\n%s", id, n, logs.String())
		}
	}
	if strings.Contains(logs.String(), "c-ok") {
		t.Errorf("the believable region was logged:\n%s", logs.String())
	}

	// The forged process of c-over exits and the region is sound again: its
	// forged launches do not stay in the counter.
	regiontest.Write(t, regionPath(cfg, "c-over"), []region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 0, Cores: 20}}, nil)
	compare(t, c, suspectHeader+
		series("nri_vgpu_container_region_suspect", "c-huge", "1")+
		series("nri_vgpu_container_region_suspect", "c-ok", "0")+
		series("nri_vgpu_container_region_suspect", "c-over", "0")+
		series("nri_vgpu_container_region_suspect", "c-zero", "1")+
		launchesHeader+
		series("nri_vgpu_container_kernel_launches_total", "c-ok", "4")+
		series("nri_vgpu_container_kernel_launches_total", "c-over", "0"),
		"nri_vgpu_container_region_suspect", "nri_vgpu_container_kernel_launches_total")
	if !strings.Contains(logs.String(), "believable again") {
		t.Errorf("the recovery of c-over was not logged:\n%s", logs.String())
	}
}

// Links planted below run_dir are not followed: a linked region is counted
// as an unreadable region, a linked limits file as an unreadable limits
// file, and a linked container directory is no container.
func TestScrapeFollowsNoLink(t *testing.T) {
	cfg := testConfig(t)
	elsewhere := t.TempDir()
	believable := filepath.Join(elsewhere, "usage")
	regiontest.Write(t, believable, []region.DeviceUsage{{UUID: uuidA, Used: gib}},
		[]region.ProcessUsage{{PID: 100, StartTime: 5, Used: []uint64{gib}, Launches: []uint64{0}}})
	forgedLimits := filepath.Join(elsewhere, "limits")
	write(t, forgedLimits, "version=1\ngpu.0.uuid="+uuidA+"\ngpu.0.memory=0\ngpu.0.cores=100\n")

	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	prepare(t, cfg, "c-region", "ml/c-region", "train", a)
	// The tenant deletes the region the host made and plants a link.
	if err := os.Remove(regionPath(cfg, "c-region")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(believable, regionPath(cfg, "c-region")); err != nil {
		t.Fatal(err)
	}
	prepare(t, cfg, "c-limits", "ml/c-limits", "train", a)
	limitsPath := filepath.Join(hoststate.ContainerDir(cfg, "c-limits"), hoststate.LimitsFileName)
	if err := os.Remove(limitsPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(forgedLimits, limitsPath); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, hoststate.ContainerDir(cfg, "c-dir")); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	c := NewCollector(cfg, twoA100s, slog.New(slog.NewTextHandler(&logs, nil)))
	compare(t, c, `
# HELP nri_vgpu_container_memory_limit_bytes Memory limit of the container on the GPU; 0 means no memory limit.
# TYPE nri_vgpu_container_memory_limit_bytes gauge
`+series("nri_vgpu_container_memory_limit_bytes", "c-region", "8.589934592e+09")+
		header[strings.Index(header, "# HELP nri_vgpu_scrape_errors_total"):]+
		scrapeErrors(map[string]int{SourceLimits: 1, SourceRegion: 1}),
		"nri_vgpu_container_memory_limit_bytes", "nri_vgpu_container_memory_used_bytes", "nri_vgpu_scrape_errors_total")
	if n := strings.Count(logs.String(), "symbolic link"); n != 2 {
		t.Errorf("%d log lines name a symbolic link, want 2 (the region, the limits file):\n%s", n, logs.String())
	}
}
