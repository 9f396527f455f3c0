//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// promInterval is the harness Prometheus' scrape interval: a counter read
// this far apart has been scraped again.
const promInterval = 2 * time.Second

// prometheus: Debian's Prometheus, finding the chart's NRI plugin through
// its metrics Service as a cluster Prometheus would (the ServiceMonitor's
// labels and port, node by docs/metrics.md's relabelling), scrapes one
// target, up, whose `node` is the node's name; while a GPU pod's workload
// holds 1 GiB and launches kernels flat out on a 25 % slice, PromQL gives
// that pod's container the memory it holds, its slice's limit, and launch
// counts that grow.
//
// The NRI plugin's pod is not on the host network: Prometheus on the host
// reaches it at its pod address on the test's CNI bridge, which holds the
// gateway address on the host (as the kubelet's probes do), so the scrape
// goes where a cluster Prometheus's would, not through a port of the host.
func (h *helmNode) prometheus(t *testing.T, ctx context.Context) {
	p := startPrometheus(t, ctx, h.k, nil, harness.ServiceJob{
		Name: "nri-vgpu", Namespace: "kube-system", Port: "metrics",
		// What the chart's ServiceMonitor selects.
		ServiceLabels: map[string]string{
			"app.kubernetes.io/name":      "nri-vgpu",
			"app.kubernetes.io/instance":  chartRelease,
			"app.kubernetes.io/component": "nri-plugin",
		},
	})
	up := waitQuery(t, ctx, p, time.Minute, `up{job="nri-vgpu"}`, func(v model.Vector) bool { return len(v) == 1 && v[0].Value == 1 })
	if got := string(up[0].Metric["node"]); got != h.k.NodeName {
		t.Errorf("up%v: node %q, want the node's name %q", up[0].Metric, got, h.k.NodeName)
	}

	pod := podSpec("cuda-prom", cudaTestImage, 1)
	id := h.runPod(t, ctx, pod)
	a := h.allocationOfContainer(t, ctx, id)
	if len(a.GPUs) != 1 || a.GPUs[0].Memory != sliceMemory || a.GPUs[0].Cores != sliceCores {
		t.Fatalf("allocation = %+v, want one slice (%d bytes, %d %% of the SMs)", a.GPUs, sliceMemory, sliceCores)
	}
	uuid := a.GPUs[0].UUID
	// The workload runs on in the container after the exec returns; the
	// pod's deletion ends it.
	const held = 1 << 30
	workload := fmt.Sprintf("%s cudaprog -m direct init alloc:1GiB launchfor:600:0:1 </dev/null >/tmp/workload.log 2>&1 &", fakeDriverEnv(uuid, "/tmp"))
	if res, err := h.c.Exec(ctx, id, "/bin/sh", "-c", workload); err != nil || res.ExitCode != 0 {
		t.Fatalf("starting the workload: %v, %+v", err, res)
	}
	t.Cleanup(func() {
		if t.Failed() {
			res, _ := h.c.Exec(context.Background(), id, "/bin/sh", "-c", "cat /tmp/workload.log; ps")
			t.Logf("the workload's output and the container's processes:\n%s%s", res.Stdout, res.Stderr)
		}
	})

	ctr := fmt.Sprintf(`{namespace=%q,pod=%q,container="main"}`, podNamespace, pod.Name)
	used := waitQuery(t, ctx, p, time.Minute, "nri_vgpu_container_memory_used_bytes"+ctr,
		func(v model.Vector) bool { return len(v) == 1 && v[0].Value == held })
	wantLabels(t, used[0], map[string]string{"node": h.k.NodeName, "UUID": uuid, "container_id": id, "job": "nri-vgpu"})
	limit := waitQuery(t, ctx, p, 10*time.Second, "nri_vgpu_container_memory_limit_bytes"+ctr, one)
	if limit[0].Value != sliceMemory {
		t.Errorf("%v, want the slice's %d bytes", limit[0], sliceMemory)
	}
	wantLabels(t, limit[0], map[string]string{"node": h.k.NodeName, "UUID": uuid})
	growing(t, ctx, p, "nri_vgpu_container_kernel_launches_total"+ctr)

	// Gone before the daemons change, so that its host state is removed
	// by the NRI plugin that made it.
	dir := h.hostContainerDir(id)
	h.deletePod(t, ctx, pod)
	if err := waitFor(ctx, 90*time.Second, func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	}); err != nil {
		t.Errorf("%s still there after the pod was deleted", filepath.Base(dir))
	}
}

// wantLabels checks labels of s.
func wantLabels(t *testing.T, s *model.Sample, want map[string]string) {
	t.Helper()
	var wrong []string
	for k, v := range want {
		if got := string(s.Metric[model.LabelName(k)]); got != v {
			wrong = append(wrong, fmt.Sprintf("%s=%q (want %q)", k, got, v))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%v: %s", s, strings.Join(wrong, ", "))
	}
}

// growing checks that the one series q selects is higher a few scrapes
// later than it is now.
func growing(t *testing.T, ctx context.Context, p *harness.Prometheus, q string) {
	t.Helper()
	first := waitQuery(t, ctx, p, 30*time.Second, q, one)
	time.Sleep(3 * promInterval)
	second := waitQuery(t, ctx, p, 10*time.Second, q, one)
	if second[0].Value <= first[0].Value {
		t.Errorf("%s: %v, then %v %v later; want it to grow", q, first[0], second[0], 3*promInterval)
	}
}
