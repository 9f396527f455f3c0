//go:build e2e

package e2e

import (
	"errors"
	"io/fs"
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

// A pod with a claim under the real kubelet: the DRA driver registers with
// it and prepares the claim, containerd applies the claim's CDI device and
// nri-vgpu turns it into the claim's GPU and quota inside the container;
// restarts of the kubelet and the driver keep the claim prepared, and
// deleting the pod unprepares it.
func TestDRAClaimPodUnderTheKubelet(t *testing.T) {
	draGPU := testGPUs[1]
	n := startClusterNode(t, harness.KubernetesVersion, vgpuOptions{
		extraConfig: "[dra]\nenabled = true\ngpus = [\"" + draGPU.UUID + "\"]\n",
	})
	ctx := testContext(t, 8*time.Minute)

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
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName, Namespace: podNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: draDriver,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("6Gi"), "cores": resource.MustParse("30"),
				}},
			},
		}}}},
	}
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
}
