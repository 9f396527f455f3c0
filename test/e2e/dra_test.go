//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// draDriver is the DRA driver's name in these tests: the default.
const draDriver = "gpu.nri-vgpu.io"

// draDeviceName is the device testGPUs[i] is published as.
func draDeviceName(i int) string {
	return "gpu-" + strings.ToLower(strings.TrimPrefix(testGPUs[i].UUID, "GPU-"))
}

// draScheduler is a control plane without a kubelet (so it runs beside the
// tests that run the machine's one kubelet), a node object, and the DRA
// driver, as a process, publishing the node's two simulated GPUs.
type draScheduler struct {
	k      *harness.Cluster
	driver *harness.Process
	log    string
	dir    string // the driver's config, run_dir, state_dir, cdi_dir
	// taintEffect is dra.unhealthy_taint_effect in the config writeConfig
	// writes; empty: the default.
	taintEffect string
}

// draPCIeRoots are the PCIe root complexes of testGPUs in the driver's
// configuration.
var draPCIeRoots = []string{"pci0000:00", "pci0000:80"}

// writeConfig writes the driver's configuration file: the simulated GPUs
// testGPUs, described as A100s under driver 550.54.15 (each under its own
// PCIe root complex), those listed in unhealthy marked so.
func (s *draScheduler) writeConfig(t *testing.T, unhealthy ...int) string {
	t.Helper()
	// Two 16 GiB GPUs split in 16: a claim takes at least 1 GiB and 6 %.
	var cfg strings.Builder
	cfg.WriteString("[device_plugin]\nsplit_count = 16\n[gpu]\nbackend = \"simulated\"\n")
	for i, g := range testGPUs {
		fmt.Fprintf(&cfg, "[[gpu.simulated]]\nuuid = %q\nname = %q\nmemory = %d\nminor = %d\nhealthy = %t\n",
			g.UUID, g.Name, g.Memory, g.Minor, !slices.Contains(unhealthy, i))
		fmt.Fprintf(&cfg, "architecture = \"Ampere\"\nbrand = \"Nvidia\"\ncuda_compute_capability = \"8.0\"\n"+
			"driver_version = \"550.54.15\"\ncuda_driver_version = \"12.4\"\npcie_root = %q\n", draPCIeRoots[i])
	}
	fmt.Fprintf(&cfg, "[paths]\nrun_dir = %q\nstate_dir = %q\n[dra]\nenabled = true\ncdi_dir = %q\n",
		filepath.Join(s.dir, "run"), filepath.Join(s.dir, "state"), filepath.Join(s.dir, "cdi"))
	if s.taintEffect != "" {
		fmt.Fprintf(&cfg, "unhealthy_taint_effect = %q\n", s.taintEffect)
	}
	configPath := filepath.Join(s.dir, "config.toml")
	if err := os.WriteFile(configPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return configPath
}

// start runs the DRA driver binary bin as a process until the test ends,
// with its kubelet directories under s.dir.
func (s *draScheduler) start(t *testing.T, bin, configPath, kubeconfig string) {
	t.Helper()
	// The kubelet's registration directory, which it makes.
	if err := os.MkdirAll(filepath.Join(s.dir, "registry"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", configPath, "--kubeconfig", kubeconfig, "--node-name", s.k.NodeName,
		"--plugin-dir", filepath.Join(s.dir, "plugin"), "--registry-dir", filepath.Join(s.dir, "registry"))
	p, err := harness.StartProcess(cmd, s.log)
	if err != nil {
		t.Fatal(err)
	}
	s.driver = p
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("DRA driver log (tail):\n%s", harness.Tail(s.log, 30))
		}
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the DRA driver: %v", err)
		}
	})
}

// startDRASchedulerOn starts a control plane of Kubernetes version and the
// DRA driver publishing the two simulated GPUs (draScheduler).
func startDRASchedulerOn(t *testing.T, version string) *draScheduler {
	t.Helper()
	ctx := testContext(t, 3*time.Minute)
	dir := t.TempDir()
	bin := filepath.Join(dir, "nri-vgpu-dra-driver")
	if err := harness.GoBuild(ctx, "./cmd/dra-driver", bin, false); err != nil {
		t.Fatal(err)
	}
	k, err := harness.StartCluster(ctx, harness.ClusterOptions{Version: version, ControlPlaneOnly: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-scheduler log (tail):\n%s", k.LogTail("kube-scheduler", 30))
		}
		if err := k.Close(); err != nil {
			t.Errorf("cleaning up the cluster: %v", err)
		}
	})
	if err := k.CreateNode(ctx); err != nil {
		t.Fatal(err)
	}

	s := &draScheduler{k: k, dir: dir, log: filepath.Join(dir, "dra-driver.log")}
	configPath := s.writeConfig(t)
	s.start(t, bin, configPath, k.Kubeconfig)

	// The DeviceClass the chart installs.
	if _, err := k.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: draDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", draDriver)},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitSlice waits until the driver's ResourceSlice for the node lists the
