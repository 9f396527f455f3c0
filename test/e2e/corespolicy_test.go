//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestNodeCoresPolicyAndLogLevel: a node configured with
// limits.cores_policy = "burst" and limits.log_level = "debug" signs burst
// into the pod's allocation, nri-vgpu writes both into the limits file the
// container sees, and the shim in the container runs with them (it logs
// at debug level, and enforces the slice rather than failing closed).
func TestNodeCoresPolicyAndLogLevel(t *testing.T) {
	forEachContainerd(t, testNodeCoresPolicyAndLogLevel)
}

func testNodeCoresPolicyAndLogLevel(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{extraConfig: "\n[limits]\ncores_policy = \"burst\"\nlog_level = \"debug\"\n"})
	ctx := testContext(t, 3*time.Minute)
	rp := v.mustRun(t, ctx, cudaPod(t, "burst", 1))
	id := rp.ContainerID("main")

	a := v.allocationOf(t, rp, "main")
	if a.CoresPolicy != "burst" {
		t.Errorf("signed cores policy %q, want burst", a.CoresPolicy)
	}
	if len(a.GPUs) != 1 {
		t.Fatalf("allocation %+v, want one GPU", a.GPUs)
	}
	uuid := a.GPUs[0].UUID

	// One slice of a 16 GiB GPU split 4 ways: 4 GiB, 25 %.
	want := "# written by nri-vgpu; read by libvgpu-shim.so\n" +
		"version=1\n" +
		"gpu.0.uuid=" + uuid + "\n" +
		"gpu.0.memory=4294967296\n" +
		"gpu.0.cores=25\n" +
		"cores.policy=burst\n" +
		"log.level=debug\n" +
		"ledger.shards=64\n"
	if got := v.sh(t, ctx, id, "cat "+limitsInContainer); got != want {
		t.Errorf("limits file in the container:\n%s\nwant:\n%s", got, want)
	}

	script := fmt.Sprintf("%s cudaprog -m direct init info:4GiB:4GiB alloc:5GiB:2 alloc:1GiB", fakeDriverEnv(uuid, "/tmp"))
	res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Errorf("%s\nexit %d\nstdout:\n%s\nstderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	if line := "debug: limits from " + limitsInContainer + ": 1 GPU(s)"; !strings.Contains(res.Stderr, line) {
		t.Errorf("the shim's stderr lacks %q (log.level=debug):\n%s", line, res.Stderr)
	}
}
