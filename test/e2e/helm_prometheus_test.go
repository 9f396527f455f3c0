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

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// promInterval is the harness Prometheus' scrape interval: a counter read
// this far apart has been scraped again.
const promInterval = 2 * time.Second

// prometheus: Debian's Prometheus, finding the chart's NRI plugin through
// its metrics Service as a cluster Prometheus would (the ServiceMonitor's
// labels, port and job name, node by docs/metrics.md's relabelling), with
// the chart's alerting rules loaded, scrapes one target, up, whose `node`
// is the node's name. While a GPU pod's workload holds 3900 MiB of its
// 4 GiB slice and launches kernels flat out, more than its 25 % share of SM
// time, PromQL gives that pod's container, on its node and GPU: the memory
// it holds and its peak, the slice's memory limit and SM share, launch
// counts that grow, seconds held back by the SM limiter that grow, and an
// SM utilisation above 0 (of the GPU and of its share); the
// near-memory-limit alert is pending or firing for it, and neither
// plugin-down alert is (their job selector matches the scrape's job).
//
// The NRI plugin's pod is not on the host network: Prometheus on the host
// reaches it at its pod address on the test's CNI bridge, which holds the
// gateway address on the host (as the kubelet's probes do), so the scrape
// goes where a cluster Prometheus's would, not through a port of the host.
func (h *helmNode) prometheus(t *testing.T, ctx context.Context) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	state := h.fakeGPUState()
	if err := os.MkdirAll(state, 0o777); err != nil {
		t.Fatal(err)
	}
	pod := podSpec("cuda-prom", cudaTestImage, 1)
	pod.Spec.Volumes = []corev1.Volume{{Name: "fakegpu", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: state}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "fakegpu", MountPath: "/fakegpu"}}
	id := h.runPod(t, ctx, pod)
	a := h.allocationOfContainer(t, ctx, id)
	if len(a.GPUs) != 1 || a.GPUs[0].Memory != sliceMemory || a.GPUs[0].Cores != sliceCores {
		t.Fatalf("allocation = %+v, want one slice (%d bytes, %d %% of the SMs)", a.GPUs, sliceMemory, sliceCores)
	}
	uuid := a.GPUs[0].UUID
	// Over 90 % of the slice, as the alert wants; the shim's first grant
	// is exactly what is asked, so used is this to the byte. The workload
	// runs on in the container after the exec returns; the pod's deletion
	// ends it. Each launchfor prints the share of the GPU's time its 8 s
	// had (the last 7 of them): the log shows the workload held to its
	// share.
	const held = 3900 << 20
	workload := fmt.Sprintf("%s cudaprog -m direct init alloc:3900MiB%s </dev/null >/tmp/workload.log 2>&1 &",
		fakeDriverEnv(uuid, "/fakegpu"), strings.Repeat(" launchfor:8:1:1", 75))
	if res, err := h.c.Exec(ctx, id, "/bin/sh", "-c", workload); err != nil || res.ExitCode != 0 {
		t.Fatalf("starting the workload: %v, %+v", err, res)
	}
	logged := false
	workloadLog := func() {
		if !logged {
			logged = true
			res, err := h.c.Exec(context.Background(), id, "/bin/sh", "-c", "cat /tmp/workload.log")
			t.Logf("the workload's output (%v):\n%s%s", err, res.Stdout, res.Stderr)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			workloadLog()
		}
	})
	// The workload makes the fake GPU's state (showing its GPU) before
	// the first scrape loads the NRI plugin's NVML, as a real GPU exists
	// before it.
	if err := waitFor(ctx, 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(state, "fakecuda.state"))
		return err == nil
	}); err != nil {
		t.Fatal("the workload made no fake GPU state")
	}

	rules := filepath.Join(root, "packaging", "helm", "nri-vgpu", "rules", "nri-vgpu.rules.yaml")
	p := startPrometheus(t, ctx, h.k, []string{rules}, harness.ServiceJob{
		// The job name the chart's ServiceMonitor gives its targets (the
		// Service's name), which the rules' plugin-down alerts select.
		Name: chartRelease + "-metrics", Namespace: "kube-system", Port: "metrics",
		// What the ServiceMonitor selects.
		ServiceLabels: map[string]string{
			"app.kubernetes.io/name":      "nri-vgpu",
			"app.kubernetes.io/instance":  chartRelease,
			"app.kubernetes.io/component": "nri-plugin",
		},
	})
	up := waitQuery(t, ctx, p, time.Minute, `up`, func(v model.Vector) bool { return len(v) == 1 && v[0].Value == 1 })
	wantLabels(t, up[0], map[string]string{"node": h.k.NodeName, "job": chartRelease + "-metrics"})

	ctr := fmt.Sprintf(`{namespace=%q,pod=%q,container="main"}`, podNamespace, pod.Name)
	labels := map[string]string{"node": h.k.NodeName, "UUID": uuid, "container_id": id, "claim": ""}
	for _, c := range []struct {
		series string
		want   float64
	}{
		{"nri_vgpu_container_memory_used_bytes", held},
		{"nri_vgpu_container_memory_peak_bytes", held},
		{"nri_vgpu_container_memory_limit_bytes", sliceMemory},
		{"nri_vgpu_container_sm_limit_ratio", sliceCores / 100.0},
	} {
		got := waitQuery(t, ctx, p, time.Minute, c.series+ctr, func(v model.Vector) bool { return len(v) == 1 && float64(v[0].Value) == c.want })
		wantLabels(t, got[0], labels)
	}
	growing(t, ctx, p, "nri_vgpu_container_kernel_launches_total"+ctr)
	growing(t, ctx, p, "nri_vgpu_container_sm_throttled_seconds_total"+ctr)
	// Measured by NVML on the host side, the processes found by host pid
	// in the host's /proc the chart mounts, mapped to the container by
	// their cgroup.
	for _, series := range []string{"nri_vgpu_container_sm_utilization_ratio", "nri_vgpu_container_sm_share_utilization_ratio"} {
		got := waitQuery(t, ctx, p, time.Minute, series+ctr, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })
		t.Logf("%v", got[0])
		wantLabels(t, got[0], labels)
	}

	h.wantAlerts(t, ctx, p, pod.Name)

	if t.Failed() {
		workloadLog()
	}
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