// devices want, and returns them.
func (s *draScheduler) waitSlice(t *testing.T, ctx context.Context, want []string) []resourceapi.Device {
	t.Helper()
	var last []string
	for {
		slices_, err := s.k.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil {
			var devs []resourceapi.Device
			last = nil
			for _, sl := range slices_.Items {
				if sl.Spec.Driver == draDriver && sl.Spec.NodeName != nil && *sl.Spec.NodeName == s.k.NodeName {
					devs = append(devs, sl.Spec.Devices...)
				}
			}
			for _, d := range devs {
				last = append(last, d.Name)
			}
			slices.Sort(last)
			if slices.Equal(last, want) {
				return devs
			}
		}
		select {
		case <-s.driver.Exited():
			t.Fatalf("the DRA driver exited: %v; log:\n%s", s.driver.Err(), harness.Tail(s.log, 10))
		case <-ctx.Done():
			t.Fatalf("ResourceSlice devices = %v (%v), want %v", last, err, want)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// claimPod creates a ResourceClaim asking for memory and cores of one GPU
// and a pod that uses it, both named name.
func (s *draScheduler) claimPod(t *testing.T, ctx context.Context, name, memory, cores string) {
	t.Helper()
	claim := gpuClaim(name, memory, cores)
	if _, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.invalid/never-pulled:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	if _, err := s.k.Client.CoreV1().Pods(podNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// gpuClaim is a ResourceClaim named name asking for memory and cores of
// one GPU of the driver's DeviceClass.
func gpuClaim(name, memory, cores string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draDriver,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse(memory), "cores": resource.MustParse(cores),
				}},
			},
		}}}},
	}
}

// placement is where the scheduler put a claim: the device and what it
// consumed there.
type placement struct {
	device        string
	memory, cores string
}

// waitScheduled waits until the pod is bound and returns its claim's
// placement.
func (s *draScheduler) waitScheduled(t *testing.T, ctx context.Context, name string) placement {
	t.Helper()
	for {
		pod, err := s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && pod.Spec.NodeName != "" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not scheduled: %v", name, podScheduledCondition(pod))
		case <-time.After(300 * time.Millisecond):
		}
	}
	claim, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s of a scheduled pod: allocation %+v, want one device", name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
	return placement{device: r.Device, memory: mem.String(), cores: cores.String()}
}

// waitUnschedulable waits until the scheduler reports the pod unschedulable,
// and checks that its claim is not allocated.
func (s *draScheduler) waitUnschedulable(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var pod *corev1.Pod
	for {
		var err error
		pod, err = s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && pod.Spec.NodeName != "" {
			t.Fatalf("pod %s was scheduled, want it pending", name)
		}
		if c := podScheduledCondition(pod); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not reported unschedulable: %v", name, podScheduledCondition(pod))
		case <-time.After(300 * time.Millisecond):
		}
	}
	claim, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Errorf("claim %s of an unschedulable pod is allocated: %+v", name, claim.Status.Allocation)
	}
}

