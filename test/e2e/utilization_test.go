//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// TestSMUtilizationByContainer: three pods share one GPU of the fake
// driver, each container in a pid namespace and a pod cgroup of its own
// (as the kubelet's cgroupfs driver names them). A keeps the GPU busy a
// third of the time, B a ninth, C holds a context and runs nothing.
// nri-vgpu's utilisation Source, run on the host against the same fake
// NVML and state, attributes about 0.33 of the GPU to A's container and
// pod, about 0.11 to B's, and nothing to C; so do nri-vgpu's metrics
// (nri_vgpu_container_sm_utilization_ratio), its driver root holding the
// fake NVML.
func TestSMUtilizationByContainer(t *testing.T) {
	forEachContainerd(t, testSMUtilizationByContainer)
}

func testSMUtilizationByContainer(t *testing.T, containerd string) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 4*time.Minute)
	smutil := filepath.Join(t.TempDir(), "smutil")
	if err := harness.GoBuild(ctx, "./test/e2e/cmd/smutil", smutil, false); err != nil {
		t.Fatal(err)
	}
	// The fake GPU's state, shared by the pods and the host like a real
	// GPU's (the pods' programs make it: it shows their GPU).
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	// nri-vgpu's driver root holds the fake NVML beside the fake device
	// nodes, so that it measures the simulated GPUs; it serves metrics.
	devRoot := t.TempDir()
	minors := make([]int, len(testGPUs))
	for i, g := range testGPUs {
		minors[i] = g.Minor
	}
	if err := harness.MakeFakeNVIDIADevRoot(devRoot, minors); err != nil {
		t.Fatal(err)
	}
	lib, err := os.ReadFile(filepath.Join(root, "shim", "build", "fake", "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(devRoot, "usr", "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(devRoot, "usr", "lib64", "libnvidia-ml.so.1"), lib, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	v := startVGPU(t, containerd, vgpuOptions{
		driver:      fmt.Sprintf("injection = \"none\"\ndev_root = %q\n", devRoot),
		extraConfig: fmt.Sprintf("\n[metrics]\nlisten = %q\n", metricsAddr),
		nriEnv:      []string{"FAKECUDA_STATE=" + shared, "FAKECUDA_HOST_PIDS=1"},
	})
	type podSpec struct {
		name   string
		slices int
		script string // what runs on the GPU, after "cudaprog -m direct init"
	}
	specs := []podSpec{
		// Launches of one 10 ms wave (FAKECUDA_KERNEL_US), few enough that
		// a loaded host keeps the pace. "paced:PCT" follows each
		// (asynchronous) launch with a pause of wave × (100/PCT − 1), so
		// the GPU runs one wave a pause: PCT/(100−PCT) of the time, 25 →
		// 1/3 (under A's share of 50 %), 10 → 1/9 (under B's 25 %).
		{"util-a", 2, "launchfor:40:0:1:paced:25"},
		{"util-b", 1, "launchfor:40:0:1:paced:10"},
		{"util-c", 1, "alloc:1MiB sleep:40000"},
	}
	pods := make([]*kubeletsim.RunningPod, len(specs))
	for i, s := range specs {
		pod := cudaPod(t, s.name, s.slices)
		pod.CgroupParent = "/kubepods/besteffort/pod" + pod.UID
		t.Cleanup(func() { removePodCgroups(t, pod.CgroupParent) })
		pod.Containers[0].Mounts = []kubeletsim.Mount{{HostPath: shared, ContainerPath: "/fakegpu"}}
		pods[i] = v.mustRun(t, ctx, pod)
	}
	uuid := v.allocationOf(t, pods[0], "main").GPUs[0].UUID
	for _, rp := range pods[1:] {
		if g := v.allocationOf(t, rp, "main").GPUs; len(g) != 1 || g[0].UUID != uuid {
			t.Fatalf("pod %s got %+v, want GPU %s shared with pod %s (binpack)", rp.Pod.Name, g, uuid, pods[0].Pod.Name)
		}
	}
	env := fakeDriverEnv(uuid, "/fakegpu") + " FAKECUDA_KERNEL_US=10000"
	for i, s := range specs {
		v.sh(t, ctx, pods[i].ContainerID("main"), env+" cudaprog -m direct init "+s.script+" >/tmp/gpu.log 2>&1 &")
	}
	// The pods' programs make the fake GPU's state (showing their GPU)
	// before nri-vgpu's first scrape loads its NVML, which only starts its
	// window.
	if err := waitFor(ctx, 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(shared, "fakecuda.state"))
		return err == nil
	}); err != nil {
		t.Fatal("the pods' programs made no fake GPU state")
	}
	scrape(t, metricsAddr)
	// Each program has its context once its first call is through; give
	// the loads a moment to reach their pace.
	time.Sleep(3 * time.Second)

	cmd := exec.CommandContext(ctx, smutil, "-library-dir", filepath.Join(root, "shim", "build", "fake"), "-window", "5s")
	cmd.Env = append(os.Environ(), "FAKECUDA_STATE="+shared, "FAKECUDA_DEVICES="+uuid+":16GiB:108", "FAKECUDA_HOST_PIDS=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("smutil: %v\n%s", err, stderr.String())
	}
	var samples []utilization.Sample
	if err := json.Unmarshal(out, &samples); err != nil {
		t.Fatalf("smutil printed %q: %v", out, err)
	}
	t.Logf("samples: %+v", samples)
	got := map[string]utilization.Sample{}
	for _, s := range samples {
		got[s.ContainerID] = s
	}
	// The fake's samples are whole percents, rounded down; a loaded host
	// stretches the pauses, never shortens them.
	for i, want := range []struct{ lo, hi float64 }{{0.25, 0.34}, {0.07, 0.12}} {
		rp := pods[i]
		s, ok := got[rp.ContainerID("main")]
		delete(got, rp.ContainerID("main"))
		switch {
		case !ok:
			t.Errorf("pod %s: no sample for its container %.12s", rp.Pod.Name, rp.ContainerID("main"))
		case s.PodUID != rp.Pod.UID || s.UUID != uuid:
			t.Errorf("pod %s: sample %+v, want pod UID %s and GPU %s", rp.Pod.Name, s, rp.Pod.UID, uuid)
		case s.SM < want.lo || s.SM > want.hi:
			t.Errorf("pod %s (%s): SM %.3f, want %.2f..%.2f", rp.Pod.Name, specs[i].script, s.SM, want.lo, want.hi)
		}
	}
	// C runs nothing: no sample (or one of 0, as NVML may give for a
	// process with a context); nothing for anything else.
	if s, ok := got[pods[2].ContainerID("main")]; ok && s.SM != 0 {
		t.Errorf("pod %s runs nothing: sample %+v", pods[2].Pod.Name, s)
	}
	delete(got, pods[2].ContainerID("main"))
	for id, s := range got {
		t.Errorf("unexpected sample for container %.12s: %+v", id, s)
	}

	// The same through nri-vgpu's metrics, over the window since the
	// first scrape: A and B as above, C 0.
	m := scrape(t, metricsAddr)
	for i, want := range []struct{ lo, hi float64 }{{0.25, 0.34}, {0.07, 0.12}, {0, 0}} {
		id := pods[i].ContainerID("main")
		line := grepLines(grepLines(m, "nri_vgpu_container_sm_utilization_ratio{"), `container_id="`+id+`"`)
		fields := strings.Fields(line)
		if strings.Contains(line, "\n") || len(fields) != 2 {
			t.Errorf("pod %s: the metrics have %q, want one nri_vgpu_container_sm_utilization_ratio of its container\n%s", pods[i].Pod.Name, line, grepLines(m, "sm_utilization"))
			continue
		}
		got, err := strconv.ParseFloat(fields[1], 64)
		if err != nil || got < want.lo || got > want.hi {
			t.Errorf("pod %s: nri_vgpu_container_sm_utilization_ratio %s, want %.2f..%.2f", pods[i].Pod.Name, fields[1], want.lo, want.hi)
		}
	}

	if t.Failed() {
		for i := range pods {
			t.Logf("pod %s: %s", pods[i].Pod.Name, v.sh(t, ctx, pods[i].ContainerID("main"), "cat /tmp/gpu.log"))
		}
	}
}

// scrape returns nri-vgpu's metrics at addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	var body string
	err := waitFor(context.Background(), 20*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	})
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	return body
}

// removePodCgroups removes the (empty) cgroups of a pod's cgroup parent in
// every hierarchy once its containers are gone, and the QoS and kubepods
// cgroups above it where nothing else uses them.
func removePodCgroups(t *testing.T, parent string) {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	if err != nil {
		t.Error(err)
		return
	}
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent)) // cgroup v2 alone
	for _, d := range dirs {
		for p := d; strings.Contains(p, "/kubepods"); p = filepath.Dir(p) {
			if err := os.Remove(p); err != nil {
				break // not there, or still in use
			}
		}
	}
}
