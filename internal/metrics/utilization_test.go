package metrics

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

// fakeSource is a utilization.Source giving fixed samples or an error.
type fakeSource struct {
	samples []utilization.Sample
	err     error
}

func (f *fakeSource) Samples() ([]utilization.Sample, error) { return f.samples, f.err }

var utilMetrics = []string{
	"nri_vgpu_container_sm_utilization_ratio", "nri_vgpu_container_sm_share_utilization_ratio",
	"nri_vgpu_gpu_sm_utilization_ratio", "nri_vgpu_scrape_errors_total",
}

// SM utilisation per container and GPU: a container's processes by
// container ID, a claim's by its pods' UIDs on its GPUs only; processes of
// no vGPU container count nowhere. A tenant that forges its usage region
// (c1's is suspect) does not hide its utilisation, which the host measures.
// When the source fails, the utilisation series are left out, not 0, and
// so are a claim's when its container.json (which names its pods) cannot
// be read.
func TestCollectUtilization(t *testing.T) {
	cfg := testConfig(t)
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 25})
	regiontest.Write(t, regionPath(cfg, "c1"), []region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 1 << 40, Cores: 25}},
		[]region.ProcessUsage{{PID: 1, HostPID: 4001, StartTime: 5, Used: []uint64{1 << 40}}})
	prepare(t, cfg, "c2", "ml/b", "serve",
		allocation.GPU{UUID: uuidA, Slices: 5, Memory: 20 * gib, Cores: 50},
		allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 * gib, Cores: 10})
	claimID := prepareClaim(t, cfg, "ml", "shared", "11111111-2222-4333-8444-555555555555",
		[]string{"w0", "w1"}, []string{"uid-w0", "uid-w1"},
		allocation.GPU{UUID: uuidB, Slices: 2, Memory: 8 * gib, Cores: 25})
	src := &fakeSource{samples: []utilization.Sample{
		{ContainerID: "c1", PodUID: "uid-a", UUID: uuidA, SM: 0.25},
		{ContainerID: "c1", PodUID: "uid-a", UUID: uuidA, SM: 0.125},
		{ContainerID: "c2", PodUID: "uid-b", UUID: uuidA, SM: 0.25},
		{ContainerID: "w0-ctr", PodUID: "uid-w0", UUID: uuidB, SM: 0.125},
		{ContainerID: "w1-ctr", PodUID: "uid-w1", UUID: uuidB, SM: 0.0625},
		// A pod of the claim on a GPU the claim does not hold.
		{ContainerID: "w1-ctr", PodUID: "uid-w1", UUID: uuidA, SM: 0.5},
		// A process of no vGPU container, and one of another pod.
		{UUID: uuidA, SM: 0.03125},
		{ContainerID: "other", PodUID: "uid-other", UUID: uuidB, SM: 0.5},
	}}
	c := NewCollectorWith(cfg, Options{Inventory: twoA100s, Utilization: src})

	const helpCtr = `
# HELP nri_vgpu_container_sm_utilization_ratio Share of the GPU's SM time the container's processes used, measured by NVML on the host (0-1 of the whole GPU).
# TYPE nri_vgpu_container_sm_utilization_ratio gauge
`
	const helpShare = `
# HELP nri_vgpu_container_sm_share_utilization_ratio SM utilisation of the container as a ratio of its SM-time share (1 = its whole share; above 1 only with the burst cores policy).
# TYPE nri_vgpu_container_sm_share_utilization_ratio gauge
`
	const helpGPU = `
# HELP nri_vgpu_gpu_sm_utilization_ratio Share of the GPU's SM time the vGPU containers' processes used (sum of nri_vgpu_container_sm_utilization_ratio), measured by NVML on the host.
# TYPE nri_vgpu_gpu_sm_utilization_ratio gauge
`
	c1A := `{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"} `
	c2A := `{UUID="` + uuidA + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} `
	c2B := `{UUID="` + uuidB + `",claim="",container="serve",container_id="c2",namespace="ml",pod="b"} `
	clB := `{UUID="` + uuidB + `",claim="shared",container="",container_id="` + claimID + `",namespace="ml",pod=""} `
	gA := `{UUID="` + uuidA + `",gpu="0",name="NVIDIA A100-SXM4-40GB"} `
	gB := `{UUID="` + uuidB + `",gpu="1",name="NVIDIA A100-SXM4-40GB"} `
	want := helpGPU +
		"nri_vgpu_gpu_sm_utilization_ratio" + gA + "0.625\n" +
		"nri_vgpu_gpu_sm_utilization_ratio" + gB + "0.1875\n" +
		helpCtr +
		"nri_vgpu_container_sm_utilization_ratio" + c1A + "0.375\n" +
		"nri_vgpu_container_sm_utilization_ratio" + c2A + "0.25\n" +
		"nri_vgpu_container_sm_utilization_ratio" + c2B + "0\n" +
		"nri_vgpu_container_sm_utilization_ratio" + clB + "0.1875\n" +
		helpShare +
		"nri_vgpu_container_sm_share_utilization_ratio" + c1A + "1.5\n" +
		"nri_vgpu_container_sm_share_utilization_ratio" + c2A + "0.5\n" +
		"nri_vgpu_container_sm_share_utilization_ratio" + c2B + "0\n" +
		"nri_vgpu_container_sm_share_utilization_ratio" + clB + "0.75\n" +
		header + scrapeErrors(nil)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), utilMetrics...); err != nil {
		t.Error(err)
	}
	suspect := `
