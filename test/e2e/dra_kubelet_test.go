//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/util/jsonpath"

	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// A pod with a claim under the real kubelet: the DRA driver registers with
// it and prepares the claim, containerd applies the claim's CDI device and
// nri-vgpu turns it into the claim's GPU and quota inside the container;
// restarts of the kubelet and the driver keep the claim prepared, and
// deleting the pod unprepares it. Then two containers of one pod share a
// claim, each in its own pid namespace. On each containerd version
// selected (the README names 1.7 with CDI enabled, and 2.x) under the
// first Kubernetes release selected, and on containerd 2.x under each
// other one.
func TestDRAClaimPodUnderTheKubelet(t *testing.T) {
	first := true
	forEachKubernetes(t, func(t *testing.T, version string) {
		if first {
			first = false
			forEachContainerd(t, func(t *testing.T, containerd string) {
				testDRAClaimPodUnderTheKubelet(t, version, containerd)
			})
			return
		}
		if !slices.Contains(containerdVersions, harness.ContainerdVersion) {
			t.Skipf("containerd %s is not selected", harness.ContainerdVersion)
		}
		t.Run(harness.ContainerdVersion, func(t *testing.T) {
			testDRAClaimPodUnderTheKubelet(t, version, harness.ContainerdVersion)
		})
	})
}

func testDRAClaimPodUnderTheKubelet(t *testing.T, kubernetes, containerd string) {
	draGPU := testGPUs[1]
	n := startClusterNodeOn(t, kubernetes, containerd, vgpuOptions{
		extraConfig: "[dra]\nenabled = true\ngpus = [\"" + draGPU.UUID + "\"]\n",
	})
	ctx := testContext(t, 10*time.Minute)

	dir := t.TempDir()
	bin := filepath.Join(dir, "nri-vgpu-dra-driver")
	if err := harness.GoBuild(ctx, "./cmd/dra-driver", bin, false); err != nil {
		t.Fatal(err)
	}
	// The node's config, with the CDI directory containerd reads: [dra] is
	// its last table.
	nodeCfg, err := os.ReadFile(n.configPath)
	if err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(n.c.Dir, "cdi")
	driverCfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(driverCfg, append(nodeCfg, []byte("cdi_dir = \""+cdiDir+"\"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeletRoot := filepath.Join(n.k.Dir, "kubelet")
	logPath := filepath.Join(dir, "dra-driver.log")
	var driver *harness.Process
	startDriver := func() {
		t.Helper()
		cmd := exec.Command(bin, "--config", driverCfg, "--kubeconfig", n.k.Kubeconfig, "--node-name", n.k.NodeName,
			"--plugin-dir", filepath.Join(kubeletRoot, "plugins", draDriver),
			"--registry-dir", filepath.Join(kubeletRoot, "plugins_registry"))
		p, err := harness.StartProcess(cmd, logPath)
		if err != nil {
			t.Fatal(err)
		}
		driver = p
	}
	startDriver()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("DRA driver log (tail):\n%s", harness.Tail(logPath, 40))
		}
		if driver != nil {
			_ = driver.Stop(10 * time.Second)
		}
	})
	s := &draScheduler{k: n.k, driver: driver, log: logPath}
	if _, err := n.k.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: draDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + draDriver + `"`},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitSlice(t, ctx, []string{draDeviceName(1)})

	claimName := "quota"
	claim := gpuClaim(claimName, "6Gi", "30")
	created, err := n.k.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := podSpec("claim", harness.BusyboxImage, 0)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	id := n.runPod(t, ctx, pod)

	want := []limits.GPULimit{{UUID: draGPU.UUID, Memory: 6 << 30, Cores: 30}}
	checkQuota := func(id string) {
		t.Helper()
		lf, err := limits.ParseLimits([]byte(n.sh(t, ctx, id, "cat "+limitsInContainer)))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(lf.GPUs, want) {
			t.Errorf("limits file GPUs in the container = %+v, want %+v", lf.GPUs, want)
		}
		if out := n.sh(t, ctx, id, "ls /dev/nvidia1 && (ls /dev/nvidia0 2>/dev/null || echo no-gpu0)"); out != "/dev/nvidia1\nno-gpu0\n" {
			t.Errorf("GPU device nodes in the container: %q, want /dev/nvidia1 only", out)
		}
	}
	checkQuota(id)
	t.Run("quota in the claim's status", func(t *testing.T) {
		checkClaimStatus(t, ctx, n.k, claimName, draDeviceName(1),
			`{"apiVersion":"nri-vgpu.io/v1","kind":"GPUQuota","uuid":"`+draGPU.UUID+`","memory":6442450944,"cores":30,"coresPolicy":"hard"}`)
	})
	claimDir := filepath.Join(n.runDir, "containers", "claim-"+string(created.UID))
	if _, err := os.Stat(filepath.Join(claimDir, "limits")); err != nil {
		t.Fatalf("the claim's host state: %v", err)
	}

	// Restart the kubelet and the driver: the claim stays prepared and
	// the container keeps its quota; the restarted driver unprepares it.
	if err := n.k.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := driver.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	startDriver()
	if err := n.k.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.k.WaitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	checkQuota(id)
	if _, err := os.Stat(filepath.Join(claimDir, "limits")); err != nil {
		t.Fatalf("the claim's host state after the restarts: %v", err)
	}

	// Deleting the pod unprepares the claim: its host state goes.
	n.deletePod(t, ctx, pod)
	if err := waitFor(ctx, 90*time.Second, func() bool {
		_, err := os.Stat(claimDir)
		return errors.Is(err, fs.ErrNotExist)
	}); err != nil {
		t.Errorf("the claim's host state %s is still there after its pod went", claimDir)
	}

	t.Run("containers sharing the claim without a shared pid namespace", func(t *testing.T) {
		sharedClaimPair(t, ctx, n, draGPU.UUID)
	})
	t.Run("pods joining and leaving a running claim", func(t *testing.T) {
		claimOverTime(t, ctx, n, draGPU.UUID)
	})
}

