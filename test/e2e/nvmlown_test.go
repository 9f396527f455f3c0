//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// Sizes of TestShimIgnoresTheTenantsNVML. Each context costs ctxBytes on
// the fake GPU (FAKECUDA_CTX_BYTES), what the driver's NVML reports as the
// process's footprint; the shim charges it to the slice. Measured, the
// three contexts leave 4 GiB - 900 MiB to allocate (49 chunks); charged the
// shim's bound for a context it cannot measure (1 GiB, VGPU_FP_BOUND in
// shim/src/footprint.h), 1 GiB (16 chunks); uncounted, the whole 4 GiB (64
// chunks), and the GPU then holds 900 MiB more than the slice.
const (
	nvmlOwnSlice    = 4 << 30
	nvmlOwnCtxBytes = 300 << 20
	nvmlOwnBound    = 1 << 30
	nvmlOwnProcs    = 3
)

// TestShimIgnoresTheTenantsNVML: the tenant of a one-slice pod (4 GiB of a
// 16 GiB GPU) ships its own libnvidia-ml.so.1 in its image and puts it first
// on LD_LIBRARY_PATH, one whose nvmlInit fails and one that lies (no process
// on the GPU), to hide its contexts' memory from the shim. The driver's
// directory follows on the path, as on a node where the loader finds the
// driver's NVML on its own (the control run has only that). Three processes
// each create a context before any allocates, then each allocates in 64 MiB
// chunks until refused. The fake GPU's peak use, contexts included, stays
// within the slice, and the processes get as much as in the control run,
// more than if the contexts were charged the bound: the shim measured them
// with the NVML beside the driver, not the tenant's (which would have had
// them charged the bound, or not counted at all).
func TestShimIgnoresTheTenantsNVML(t *testing.T) {
	forEachContainerd(t, testShimIgnoresTheTenantsNVML)
}

func testShimIgnoresTheTenantsNVML(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	rp := v.mustRun(t, ctx, cudaPod(t, "cuda", 1))
	id := rp.ContainerID("main")
	uuid := v.allocationOf(t, rp, "main").GPUs[0].UUID

	control := v.nvmlOwnRun(t, ctx, id, uuid, "control", "LD_LIBRARY_PATH="+harness.DriverDirInImage)
	// The contexts are counted when nothing misleads the shim: the chunks
	// and contexts together fit in the slice.
	if got := uint64(control.Filled)*harness.TenantNVMLChunk + nvmlOwnProcs*nvmlOwnCtxBytes; got > nvmlOwnSlice {
		t.Fatalf("control: %d chunks and %d contexts hold %d MiB, past the %d MiB slice", control.Filled, nvmlOwnProcs, got>>20, nvmlOwnSlice>>20)
	}
	if control.Peak > nvmlOwnSlice {
		t.Fatalf("control: the fake GPU's peak use %d MiB passed the %d MiB slice", control.Peak>>20, nvmlOwnSlice>>20)
	}

	for _, mode := range []string{"fail", "liar"} {
		t.Run(mode, func(t *testing.T) {
			env := fmt.Sprintf("LD_LIBRARY_PATH=%s:%s EVILNVML=%s", path.Dir(harness.TenantNVMLInImage), harness.DriverDirInImage, mode)
			r := v.nvmlOwnRun(t, ctx, id, uuid, mode, env)
			if r.Peak > nvmlOwnSlice {
				t.Errorf("the fake GPU's peak use %d MiB passed the %d MiB slice: the contexts went uncounted", r.Peak>>20, nvmlOwnSlice>>20)
			}
			// Each process may end up to one chunk short where its
			// share of the slice does not split into whole chunks.
			if d := r.Filled - control.Filled; d < -nvmlOwnProcs || d > nvmlOwnProcs {
				t.Errorf("the processes got %d chunks, the control run %d: the shim measured the contexts otherwise than with the driver's NVML", r.Filled, control.Filled)
			}
		})
	}
}

// nvmlOwnRun runs harness.TenantNVMLScript in the container, on a fake
// GPU of its own (state in /tmp/NAME), and checks the chunks its processes
// got against what contexts charged the bound would leave.
func (v *vgpu) nvmlOwnRun(t *testing.T, ctx context.Context, id, uuid, name, env string) harness.TenantNVMLResult {
	t.Helper()
	d := "/tmp/" + name
	out := v.sh(t, ctx, id, harness.TenantNVMLScript(d, fakeDriverEnv(uuid, d)+" "+env, nvmlOwnProcs, nvmlOwnCtxBytes))
	r, err := harness.ParseTenantNVML(out, nvmlOwnProcs)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Logf("%s: filled %d chunks, fake GPU peak %d MiB (slice %d MiB)", name, r.Filled, r.Peak>>20, nvmlOwnSlice>>20)
	// Contexts charged the bound leave at most this many chunks; measured
	// (smaller on this fake), they leave more.
	if boundLeaves := (nvmlOwnSlice - nvmlOwnProcs*nvmlOwnBound) / harness.TenantNVMLChunk; r.Filled <= boundLeaves {
		t.Errorf("%s: the processes got %d chunks, no more than the %d left with each context charged the %d MiB bound: the shim did not measure the contexts with the driver's NVML",
			name, r.Filled, boundLeaves, nvmlOwnBound>>20)
	}
	return r
}