# HELP nri_vgpu_container_region_suspect 1 when the container's usage region holds impossible counters for the GPU (its memory used, peak, throttled time and kernel launches are then left out), else 0.
# TYPE nri_vgpu_container_region_suspect gauge
nri_vgpu_container_region_suspect` + c1A + `1
nri_vgpu_container_region_suspect` + c2A + `0
nri_vgpu_container_region_suspect` + c2B + `0
nri_vgpu_container_region_suspect` + clB + `0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(suspect), "nri_vgpu_container_region_suspect"); err != nil {
		t.Error(err)
	}

	// NVML fails: counted, and the utilisation series are left out.
	src.err = errors.New("nvmlDeviceGetProcessUtilization: GPU is lost")
	if err := testutil.CollectAndCompare(c, strings.NewReader(header+scrapeErrors(map[string]int{SourceNVML: 1})), utilMetrics...); err != nil {
		t.Errorf("with NVML failing: %v", err)
	}
	if n := testutil.CollectAndCount(c, "nri_vgpu_container_sm_limit_ratio"); n != 4 {
		t.Errorf("with NVML failing: %d nri_vgpu_container_sm_limit_ratio series, want 4", n)
	}
	src.err = nil
	// Two failed scrapes: the comparison's and the count's.
	want = strings.Replace(want, `source="nvml"} 0`, `source="nvml"} 2`, 1)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), utilMetrics...); err != nil {
		t.Errorf("after NVML came back: %v", err)
	}

	// Without its container.json, the claim's pods are unknown: its
	// utilisation is left out (and adds nothing to B's), not 0.
	write(t, filepath.Join(hoststate.ContainerDir(cfg, claimID), hoststate.InfoFileName), "{")
	want = helpGPU +
		"nri_vgpu_gpu_sm_utilization_ratio" + gA + "0.625\n" +
		"nri_vgpu_gpu_sm_utilization_ratio" + gB + "0\n" +
		helpCtr +
		"nri_vgpu_container_sm_utilization_ratio" + c1A + "0.375\n" +
		"nri_vgpu_container_sm_utilization_ratio" + c2A + "0.25\n" +
		"nri_vgpu_container_sm_utilization_ratio" + c2B + "0\n" +
		helpShare +
		"nri_vgpu_container_sm_share_utilization_ratio" + c1A + "1.5\n" +
		"nri_vgpu_container_sm_share_utilization_ratio" + c2A + "0.5\n" +
		"nri_vgpu_container_sm_share_utilization_ratio" + c2B + "0\n" +
		header + scrapeErrors(map[string]int{SourceNVML: 2, SourceContainerInfo: 1})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), utilMetrics...); err != nil {
		t.Errorf("with the claim's container.json broken: %v", err)
	}
}
