//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// One pod spec, asking for nvidia.com/gpu: 1 and naming no claim, gets the
// same quota, one slice of one GPU, on a node whose GPUs the device plugin
// serves and on one whose GPUs the DRA driver serves through a DeviceClass
// with extendedResourceName nvidia.com/gpu: there the scheduler makes the
// pod a claim that names no capacity, which takes the driver's default of
// one slice. The machine runs one kubelet: the two nodes run one after the
// other.
func TestClusterExtendedResource(t *testing.T) { forEachKubernetes(t, testClusterExtendedResource) }

func testClusterExtendedResource(t *testing.T, version string) {
	// The pod spec both nodes get, unchanged.
	spec := func() *corev1.Pod { return podSpec("same", harness.BusyboxImage, 1) }
	// quota reads the limits file in the pod's container and checks that
	// it holds one slice of one GPU.
	quota := func(t *testing.T, ctx context.Context, n *clusterNode, id string) {
		t.Helper()
		lf, err := limits.ParseLimits([]byte(n.sh(t, ctx, id, "cat "+limitsInContainer)))
		if err != nil {
			t.Fatal(err)
		}
		if len(lf.GPUs) != 1 || lf.GPUs[0].Memory != sliceMemory || lf.GPUs[0].Cores != sliceCores {
			t.Errorf("limits file GPUs in the container = %+v, want one GPU with %d bytes and %d %%", lf.GPUs, sliceMemory, sliceCores)
		}
	}

	t.Run("device plugin", func(t *testing.T) {
		n := startClusterNode(t, version, vgpuOptions{})
		ctx := testContext(t, 5*time.Minute)
		id := n.runPod(t, ctx, spec())
		quota(t, ctx, n, id)
	})

	t.Run("DRA", func(t *testing.T) {
		n := startClusterNode(t, version, vgpuOptions{extraConfig: "[dra]\nenabled = true\n"})
		ctx := testContext(t, 8*time.Minute)
		s := startKubeletDRADriver(t, ctx, n)
		// The chart's DeviceClass with draDriver.extendedResourceName.
		if _, err := n.k.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: draDriver},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{
					CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + draDriver + `"`},
				}},
				ExtendedResourceName: ptrTo(resourceName),
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		both := []string{draDeviceName(0), draDeviceName(1)}
		slices.Sort(both)
		s.waitSlice(t, ctx, both)

		id := n.runPod(t, ctx, spec())
		quota(t, ctx, n, id)
		// Served through DRA, not by a device plugin: the scheduler's
		// claim holds one slice of a GPU.
		pod, err := n.k.Client.CoreV1().Pods(podNamespace).Get(ctx, "same", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st := pod.Status.ExtendedResourceClaimStatus
		if st == nil {
			t.Fatalf("pod status has no extended resource claim: not served through DRA")
		}
		claim, err := n.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim %s: allocation %+v, want one device", claim.Name, claim.Status.Allocation)
		}
		r := claim.Status.Allocation.Devices.Results[0]
		mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
		if mem.Value() != sliceMemory || cores.Value() != sliceCores {
			t.Errorf("claim %s consumed memory %s and cores %s, want one slice: %d bytes, %d", claim.Name, mem.String(), cores.String(), sliceMemory, sliceCores)
		}
	})
}

