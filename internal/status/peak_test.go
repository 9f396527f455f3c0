package status

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

// The peak and the throttled time of a version 2 region are shown; a
// version 1 region (a container started with an earlier shim) has neither,
// and counters Check does not believe are not shown at all.
func TestCollectPeakAndThrottled(t *testing.T) {
	cfg := testConfig(t)
	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	for _, id := range []string{"c1", "c2", "c3"} {
		prepare(t, cfg, id, "ml/"+id, a)
	}
	proc := []region.ProcessUsage{{PID: 10, StartTime: 1, Used: []uint64{3 * gib}, Launches: []uint64{4}}}
	regiontest.WriteV2(t, regionPath(cfg, "c1"),
		[]region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 3 * gib, Cores: 20, Peak: 5 * gib, ThrottledNs: 12_500_000_000}}, proc)
	regiontest.Write(t, regionPath(cfg, "c2"),
		[]region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 3 * gib, Cores: 20}}, proc)
	// A peak below what is in use: forged.
	regiontest.WriteV2(t, regionPath(cfg, "c3"),
		[]region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 3 * gib, Cores: 20, Peak: 1 * gib, ThrottledNs: 7_000_000_000}}, proc)

	r := collect(t, cfg)
	if len(r.GPUs) != 1 || len(r.GPUs[0].Containers) != 3 {
		t.Fatalf("GPUs = %+v, want A with c1, c2, c3", r.GPUs)
	}
	c1, c2, c3 := r.GPUs[0].Containers[0], r.GPUs[0].Containers[1], r.GPUs[0].Containers[2]
	if c1.MemoryPeak == nil || *c1.MemoryPeak != 5*gib || c1.ThrottledSeconds == nil || *c1.ThrottledSeconds != 12.5 {
		t.Errorf("c1 (version 2) = %+v, want a peak of 5 GiB and 12.5 s throttled", c1)
	}
	if c2.MemoryUsed == nil || *c2.MemoryUsed != 3*gib || c2.MemoryPeak != nil || c2.ThrottledSeconds != nil {
		t.Errorf("c2 (version 1) = %+v, want 3 GiB used and neither peak nor throttled time", c2)
	}
	if !c3.Suspect || !strings.Contains(c3.SuspectReason, "peak") || c3.MemoryUsed != nil || c3.MemoryPeak != nil || c3.ThrottledSeconds != nil {
		t.Errorf("c3 (peak below used) = %+v, want suspect, naming the peak, with nothing shown", c3)
	}

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, l := range strings.Split(table.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for id, want := range map[string]string{
		"CONTAINER": "CONTAINER POD NAME SLICES MEMORY LIMIT MEMORY USED MEMORY PEAK CORES THROTTLED",
		"c1":        "c1 ml/c1 ctr-c1 2 8GiB 3GiB 5GiB 20% 12.5s",
		"c2":        "c2 ml/c2 ctr-c2 2 8GiB 3GiB - 20% -",
		"c3":        "c3 ml/c3 ctr-c3 2 8GiB suspect - 20% -",
	} {
		if rows[id] != want {
			t.Errorf("row %s = %q, want %q\n%s", id, rows[id], want, table.String())
		}
	}
}

// A container that has not used the GPU yet shows the empty region the
// host made when it provisioned it: nothing in use, no peak, nothing
// throttled. A record without a region (made by the previous release,
// which left the region to the container's first process) shows nothing
// known, and no warning either.
func TestCollectEmptyRegion(t *testing.T) {
	cfg := testConfig(t)
	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	prepare(t, cfg, "c-new", "ml/new", a)
	prepare(t, cfg, "c-old", "ml/old", a)
	if err := os.Remove(regionPath(cfg, "c-old")); err != nil {
		t.Fatal(err)
	}

	r := collect(t, cfg)
	if len(r.GPUs) != 1 || len(r.GPUs[0].Containers) != 2 || len(r.Warnings) != 0 {
		t.Fatalf("GPUs = %+v, warnings %q; want A with c-new and c-old, no warning", r.GPUs, r.Warnings)
	}
	cNew, cOld := r.GPUs[0].Containers[0], r.GPUs[0].Containers[1]
	if cNew.MemoryUsed == nil || *cNew.MemoryUsed != 0 || cNew.MemoryPeak == nil || *cNew.MemoryPeak != 0 ||
		cNew.ThrottledSeconds == nil || *cNew.ThrottledSeconds != 0 || cNew.Suspect {
		t.Errorf("c-new = %+v, want 0 bytes used, a peak of 0, 0 s throttled", cNew)
	}
	if cOld.MemoryUsed != nil || cOld.MemoryPeak != nil || cOld.ThrottledSeconds != nil || cOld.Suspect {
		t.Errorf("c-old = %+v, want nothing known", cOld)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"c-new ml/new ctr-c-new 2 8GiB 0B 0B 20% 0.0s", "c-old ml/old ctr-c-old 2 8GiB - - 20% -"} {
		found := false
		for _, l := range strings.Split(table.String(), "\n") {
			found = found || strings.Join(strings.Fields(l), " ") == want
		}
		if !found {
			t.Errorf("no row %q in\n%s", want, table.String())
		}
	}
}
