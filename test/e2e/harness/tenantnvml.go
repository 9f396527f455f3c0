package harness

import (
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// TenantNVMLChunk is what each process of TenantNVMLScript allocates at a
// time.
const TenantNVMLChunk = 64 << 20

// TenantNVMLScript is a shell script, run in a container of the CUDA test
// image, that plays a tenant hiding its contexts' memory: procs cudaprogs,
// with the variables env (the tenant's LD_LIBRARY_PATH among them) and each
// context costing ctxBytes on the fake GPU, each create a context, then,
// once all have, fill what the slice leaves in TenantNVMLChunk steps and
// hold it until the fake GPU's peak use (state in dir, fresh) is read. It
// prints each process's output, then the peak; ParseTenantNVML reads it.
func TenantNVMLScript(dir, env string, procs int, ctxBytes uint64) string {
	return fmt.Sprintf(`
d=%[1]s; rm -rf $d; mkdir -p $d
export FAKECUDA_STATE=$d FAKECUDA_CTX_BYTES=%[3]d %[2]s
for i in $(seq %[4]d); do
	%[5]s -m direct init touch:$d/ctx.$i waitfile:$d/go fill:%[6]d touch:$d/full.$i waitfile:$d/end >$d/out.$i 2>$d/err.$i &
	eval p$i=$!
	# Its context made, or refused (the process then ends).
	n=0; while [ ! -e $d/ctx.$i ] && kill -0 $! 2>/dev/null && [ $n -lt 600 ]; do n=$((n+1)); sleep 0.05; done
done
touch $d/go
for i in $(seq %[4]d); do
	eval p=\$p$i
	n=0; while [ ! -e $d/full.$i ] && kill -0 $p 2>/dev/null && [ $n -lt 600 ]; do n=$((n+1)); sleep 0.05; done
done
%[5]s peak:0:1024GiB >$d/peak 2>&1
touch $d/end; wait
for i in $(seq %[4]d); do echo "== process $i"; cat $d/out.$i $d/err.$i; done
cat $d/peak`, dir, env, ctxBytes, procs, CudaProgInImage, TenantNVMLChunk)
}

// TenantNVMLResult is what one TenantNVMLScript saw: the chunks all its
// processes got, and the fake GPU's peak use in bytes.
type TenantNVMLResult struct {
	Filled int
	Peak   uint64
}

var (
	filledRE = regexp.MustCompile(`(?m)^filled (\d+)$`)
	peakRE   = regexp.MustCompile(`(?m)^peak (\d+)$`)
)

// ParseTenantNVML reads TenantNVMLScript's output: every one of procs
// processes must have filled, none failed a step, and the peak be there.
func ParseTenantNVML(out string, procs int) (TenantNVMLResult, error) {
	fills := filledRE.FindAllStringSubmatch(out, -1)
	peak := peakRE.FindStringSubmatch(out)
	if len(fills) != procs || peak == nil || strings.Contains(out, "FAIL") {
		return TenantNVMLResult{}, fmt.Errorf("harness: want %d processes to fill what the slice leaves and the fake GPU's peak, got:\n%s", procs, out)
	}
	var r TenantNVMLResult
	for _, f := range fills {
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return r, fmt.Errorf("harness: filled count %q: %w", f[1], err)
		}
		r.Filled += n
	}
	var err error
	if r.Peak, err = strconv.ParseUint(peak[1], 10, 64); err != nil {
		return r, fmt.Errorf("harness: peak %q: %w", peak[1], err)
	}
	return r, nil
}

// DriverDirInImage is where BuildCudaTestImage puts the fake driver and its
// NVML.
var DriverDirInImage = path.Dir(CudaProgInImage) + "/fake"
