package deviceplugin

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/nri-vgpu/nri-vgpu/internal/daemonflags"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// newBackend builds the GPU backend from the configuration, as the daemon
// does; tests replace it to put a mock NVML behind it.
var newBackend = gpu.New

// inventoryGPU is one GPU as the inventory command prints it.
type inventoryGPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	Minor       int    `json:"minor"`
	// PCIBusID is in the sysfs form, "0000:07:00.0" (nvidia-smi prints
	// "00000000:07:00.0").
	PCIBusID string `json:"pci_bus_id"`
	Healthy  bool   `json:"healthy"`
	// ServedElsewhere is "MIG mode" for a GPU in MIG mode, which another
	// plugin serves and the daemon never advertises; absent otherwise.
	ServedElsewhere string `json:"served_elsewhere,omitempty"`
	// HealthEvents is what the driver said when the GPU's health events
	// were registered; NVML backend only.
	HealthEvents *gpu.HealthEventTypes `json:"health_events,omitempty"`
}

// healthEventTyper is a backend that can say which health events each GPU
// accepts (the NVML backend).
type healthEventTyper interface {
	HealthEventTypes() (map[string]gpu.HealthEventTypes, error)
}

// inventoryMain is the inventory command: it prints the GPUs the configured
// backend sees, as a JSON array, and returns the exit status.
func inventoryMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(ProgramName+" inventory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s inventory [flags]\n\n"+
			"Prints the GPUs of the configured gpu.backend as a JSON array, one object per GPU\n"+
			"(index, uuid, name, memory_bytes, minor, pci_bus_id, healthy, served_elsewhere for a\n"+
			"GPU in MIG mode, and for NVML health_events: the event types the driver accepted\n"+
			"and those it does not support),\n"+
			"and exits. The backend is the daemon's own; its log goes to stderr.\n\n", ProgramName)
		fs.PrintDefaults()
	}
	common := daemonflags.Register(fs, ProgramName+" inventory")
	if code, done := common.Parse(fs, args, stderr); done {
		return code
	}
	logger, cfg, code := common.Setup(stderr)
	if logger == nil {
		return code
	}
	backend, err := newBackend(cfg)
	if err != nil {
		logger.Error("cannot set up the GPU backend", "err", err)
		return 1
	}
	defer backend.Close()
	devs, err := backend.Devices()
	if err != nil {
		logger.Error("cannot list the GPUs", "backend", backend.Name(), "err", err)
		return 1
	}
	if l, ok := backend.(gpu.ElsewhereLister); ok {
		elsewhere, err := l.ServedElsewhere()
		if err != nil {
			logger.Error("cannot list the GPUs in MIG mode", "backend", backend.Name(), "err", err)
			return 1
		}
		devs = append(devs, elsewhere...)
		slices.SortStableFunc(devs, func(a, b gpu.Device) int { return cmp.Compare(a.Index, b.Index) })
	}
	var events map[string]gpu.HealthEventTypes
	if h, ok := backend.(healthEventTyper); ok {
		// Not fatal: the inventory itself is known; the log says why
		// health_events is missing.
		if events, err = h.HealthEventTypes(); err != nil {
			logger.Error("cannot register health events; health_events left out", "err", err)
		}
	}
	out := make([]inventoryGPU, len(devs))
	for i, d := range devs {
		out[i] = inventoryGPU{Index: d.Index, UUID: d.UUID, Name: d.Name, MemoryBytes: d.Memory, Minor: d.Minor, PCIBusID: d.PCIBusID, Healthy: d.Healthy}
		if d.MIG {
			out[i].ServedElsewhere = "MIG mode"
		}
		if e, ok := events[d.UUID]; ok {
			out[i].HealthEvents = &e
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		logger.Error("cannot encode the inventory", "err", err)
		return 1
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", b); err != nil {
		logger.Error("cannot print the inventory", "err", err)
		return 1
	}
	return 0
}
