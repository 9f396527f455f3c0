//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// Image of the chart's pods, built from this tree's binaries and shim.
const (
	chartImageRepo = "nri-vgpu.test/nri-vgpu"
	chartImageTag  = "e2e"
)

// chartRelease is the Helm release the chart is installed as; both
// DaemonSets are named after it.
const chartRelease = "nri-vgpu"

// buildChartImage writes the image the chart runs into dir: both daemons,
// the shim and the static pin hook at the paths of packaging/Dockerfile,
// and the busybox shell the shim-installing init container runs.
func buildChartImage(dir string) (string, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	if err := cmpErr(binaries.nriErr, binaries.dpErr, binaries.hookErr); err != nil {
		return "", fmt.Errorf("the daemons and the hook: %w", err)
	}
	return harness.BuildBusyboxImage(dir, chartImageRepo+":"+chartImageTag, nil,
		image.File{Src: binaries.nriPlugin, Dst: "/usr/bin/nri-vgpu", Mode: 0o755, WithLibs: true},
		image.File{Src: binaries.devicePlugin, Dst: "/usr/bin/nri-vgpu-device-plugin", Mode: 0o755, WithLibs: true},
		image.File{Src: filepath.Join(root, "shim", "build", "libvgpu-shim.so"), Dst: "/usr/lib/nri-vgpu/libvgpu-shim.so", Mode: 0o644},
		// Without its libraries: it has none.
		image.File{Src: binaries.hook, Dst: "/usr/lib/nri-vgpu/nri-vgpu-hook", Mode: 0o755})
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// helmNode is a cluster node whose daemons come from the chart.
type helmNode struct {
	*clusterNode
	helm string
}

// helm runs the pinned helm against the cluster.
func (h *helmNode) run(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	args = append(args, "--kubeconfig", h.k.Kubeconfig)
	out, err := exec.CommandContext(ctx, h.helm, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// chartValues are the release's values: this tree's image (imported, never
// pulled), the node's simulated GPUs split splits ways, and every host path
// in the node's directories.
func (h *helmNode) chartValues(t *testing.T, splits int) string {
	t.Helper()
	// The config names the paths as the host has them; the NRI plugin's pod
	// sees the fake device root at /host.
	shimDir := filepath.Join(h.base, "shim")
	inPod := *h.vgpu
	inPod.devRoot = "/host"
	// The fake NVML, for the metrics' SM utilisation (helmNode.prometheus),
	// beneath the driver root as the pod sees it: in the host's /dev,
	// the only host directory the pod has at /host.
	if err := os.MkdirAll(filepath.Join(h.devRoot, "dev", fakeNVMLDir), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	lib, err := os.ReadFile(filepath.Join(root, "shim", "build", "fake", "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.devRoot, "dev", fakeNVMLDir, "libnvidia-ml.so.1"), lib, 0o755); err != nil {
		t.Fatal(err)
	}
	driver := fmt.Sprintf("injection = \"none\"\ndev_root = \"/host\"\nlibrary_dirs = [%q]\n", "/dev/"+fakeNVMLDir)
	config := strings.Replace(configTOML(&inPod, harness.DevicePluginDir, filepath.Join(shimDir, "libvgpu-shim.so"), vgpuOptions{driver: driver}),
		fmt.Sprintf("split_count = %d", splitCount), fmt.Sprintf("split_count = %d", splits), 1)
	values := map[string]any{
		"image":  map[string]any{"repository": chartImageRepo, "tag": chartImageTag, "pullPolicy": "Never"},
		"config": config,
		// The metrics Service Prometheus scrapes (helmNode.prometheus).
		"metrics": map[string]any{"enabled": true},
		// The fake NVML in the NRI plugin reads the fake GPU's state,
		// which the GPU pods' programs write, and names their processes
		// by host pid, from the host's /proc the chart gives the pod.
		"nriPlugin": map[string]any{"extraEnv": []map[string]string{
			{"name": "FAKECUDA_STATE", "value": h.fakeGPUState()},
			{"name": "FAKECUDA_HOST_PIDS", "value": "1"},
			{"name": "FAKECUDA_PROC", "value": "/host/proc"},
		}},
		"hostPaths": map[string]any{
			"nriSocketDir": filepath.Dir(h.nriSocket),
			"stateDir":     h.stateDir,
			"runDir":       h.runDir,
			"shimDir":      shimDir,
			"dev":          filepath.Join(h.devRoot, "dev"),
			// The test node has no CDI specs; the defaults would create
			// /etc/cdi and /var/run/cdi on the host.
			"cdiDirs": []string{},
		},
	}
	raw, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.base, fmt.Sprintf("values-%d.yaml", splits))
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeNVMLDir is where, in the node's /dev, the fake NVML lies.
const fakeNVMLDir = "nri-vgpu-e2e-nvml"

// fakeGPUState is the directory of the fake GPU's state on the node, shared
// by the GPU pods' programs and the NRI plugin's NVML as a real GPU is: in
// run_dir, the one host directory the NRI plugin's pod can write.
func (h *helmNode) fakeGPUState() string { return filepath.Join(h.runDir, "fakegpu") }

// daemonSets are the chart's two DaemonSets.
var daemonSets = []string{chartRelease + "-device-plugin", chartRelease + "-nri-plugin"}

// waitRolledOut waits until each of the chart's DaemonSets has its pod
// updated to its latest template and ready, and returns the pods' UIDs.
func (h *helmNode) waitRolledOut(t *testing.T, ctx context.Context) []string {
	t.Helper()
	var last string
	err := waitFor(ctx, 2*time.Minute, func() bool {
		for _, name := range daemonSets {
			ds, err := h.k.Client.AppsV1().DaemonSets("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false
			}
			if !rolledOut(ds) {
				last = fmt.Sprintf("%s: generation %d observed %d, desired %d, updated %d, ready %d, available %d", name,
					ds.Generation, ds.Status.ObservedGeneration, ds.Status.DesiredNumberScheduled,
					ds.Status.UpdatedNumberScheduled, ds.Status.NumberReady, ds.Status.NumberAvailable)
				return false
			}
		}
		return true
	})
	if err != nil {
		pods, _ := h.k.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		var states []string
		if pods != nil {
			for i := range pods.Items {
				states = append(states, pods.Items[i].Name+": "+describePod(&pods.Items[i]))
			}
		}
		t.Fatalf("the chart's DaemonSets did not roll out (%s); pods:\n%s", last, strings.Join(states, "\n"))
	}
	pods, err := h.k.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + chartRelease})
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			uids = append(uids, string(p.UID))
		}
	}
	return uids
}

// rolledOut: one pod scheduled, of the latest template, ready, and no
// other left.
func rolledOut(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled == 1 &&
		s.UpdatedNumberScheduled == 1 && s.NumberReady == 1 && s.NumberAvailable == 1 && s.CurrentNumberScheduled == 1
}

// TestHelmChart installs packaging/helm/nri-vgpu into a real cluster, with
// an image built from this tree: both DaemonSets become ready, the device
// plugin from the chart registers (the node advertises the slices), the NRI
// plugin from the chart connects to containerd (it edits new containers),
// and a GPU pod gets its slice through them, limited by the shim the chart
// installed. Prometheus, scraping the chart's metrics Service, sees what a
// GPU pod's workload holds and does (helmNode.prometheus). helm upgrade
// with another config rolls both pods (the node then advertises the new
// split), and helm uninstall leaves no socket, mount or container directory
// of the chart's daemons behind.
func TestHelmChart(t *testing.T) { forEachKubernetes(t, testHelmChart) }

func testHelmChart(t *testing.T, version string) {
	if images.cudaTestErr != nil {
		t.Fatalf("the CUDA test image: %v", images.cudaTestErr)
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 10*time.Minute)
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "helm.sh"), "bin").Output()
	if err != nil {
		t.Fatalf("hack/helm.sh bin: %v", err)
	}
	chartImage, err := buildChartImage(images.dir)
	if err != nil {
		t.Fatalf("the chart's image: %v", err)
	}

	opts := vgpuOptions{withoutNRI: true, socketDir: harness.DevicePluginDir}
	opts.containerd.CNI = true
	v := setUpNode(t, harness.ContainerdVersion, opts)
	if err := v.c.Import(ctx, chartImage); err != nil {
		t.Fatal(err)
	}
	// The NRI plugin's pod mounts run_dir with Bidirectional propagation,
	// which needs a shared mount at the source; this machine's / is not.
	shareMount(t, v.runDir)
	h := &helmNode{clusterNode: &clusterNode{vgpu: v}, helm: strings.TrimSpace(string(out))}
	h.k = startCluster(t, version, v.c)
	chart := filepath.Join(root, "packaging", "helm", "nri-vgpu")
	total := int64(splitCount * len(testGPUs))

	t.Run("install", func(t *testing.T) {
		h.run(t, ctx, "install", chartRelease, chart, "--namespace", "kube-system", "--values", h.chartValues(t, splitCount))
		h.waitRolledOut(t, ctx)
		// The device plugin from the chart registered.
		h.waitAllocatable(t, ctx, total)
		// The NRI plugin from the chart is connected: only it gives a pod
		// without a GPU NVIDIA_VISIBLE_DEVICES=void.
		h.waitChartNRI(t, ctx)
		// The init container put the pin hook beside the shim.
		if fi, err := os.Stat(filepath.Join(h.base, "shim", "nri-vgpu-hook")); err != nil || fi.Mode() != 0o755 {
			t.Errorf("the pin hook on the host: %v, %v; want a file of mode 0755", fi, err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("GPU pod", func(t *testing.T) {
		pod := podSpec("cuda-chart", cudaTestImage, 1)
		id := h.runPod(t, ctx, pod)
		a := h.allocationOfContainer(t, ctx, id)
		if len(a.GPUs) != 1 || a.GPUs[0].Slices != 1 || a.GPUs[0].Memory != sliceMemory {
			t.Fatalf("allocation = %+v, want one slice of one GPU (%d bytes)", a.GPUs, sliceMemory)
		}
		if got := strings.TrimSpace(h.sh(t, ctx, id, "cat /etc/ld.so.preload")); got != shimInContainer {
			t.Errorf("/etc/ld.so.preload = %q, want %q", got, shimInContainer)
		}
		h.cudaprog(t, ctx, id, fakeDriverEnv(a.GPUs[0].UUID, "/tmp"), "direct",
			"init", "info:4GiB:4GiB", "alloc:4GiB", "alloc:1MiB:2")
		// The pin hook ran: runc found the chart's host copy of
		// nri-vgpu-hook (the pod's /usr/bin/nri-vgpu is not on the host),
		// and the limiter's directories are mount points.
		for _, attack := range []string{"mv /run/nri-vgpu /run/x", "mv /usr/local/nri-vgpu /usr/local/x"} {
			res, err := h.c.Exec(ctx, id, "/bin/sh", "-c", attack)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 || !strings.Contains(res.Stderr, "busy") {
				t.Errorf("%q in the chart's GPU container: exit %d, %q; want EBUSY", attack, res.ExitCode, strings.TrimSpace(res.Stderr))
			}
		}
		// The region's tmpfs, mounted by the plugin in its pod, reached
		// the host (Bidirectional propagation of run_dir).
		region := filepath.Join(h.hostContainerDir(id), "region")
		if mounts, err := mountinfo.Under(region); err != nil || len(mounts) == 0 {
			t.Errorf("no file system mounted on the host at %s (%v): the plugin's mount did not reach the host", region, err)
		}
		// Gone before the daemons change, so that its host state is
		// removed by the NRI plugin that made it.
		dir := h.hostContainerDir(id)
		h.deletePod(t, ctx, pod)
		if err := waitFor(ctx, 90*time.Second, func() bool {
			_, err := os.Stat(dir)
			return os.IsNotExist(err)
		}); err != nil {
			t.Errorf("%s still there after the pod was deleted", dir)
		}
	})

	t.Run("Prometheus", func(t *testing.T) { h.prometheus(t, ctx) })
	t.Run("kubectl nri-vgpu", func(t *testing.T) { testKubectlPlugin(t, ctx, h) })

	t.Run("upgrade", func(t *testing.T) {
		before := h.waitRolledOut(t, ctx)
		const splits = 2
		h.run(t, ctx, "upgrade", chartRelease, chart, "--namespace", "kube-system", "--values", h.chartValues(t, splits))
		after := h.waitRolledOut(t, ctx)
		if len(after) != len(daemonSets) {
			t.Fatalf("%d pods of the chart after the upgrade, want %d", len(after), len(daemonSets))
		}
		for _, uid := range after {
			if slices.Contains(before, uid) {
				t.Errorf("pod %s survived a config change (pods before: %v)", uid, before)
			}
		}
		h.waitAllocatable(t, ctx, int64(splits*len(testGPUs)))
		h.waitChartNRI(t, ctx)
	})

	t.Run("uninstall", func(t *testing.T) {
		h.run(t, ctx, "uninstall", chartRelease, "--namespace", "kube-system", "--wait")
		if err := waitFor(ctx, 90*time.Second, func() bool {
			pods, err := h.k.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + chartRelease})
			return err == nil && len(pods.Items) == 0
		}); err != nil {
			t.Fatal("the chart's pods are still there after helm uninstall")
		}
		entries, err := os.ReadDir(harness.DevicePluginDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != "kubelet.sock" && e.Name() != "kubelet_internal_checkpoint" {
				t.Errorf("%s left in the kubelet's device-plugin directory", e.Name())
			}
		}
		h.waitAllocatable(t, ctx, 0)
		containers, err := os.ReadDir(filepath.Join(h.runDir, "containers"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range containers {
			t.Errorf("container directory %s left in run_dir", e.Name())
		}
		mounts, err := mountinfo.Under(h.runDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mounts {
			if m != h.runDir {
				t.Errorf("mount %s left under run_dir", m)
			}
		}
	})
}

// waitChartNRI waits until a pod without a GPU is edited by nri-vgpu.
func (h *helmNode) waitChartNRI(t *testing.T, ctx context.Context) {
	t.Helper()
	var got string
	for i := 0; ; i++ {
		pod := podSpec(fmt.Sprintf("nri-probe-%d", i), cudaLikeImage, 0)
		id := h.runPod(t, ctx, pod)
		got = strings.TrimSpace(h.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES"))
		h.deletePod(t, ctx, pod)
		if got == "void" {
			return
		}
		if i == 10 {
			t.Fatalf("a pod without a GPU has NVIDIA_VISIBLE_DEVICES=%q, want void: the chart's NRI plugin does not edit containers", got)
		}
		time.Sleep(2 * time.Second)
	}
}

// shareMount makes dir a shared mount point of its own (a bind mount on
// itself) for the rest of t; the node's cleanup detaches it.
func shareMount(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting %s: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("making %s shared: %v", dir, err)
	}
}
