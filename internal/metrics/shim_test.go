package metrics

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// buildShim builds the shim, its test programs and the fake driver, and
// returns their directory; it skips the test where they cannot be built or
// run as a test needs.
func buildShim(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	if _, err := os.Stat("/run/nri-vgpu/limits"); err == nil {
		t.Skip("/run/nri-vgpu/limits exists: the shim would ignore the test's overrides")
	}
	_, file, _, _ := runtime.Caller(0)
	shim := filepath.Join(filepath.Dir(file), "..", "..", "shim")
	if out, err := exec.Command("make", "-s", "-C", shim).CombinedOutput(); err != nil {
		t.Fatalf("building the shim: %v\n%s", err, out)
	}
	return filepath.Join(shim, "build")
}

// The real shim, against the fake driver, writes the region of a container
// prepared like the NRI plugin does; the scrape shows what its process holds
// and launched, and keeps the launches after the process exits.
func TestScrapesTheShimsRegion(t *testing.T) {
	build := buildShim(t)

	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	cfg := testConfig(t)
	// Cores below 100: the shim counts launches on its throttled path only.
	prepare(t, cfg, "c1", "ml/a", "train", allocation.GPU{UUID: uuid, Slices: 4, Memory: 1 << 30, Cores: 50})
	dir := hoststate.ContainerDir(cfg, "c1")
	state := t.TempDir()
	held, release := filepath.Join(state, "held"), filepath.Join(state, "release")
	cmd := exec.Command(filepath.Join(build, "cudaprog"), "init", "alloc:100MiB", "alloc:28MiB", "launch:3",
		"touch:"+held, "waitfile:"+release)
	cmd.Env = append(os.Environ(),
		"LD_PRELOAD="+filepath.Join(build, "libvgpu-shim.so"),
		"LD_LIBRARY_PATH="+filepath.Join(build, "fake"),
		"NRI_VGPU_LIMITS="+filepath.Join(dir, hoststate.LimitsFileName),
		"NRI_VGPU_REGION_DIR="+filepath.Join(dir, hoststate.RegionDirName),
		"NRI_VGPU_LEDGER_DIR="+filepath.Join(dir, hoststate.LedgerDirName),
		"FAKECUDA_STATE="+state,
		"FAKECUDA_DEVICES="+uuid+":16GiB:132",
		"FAKECUDA_KERNEL_US=10",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = os.WriteFile(release, nil, 0o644)
			_ = cmd.Wait()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cudaprog did not get to its allocations; stderr:\n%s", stderr.String())
		}
	}

	c := NewCollector(cfg, nil, nil)
	names := []string{"nri_vgpu_container_memory_used_bytes", "nri_vgpu_container_kernel_launches_total",
		"nri_vgpu_container_processes", "nri_vgpu_gpu_memory_used_bytes"}
	want := func(used, launches, procs int) string {
		lbl := `{UUID="` + uuid + `",claim="",container="train",container_id="c1",namespace="ml",pod="a"}`
		return fmt.Sprintf(`
# HELP nri_vgpu_gpu_memory_used_bytes Sum of the memory the vGPU containers' processes hold on the GPU, from their usage regions.
# TYPE nri_vgpu_gpu_memory_used_bytes gauge
nri_vgpu_gpu_memory_used_bytes{UUID="%s",gpu="",name=""} %d
# HELP nri_vgpu_container_memory_used_bytes Memory the container's processes hold on the GPU, from its usage region.
# TYPE nri_vgpu_container_memory_used_bytes gauge
nri_vgpu_container_memory_used_bytes%s %d
# HELP nri_vgpu_container_kernel_launches_total Kernel launches of the container's processes on the GPU since this daemon first saw them.
# TYPE nri_vgpu_container_kernel_launches_total counter
nri_vgpu_container_kernel_launches_total%s %d
# HELP nri_vgpu_container_processes Processes of the container registered in its usage region (processes that initialised CUDA or NVML and are alive).
# TYPE nri_vgpu_container_processes gauge
nri_vgpu_container_processes{claim="",container="train",container_id="c1",namespace="ml",pod="a"} %d
`, uuid, used, lbl, used, lbl, launches, procs)
	}
	// The shim writes its launch counts to the region every 100 ms (its
	// watcher thread): scrape until they are there, or give up after 10 s.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := testutil.CollectAndCompare(c, strings.NewReader(want(128<<20, 3, 1)), names...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("while the process holds its memory: %v", err)
		}
	}

	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	exited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cudaprog: %v\n%s", err, stderr.String())
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want(0, 3, 0)), names...); err != nil {
		t.Errorf("after the process exited: %v", err)
	}
}
