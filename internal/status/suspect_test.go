package status

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const gib = 1 << 30

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func regionPath(cfg *config.Config, id string) string {
	return filepath.Join(hoststate.ContainerDir(cfg, id), hoststate.RegionDirName, region.FileName)
}

// writeUsage writes container id's region: the device total used and one
// process holding held.
func writeUsage(t *testing.T, cfg *config.Config, id string, used, held uint64) {
	t.Helper()
	regiontest.Write(t, regionPath(cfg, id),
		[]region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: used, Cores: 20}},
		[]region.ProcessUsage{{PID: 10, StartTime: 1, Used: []uint64{held}, Launches: []uint64{0}}})
}

var oneA100 = []gpu.Device{{Index: 0, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 * gib}}

// collect runs Collect with a failure detector: it must not wait on any
// container (the 30 s are a bound for a hung read, not a timing).
func collect(t *testing.T, cfg *config.Config) *Report {
	t.Helper()
	type result struct {
		r   *Report
		err error
	}
	done := make(chan result, 1)
	go func() { r, err := Collect(cfg, oneA100, RegionUsage); done <- result{r, err} }()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatal(res.err)
		}
		return res.r
	case <-time.After(30 * time.Second):
		t.Fatal("Collect did not return")
	}
	return nil
}

// A tenant holding its region's lock does not stall status, which shows
// the container's usage all the same.
func TestCollectDoesNotWaitForALockedRegion(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20})
	writeUsage(t, cfg, "c1", 3*gib, 3*gib)
	holder, err := os.OpenFile(regionPath(cfg, "c1"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLKW, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	r := collect(t, cfg)
	if len(r.Warnings) != 0 {
		t.Errorf("warnings: %v", r.Warnings)
	}
	c := r.GPUs[0].Containers
	if len(c) != 1 || c[0].MemoryUsed == nil || *c[0].MemoryUsed != 3*gib || c[0].Suspect {
		t.Errorf("containers on A = %+v, want c1 using 3GiB", c)
	}
}

// Counters a tenant forged are flagged, with the reason, and never shown
// as memory in use; the limits shown are those of the limits files.
func TestCollectFlagsSuspectCounters(t *testing.T) {
	cfg := testConfig(t)
	tests := []struct {
		id         string
		used, held uint64
		reason     string // "" = believable
	}{
		{"c-ok", 3 * gib, 3 * gib, ""},
		{"c-zero", 0, 3 * gib, "not the sum"},
		{"c-huge", 1<<63 - 1, 1<<63 - 1, "more than the limit"},
		{"c-over", 20 * gib, 20 * gib, "more than the limit"},
	}
	for _, tt := range tests {
		prepare(t, cfg, tt.id, "ml/"+tt.id, allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20})
		writeUsage(t, cfg, tt.id, tt.used, tt.held)
	}
	r := collect(t, cfg)
	byID := map[string]Container{}
	for _, c := range r.GPUs[0].Containers {
		byID[c.ID] = c
	}
	for _, tt := range tests {
		c, ok := byID[tt.id]
		if !ok {
			t.Errorf("%s missing from %+v", tt.id, r.GPUs[0].Containers)
			continue
		}
		if c.MemoryLimit != 8*gib || c.Cores != 20 {
			t.Errorf("%s: limit %d, cores %d; want the limits file's 8GiB and 20%%", tt.id, c.MemoryLimit, c.Cores)
		}
		if tt.reason == "" {
			if c.Suspect || c.MemoryUsed == nil || *c.MemoryUsed != tt.used {
				t.Errorf("%s = %+v, want %d bytes used and not suspect", tt.id, c, tt.used)
			}
			continue
		}
		if !c.Suspect || c.MemoryUsed != nil || !strings.Contains(c.SuspectReason, tt.reason) {
			t.Errorf("%s = %+v, want suspect (%q) without memory used", tt.id, c, tt.reason)
		}
		if !strings.Contains(strings.Join(r.Warnings, "\n"), "container "+tt.id+": usage region: GPU "+uuidA) {
			t.Errorf("warnings %q do not name %s", r.Warnings, tt.id)
		}
	}

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(table.String(), "\n") {
		for _, tt := range tests {
			if !strings.Contains(line, "ml/"+tt.id+" ") {
				continue
			}
			if got := strings.Contains(line, "suspect"); got != (tt.reason != "") {
				t.Errorf("row of %s says suspect: %v, want %v:\n%s", tt.id, got, tt.reason != "", line)
			}
			if strings.Contains(line, "EiB") || strings.Contains(line, "20GiB") {
				t.Errorf("row of %s shows a forged value:\n%s", tt.id, line)
			}
		}
	}

	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		GPUs []struct {
			Containers []map[string]any `json:"containers"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(js.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, c := range raw.GPUs[0].Containers {
		want := c["id"] != "c-ok"
		if got, _ := c["suspect"].(bool); got != want {
			t.Errorf("JSON of %v: suspect = %v, want %v", c["id"], c["suspect"], want)
		}
		if _, has := c["memoryUsed"]; has == want {
			t.Errorf("JSON of %v: memoryUsed present = %v, want %v", c["id"], has, !want)
		}
	}
}

// Links planted below run_dir are not followed: not at the region file (the
// container's region directory is its to write), not at a container's
// directory, not at its limits file.
func TestCollectFollowsNoLink(t *testing.T) {
	cfg := testConfig(t)
	elsewhere := t.TempDir()
	believable := filepath.Join(elsewhere, "usage")
	regiontest.Write(t, believable, []region.DeviceUsage{{UUID: uuidA, Used: gib}},
		[]region.ProcessUsage{{PID: 10, Used: []uint64{gib}, Launches: []uint64{0}}})
	forgedLimits := filepath.Join(elsewhere, "limits")
	if err := os.WriteFile(forgedLimits, []byte("version=1\ngpu.0.uuid="+uuidA+"\ngpu.0.memory=0\ngpu.0.cores=100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	prepare(t, cfg, "c-region", "ml/region", a)
	// The tenant deletes the region the host made and plants a link.
	if err := os.Remove(regionPath(cfg, "c-region")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(believable, regionPath(cfg, "c-region")); err != nil {
		t.Fatal(err)
	}
	prepare(t, cfg, "c-limits", "ml/limits", a)
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

	r := collect(t, cfg)
	cs := r.GPUs[0].Containers
	if len(cs) != 1 || cs[0].ID != "c-region" || cs[0].MemoryUsed != nil || cs[0].MemoryLimit != 8*gib {
		t.Errorf("containers on A = %+v, want only c-region, with its own limit and no usage", cs)
	}
	warnings := strings.Join(r.Warnings, "\n")
	for _, want := range []string{"container c-region: usage region", "container c-limits: limits file"} {
		if !strings.Contains(warnings, want) || !strings.Contains(warnings, "symbolic link") {
			t.Errorf("warnings %q lack %q naming the link", r.Warnings, want)
		}
	}
}
