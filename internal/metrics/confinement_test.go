package metrics

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
)

// nri_vgpu_confinement_available follows runtime.json: absent before the
// NRI plugin connected, 0 on containerd 1.7, 1 on containerd 2.4.
func TestConfinementAvailable(t *testing.T) {
	cfg := testConfig(t)
	c := NewCollector(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if n := testutil.CollectAndCount(c, "nri_vgpu_confinement_available"); n != 0 {
		t.Errorf("%d confinement series before the plugin connected, want none", n)
	}
	const help = "# HELP nri_vgpu_confinement_available 1 when the container runtime applies the confinement of GPU containers (NRI seccomp adjustment, containerd 2.2 and later), 0 when it cannot or nri-vgpu cannot tell; absent until the NRI plugin first connected. policy is nri.confinement: what happens to a GPU container that cannot be confined.\n# TYPE nri_vgpu_confinement_available gauge\n"
	for _, tt := range []struct {
		rt   hoststate.Runtime
		want string
	}{
		{hoststate.Runtime{Name: "containerd", Version: "v1.7.35", NRIVersion: "v0.8.0", Reason: "old", ConfinementPolicy: "required"},
			`nri_vgpu_confinement_available{nri_version="v0.8.0",policy="required",runtime="containerd",runtime_version="v1.7.35"} 0` + "\n"},
		{hoststate.Runtime{Name: "containerd", Version: "v2.4.2", NRIVersion: "v0.12.3", Confinement: true, ConfinementPolicy: "best-effort"},
			`nri_vgpu_confinement_available{nri_version="v0.12.3",policy="best-effort",runtime="containerd",runtime_version="v2.4.2"} 1` + "\n"},
	} {
		if err := hoststate.WriteRuntime(cfg, &tt.rt); err != nil {
			t.Fatal(err)
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(help+tt.want), "nri_vgpu_confinement_available"); err != nil {
			t.Errorf("%s %s: %v", tt.rt.Name, tt.rt.Version, err)
		}
	}
}
