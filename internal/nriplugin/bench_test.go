package nriplugin

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"
)

// BenchmarkCreateContainer measures CreateContainer for a vGPU container
// (verify, Compute with CDI translation, limits file written and synced,
// region directory) and for a container without allocation (Hide), both in
// the plugin alone ("plugin") and as the runtime sees it over the NRI socket
// ("nri"). It reports the median and the 99th percentile per call.
func BenchmarkCreateContainer(b *testing.B) {
	h := newHarness(b, newConfig(b))
	ann, _ := sign(b, h.key, gpu0)
	p := pod("sb1", "uid-1")

	for _, kind := range []string{"gpu", "none"} {
		annotation := ""
		if kind == "gpu" {
			annotation = ann
		}
		b.Run("plugin/"+kind, func(b *testing.B) {
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				i++
				c := container("bp-"+kind+"-"+strconv.Itoa(i), p, annotation)
				start := time.Now()
				if _, _, err := h.plugin.CreateContainer(ctx, p, c); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			reportPercentiles(b, lat)
		})
		b.Run("nri/"+kind, func(b *testing.B) {
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				i++
				req := &adaptation.CreateContainerRequest{
					Pod:       proto.Clone(p).(*api.PodSandbox),
					Container: container("bn-"+kind+"-"+strconv.Itoa(i), p, annotation),
				}
				start := time.Now()
				if _, err := h.r.CreateContainer(ctx, req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
