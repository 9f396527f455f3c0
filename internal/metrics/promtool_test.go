package metrics

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/promserver"
	"github.com/nri-vgpu/nri-vgpu/internal/promserver/promtooltest"
	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

// realisticNode fills cfg's run_dir with what a busy node holds: containers
// of the device plugin with processes (one with a version 1 region of an
// earlier release's shim), a DRA claim serving two pods, a container not
// started yet (the empty region the host made), one whose region is suspect, one whose limits
// file is broken, and runtime.json. It returns an inventory of its two GPUs
// and a utilisation source for its processes.
func realisticNode(t *testing.T, cfg *config.Config) (Inventory, utilization.Source) {
	t.Helper()
	prepare(t, cfg, "c1", "ml/train-0", "train", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 * gib, Cores: 20})
	regiontest.WriteV2(t, regionPath(cfg, "c1"), []region.DeviceUsage{{UUID: uuidA, Limit: 8 * gib, Used: 3 * gib, Cores: 20, Peak: 6 * gib, ThrottledNs: 12_345_678_901}},
		[]region.ProcessUsage{
			{PID: 100, HostPID: 4100, StartTime: 5, Used: []uint64{1 * gib}, Launches: []uint64{5}},
			{PID: 101, HostPID: 4101, StartTime: 6, Used: []uint64{2 * gib}, Launches: []uint64{7}},
		})
	prepare(t, cfg, "c2", "web/serve-0", "serve",
		allocation.GPU{UUID: uuidA, Slices: 5, Memory: 20 * gib, Cores: 50},
		allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 * gib, Cores: 10})
	prepare(t, cfg, "c5", "ml/old", "legacy", allocation.GPU{UUID: uuidA, Slices: 1, Memory: 4 * gib, Cores: 10})
	regiontest.Write(t, regionPath(cfg, "c5"), []region.DeviceUsage{{UUID: uuidA, Limit: 4 * gib, Used: 1 * gib, Cores: 10}},
		[]region.ProcessUsage{{PID: 1, HostPID: 7001, StartTime: 2, Used: []uint64{1 * gib}, Launches: []uint64{3}}})
	prepare(t, cfg, "c3", "ml/forger", "evil", allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 * gib, Cores: 10})
	regiontest.Write(t, regionPath(cfg, "c3"), []region.DeviceUsage{{UUID: uuidB, Limit: 4 * gib, Used: 1 << 40, Cores: 10}},
		[]region.ProcessUsage{{PID: 1, HostPID: 5001, StartTime: 9, Used: []uint64{1 << 40}, Launches: []uint64{1}}})
	prepare(t, cfg, "c4", "ml/broken", "x", allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 * gib, Cores: 10})
	write(t, filepath.Join(hoststate.ContainerDir(cfg, "c4"), hoststate.LimitsFileName), "version=99\n")
	id := prepareClaim(t, cfg, "ml", "shared", "11111111-2222-4333-8444-555555555555",
		[]string{"worker-0", "worker-1"}, []string{"uid-w0", "uid-w1"},
		allocation.GPU{UUID: uuidB, Slices: 2, Memory: 8 * gib, Cores: 25})
	regiontest.WriteV2(t, regionPath(cfg, id), []region.DeviceUsage{{UUID: uuidB, Limit: 8 * gib, Used: 1 * gib, Cores: 25, Peak: 2 * gib, ThrottledNs: 40_000}},
		[]region.ProcessUsage{{PID: 7, HostPID: 6007, StartTime: 3, Used: []uint64{1 * gib}, Launches: []uint64{40}}})
	if err := hoststate.WriteRuntime(cfg, &hoststate.Runtime{Name: "containerd", Version: "v2.4.2", NRIVersion: "v0.12.3",
		Confinement: true, ConfinementPolicy: "required"}); err != nil {
		t.Fatal(err)
	}
	return twoA100s, &fakeSource{samples: []utilization.Sample{
		{ContainerID: "c1", PodUID: "uid-train-0", UUID: uuidA, SM: 0.18},
		{ContainerID: "c5", PodUID: "uid-old", UUID: uuidA, SM: 0.1},
		{ContainerID: "w0", PodUID: "uid-w0", UUID: uuidB, SM: 0.2},
	}}
}

// What the endpoint serves for a realistic node passes `promtool check
// metrics` (Debian's pinned promtool, the one the project's Prometheus
// runs): names, units, HELP, counters, label names, the text format
// itself. Any complaint fails the test.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := promtooltest.Promtool(t)
	cfg := testConfig(t)
	inv, util := realisticNode(t, cfg)
	c := NewCollectorWith(cfg, Options{Inventory: inv, Utilization: util, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h := promserver.Handler(NewRegistry(c), nil, nil)
	var body []byte
	for range 2 { // the second scrape has launch history and counted errors
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET /metrics: %d\n%s", rec.Code, rec.Body.String())
		}
		body = rec.Body.Bytes()
	}
	// The check saw the series this package exports, not an empty page.
	for _, want := range []string{
		`nri_vgpu_container_memory_used_bytes{UUID="` + uuidA + `",claim="",container="train"`,
		`nri_vgpu_container_region_suspect{UUID="` + uuidB + `",claim="",container="evil"`,
		`nri_vgpu_claim_pod_info{claim="shared",namespace="ml",pod="worker-1"} 1`,
		`nri_vgpu_container_memory_peak_bytes{UUID="` + uuidB + `",claim="shared",container="",`,
		`nri_vgpu_container_sm_throttled_seconds_total{UUID="` + uuidA + `",claim="",container="train",container_id="c1",namespace="ml",pod="train-0"} 12.345678901`,
		`nri_vgpu_container_sm_share_utilization_ratio{UUID="` + uuidB + `",claim="shared",`,
		`nri_vgpu_gpu_sm_utilization_ratio{UUID="` + uuidA + `"`,
		`nri_vgpu_scrape_errors_total{source="limits"} 2`,
		`nri_vgpu_confinement_available{`,
		`go_goroutines `,
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Fatalf("the scrape lacks %s:\n%s", want, body)
		}
	}

	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running %s: %v", promtool, err)
	}
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s\nthe scrape:\n%s", err, out, body)
	}
}
