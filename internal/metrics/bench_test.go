package metrics

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const (
	benchGPUs       = 8
	benchContainers = 200
	benchProcs      = 3 // per container
)

// benchNode fills cfg's run_dir with benchContainers containers spread
// over benchGPUs GPUs, each with its limits file, container.json and a
// version 2 region of benchProcs processes, and returns the inventory and
// a utilisation source with a sample per container.
func benchNode(b *testing.B) (*Options, func() *Collector) {
	cfg := testConfig(b)
	inv := &fakeInventory{}
	for i := range benchGPUs {
		inv.devs = append(inv.devs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%08x-0000-4000-8000-000000000000", i),
			Name: "NVIDIA A100-SXM4-80GB", Memory: 80 << 30})
	}
	src := &fakeSource{}
	for i := range benchContainers {
		id := fmt.Sprintf("%064x", i+1)
		uuid := inv.devs[i%benchGPUs].UUID
		prepare(b, cfg, id, fmt.Sprintf("team-%d/job-%d", i%10, i), "worker",
			allocation.GPU{UUID: uuid, Slices: 1, Memory: 2 << 30, Cores: 10})
		var procs []region.ProcessUsage
		for p := range benchProcs {
			procs = append(procs, region.ProcessUsage{PID: int32(100 + p), HostPID: int32(10000 + 10*i + p), StartTime: uint64(p + 1),
				Used: []uint64{256 << 20}, Launches: []uint64{uint64(1000 * (p + 1))}})
		}
		regiontest.WriteV2(b, regionPath(cfg, id), []region.DeviceUsage{{UUID: uuid, Limit: 2 << 30, Used: benchProcs * 256 << 20,
			Cores: 10, Peak: 1 << 30, ThrottledNs: uint64(i) * 1e9}}, procs)
		src.samples = append(src.samples, utilization.Sample{ContainerID: id, PodUID: fmt.Sprintf("uid-%d", i), UUID: uuid, SM: 0.05})
	}
	opts := &Options{Inventory: inv, Utilization: src, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return opts, func() *Collector { return NewCollectorWith(cfg, *opts) }
}

// scrapeOnce gathers c's series and writes them in the text format, as a
// scrape of /metrics does (without the Go and process collectors).
func scrapeOnce(b *testing.B, reg *prometheus.Registry) {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrape is one scrape of a node with 8 GPUs and 200 containers,
// with and without the SM utilisation series. kept-B/op is what the
// collector holds between scrapes (the launch history above all), measured
// once as the live heap it adds after its first scrape.
func BenchmarkScrape(b *testing.B) {
	opts, newCollector := benchNode(b)
	for _, withUtil := range []bool{false, true} {
		b.Run(fmt.Sprintf("utilization=%v", withUtil), func(b *testing.B) {
			util := opts.Utilization
			if !withUtil {
				opts.Utilization = nil
			}
			defer func() { opts.Utilization = util }()

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			c := newCollector()
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			scrapeOnce(b, reg)
			runtime.GC()
			runtime.ReadMemStats(&after)
			kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			if n := len(c.launches); n != benchContainers {
				b.Fatalf("launch history of %d containers, want %d", n, benchContainers)
			}

			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				scrapeOnce(b, reg)
			}
			b.ReportMetric(float64(kept), "kept-B/op")
			runtime.KeepAlive(c)
		})
	}
}