// claimOverTime: a standalone claim serves the pods created after its
// first pod runs (the kubelet prepares it once), at their first attempt,
// all of them held to the claim's one quota; a pod that leaves takes
// nothing from the others; a pod the claim is not reserved for, carrying
// the claim's marker through a volume of its own, is refused.
func claimOverTime(t *testing.T, ctx context.Context, n *clusterNode, gpuUUID string) {
	t.Helper()
	if images.cudaTestErr != nil {
		t.Fatalf("the CUDA test image: %v", images.cudaTestErr)
	}
	// The cluster runs no resourceclaim controller: the claims of the
	// earlier cases, whose pods are gone, stay reserved and allocated. What
	// the controller would do, done here: they are freed.
	claims := n.k.Client.ResourceV1().ResourceClaims(podNamespace)
	release := func(name string, keep ...types.UID) {
		t.Helper()
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Status.ReservedFor = slices.DeleteFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return !slices.Contains(keep, r.UID)
		})
		if len(c.Status.ReservedFor) == 0 {
			c.Status.Allocation = nil
		}
		if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	earlier, err := claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range earlier.Items {
		release(c.Name)
	}
	claimName := "overtime"
	created, err := n.k.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, gpuClaim(claimName, "6Gi", "30"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shared := t.TempDir()
	env := fakeDriverEnv(gpuUUID, "/tmp")
	idle := "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
	claimPod := func(name, ops string) *corev1.Pod {
		pod := podSpec(name, cudaTestImage, 0)
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
		pod.Spec.Volumes = []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: shared}}}}
		main := &pod.Spec.Containers[0]
		main.Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		main.VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
		script := idle
		if ops != "" {
			script = fmt.Sprintf("%s cudaprog -m direct %s >/shared/%s.log 2>&1 & %s", env, ops, name, idle)
		}
		main.Command = []string{"/bin/sh", "-c", script}
		return pod
	}
	waitFile := func(name, log string) {
		t.Helper()
		if err := waitFor(ctx, 90*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(shared, name))
			return err == nil
		}); err != nil {
			out, _ := os.ReadFile(filepath.Join(shared, log))
			t.Fatalf("no %s: the program's log:\n%s", name, out)
		}
	}
	// A pod that joins a running claim starts at its first attempt: a
	// refused container would leave a Failed event before the kubelet's
	// retry let it run.
	firstAttempt := func(pod *corev1.Pod) {
		t.Helper()
		events, err := n.k.Client.CoreV1().Events(podNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			if e.Reason == "Failed" {
				t.Errorf("pod %s ran only after a refusal: %s", pod.Name, e.Message)
			}
		}
	}
	defer os.WriteFile(filepath.Join(shared, "release"), nil, 0o644)

	// Pod 1 runs and holds 4 GiB of the claim's 6.
	one := claimPod("overtime-1", "init alloc:4GiB touch:/shared/one-held waitfile:/shared/release")
	oneID := n.runPod(t, ctx, one)
	waitFile("one-held", "overtime-1.log")

	// Pods 2 and 3 are created once the claim is prepared and in use.
	two := claimPod("overtime-2", "init waitfile:/shared/go alloc:3GiB:2 alloc:2GiB touch:/shared/two-held waitfile:/shared/release")
	twoID := n.runPod(t, ctx, two)
	three := claimPod("overtime-3", "")
	threeID := n.runPod(t, ctx, three)
	firstAttempt(two)
	firstAttempt(three)
	c, err := n.k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Status.ReservedFor) != 3 {
		t.Errorf("the claim is reserved for %+v, want the three pods", c.Status.ReservedFor)
	}

	// Pod 2 gets 2 GiB beside pod 1's 4 (not 3): one quota for the pods.
	if err := os.WriteFile(filepath.Join(shared, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFile("two-held", "overtime-2.log")
	// Pod 3 sees the claim's 6 GiB used and gets nothing more.
	n.cudaprog(t, ctx, threeID, env, "direct", "init", "info:0:6GiB", "alloc:1MiB:2")
	for _, id := range []string{oneID, twoID, threeID} {
		if lf, err := limits.ParseLimits([]byte(n.sh(t, ctx, id, "cat "+limitsInContainer))); err != nil {
			t.Fatal(err)
		} else if want := []limits.GPULimit{{UUID: gpuUUID, Memory: 6 << 30, Cores: 30}}; !slices.Equal(lf.GPUs, want) {
			t.Errorf("container %s: limits %+v, want the claim's %+v", id, lf.GPUs, want)
		}
	}

	// Pod 2 leaves (the claim controller's part done here): its 2 GiB
	// come back, pods 1 and 3 keep the claim, still held to its 6 GiB.
	podUID := func(pod *corev1.Pod) types.UID {
		t.Helper()
		p, err := n.k.Client.CoreV1().Pods(podNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.UID
	}
	oneUID, twoUID, threeUID := podUID(one), podUID(two), podUID(three)
	n.deletePod(t, ctx, two)
	release(claimName, oneUID, threeUID)
	n.cudaprog(t, ctx, threeID, env, "direct", "init", "alloc:3GiB:2", "alloc:2GiB")
	n.cudaprog(t, ctx, oneID, env, "direct", "init", "alloc:3GiB:2", "alloc:2GiB")
	if out, _ := os.ReadFile(filepath.Join(shared, "overtime-1.log")); strings.Contains(string(out), "FAIL") {
		t.Errorf("pod 1's program after pod 2 left:\n%s", out)
	}
	// A pod joining after one left runs too.
	four := claimPod("overtime-4", "")
	fourID := n.runPod(t, ctx, four)
	firstAttempt(four)
	n.cudaprog(t, ctx, fourID, env, "direct", "init", "info:2GiB:6GiB")
	// The claim's record follows: pod 2 is gone from it, pod 4 in it.
	data, err := os.ReadFile(filepath.Join(n.runDir, "containers", "claim-"+string(created.UID), "container.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rec := string(data); strings.Contains(rec, string(twoUID)) || !strings.Contains(rec, string(podUID(four))) ||
		!strings.Contains(rec, string(oneUID)) || !strings.Contains(rec, string(threeUID)) {
		t.Errorf("the claim's record after pod 2 left and pod 4 joined:\n%s", rec)
	}

	// A pod the claim is not reserved for, with the claim's marker as a
	// volume of its own, is refused.
	dev, err := draclaim.DeviceName(gpuUUID)
	if err != nil {
		t.Fatal(err)
	}
	outsider := podSpec("overtime-outsider", cudaTestImage, 0)
	outsider.Spec.Volumes = []corev1.Volume{{Name: "marker", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	outsider.Spec.Containers[0].Command = []string{"/bin/sh", "-c", idle}
	outsider.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "marker", MountPath: draclaim.MarkerPath(string(created.UID), dev)}}
	n.create(t, ctx, outsider)
	var last *corev1.Pod
	if err := waitFor(ctx, 60*time.Second, func() bool {
		p, err := n.k.Client.CoreV1().Pods(podNamespace).Get(ctx, outsider.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = p
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && strings.Contains(w.Message, "is not reserved for pod "+string(p.UID)) {
				return true
			}
		}
		return false
	}); err != nil {
		t.Errorf("a pod the claim is not reserved for was not refused: %s", describePod(last))
	}
	if last != nil && last.Status.Phase == corev1.PodRunning {
		t.Errorf("a pod the claim is not reserved for runs")
	}
}

// sharedClaimPair: two containers of one pod share a claim without sharing a
// pid namespace, and their GPU programs have the same pid: each allocates, together they are held to the
// claim's memory, and each container sees the claim's whole use.
func sharedClaimPair(t *testing.T, ctx context.Context, n *clusterNode, gpuUUID string) {
	t.Helper()
	if images.cudaTestErr != nil {
		t.Fatalf("the CUDA test image: %v", images.cudaTestErr)
	}
	claimName := "pair"
	claim := gpuClaim(claimName, "6Gi", "30")
	if _, err := n.k.Client.ResourceV1().ResourceClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	shared := t.TempDir()
	env := fakeDriverEnv(gpuUUID, "/tmp")
	// Each container's pid 1 forks until its namespace has handed out pid
	// 99, then starts the program: pid 100 in both. "a" holds 4 GiB; then
	// "b" is refused 3 GiB and given 2.
	start := func(name, ops string) string {
		return fmt.Sprintf("p=0; while [ $p -lt 99 ]; do (:) & p=$!; wait $p; done; "+
			"%s cudaprog -m direct %s >/shared/%s.log 2>&1 & echo $! >/shared/%s.pid; "+
			"trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done", env, ops, name, name)
	}
	pod := podSpec("pair", cudaTestImage, 0)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: shared}}}}
	main := &pod.Spec.Containers[0]
	main.Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	main.VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	second := *main
	second.Name = "second"
	main.Command = []string{"/bin/sh", "-c", start("a", "init alloc:4GiB touch:/shared/a-held waitfile:/shared/release")}
	second.Command = []string{"/bin/sh", "-c", start("b",
		"init waitfile:/shared/a-held alloc:3GiB:2 alloc:2GiB touch:/shared/b-held waitfile:/shared/release")}
	pod.Spec.Containers = append(pod.Spec.Containers, second)
	mainID := n.runPod(t, ctx, pod)
	defer n.deletePod(t, ctx, pod)
	defer os.WriteFile(filepath.Join(shared, "release"), nil, 0o644)

	if err := waitFor(ctx, 90*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(shared, "b-held"))
		return err == nil
	}); err != nil {
		a, _ := os.ReadFile(filepath.Join(shared, "a.log"))
		b, _ := os.ReadFile(filepath.Join(shared, "b.log"))
		t.Fatalf("the two programs did not both get their memory\na: %s\nb: %s", a, b)
	}
	a, _ := os.ReadFile(filepath.Join(shared, "a.pid"))
	b, _ := os.ReadFile(filepath.Join(shared, "b.pid"))
	if strings.TrimSpace(string(a)) != strings.TrimSpace(string(b)) {
		t.Fatalf("the programs' pids in their containers differ (%q, %q): the case would prove nothing", a, b)
	}
	p, err := n.k.Client.CoreV1().Pods(podNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secondID := ""
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "second" {
			secondID = strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	if secondID == "" {
		t.Fatalf("no status of container second: %s", describePod(p))
	}
	// A third program in either container sees both programs' 6 GiB used,
	// nothing free, and gets nothing more.
	for _, id := range []string{mainID, secondID} {
		n.cudaprog(t, ctx, id, env, "direct", "init", "info:0:6GiB", "nvml:0:6GiB:6GiB:0", "alloc:1MiB:2")
	}
}

// checkClaimStatus checks that the prepared claim name of one GPU carries,
// in its status.devices, one entry of the driver for its allocation result
// (same device and shareID) whose data is the JSON object want, and that
// the README's kubectl jsonpath reads the entry's device, memory and cores.
func checkClaimStatus(t *testing.T, ctx context.Context, k *harness.Cluster, name, device, want string) {
	t.Helper()
	claim, err := k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one device", name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	if r.Device != device || r.ShareID == nil {
		t.Fatalf("claim %s allocated %s share %v, want a share of %s", name, r.Device, r.ShareID, device)
	}
	var mine []resourceapi.AllocatedDeviceStatus
	for _, d := range claim.Status.Devices {
		if d.Driver == draDriver {
			mine = append(mine, d)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("claim %s: status.devices of %s = %+v, want one entry", name, draDriver, mine)
	}
	e := mine[0]
	if e.Pool != k.NodeName || e.Device != device || e.ShareID == nil || *e.ShareID != string(*r.ShareID) {
		t.Errorf("status entry %s/%s share %v, want %s/%s share %s", e.Pool, e.Device, e.ShareID, k.NodeName, device, *r.ShareID)
	}
	if e.Data == nil {
		t.Fatalf("status entry of %s has no data", device)
	}
	var got, exp map[string]any
	if err := json.Unmarshal(e.Data.Raw, &got); err != nil {
		t.Fatalf("status data %s: %v", e.Data.Raw, err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("status data = %s, want %s", e.Data.Raw, want)
	}

	// What kubectl -o jsonpath prints, with the README's expression: on
	// the claim's JSON decoded as kubectl decodes it (integers as int64).
	raw, err := k.Client.ResourceV1().RESTClient().Get().Namespace(podNamespace).Resource("resourceclaims").Name(name).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	jp := jsonpath.New("readme")
	if err := jp.Parse(`{range .status.devices[?(@.driver=="gpu.nri-vgpu.io")]}{.device}{"\t"}{.data.memory}{"\t"}{.data.cores}{"\n"}{end}`); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := jp.Execute(&out, obj); err != nil {
		t.Fatal(err)
	}
	var memory, cores float64
	memory, _ = exp["memory"].(float64)
	cores, _ = exp["cores"].(float64)
	if line := fmt.Sprintf("%s\t%.0f\t%.0f\n", device, memory, cores); out.String() != line {
		t.Errorf("jsonpath printed %q, want %q", out.String(), line)
	}
}