// startKubeletDRADriver runs the DRA driver as a process registered with the
// node's kubelet, with the node's config and a CDI directory containerd
// reads, until t ends.
func startKubeletDRADriver(t *testing.T, ctx context.Context, n *clusterNode) *draScheduler {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nri-vgpu-dra-driver")
	if err := harness.GoBuild(ctx, "./cmd/dra-driver", bin, false); err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := os.ReadFile(n.configPath)
	if err != nil {
		t.Fatal(err)
	}
	// [dra] is the config's last table.
	driverCfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(driverCfg, append(nodeCfg, []byte("cdi_dir = \""+filepath.Join(n.c.Dir, "cdi")+"\"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeletRoot := filepath.Join(n.k.Dir, "kubelet")
	logPath := filepath.Join(dir, "dra-driver.log")
	cmd := exec.Command(bin, "--config", driverCfg, "--kubeconfig", n.k.Kubeconfig, "--node-name", n.k.NodeName,
		"--plugin-dir", filepath.Join(kubeletRoot, "plugins", draDriver),
		"--registry-dir", filepath.Join(kubeletRoot, "plugins_registry"))
	p, err := harness.StartProcess(cmd, logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("DRA driver log (tail):\n%s", harness.Tail(logPath, 40))
		}
		_ = p.Stop(10 * time.Second)
	})
	return &draScheduler{k: n.k, driver: p, log: logPath}
}

// The real scheduler serves a pod asking for nvidia.com/gpu through the
// DeviceClass's extendedResourceName from the driver's GPUs on a node that
// advertises no such resource: it makes the pod a claim whose request names
// no capacity, and the allocation consumes one slice of a GPU per unit, on
// as many distinct GPUs. Beyond the GPUs' count, the pod waits.
func TestDRASchedulerServesExtendedResource(t *testing.T) {
	forEachKubernetes(t, testDRASchedulerServesExtendedResource)
}

func testDRASchedulerServesExtendedResource(t *testing.T, version string) {
	s := startDRASchedulerOn(t, version)
	ctx := testContext(t, 3*time.Minute)
	class, err := s.k.Client.ResourceV1().DeviceClasses().Get(ctx, draDriver, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	class.Spec.ExtendedResourceName = ptrTo(resourceName)
	if _, err := s.k.Client.ResourceV1().DeviceClasses().Update(ctx, class, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	both := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(both)
	s.waitSlice(t, ctx, both)

	// units creates a pod asking for n units of nvidia.com/gpu, as a pod
	// for the device plugin does, and no claim.
	units := func(name string, n int64) {
		t.Helper()
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.invalid/never-pulled:1",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{resourceName: *resource.NewQuantity(n, resource.DecimalSI)}},
			}}},
		}
		if _, err := s.k.Client.CoreV1().Pods(podNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// placed waits until the pod is bound and returns its claim's results.
	placed := func(name string) []resourceapi.DeviceRequestAllocationResult {
		t.Helper()
		var pod *corev1.Pod
		for {
			var err error
			pod, err = s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil && pod.Spec.NodeName != "" && pod.Status.ExtendedResourceClaimStatus != nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("pod %s not scheduled through a claim: %v", name, podScheduledCondition(pod))
			case <-time.After(300 * time.Millisecond):
			}
		}
		claim, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, pod.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil {
			t.Fatalf("claim %s of scheduled pod %s is not allocated", claim.Name, name)
		}
		return claim.Status.Allocation.Devices.Results
	}
	// One slice of a GPU split in 16 (writeConfig): 1 GiB and 6 %.
	oneSlice := func(what string, r resourceapi.DeviceRequestAllocationResult) {
		t.Helper()
		mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
		if mem.Cmp(resource.MustParse("1Gi")) != 0 || cores.Cmp(resource.MustParse("6")) != 0 {
			t.Errorf("%s: %s consumes memory %s and cores %s, want one slice: 1Gi and 6", what, r.Device, mem.String(), cores.String())
		}
	}

	units("one", 1)
	res := placed("one")
	if len(res) != 1 {
		t.Fatalf("pod one's claim holds %d devices, want 1: %+v", len(res), res)
	}
	oneSlice("pod one", res[0])

	units("two", 2)
	res = placed("two")
	if len(res) != 2 || res[0].Device == res[1].Device {
		t.Fatalf("pod two's claim holds %+v, want two distinct GPUs", res)
	}
	for _, r := range res {
		oneSlice("pod two", r)
	}

	// Three GPUs on a node of two: no request gets one GPU twice.
	units("three", 3)
	for {
		pod, err := s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, "three", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.NodeName != "" {
			t.Fatalf("pod three, asking for 3 GPUs of 2, was scheduled")
		}
		if c := podScheduledCondition(pod); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod three not reported unschedulable: %v", podScheduledCondition(pod))
		case <-time.After(300 * time.Millisecond):
		}
	}
}
