//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/bindings"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// TestAllocationIDServesOnePodEver: the annotation of a removed pod is
// refused to a new pod, also after nri-vgpu and containerd restarted (the
// bindings live under state_dir), while the kubelet counts the slice free.
func TestAllocationIDServesOnePodEver(t *testing.T) {
	forEachContainerd(t, testAllocationIDServesOnePodEver)
}

func testAllocationIDServesOnePodEver(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 4*time.Minute)
	gone := v.mustRun(t, ctx, gpuPod("gone", 1))
	issued := gone.Containers["main"].Config.Annotations[allocationAnnotation]
	if err := v.kubelet.KillPod(ctx, v.c.Runtime, gone); err != nil {
		t.Fatal(err)
	}
	replay := func(stage, want string) {
		t.Helper()
		pod := gpuPod("replay", 0)
		pod.Containers[0].ExtraAnnotations = map[string]string{allocationAnnotation: issued}
		_, err := v.run(t, ctx, pod)
		if err == nil || !strings.Contains(err.Error(), "nri-vgpu: allocation rejected") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: replaying a removed pod's allocation: error = %v, want a rejection containing %q", stage, err, want)
		}
	}
	removed := gone.Pod.UID + ", which was removed"
	replay("after the pod was removed", removed)
	if err := v.c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	v.waitNRIReady(t, ctx)
	replay("after containerd (and the pre-registered nri-vgpu) restarted", removed)
	// The store deleted beside the key: the record is lost, and the
	// floor it restarts with refuses what it no longer remembers.
	if err := os.Remove(filepath.Join(v.stateDir, bindings.FileName)); err != nil {
		t.Fatal(err)
	}
	if err := v.c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	v.waitNRIReady(t, ctx)
	replay("after bindings.json was deleted and nri-vgpu restarted", "the oldest allocation this node still remembers")
	// The node still serves new pods.
	v.mustRun(t, ctx, gpuPod("fresh", 1))
}

// TestPodAnnotationsCannotCarryAnAllocation: with containerd passing every
// pod annotation through to the containers (pod_annotations = ["*/*"]), a
// pod that asked for no GPU and carries a validly signed allocation in its
// own annotations is refused.
func TestPodAnnotationsCannotCarryAnAllocation(t *testing.T) {
	forEachContainerd(t, testPodAnnotationsCannotCarryAnAllocation)
}

func testPodAnnotationsCannotCarryAnAllocation(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{containerd: harness.Options{PodAnnotations: []string{"*/*"}}})
	ctx := testContext(t, 3*time.Minute)
	victim := v.mustRun(t, ctx, gpuPod("victim", 1))
	a := v.allocationOf(t, victim, "main")

	// The pass-through is on: a harmless pod annotation reaches the
	// container's runtime spec.
	control := gpuPod("control", 0)
	control.Annotations = map[string]string{"example.com/team": "ml"}
	rc := v.mustRun(t, ctx, control)
	if got := v.runtimeSpec(t, ctx, rc.ContainerID("main")).Annotations["example.com/team"]; got != "ml" {
		t.Fatalf("pod annotations are not passed through (example.com/team = %q): the test would prove nothing", got)
	}

	// A fresh, validly signed allocation (say, leaked from the node).
	key, err := allockey.Load(v.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	forged := *a
	if forged.ID, err = allocation.NewID(); err != nil {
		t.Fatal(err)
	}
	value, err := allocation.Sign(key, &forged)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1} {
		pod := gpuPod("forger", n)
		pod.Annotations = map[string]string{allocationAnnotation: value}
		_, err := v.run(t, ctx, pod)
		if err == nil || !strings.Contains(err.Error(), "nri-vgpu: allocation rejected: the pod's own annotations carry "+allocationAnnotation) {
			t.Errorf("pod asking for %d slices with an allocation in its annotations: error = %v, want the pod-annotation rejection", n, err)
		}
	}
}

// TestTenantCannotFillTheNode: the region directory is the only host storage
// a container can write; filling it stops at its own 1 MiB, and the next
// pod is created as usual.
func TestTenantCannotFillTheNode(t *testing.T) {
	forEachContainerd(t, testTenantCannotFillTheNode)
}

func testTenantCannotFillTheNode(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	tenant := v.mustRun(t, ctx, gpuPod("filler", 1))
	res, err := v.c.Exec(ctx, tenant.ContainerID("main"), "/bin/sh", "-c",
		"dd if=/dev/zero of="+regionInContainer+"/fill bs=65536 count=1024; ls -l "+regionInContainer+"/fill")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Stderr, "No space left on device") {
		t.Errorf("writing 64 MiB into the region directory: stderr %q; want ENOSPC", res.Stderr)
	}
	var size int64 = -1
	for _, f := range strings.Fields(res.Stdout) {
		if n, err := strconv.ParseInt(f, 10, 64); err == nil && n > 4096 {
			size = n
		}
	}
	if size > 1<<20 {
		t.Errorf("the tenant wrote %d bytes to host storage, want at most 1 MiB (%s)", size, res.Stdout)
	}
	v.mustRun(t, ctx, gpuPod("next", 1))
}
