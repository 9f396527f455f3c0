package hoststate

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// RuntimeFileName is <run_dir>/runtime.json: what the NRI plugin learned of
// the container runtime when it last connected, and how it gives GPU
// containers the driver's files, for `nri-vgpu status` and the metrics,
// which run in other processes or read only files.
const RuntimeFileName = "runtime.json"

// maxRuntimeSize bounds what is read of runtime.json.
const maxRuntimeSize = 64 << 10

// Runtime is the content of runtime.json.
type Runtime struct {
	Name       string `json:"name"`       // as the runtime names itself to NRI ("containerd")
	Version    string `json:"version"`    // its version ("v2.4.2")
	NRIVersion string `json:"nriVersion"` // the NRI version it reports, or the one inferred from Version
	// Confinement is whether the runtime applies the confinement of GPU
	// containers (NRI's seccomp adjustment); Reason says why not.
	Confinement bool   `json:"confinement"`
	Reason      string `json:"reason,omitempty"`
	// ConfinementPolicy is nri.confinement when the runtime connected: what
	// happens to a GPU container the runtime cannot confine. Its JSON name
	// stays "policy", which earlier releases wrote and read.
	ConfinementPolicy string    `json:"policy"`
	Connected         time.Time `json:"connected"`
	// DriverFiles says how GPU containers get the driver's files:
	// driver.injection as resolved on the node (oci.DriverFiles.Source),
	// when the runtime connected and again whenever it changes.
	DriverFiles string `json:"driverFiles,omitempty"`
}

// WriteRuntime replaces runtime.json.
func WriteRuntime(cfg *config.Config, rt *Runtime) error {
	data, err := json.MarshalIndent(rt, "", "  ")
	if err != nil {
		return fmt.Errorf("runtime file: %w", err)
	}
	run, err := openRunDir(cfg)
	if err != nil {
		return err
	}
	defer run.Close()
	if err := atomicfile.WriteIn(run, RuntimeFileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("runtime file: %w", err)
	}
	return nil
}

// ReadRuntime reads runtime.json, not through a symbolic link. No file
// (the NRI plugin never connected, or the node runs Docker) gives an error
// wrapping fs.ErrNotExist.
func ReadRuntime(cfg *config.Config) (*Runtime, error) {
	run, err := safepath.OpenDir(cfg.Paths.RunDir)
	if err != nil {
		return nil, fmt.Errorf("runtime file: %w", err)
	}
	defer run.Close()
	data, err := run.ReadFile(RuntimeFileName, maxRuntimeSize)
	if err != nil {
		return nil, fmt.Errorf("runtime file: %w", err)
	}
	var rt Runtime
	if err := json.Unmarshal(data, &rt); err != nil {
		return nil, fmt.Errorf("runtime file %s: %w", run.Join(RuntimeFileName), err)
	}
	return &rt, nil
}
