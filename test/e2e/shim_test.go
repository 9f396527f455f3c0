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

	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// cudaPod is a pod of one container of the CUDA test image asking for n
// slices.
func cudaPod(t *testing.T, name string, n int) *kubeletsim.Pod {
	t.Helper()
	if images.cudaTestErr != nil {
		t.Fatalf("the CUDA test image: %v", images.cudaTestErr)
	}
	pod := gpuPod(name, n)
	pod.Containers[0].Image = cudaTestImage
	return pod
}

// fakeDriverEnv is the environment of cudaprog in a container holding GPU
// uuid: the fake driver shows that one GPU (16 GiB, 108 SMs), with its
// state in stateDir.
func fakeDriverEnv(uuid, stateDir string) string {
	return fmt.Sprintf("FAKECUDA_DEVICES=%s:16GiB:108 FAKECUDA_STATE=%s", uuid, stateDir)
}

// cudaprog runs the shim's test program in a container; it exits non-zero
// with a "FAIL: ..." line when a result differs from the script's.
func (v *vgpu) cudaprog(t *testing.T, ctx context.Context, id, env, mode string, ops ...string) string {
	t.Helper()
	script := fmt.Sprintf("%s cudaprog -m %s %s", env, mode, strings.Join(ops, " "))
	res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Errorf("%s\nexit %d\nstdout:\n%s\nstderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// TestShimEnforcesTheSlice: a program in a one-slice pod sees the slice (4
// GiB of a 16 GiB GPU) in cuMemGetInfo, cuDeviceTotalMem and NVML, and is
// refused an allocation past it, whether it links libcuda or loads it the
// way the CUDA runtime does.
func TestShimEnforcesTheSlice(t *testing.T) { forEachContainerd(t, testShimEnforcesTheSlice) }

func testShimEnforcesTheSlice(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	rp := v.mustRun(t, ctx, cudaPod(t, "cuda", 1))
	id := rp.ContainerID("main")
	uuid := v.allocationOf(t, rp, "main").GPUs[0].UUID

	for _, mode := range []string{"direct", "rt12"} {
		t.Run(mode, func(t *testing.T) {
			v.cudaprog(t, ctx, id, fakeDriverEnv(uuid, "/tmp"), mode,
				"init",
				"info:4GiB:4GiB", "total:0:4GiB", "nvml:0:4GiB:0:4GiB",
				"alloc:3GiB",
				"info:1GiB:4GiB", "nvml:0:4GiB:3GiB:1GiB",
				"alloc:2GiB:2", // CUDA_ERROR_OUT_OF_MEMORY: past the slice
				"alloc:1GiB",   // exactly up to it
				"alloc:1MiB:2",
				"info:0:4GiB",
				"freeall", "info:4GiB:4GiB")
		})
	}
}

// TestTwoPodsShareAGPU: two pods of two slices each land on the same GPU
// (binpack); each holds at most its 8 GiB, counted over all its processes,
// and together they stay within the GPU's 16 GiB.
func TestTwoPodsShareAGPU(t *testing.T) { forEachContainerd(t, testTwoPodsShareAGPU) }

func testTwoPodsShareAGPU(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	// The fake driver's state is shared by both pods, like a real GPU; it
	// tells live processes by PID, so the pods use the node's PID namespace.
	shared := filepath.Join(filepath.Dir(v.configPath), "fakegpu")
	if err := os.MkdirAll(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	var pods [2]*kubeletsim.RunningPod
	for i, name := range []string{"pod-a", "pod-b"} {
		pod := cudaPod(t, name, 2)
		pod.HostPID = true
		pod.Containers[0].Mounts = []kubeletsim.Mount{{HostPath: shared, ContainerPath: "/fakegpu"}}
		pods[i] = v.mustRun(t, ctx, pod)
	}
	ga, gb := v.allocationOf(t, pods[0], "main").GPUs, v.allocationOf(t, pods[1], "main").GPUs
	if len(ga) != 1 || len(gb) != 1 || ga[0].UUID != gb[0].UUID {
		t.Fatalf("the pods got %+v and %+v, want one GPU shared (binpack)", ga, gb)
	}
	env := fakeDriverEnv(ga[0].UUID, "/fakegpu")
	a, b := pods[0].ContainerID("main"), pods[1].ContainerID("main")

	// Pod A holds 7 GiB in a background process until told to let go. It
	// says so once quiet for a while: a process returns the unused part of
	// its lease (shim/README.md, "Leases") after 0.1 s without allocating,
	// and until then the others see that part as neither used nor free.
	v.sh(t, ctx, a, env+" cudaprog -m direct init alloc:7GiB sleep:500 touch:/fakegpu/a-held waitfile:/fakegpu/a-release freeall >/tmp/a.log 2>&1 & echo $! >/tmp/a.pid")
	t.Cleanup(func() { _ = os.WriteFile(filepath.Join(shared, "a-release"), nil, 0o644) })
	if err := waitFor(ctx, 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(shared, "a-held"))
		return err == nil
	}); err != nil {
		t.Fatalf("pod A's program did not allocate: %s", v.sh(t, ctx, a, "cat /tmp/a.log"))
	}

	// A second process of pod A shares A's 8 GiB with the first.
	v.cudaprog(t, ctx, a, env, "direct", "init", "info:1GiB:8GiB", "alloc:2GiB:2", "alloc:1GiB")
	// Pod B has its own 8 GiB, whatever A holds; the GPU then has 1 GiB left.
	v.cudaprog(t, ctx, b, env, "direct", "init", "info:8GiB:8GiB", "nvml:0:8GiB:0:8GiB",
		"alloc:7GiB", "info:1GiB:8GiB", "alloc:2GiB:2", "alloc:1GiB", "info:0:8GiB", "alloc:1MiB:2")

	if err := os.WriteFile(filepath.Join(shared, "a-release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// cudaprog prints "ok" last when every step went as scripted. (With the
	// node's PID namespace, pidof would see other cudaprogs of the machine.)
	var log string
	if err := waitFor(ctx, 20*time.Second, func() bool {
		log = v.sh(t, ctx, a, "cat /tmp/a.log")
		return strings.Contains(log, "FAIL") || strings.HasSuffix(strings.TrimSpace(log), "ok")
	}); err != nil || strings.Contains(log, "FAIL") {
		t.Fatalf("pod A's program did not finish cleanly: %s", log)
	}
	// Its exit, just after "ok", must be over before A's slice is checked.
	if err := waitFor(ctx, 20*time.Second, func() bool {
		res, err := v.c.Exec(ctx, a, "/bin/sh", "-c", "kill -0 $(cat /tmp/a.pid)")
		return err == nil && res.ExitCode != 0
	}); err != nil {
		t.Fatalf("pod A's program did not exit")
	}
	// Pod A's processes are gone, so is their usage: A can have its whole
	// slice again. (The fake driver, like the real one, frees a dead
	// process's memory, though only when it runs short.)
	v.cudaprog(t, ctx, a, env, "direct", "init", "nvml:0:8GiB:0", "alloc:8GiB", "info:0:8GiB")
}
