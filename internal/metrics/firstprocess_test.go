package metrics

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// The container's first process, with the real shim against the fake
// driver, takes the region the host wrote at provision as it is: no damage
// logged, and only its own ledger shard opened (a rebuild of the region
// opens every shard to learn what the container's other processes hold).
// The control: with the region deleted first, the same process makes the
// file and rebuilds it, opening every shard, so the count can tell.
func TestFirstProcessTakesTheHostsRegion(t *testing.T) {
	build := buildShim(t)
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace not installed (hack/deps.sh installs it)")
	}
	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	for _, tc := range []struct {
		name       string
		remove     bool // the region deleted before the process starts
		wantShards int  // ledger shards the process opens
	}{
		{"the host's region", false, 1},
		{"no region", true, limits.LedgerShards},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			gpus := []allocation.GPU{{UUID: uuid, Slices: 4, Memory: 1 << 30, Cores: 100}}
			info := &hoststate.Info{ID: "c1", Name: "train", Pod: "ml/a", GPUs: gpus, Source: "nri"}
			// At debug level, so that a rebuild logged as such shows too.
			if _, err := hoststate.New(cfg).Provision(info, (&allocation.Allocation{GPUs: gpus}).Limits(limits.LogLevelDebug)); err != nil {
				t.Fatal(err)
			}
			dir := hoststate.ContainerDir(cfg, "c1")
			regionDir := filepath.Join(dir, hoststate.RegionDirName)
			if tc.remove {
				if err := os.Remove(filepath.Join(regionDir, region.FileName)); err != nil {
					t.Fatal(err)
				}
			}
			ledger := filepath.Join(dir, hoststate.LedgerDirName)
			state := t.TempDir()
			trace := filepath.Join(state, "trace")
			// The shim is preloaded into the traced program only, not into strace.
			cmd := exec.Command(strace, "-f", "-e", "trace=openat", "-o", trace,
				"-E", "LD_PRELOAD="+filepath.Join(build, "libvgpu-shim.so"),
				filepath.Join(build, "cudaprog"), "init", "alloc:1MiB")
			cmd.Env = append(os.Environ(),
				"LD_LIBRARY_PATH="+filepath.Join(build, "fake"),
				"NRI_VGPU_LIMITS="+filepath.Join(dir, hoststate.LimitsFileName),
				"NRI_VGPU_REGION_DIR="+regionDir,
				"NRI_VGPU_LEDGER_DIR="+ledger,
				"FAKECUDA_STATE="+state,
				"FAKECUDA_DEVICES="+uuid+":16GiB:132",
			)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("cudaprog under strace: %v\n%s", err, stderr.String())
			}
			if log := stderr.String(); strings.Contains(log, "tampered") || strings.Contains(log, "rebuilt") {
				t.Errorf("the shim found the region damaged:\n%s", log)
			}
			data, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			opened := regexp.MustCompile(`openat\([^,]*, "`+regexp.QuoteMeta(ledger)+`/([0-9]+)"`).FindAllSubmatch(data, -1)
			shards := map[string]bool{}
			for _, m := range opened {
				shards[string(m[1])] = true
			}
			if len(opened) != tc.wantShards || len(shards) != tc.wantShards {
				t.Errorf("%d opens of %d ledger shards %v, want %d of %d", len(opened), len(shards), shards, tc.wantShards, tc.wantShards)
			}
			u, err := region.ReadUsage(filepath.Join(regionDir, region.FileName))
			if err != nil {
				t.Fatal(err)
			}
			if len(u.Devices) != 1 || u.Devices[0].UUID != uuid || u.Devices[0].Used != 0 || len(u.Processes) != 0 {
				t.Errorf("region after the process exited = %+v, want %s with nothing in use and no process", u, uuid)
			}
		})
	}
}
