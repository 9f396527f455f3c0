//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// podNamespace is where the cluster tests run their pods.
const podNamespace = "default"

// clusterNode is a node of a real single-node cluster: containerd with
// nri-vgpu pre-registered and a pod network, the control plane and a
// kubelet on it, and the device plugin (a process, as the node package
// runs it) registered with that kubelet.
type clusterNode struct {
	*vgpu
	k *harness.Cluster
}

// forEachKubernetes runs test as a subtest of t, named after the version,
// for each Kubernetes release selected ($NRI_VGPU_E2E_KUBERNETES, else
// harness.KubernetesVersion).
func forEachKubernetes(t *testing.T, test func(t *testing.T, version string)) {
	t.Helper()
	versions, err := harness.SelectedKubernetesVersions()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		t.Run(v, func(t *testing.T) { test(t, v) })
	}
}

// startClusterNode starts a cluster node of Kubernetes version on
// containerd ContainerdVersion for t, with the device plugin running, and
// tears it down when t ends.
func startClusterNode(t *testing.T, version string, opts vgpuOptions) *clusterNode {
	t.Helper()
	return startClusterNodeOn(t, version, harness.ContainerdVersion, opts)
}

// startClusterNodeOn is startClusterNode on the given containerd version.
func startClusterNodeOn(t *testing.T, version, containerd string, opts vgpuOptions) *clusterNode {
	t.Helper()
	opts.socketDir = harness.DevicePluginDir
	opts.containerd.CNI = true
	n := &clusterNode{vgpu: setUpNode(t, containerd, opts)}
	n.k = startCluster(t, version, n.c)
	n.runDevicePlugin(t)
	return n
}

// startCluster starts the control plane and a kubelet of Kubernetes
// version on c for t, and tears them down when t ends; on failure the
// components' log tails are printed first.
func startCluster(t *testing.T, version string, c *harness.Containerd) *harness.Cluster {
	t.Helper()
	// One kubelet per machine: StartCluster waits for the node lock
	// (harness.NodeLockPath) that other test runs hold.
	ctx := testContext(t, 3*time.Minute)
	k, err := harness.StartCluster(ctx, harness.ClusterOptions{
		Version:    version,
		Containerd: c,
		NodeLabels: map[string]string{"nvidia.com/gpu.present": "true"},
		Logf:       t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager"} {
				t.Logf("%s log (tail):\n%s", name, k.LogTail(name, 30))
			}
		}
		if err := k.Close(); err != nil {
			t.Errorf("cleaning up the cluster: %v", err)
		}
	})
	return k
}

// allocatable waits until the node's allocatable count of resourceName is
// want, and returns the node's capacity of it then.
func (n *clusterNode) waitAllocatable(t *testing.T, ctx context.Context, want int64) int64 {
	t.Helper()
	var got, capacity int64
	err := waitFor(ctx, 60*time.Second, func() bool {
		node, err := n.k.Client.CoreV1().Nodes().Get(ctx, n.k.NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		a, c := node.Status.Allocatable[resourceName], node.Status.Capacity[resourceName]
		got, capacity = a.Value(), c.Value()
		return got == want
	})
	if err != nil {
		t.Fatalf("node %s: allocatable %s = %d, want %d", n.k.NodeName, resourceName, got, want)
	}
	return capacity
}

// podSpec is a pod of one container "main" of image asking for slices
// slices (none for 0), on the host network: no pod of these tests needs
// one of its own.
func podSpec(name, image string, slices int) *corev1.Pod {
	grace := int64(2)
	c := corev1.Container{
		Name:            "main",
		Image:           image,
		ImagePullPolicy: corev1.PullNever,
	}
	if slices > 0 {
		c.Resources.Limits = corev1.ResourceList{resourceName: *resource.NewQuantity(int64(slices), resource.DecimalSI)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{c},
		},
	}
}

// create creates pod and deletes it when t ends (if the test did not).
func (n *clusterNode) create(t *testing.T, ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	created, err := n.k.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		n.deletePod(t, cctx, created)
	})
	return created
}

// deletePod deletes pod and waits until the kubelet has stopped it.
func (n *clusterNode) deletePod(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	pods := n.k.Client.CoreV1().Pods(pod.Namespace)
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return // deleted already
	}
	if err := waitFor(ctx, 45*time.Second, func() bool {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return err != nil
	}); err != nil {
		t.Errorf("pod %s still there 45 s after deleting it", pod.Name)
	}
}