// wantAlerts waits until the chart's near-memory-limit alert is pending or
// firing for pod's container on the node, and checks that neither
// plugin-down alert is active.
func (h *helmNode) wantAlerts(t *testing.T, ctx context.Context, p *harness.Prometheus, pod string) {
	t.Helper()
	var alerts []promv1.Alert
	var last error
	found := func() bool {
		r, err := p.API.Alerts(ctx)
		if err != nil {
			last = err
			return false
		}
		alerts = r.Alerts
		for _, a := range alerts {
			if a.Labels["alertname"] == "NriVgpuContainerMemoryNearLimit" && string(a.Labels["pod"]) == pod &&
				string(a.Labels["node"]) == h.k.NodeName && (a.State == promv1.AlertStatePending || a.State == promv1.AlertStateFiring) {
				return true
			}
		}
		return false
	}
	if err := waitFor(ctx, 30*time.Second, func() bool {
		if found() {
			return true
		}
		time.Sleep(500 * time.Millisecond)
		return false
	}); err != nil {
		t.Errorf("no NriVgpuContainerMemoryNearLimit alert for pod %s on %s (%v); alerts: %+v", pod, h.k.NodeName, last, alerts)
	}
	for _, a := range alerts {
		if name := a.Labels["alertname"]; name == "NriVgpuPluginDown" || name == "NriVgpuPluginAbsent" {
			t.Errorf("alert %s %s: %v", name, a.State, a.Labels)
		}
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
