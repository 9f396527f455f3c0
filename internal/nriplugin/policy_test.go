package nriplugin

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// signPolicy signs an allocation of gpu0 with the cores policy as the
// device plugin writes it ("burst", or "" for hard).
func signPolicy(t *testing.T, key allocation.Key, policy string) string {
	t.Helper()
	id, err := allocation.NewID()
	if err != nil {
		t.Fatal(err)
	}
	a := &allocation.Allocation{V: allocation.Version, ID: id, Issued: time.Now().Unix(),
		GPUs: []allocation.GPU{gpu0}, CoresPolicy: policy}
	v, err := allocation.Sign(key, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The limits file takes its cores policy from the signed allocation, never
// from the NRI plugin's own config (the device plugin decided it when it
// handed out the slices), and its log level from the NRI plugin's config.
func TestLimitsFileCoresPolicyAndLogLevel(t *testing.T) {
	tests := []struct {
		name       string
		allocation string // the allocation's cores policy
		nodePolicy string // limits.cores_policy of the NRI plugin's config
		logLevel   string
		wantPolicy string
	}{
		{"burst allocation", "burst", "hard", "debug", "burst"},
		{"hard allocation on a burst node", "", "burst", "info", "hard"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := newConfig(t)
			cfg.Limits.CoresPolicy = tt.nodePolicy
			cfg.Limits.LogLevel = tt.logLevel
			h := newHarness(t, cfg)
			p := pod("sb1", "uid-1")
			if _, err := h.create(p, container("c1", p, signPolicy(t, h.key, tt.allocation))); err != nil {
				t.Fatal(err)
			}
			// gpu0 written out by hand: 8 GiB and 20 % of SM time.
			want := "# written by nri-vgpu; read by libvgpu-shim.so\n" +
				"version=1\n" +
				"gpu.0.uuid=" + uuid0 + "\n" +
				"gpu.0.memory=8589934592\n" +
				"gpu.0.cores=20\n" +
				"cores.policy=" + tt.wantPolicy + "\n" +
				"log.level=" + tt.logLevel + "\n" +
				"ledger.shards=64\n"
			path := filepath.Join(cfg.Paths.RunDir, "containers", "c1", "limits")
			if got, err := os.ReadFile(path); err != nil || string(got) != want {
				t.Errorf("limits file = %q (%v), want %q", got, err, want)
			}
		})
	}
}