// runPod creates pod and waits until it runs; it returns the ID of its
// container "main".
func (n *clusterNode) runPod(t *testing.T, ctx context.Context, pod *corev1.Pod) string {
	t.Helper()
	n.create(t, ctx, pod)
	var last *corev1.Pod
	err := waitFor(ctx, 60*time.Second, func() bool {
		p, err := n.k.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = p
		return p.Status.Phase == corev1.PodRunning
	})
	if err != nil {
		t.Fatalf("pod %s not running: %s", pod.Name, describePod(last))
	}
	for _, cs := range last.Status.ContainerStatuses {
		if cs.Name == "main" {
			return strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	t.Fatalf("pod %s runs, without a status of container main: %s", pod.Name, describePod(last))
	return ""
}

// describePod says where pod stands, for failure messages.
func describePod(p *corev1.Pod) string {
	if p == nil {
		return "(no pod)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "; %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if x := cs.State.Terminated; x != nil {
			fmt.Fprintf(&b, "; %s terminated: %s %s", cs.Name, x.Reason, x.Message)
		}
	}
	if p.Status.Message != "" {
		fmt.Fprintf(&b, "; %s %s", p.Status.Reason, p.Status.Message)
	}
	return b.String()
}

// allocationOfContainer verifies, with the node's key, the allocation
// annotation the kubelet created container id with (from the device
// plugin's Allocate response), and returns it.
func (n *clusterNode) allocationOfContainer(t *testing.T, ctx context.Context, id string) *allocation.Allocation {
	t.Helper()
	st, err := n.c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	value := st.GetStatus().GetAnnotations()[allocationAnnotation]
	if value == "" {
		t.Fatalf("container %.12s was created without %s; annotations: %v", id, allocationAnnotation, st.GetStatus().GetAnnotations())
	}
	key, err := allockey.Load(n.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocation.Verify(key, value)
	if err != nil {
		t.Fatalf("the device plugin's annotation does not verify: %v", err)
	}
	return a
}

// registrations counts the device plugin's registrations with a kubelet.
func (n *clusterNode) registrations() int {
	raw, _ := os.ReadFile(n.dpLog)
	return strings.Count(string(raw), "registered with kubelet")
}

// TestCluster runs the device plugin and nri-vgpu under a real kubelet,
// scheduler and API server: the node advertises the slices, pods asking
// for slices are scheduled, allocated (the kubelet honouring the plugin's
// preferred allocation), edited by nri-vgpu and limited by the shim; a pod
// asking for more than the node has stays Pending; a pod without a GPU
// sees none; restarts of the kubelet, the device plugin and containerd
// lose nothing.
func TestCluster(t *testing.T) { forEachKubernetes(t, testCluster) }

func testCluster(t *testing.T, version string) {
	if images.cudaTestErr != nil {
		t.Fatalf("the CUDA test image: %v", images.cudaTestErr)
	}
	n := startClusterNode(t, version, vgpuOptions{})
	ctx := testContext(t, 10*time.Minute)
	total := int64(splitCount * len(testGPUs))

	t.Run("slices advertised", func(t *testing.T) {
		if capacity := n.waitAllocatable(t, ctx, total); capacity != total {
			t.Errorf("capacity %s = %d, want %d", resourceName, capacity, total)
		}
	})

	// The first pod runs to the end: the later ones are placed around its
	// slice, and it must keep its limits through the restarts.
	first := n.runPod(t, ctx, podSpec("cuda", cudaTestImage, 1))
	var firstGPU string
	t.Run("pod gets its slice", func(t *testing.T) {
		a := n.allocationOfContainer(t, ctx, first)
		if len(a.GPUs) != 1 || a.GPUs[0].Slices != 1 || a.GPUs[0].Memory != sliceMemory || a.GPUs[0].Cores != sliceCores {
			t.Fatalf("allocation = %+v, want one slice of one GPU (%d bytes, %d%%)", a.GPUs, sliceMemory, sliceCores)
		}
		firstGPU = a.GPUs[0].UUID
		lf, err := limits.ParseLimits([]byte(n.sh(t, ctx, first, "cat "+limitsInContainer)))
		if err != nil {
			t.Fatal(err)
		}
		if want := []limits.GPULimit{{UUID: firstGPU, Memory: sliceMemory, Cores: sliceCores}}; !slices.Equal(lf.GPUs, want) {
			t.Errorf("limits file GPUs = %+v, want %+v", lf.GPUs, want)
		}
		// The shim holds the program to the slice: 4 GiB of a 16 GiB GPU.
		n.cudaprog(t, ctx, first, fakeDriverEnv(firstGPU, "/tmp"), "direct",
			"init", "info:4GiB:4GiB", "alloc:3GiB", "alloc:2GiB:2", "alloc:1GiB", "alloc:1MiB:2")
	})
	if firstGPU == "" {
		t.Fatal("the first pod's GPU is unknown: the later steps depend on it")
	}

	t.Run("preferred allocation", func(t *testing.T) {
		// binpack: three slices go whole onto the GPU with the fewest free
		// slices that holds them, the first pod's (3 free, the other 4).
		// The kubelet left to itself picks 3 of the 7 free slices.
		id := n.runPod(t, ctx, podSpec("binpacked", harness.BusyboxImage, 3))
		a := n.allocationOfContainer(t, ctx, id)
		if len(a.GPUs) != 1 || a.GPUs[0].UUID != firstGPU || a.GPUs[0].Slices != 3 {
			t.Errorf("allocation = %+v, want 3 slices of %s (binpack, next to the first pod)", a.GPUs, firstGPU)
		}
	})

	t.Run("over-request stays pending", func(t *testing.T) {
		pod := n.create(t, ctx, podSpec("too-big", harness.BusyboxImage, int(total)+1))
		var last *corev1.Pod
		err := waitFor(ctx, 30*time.Second, func() bool {
			p, err := n.k.Client.CoreV1().Pods(podNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			last = p
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return true
				}
			}
			return false
		})
		if err != nil {
			t.Fatalf("pod asking for %d slices: %s; want unschedulable", total+1, describePod(last))
		}
		if last.Status.Phase != corev1.PodPending || last.Spec.NodeName != "" {
			t.Errorf("pod asking for %d slices: phase %s on node %q, want Pending on none", total+1, last.Status.Phase, last.Spec.NodeName)
		}
		if msg := podCondition(last, corev1.PodScheduled).Message; !strings.Contains(msg, "Insufficient "+resourceName) {
			t.Errorf("scheduling message %q does not name %s", msg, resourceName)
		}
		n.deletePod(t, ctx, pod)
	})

	t.Run("pod without GPU sees none", func(t *testing.T) {
		id := n.runPod(t, ctx, podSpec("no-gpu", cudaLikeImage, 0))
		if got := strings.TrimSpace(n.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
		}
		if out := n.sh(t, ctx, id, "ls /dev"); strings.Contains(out, "nvidia") {
			t.Errorf("NVIDIA nodes in a pod without GPUs: %s", out)
		}
		if _, err := os.Stat(n.hostContainerDir(id)); err == nil {
			t.Errorf("nri-vgpu keeps host state for a container without GPUs")
		}
	})

	firstLimits := n.sh(t, ctx, first, "cat "+limitsInContainer)
	// stillServes checks that the first pod kept its limits and host state,
	// and that a new pod gets a slice through the device plugin and
	// nri-vgpu (then goes again).
	stillServes := func(t *testing.T, stage string) {
		t.Helper()
		if got := n.sh(t, ctx, first, "cat "+limitsInContainer); got != firstLimits {
			t.Errorf("%s: limits of the running pod changed:\n%s\nwas:\n%s", stage, got, firstLimits)
		}
		if _, err := os.Stat(filepath.Join(n.hostContainerDir(first), "limits")); err != nil {
			t.Errorf("%s: host state of the running pod: %v", stage, err)
		}
		pod := podSpec("after-"+strings.ReplaceAll(stage, " ", "-"), harness.BusyboxImage, 1)
		id := n.runPod(t, ctx, pod)
		if a := n.allocationOfContainer(t, ctx, id); len(a.GPUs) != 1 || a.GPUs[0].Slices != 1 {
			t.Errorf("%s: allocation of a new pod = %+v, want one slice", stage, a.GPUs)
		}
		if _, err := limits.ParseLimits([]byte(n.sh(t, ctx, id, "cat "+limitsInContainer))); err != nil {
			t.Errorf("%s: limits of a new pod: %v", stage, err)
		}
		n.deletePod(t, ctx, pod)
	}

	t.Run("kubelet restart", func(t *testing.T) {
		before := n.registrations()
		if err := n.k.StopKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := n.k.StartKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		if err := n.k.WaitNodeReady(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(ctx, 60*time.Second, func() bool { return n.registrations() > before }); err != nil {
			t.Fatalf("the device plugin did not register with the restarted kubelet:\n%s", harness.Tail(n.dpLog, 20))
		}
		n.waitAllocatable(t, ctx, total)
		stillServes(t, "kubelet restart")
	})

	t.Run("device plugin restart", func(t *testing.T) {
		before := n.registrations()
		n.stopDevicePlugin(t)
		n.startDevicePlugin(t)
		if err := waitFor(ctx, 60*time.Second, func() bool { return n.registrations() > before }); err != nil {
			t.Fatalf("the restarted device plugin did not register:\n%s", harness.Tail(n.dpLog, 20))
		}
		n.waitAllocatable(t, ctx, total)
		stillServes(t, "device plugin restart")
	})

	t.Run("containerd restart", func(t *testing.T) {
		if err := n.c.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if err := n.k.WaitNodeReady(ctx); err != nil {
			t.Fatal(err)
		}
		stillServes(t, "containerd restart")
	})
}

// podCondition is pod's condition of type ct (zero if it has none).
func podCondition(p *corev1.Pod, ct corev1.PodConditionType) corev1.PodCondition {
	for _, c := range p.Status.Conditions {
		if c.Type == ct {
			return c
		}
	}
	return corev1.PodCondition{}
}
