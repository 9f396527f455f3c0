//go:build e2e

package docker

import (
	"context"
	"fmt"
	"path"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// Sizes of TestShimIgnoresTheTenantsNVML: a 3 GiB slice of GPU 0 (4 GiB),
// two processes, each context costing 300 MiB on the fake GPU. Measured,
// the contexts leave 3 GiB - 600 MiB to allocate (38 chunks of 64 MiB);
// charged the shim's bound for a context it cannot measure (1 GiB,
// VGPU_FP_BOUND in shim/src/footprint.h), 1 GiB (16 chunks); uncounted, the
// whole 3 GiB (48 chunks), and the GPU then holds 600 MiB more than the
// slice.
const (
	nvmlOwnSlice    = 3 << 30
	nvmlOwnCtxBytes = 300 << 20
	nvmlOwnBound    = 1 << 30
	nvmlOwnProcs    = 2
)

// TestShimIgnoresTheTenantsNVML: under docker run, a tenant whose image
// ships its own libnvidia-ml.so.1 and puts it first on LD_LIBRARY_PATH
// (ahead of the driver's directory), one whose nvmlInit fails and one that
// lies (no process on the GPU), cannot hide its contexts' memory from the
// shim: the fake GPU's peak use stays within the slice, and its processes
// get as much as in a control run without the tenant's library, more than
// contexts charged the bound would leave.
func TestShimIgnoresTheTenantsNVML(t *testing.T) {
	ctx := setup(t)
	if !env.haveShim {
		t.Skip("shim/build lacks the shim, its fake driver or cudaprog: run make -C shim")
	}
	control := nvmlOwnRun(t, ctx, "control", "LD_LIBRARY_PATH="+harness.DriverDirInImage)
	if control.Peak > nvmlOwnSlice {
		t.Fatalf("control: the fake GPU's peak use %d MiB passed the %d MiB slice", control.Peak>>20, nvmlOwnSlice>>20)
	}
	for _, mode := range []string{"fail", "liar"} {
		t.Run(mode, func(t *testing.T) {
			env := fmt.Sprintf("LD_LIBRARY_PATH=%s:%s EVILNVML=%s", path.Dir(harness.TenantNVMLInImage), harness.DriverDirInImage, mode)
			r := nvmlOwnRun(t, ctx, mode, env)
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

// nvmlOwnRun runs harness.TenantNVMLScript in a container of its own with a
// 3 GiB slice of GPU 0 and checks the chunks its processes got against what
// contexts charged the bound would leave.
func nvmlOwnRun(t *testing.T, ctx context.Context, name, env string) harness.TenantNVMLResult {
	t.Helper()
	vars := []string{"NVIDIA_VISIBLE_DEVICES=0", fmt.Sprintf("NRI_VGPU_MEMORY=%dMiB", nvmlOwnSlice>>20)}
	script := harness.TenantNVMLScript("/tmp/"+name, "FAKECUDA_DEVICES="+uuid0+":4GiB:108 "+env, nvmlOwnProcs, nvmlOwnCtxBytes)
	out := docker(t, ctx, vgpuRun(vars, "sh", "-c", script)...)
	r, err := harness.ParseTenantNVML(out, nvmlOwnProcs)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Logf("%s: filled %d chunks, fake GPU peak %d MiB (slice %d MiB)", name, r.Filled, r.Peak>>20, nvmlOwnSlice>>20)
	if boundLeaves := (nvmlOwnSlice - nvmlOwnProcs*nvmlOwnBound) / harness.TenantNVMLChunk; r.Filled <= boundLeaves {
		t.Errorf("%s: the processes got %d chunks, no more than the %d left with each context charged the %d MiB bound: the shim did not measure the contexts with the driver's NVML",
			name, r.Filled, boundLeaves, nvmlOwnBound>>20)
	}
	return r
}
