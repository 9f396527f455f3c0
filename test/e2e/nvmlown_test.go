//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// Sizes of TestShimIgnoresTheTenantsNVML. Each context costs ctxBytes on
// the fake GPU (FAKECUDA_CTX_BYTES), what the driver's NVML reports as the
// process's footprint; the shim charges it to the slice. Measured, the
// three contexts leave 4 GiB - 900 MiB to allocate (49 chunks); charged the
// shim's bound for a context it cannot measure (1 GiB, VGPU_FP_BOUND in
// shim/src/shim.h), 1 GiB (16 chunks); uncounted, the whole 4 GiB (64
// chunks), and the GPU then holds 900 MiB more than the slice.
const (
	nvmlOwnSlice    = 4 << 30
	nvmlOwnCtxBytes = 300 << 20
	nvmlOwnBound    = 1 << 30
	nvmlOwnChunk    = 64 << 20
	nvmlOwnProcs    = 3
)

// driverDirInImage is where the image keeps the fake driver and its NVML.
var driverDirInImage = pathDir(harness.CudaProgInImage) + "/fake"

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

	control := v.nvmlOwnRun(t, ctx, id, uuid, "control", "LD_LIBRARY_PATH="+driverDirInImage)
	// The contexts are counted when nothing misleads the shim: the chunks
	// and contexts together fit in the slice.
	if got := uint64(control.filled)*nvmlOwnChunk + nvmlOwnProcs*nvmlOwnCtxBytes; got > nvmlOwnSlice {
		t.Fatalf("control: %d chunks and %d contexts hold %d MiB, past the %d MiB slice", control.filled, nvmlOwnProcs, got>>20, nvmlOwnSlice>>20)
	}
	if control.peak > nvmlOwnSlice {
		t.Fatalf("control: the fake GPU's peak use %d MiB passed the %d MiB slice", control.peak>>20, nvmlOwnSlice>>20)
	}

	for _, mode := range []string{"fail", "liar"} {
		t.Run(mode, func(t *testing.T) {
			env := fmt.Sprintf("LD_LIBRARY_PATH=%s:%s EVILNVML=%s", pathDir(harness.TenantNVMLInImage), driverDirInImage, mode)
			r := v.nvmlOwnRun(t, ctx, id, uuid, mode, env)
			if r.peak > nvmlOwnSlice {
				t.Errorf("the fake GPU's peak use %d MiB passed the %d MiB slice: the contexts went uncounted", r.peak>>20, nvmlOwnSlice>>20)
			}
			// Each process may end up to one chunk short where its
			// share of the slice does not split into whole chunks.
			if d := r.filled - control.filled; d < -nvmlOwnProcs || d > nvmlOwnProcs {
				t.Errorf("the processes got %d chunks, the control run %d: the shim measured the contexts otherwise than with the driver's NVML", r.filled, control.filled)
			}
		})
	}
}

// pathDir is the directory of a path in the image.
func pathDir(p string) string { return p[:strings.LastIndex(p, "/")] }

// nvmlOwnResult is what one run of nvmlOwnRun saw: the chunks all its
// processes got, and the fake GPU's peak use in bytes.
type nvmlOwnResult struct {
	filled int
	peak   uint64
}

var (
	filledRE = regexp.MustCompile(`(?m)^filled (\d+)$`)
	peakRE   = regexp.MustCompile(`(?m)^peak (\d+)$`)
)

// nvmlOwnRun runs nvmlOwnProcs cudaprogs in the container with the
// environment env, on a fake GPU of its own (state in /tmp/NAME): each
// creates its context, then, once all have, fills what the slice leaves in
// 64 MiB chunks and holds it until the fake GPU's peak has been read.
func (v *vgpu) nvmlOwnRun(t *testing.T, ctx context.Context, id, uuid, name, env string) nvmlOwnResult {
	t.Helper()
	d := "/tmp/" + name
	script := fmt.Sprintf(`
d=%[1]s; rm -rf $d; mkdir -p $d
export %[2]s FAKECUDA_CTX_BYTES=%[3]d %[4]s
for i in $(seq %[5]d); do
	cudaprog -m direct init touch:$d/ctx.$i waitfile:$d/go fill:64MiB touch:$d/full.$i waitfile:$d/end >$d/out.$i 2>$d/err.$i &
	eval p$i=$!
	# Its context made, or refused (the process then ends).
	n=0; while [ ! -e $d/ctx.$i ] && kill -0 $! 2>/dev/null && [ $n -lt 600 ]; do n=$((n+1)); sleep 0.05; done
done
touch $d/go
for i in $(seq %[5]d); do
	eval p=\$p$i
	n=0; while [ ! -e $d/full.$i ] && kill -0 $p 2>/dev/null && [ $n -lt 600 ]; do n=$((n+1)); sleep 0.05; done
done
cudaprog peak:0:1024GiB >$d/peak 2>&1
touch $d/end; wait
for i in $(seq %[5]d); do echo "== process $i"; cat $d/out.$i $d/err.$i; done
cat $d/peak`, d, fakeDriverEnv(uuid, d), nvmlOwnCtxBytes, env, nvmlOwnProcs)
	out := v.sh(t, ctx, id, script)
	fills := filledRE.FindAllStringSubmatch(out, -1)
	peak := peakRE.FindStringSubmatch(out)
	if len(fills) != nvmlOwnProcs || peak == nil || strings.Contains(out, "FAIL") {
		t.Fatalf("%s: want %d processes to fill to the slice and the fake GPU's peak, got:\n%s", name, nvmlOwnProcs, out)
	}
	var r nvmlOwnResult
	for _, f := range fills {
		n, _ := strconv.Atoi(f[1])
		r.filled += n
	}
	r.peak, _ = strconv.ParseUint(peak[1], 10, 64)
	t.Logf("%s: filled %d chunks, fake GPU peak %d MiB (slice %d MiB)", name, r.filled, r.peak>>20, nvmlOwnSlice>>20)
	// Contexts charged the bound leave at most this many chunks; measured
	// (smaller on this fake), they leave more.
	if boundLeaves := (nvmlOwnSlice - nvmlOwnProcs*nvmlOwnBound) / nvmlOwnChunk; r.filled <= boundLeaves {
		t.Errorf("%s: the processes got %d chunks, no more than the %d left with each context charged the %d MiB bound: the shim did not measure the contexts with the driver's NVML",
			name, r.filled, boundLeaves, nvmlOwnBound>>20)
	}
	return r
}
