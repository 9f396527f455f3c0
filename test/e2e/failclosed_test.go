//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// The runtime's refusal of the device plugin's gate mount names this path.
const gatePath = "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin"

// tolerateAnnotation is the validator's tolerate_missing_plugins_annotation
// that `nri-vgpu configure containerd` sets.
const tolerateAnnotation = "nri-vgpu.io/tolerate-missing-plugin"

// hasValidator reports whether containerd version has NRI's built-in
// default validator (NRI v0.10, containerd 2.2).
func hasValidator(version string) bool { return !strings.HasPrefix(version, "v1.") }

// TestNodeFailsClosedWithoutNRIPlugin: with nri-vgpu killed, no GPU pod
// starts (the gate, on every containerd), and on a containerd with NRI's
// validator no pod at all starts unless it tolerates the plugin's absence
// (a non-GPU pod whose image sets NVIDIA_VISIBLE_DEVICES=all included).
// Once the plugin is back, they start with their edits.
func TestNodeFailsClosedWithoutNRIPlugin(t *testing.T) {
	forEachContainerd(t, testNodeFailsClosedWithoutNRIPlugin)
}

func testNodeFailsClosedWithoutNRIPlugin(t *testing.T, containerd string) {
	var opts vgpuOptions
	if hasValidator(containerd) {
		opts.containerd.Validator = &harness.Validator{RequiredPlugins: []string{"nri-vgpu"}, TolerateMissingAnnotation: tolerateAnnotation}
	}
	v := startVGPU(t, containerd, opts)
	ctx := testContext(t, 5*time.Minute)
	running := v.mustRun(t, ctx, gpuPod("running", 1))

	pids := processesOf(binaries.nriPlugin)
	if len(pids) != 1 {
		t.Fatalf("want one nri-vgpu process, found %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 10*time.Second, func() bool { return len(processesOf(binaries.nriPlugin)) == 0 }); err != nil {
		t.Fatal("nri-vgpu did not die")
	}

	mustFail := func(pod *kubeletsim.Pod, reason string) {
		t.Helper()
		rp, err := v.run(t, ctx, pod)
		if err == nil {
			t.Errorf("pod %s started while nri-vgpu was down", pod.Name)
			return
		}
		if !strings.Contains(err.Error(), reason) {
			t.Errorf("pod %s: error = %v, want one naming %q", pod.Name, err, reason)
		}
		if rp != nil && rp.SandboxID != "" {
			list, lerr := v.c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{
				Filter: &runtimeapi.ContainerFilter{PodSandboxId: rp.SandboxID}})
			if lerr != nil {
				t.Fatal(lerr)
			}
			// The gate fails the start (runc create), so the container
			// may exist, created, but never runs.
			for _, c := range list.Containers {
				if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
					t.Errorf("pod %s: container %s is running", pod.Name, c.Metadata.GetName())
				}
			}
		}
	}
	gpuReason, plainReason := gatePath, `required plugin "nri-vgpu" not present`
	if hasValidator(containerd) {
		gpuReason = plainReason // the validator speaks first
	}
	mustFail(gpuPod("gpu-while-down", 1), gpuReason)

	// A pod that tolerates the plugin's absence (the plugin's own pods,
	// static pods) passes the validator, but its GPU container still meets
	// the gate.
	tolerating := gpuPod("gpu-tolerating", 1)
	tolerating.Annotations = map[string]string{tolerateAnnotation: "true"}
	mustFail(tolerating, gatePath)

	plain := gpuPod("plain-while-down", 0)
	plain.Containers[0].Image = cudaLikeImage
	if hasValidator(containerd) {
		mustFail(plain, plainReason)
		agent := gpuPod("node-agent", 0)
		agent.Annotations = map[string]string{tolerateAnnotation: "true"}
		v.mustRun(t, ctx, agent)
	} else {
		t.Logf("containerd %s has no NRI validator: pods without GPUs are not held back while nri-vgpu is down (documented)", containerd)
	}

	// The running pod keeps its limits meanwhile.
	if _, err := limitsOf(t, ctx, v, running.ContainerID("main")); err != nil {
		t.Errorf("the running pod while nri-vgpu was down: %v", err)
	}

	// Back, as systemd or the DaemonSet would start it.
	startExternalNRIPlugin(t, v)
	v.waitNRIReady(t, ctx)
	rp := v.mustRun(t, ctx, gpuPod("gpu-after", 3))
	if got := v.allocationOf(t, rp, "main"); len(got.GPUs) != 1 || got.GPUs[0].Slices != 3 {
		t.Errorf("3 slices = %+v, want them on one GPU (binpack)", got.GPUs)
	}
	if _, err := limitsOf(t, ctx, v, rp.ContainerID("main")); err != nil {
		t.Errorf("GPU pod after the plugin came back: %v", err)
	}
	held := 0
	for _, d := range v.kubelet.Devices(resourceName) {
		if d.PodUID == rp.Pod.UID {
			held++
		}
	}
	if held != 3 {
		t.Errorf("kubelet shows %d slices held by the pod, want 3", held)
	}
	plain.UID = kubeletsim.NewUID()
	rp = v.mustRun(t, ctx, plain)
	if got := strings.TrimSpace(v.sh(t, ctx, rp.ContainerID("main"), "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
		t.Errorf("pod without GPUs after the plugin came back: NVIDIA_VISIBLE_DEVICES = %q, want void", got)
	}
}

// limitsOf reads the limits file inside a container.
func limitsOf(t *testing.T, ctx context.Context, v *vgpu, id string) (string, error) {
	t.Helper()
	res, err := v.c.Exec(ctx, id, "/bin/cat", limitsInContainer)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "gpu.0.memory=") {
		return "", fmt.Errorf("no limits file in the container: %s%s", res.Stdout, res.Stderr)
	}
	return res.Stdout, nil
}

// TestGPUPodNeverStartsWithoutNRIPlugin: on a node where nri-vgpu was never
// registered with containerd (NRI off, the plugin not installed), the device
// plugin's allocation still reaches the runtime, and its gate refuses the
// container.
func TestGPUPodNeverStartsWithoutNRIPlugin(t *testing.T) {
	forEachContainerd(t, func(t *testing.T, containerd string) {
		v := startVGPU(t, containerd, vgpuOptions{withoutNRI: true})
		ctx := testContext(t, 2*time.Minute)
		_, err := v.run(t, ctx, gpuPod("unprepared", 1))
		if err == nil || !strings.Contains(err.Error(), gatePath) {
			t.Errorf("GPU pod without nri-vgpu: error = %v, want the runtime's refusal of %s", err, gatePath)
		}
		// Pods without GPUs are not the device plugin's to hold back.
		v.mustRun(t, ctx, gpuPod("plain", 0))
	})
}