func podScheduledCondition(pod *corev1.Pod) *corev1.PodCondition {
	if pod == nil {
		return nil
	}
	for i, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// deletePod deletes the pod at once (no kubelet is there to stop it); the
// resourceclaim controller then frees its claim.
func (s *draScheduler) deletePod(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	zero := int64(0)
	if err := s.k.Client.CoreV1().Pods(podNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// The real scheduler places claims for an amount of memory and SM time on
// one GPU with room, using what the driver publishes: a claim larger than
// any one GPU's free capacity stays pending while the node has that much in
// total, and schedules once a claim is freed.
func TestDRASchedulerFitsClaimsOnOneGPU(t *testing.T) {
	forEachKubernetes(t, testDRASchedulerFitsClaimsOnOneGPU)
}

func testDRASchedulerFitsClaimsOnOneGPU(t *testing.T, version string) {
	s := startDRASchedulerOn(t, version)
	ctx := testContext(t, 3*time.Minute)
	want := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(want)
	devs := s.waitSlice(t, ctx, want)
	for _, d := range devs {
		mem, cores := d.Capacity["memory"].Value, d.Capacity["cores"].Value
		if mem.Cmp(resource.MustParse("16Gi")) != 0 || cores.Cmp(resource.MustParse("100")) != 0 ||
			d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("device %s: memory %s, cores %s, multiple allocations %v; want 16Gi, 100, true", d.Name, mem.String(), cores.String(), d.AllowMultipleAllocations)
		}
	}

	// Two 10 GiB claims cannot share a 16 GiB GPU: one on each.
	s.claimPod(t, ctx, "a", "10Gi", "30")
	s.claimPod(t, ctx, "b", "10Gi", "30")
	pa, pb := s.waitScheduled(t, ctx, "a"), s.waitScheduled(t, ctx, "b")
	if pa.device == pb.device {
		t.Fatalf("claims a and b (10 GiB each) both on %s, a 16 GiB GPU", pa.device)
	}
	for name, p := range map[string]placement{"a": pa, "b": pb} {
		if p.memory != "10Gi" || p.cores != "30" {
			t.Errorf("claim %s consumed memory %s and cores %s, want 10Gi and 30", name, p.memory, p.cores)
		}
	}

	// 12 GiB are free on the node, 6 GiB on each GPU: 8 GiB fit on none.
	s.claimPod(t, ctx, "c", "8Gi", "30")
	s.waitUnschedulable(t, ctx, "c")
	// A small one still fits beside a.
	s.claimPod(t, ctx, "d", "6Gi", "70")
	if pd := s.waitScheduled(t, ctx, "d"); pd.memory != "6Gi" || pd.cores != "70" {
		t.Errorf("claim d consumed %s and %s, want 6Gi and 70", pd.memory, pd.cores)
	}

	// Freeing a leaves 10 GiB or more on its GPU, wherever d went (b's
	// GPU keeps at most 6 GiB): c goes there.
	s.deletePod(t, ctx, "a")
	if pc := s.waitScheduled(t, ctx, "c"); pc.device != pa.device {
		t.Errorf("claim c went to %s, want %s, the GPU a freed", pc.device, pa.device)
	}
}

// Claims of half a GPU fill both GPUs exactly: every byte and percent is
// handed out, none is stranded between GPUs, and one more claim waits.
func TestDRASchedulerFillsTwoGPUs(t *testing.T) { forEachKubernetes(t, testDRASchedulerFillsTwoGPUs) }

func testDRASchedulerFillsTwoGPUs(t *testing.T, version string) {
	s := startDRASchedulerOn(t, version)
	ctx := testContext(t, 3*time.Minute)
	want := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(want)
	s.waitSlice(t, ctx, want)

	perDevice := map[string]int{}
	for i := range 4 {
		name := fmt.Sprintf("half-%d", i)
		s.claimPod(t, ctx, name, "8Gi", "50")
		perDevice[s.waitScheduled(t, ctx, name).device]++
	}
	for _, d := range want {
		if perDevice[d] != 2 {
			t.Errorf("claims per GPU = %v, want 2 on each", perDevice)
			break
		}
	}
	s.claimPod(t, ctx, "one-more", "1Gi", "6")
	s.waitUnschedulable(t, ctx, "one-more")
}

// A GPU that turns unhealthy stays in the node's ResourceSlice with the
// taint nri-vgpu.io/unhealthy, its reason as the value: the real scheduler
// places no new claim on it (a pod that fits only there waits,
// unschedulable), with NoSchedule the pod already on it keeps its claim,
// with NoExecute kube-controller-manager's device taint eviction controller
// evicts the pods on it, and on recovery the taint goes and the waiting pod
// is placed there. The simulated GPUs' health changes by a configuration
// reload (SIGHUP), which the driver receives as health events.
func TestDRAUnhealthyGPUIsTainted(t *testing.T) { forEachKubernetes(t, testDRAUnhealthyGPUIsTainted) }

func testDRAUnhealthyGPUIsTainted(t *testing.T, version string) {
	s := startDRASchedulerOn(t, version)
	ctx := testContext(t, 5*time.Minute)
	both := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(both)
	s.waitSlice(t, ctx, both)

	reload := func(unhealthy ...int) {
		t.Helper()
		s.writeConfig(t, unhealthy...)
		if err := syscall.Kill(s.driver.Pid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	const reason = "health-changed-in-the-simulated-configuration"

	// Two 16 GiB GPUs: a takes 10 GiB of one, the sick one; b 12 GiB of
	// the other, which then has 4 GiB left; c, 5 GiB, fits only beside a.
	s.claimPod(t, ctx, "a", "10Gi", "30")
	sick := slices.Index([]string{draDeviceName(0), draDeviceName(1)}, s.waitScheduled(t, ctx, "a").device)
	other := 1 - sick
	reload(sick)
	s.waitTaints(t, ctx, map[string]string{
		draDeviceName(sick):  "nri-vgpu.io/unhealthy=" + reason + ":NoSchedule",
		draDeviceName(other): "",
	})
	s.claimPod(t, ctx, "b", "12Gi", "30")
	if p := s.waitScheduled(t, ctx, "b"); p.device != draDeviceName(other) {
		t.Fatalf("claim b went to %s, want %s, the healthy GPU", p.device, draDeviceName(other))
	}
	s.claimPod(t, ctx, "c", "5Gi", "30")
	s.waitUnschedulable(t, ctx, "c")
	// NoSchedule: a keeps its pod and its claim.
	if pod, err := s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, "a", metav1.GetOptions{}); err != nil || pod.DeletionTimestamp != nil {
		t.Fatalf("pod a on the GPU tainted NoSchedule: %v, deletion %v; want it kept", err, pod.GetDeletionTimestamp())
	}

	reload()
	s.waitTaints(t, ctx, map[string]string{draDeviceName(sick): "", draDeviceName(other): ""})
	if p := s.waitScheduled(t, ctx, "c"); p.device != draDeviceName(sick) {
		t.Fatalf("claim c went to %s, want %s, the recovered GPU", p.device, draDeviceName(sick))
	}

	// NoExecute: the pods on the GPU are evicted, the other GPU's pod stays.
	if err := s.driver.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	s.taintEffect = "NoExecute"
	s.start(t, filepath.Join(s.dir, "nri-vgpu-dra-driver"), s.writeConfig(t, sick), s.k.Kubeconfig)
	s.waitTaints(t, ctx, map[string]string{
		// Unhealthy from the start: no health event, no reason.
		draDeviceName(sick):  "nri-vgpu.io/unhealthy=:NoExecute",
		draDeviceName(other): "",
	})
	s.waitEvicted(t, ctx, "a")
	s.waitEvicted(t, ctx, "c")
	if pod, err := s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, "b", metav1.GetOptions{}); err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("pod b on the healthy GPU: %v, deletion %v; want it kept", err, pod.GetDeletionTimestamp())
	}
}

// waitTaints waits until the driver's ResourceSlice for the node lists the
// devices of want, each with the taints want says ("key=value:effect",
// comma-separated; "" for none), each taint with its timeAdded.
func (s *draScheduler) waitTaints(t *testing.T, ctx context.Context, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for {
		list, err := s.k.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil {
			got = map[string]string{}
			for _, sl := range list.Items {
				if sl.Spec.Driver != draDriver || sl.Spec.NodeName == nil || *sl.Spec.NodeName != s.k.NodeName {
					continue
				}
				for _, d := range sl.Spec.Devices {
					var taints []string
					for _, tn := range d.Taints {
						taints = append(taints, tn.Key+"="+tn.Value+":"+string(tn.Effect))
						if tn.TimeAdded == nil {
							t.Errorf("%s: taint %s has no timeAdded", d.Name, tn.Key)
						}
					}
					got[d.Name] = strings.Join(taints, ",")
				}
			}
			if maps.Equal(got, want) {
				return
			}
		}
		select {
		case <-s.driver.Exited():
			t.Fatalf("the DRA driver exited: %v; log:\n%s", s.driver.Err(), harness.Tail(s.log, 10))
		case <-ctx.Done():
			t.Fatalf("ResourceSlice devices and taints = %q (%v), want %q", got, err, want)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// waitEvicted waits until the device taint eviction controller has marked
// the pod disrupted by a device taint and deleted it (no kubelet finishes
// the deletion: the pod stays, terminating).
func (s *draScheduler) waitEvicted(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var pod *corev1.Pod
	for {
		var err error
		pod, err = s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := podCondition(pod, corev1.DisruptionTarget)
		if pod.DeletionTimestamp != nil && c.Status == corev1.ConditionTrue && c.Reason == "DeletionByDeviceTaintManager" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not evicted: deletion %v, conditions %+v", name, pod.DeletionTimestamp, pod.Status.Conditions)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// The real API server accepts the attributes NVIDIA's DRA driver publishes,
// as published here, and the real scheduler places claims by selectors in
// NVIDIA's documented forms, with the domain naming this driver: on the
// GPU whose PCIe root complex a claim names, on a GPU matching product,
// architecture and versions; not for a newer driver than the node's, and
// not with NVIDIA's domain left in.
func TestDRASchedulerSelectsByNVIDIAAttributes(t *testing.T) {
	forEachKubernetes(t, testDRASchedulerSelectsByNVIDIAAttributes)
}

func testDRASchedulerSelectsByNVIDIAAttributes(t *testing.T, version string) {
	s := startDRASchedulerOn(t, version)
	ctx := testContext(t, 3*time.Minute)
	want := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(want)
	for _, d := range s.waitSlice(t, ctx, want) {
		if d.Name != draDeviceName(1) {
			continue
		}
		for name, w := range map[resourceapi.QualifiedName]string{
			"type": "gpu", "productName": "NVIDIA A100-SXM4-40GB", "brand": "Nvidia", "architecture": "Ampere",
			"resource.kubernetes.io/pcieRoot": "pci0000:80", "resource.kubernetes.io/pciBusID": "0000:02:00.0",
		} {
			if a := d.Attributes[name]; a.StringValue == nil || *a.StringValue != w {
				t.Errorf("device %s: attribute %s = %+v, want %q", d.Name, name, a, w)
			}
		}
		for name, w := range map[resourceapi.QualifiedName]string{
			"cudaComputeCapability": "8.0.0", "driverVersion": "550.54.15", "cudaDriverVersion": "12.4.0",
		} {
			if a := d.Attributes[name]; a.VersionValue == nil || *a.VersionValue != w {
				t.Errorf("device %s: attribute %s = %+v, want version %s", d.Name, name, a, w)
			}
		}
	}

	selected := func(name, expr string) {
		t.Helper()
		claim := gpuClaim(name, "1Gi", "6")
		claim.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
		if _, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
				Containers: []corev1.Container{{
					Name: "cuda", Image: "registry.invalid/never-pulled:1",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				}},
			},
		}
		if _, err := s.k.Client.CoreV1().Pods(podNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	selected("by-root", `device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:80"`)
	if p := s.waitScheduled(t, ctx, "by-root"); p.device != draDeviceName(1) {
		t.Errorf("claim on PCIe root pci0000:80 went to %s, want %s", p.device, draDeviceName(1))
	}
	selected("by-model", `device.attributes["gpu.nri-vgpu.io"].productName.lowerAscii().matches("^.*a100.*$") && `+
		`device.attributes["gpu.nri-vgpu.io"].type == "gpu" && device.attributes["gpu.nri-vgpu.io"].brand == "Nvidia" && `+
		`device.attributes["gpu.nri-vgpu.io"].architecture == "Ampere" && `+
		`device.attributes["gpu.nri-vgpu.io"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0 && `+
		`device.attributes["gpu.nri-vgpu.io"].driverVersion.compareTo(semver("550.54.15")) >= 0 && `+
		`device.attributes["gpu.nri-vgpu.io"].cudaDriverVersion.compareTo(semver("12.4.0")) >= 0`)
	s.waitScheduled(t, ctx, "by-model")
	selected("newer-driver", `device.attributes["gpu.nri-vgpu.io"].driverVersion.compareTo(semver("560.0.0")) >= 0`)
	s.waitUnschedulable(t, ctx, "newer-driver")
	// NVIDIA's domain left in: the device has no such attribute, which
	// the scheduler reports as a CEL runtime error, and places nothing.
	selected("nvidia-domain", `device.attributes["gpu.nvidia.com"].productName.lowerAscii().matches("^.*a100.*$")`)
	for {
		pod, err := s.k.Client.CoreV1().Pods(podNamespace).Get(ctx, "nvidia-domain", metav1.GetOptions{})
		if err == nil && pod.Spec.NodeName != "" {
			t.Fatal("pod nvidia-domain was scheduled, want it pending")
		}
		c := podScheduledCondition(pod)
		if c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "CEL runtime error: no such key: productName") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod nvidia-domain: %v, want the scheduler to report a CEL runtime error on productName", c)
		case <-time.After(300 * time.Millisecond):
		}
	}
	claim, err := s.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, "nvidia-domain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Errorf("claim nvidia-domain is allocated: %+v", claim.Status.Allocation)
	}
}
