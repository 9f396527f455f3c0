package metrics

import (
	"os"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const (
	peakHeader = `
# HELP nri_vgpu_container_memory_peak_bytes Most memory the container's processes held on the GPU at once since its usage region was made, from the region (version 2 and later).
# TYPE nri_vgpu_container_memory_peak_bytes gauge
`
	throttledHeader = `
# HELP nri_vgpu_container_sm_throttled_seconds_total Seconds the container's processes had kernel launches waiting on the SM limiter on the GPU, summed over processes, since its usage region was made, from the region (version 2 and later).
# TYPE nri_vgpu_container_sm_throttled_seconds_total counter
`
)

// A version 2 region's peak and throttled time are exported as bytes and
// seconds; a tenant that writes a peak below its use, or a throttled time
// no process can reach, gets its usage on the GPU reported as suspect
// instead, like an impossible memory count. A region made anew starts its
// throttled time over, which the counter shows as it is (a reset).
func TestCollectPeakAndThrottled(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/c1", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20})
	write := func(used, peak, throttledNs uint64) {
		t.Helper()
		regiontest.WriteV2(t, regionPath(cfg, "c1"),
			[]region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: used, Cores: 20, Peak: peak, ThrottledNs: throttledNs}},
			[]region.ProcessUsage{{PID: 100, StartTime: 5, Used: []uint64{used}, Launches: []uint64{9}}})
	}
	c := NewCollector(cfg, twoA100s, nil)
	names := []string{"nri_vgpu_container_memory_peak_bytes", "nri_vgpu_container_sm_throttled_seconds_total",
		"nri_vgpu_container_memory_used_bytes", "nri_vgpu_container_region_suspect"}
	believed := func(used, peak, throttled string) string {
		return usedHeader + series("nri_vgpu_container_memory_used_bytes", "c1", used) +
			peakHeader + series("nri_vgpu_container_memory_peak_bytes", "c1", peak) +
			throttledHeader + series("nri_vgpu_container_sm_throttled_seconds_total", "c1", throttled) +
			suspectHeader + series("nri_vgpu_container_region_suspect", "c1", "0")
	}
	suspect := suspectHeader + series("nri_vgpu_container_region_suspect", "c1", "1")

	write(3*gib, 5*gib, 2_500_000_000)
	compare(t, c, believed("3221225472", "5368709120", "2.5"), names...)

	for _, tt := range []struct {
		name                    string
		used, peak, throttledNs uint64
	}{
		{"peak below the memory in use", 3 * gib, 1 * gib, 0},
		{"throttled longer than 2^62 ns", 3 * gib, 5 * gib, 1<<62 + 1},
	} {
		write(tt.used, tt.peak, tt.throttledNs)
		t.Run(tt.name, func(t *testing.T) { compare(t, c, suspect, names...) })
	}

	// The region made anew: peak and throttled time start over.
	write(1*gib, 1*gib, 250_000_000)
	compare(t, c, believed("1073741824", "1073741824", "0.25"), names...)
}

// A container that has not used the GPU yet holds nothing, held nothing and
// was never throttled: as the empty region the host made when it
// provisioned it says, and as a record of the previous release, which has
// no region until its container's first process makes one, is taken to say.
func TestCollectEmptyRegion(t *testing.T) {
	cfg := testConfig(t)
	a := allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20}
	prepare(t, cfg, "c-new", "ml/c-new", "train", a)
	prepare(t, cfg, "c-old", "ml/c-old", "train", a)
	if err := os.Remove(regionPath(cfg, "c-old")); err != nil {
		t.Fatal(err)
	}
	var want string
	for _, f := range []struct{ header, name string }{
		{usedHeader, "nri_vgpu_container_memory_used_bytes"},
		{peakHeader, "nri_vgpu_container_memory_peak_bytes"},
		{throttledHeader, "nri_vgpu_container_sm_throttled_seconds_total"},
		{launchesHeader, "nri_vgpu_container_kernel_launches_total"},
		{suspectHeader, "nri_vgpu_container_region_suspect"},
	} {
		want += f.header + series(f.name, "c-new", "0") + series(f.name, "c-old", "0")
	}
	// A region that could not be read would have no such series.
	compare(t, NewCollector(cfg, twoA100s, nil), want, "nri_vgpu_container_memory_used_bytes",
		"nri_vgpu_container_memory_peak_bytes", "nri_vgpu_container_sm_throttled_seconds_total",
		"nri_vgpu_container_kernel_launches_total", "nri_vgpu_container_region_suspect")
}
