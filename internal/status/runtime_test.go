package status

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Status says whether the runtime confines GPU containers, and what
// happens to them where it cannot.
func TestStatusSaysWhetherContainersAreConfined(t *testing.T) {
	for _, tt := range []struct {
		name string
		rt   hoststate.Runtime
		want string
	}{
		{"containerd 2.4", hoststate.Runtime{Name: "containerd", Version: "v2.4.2", NRIVersion: "v0.12.3", Confinement: true, ConfinementPolicy: "best-effort"},
			"runtime containerd v2.4.2 (NRI v0.12.3): GPU containers are confined\n"},
		{"containerd 1.7, best-effort", hoststate.Runtime{Name: "containerd", Version: "v1.7.35", NRIVersion: "v0.8.0", Reason: "too old", ConfinementPolicy: "best-effort"},
			"runtime containerd v1.7.35 (NRI v0.8.0): confinement unavailable: too old; GPU containers run WITHOUT the confinement (nri.confinement = \"best-effort\")\n"},
		{"containerd 1.7, required", hoststate.Runtime{Name: "containerd", Version: "v1.7.35", NRIVersion: "v0.8.0", Reason: "too old", ConfinementPolicy: "required"},
			"runtime containerd v1.7.35 (NRI v0.8.0): confinement unavailable: too old; GPU containers are REFUSED (nri.confinement = \"required\")\n"},
		// Where the driver's files come from, as the plugin recorded it.
		{"generated driver files", hoststate.Runtime{Name: "containerd", Version: "v2.4.2", NRIVersion: "v0.12.3", Confinement: true, ConfinementPolicy: "best-effort",
			DriverFiles: "generated from driver root / (NVIDIA CDI library; driver 580.159.04; libraries in /usr/local/nvidia/lib64)"},
			"runtime containerd v2.4.2 (NRI v0.12.3): GPU containers are confined\n" +
				"driver files: generated from driver root / (NVIDIA CDI library; driver 580.159.04; libraries in /usr/local/nvidia/lib64)\n\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Paths.RunDir = hoststatetest.RunDir(t)
			if err := hoststate.WriteRuntime(cfg, &tt.rt); err != nil {
				t.Fatal(err)
			}
			r, err := Collect(cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var table, js bytes.Buffer
			if err := r.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(table.String(), tt.want) {
				t.Errorf("status:\n%s\nwant it to start with\n%s", table.String(), tt.want)
			}
			if err := r.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			if want := `"confinement": ` + map[bool]string{true: "true", false: "false"}[tt.rt.Confinement]; !strings.Contains(js.String(), want) {
				t.Errorf("status -o json has no %s:\n%s", want, js.String())
			}
		})
	}
	// No runtime.json (Docker, or nri-vgpu never connected): no line.
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	r, err := Collect(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(table.String(), "runtime") || len(r.Warnings) != 0 {
		t.Errorf("status without runtime.json:\n%s warnings %v", table.String(), r.Warnings)
	}
}
