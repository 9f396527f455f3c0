// Package gpu is the inventory of the node's NVIDIA GPUs, from NVML or from
// the simulated backend described in config.
//
// A Backend lists the physical GPUs (Devices) and reports changes of their
// health (WatchHealth). The device plugin advertises the slices of healthy
// GPUs only, so a GPU that raises a critical error stops being handed out.
package gpu

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Device is one physical GPU.
type Device struct {
	Index    int    // NVML index (simulated: position in the configuration)
	UUID     string // "GPU-…"
	Name     string // NVML product name, e.g. "NVIDIA A100-SXM4-40GB"
	Memory   uint64 // total memory in bytes
	Minor    int    // minor number of /dev/nvidia<minor>
	PCIBusID string // normalized, lower case: "0000:07:00.0"
	Healthy  bool
	// MIG is set for a GPU in MIG mode: it is served elsewhere (its MIG
	// devices are NVIDIA's device plugin's or DRA driver's), so it is
	// listed by ServedElsewhere and never by Devices.
	MIG bool

	// What the GPU is, by the names NVIDIA's tools give: each is "" when
	// the driver does not say (or names it unknown).
	Architecture string // "Ampere", "Hopper", "Ada Lovelace", ...
	Brand        string // "Nvidia", "Tesla", "GeForce", ...
	// CUDAComputeCapability is "major.minor", e.g. "8.0".
	CUDAComputeCapability string
	// DriverVersion is the NVIDIA driver's version as nvidia-smi prints
	// it, e.g. "550.54.15"; CUDADriverVersion the CUDA version it
	// supports, "major.minor", e.g. "12.4".
	DriverVersion     string
	CUDADriverVersion string
	// PCIeRoot is the PCIe root complex the GPU is under, as sysfs names
	// it: "pci0000:00".
	PCIeRoot string
}

// HealthEvent reports that a GPU's health changed (or, for NVML, that a
// critical error was observed on it). Consumers re-read Devices() for the
// full picture.
type HealthEvent struct {
	UUID    string
	Healthy bool
	Reason  string // e.g. "XID 79", "double-bit ECC error"
}

// Backend is a source of GPU inventory and health.
type Backend interface {
	// Name is the backend's configuration name: "nvml" or "simulated".
	Name() string
	// Devices lists the GPUs in a stable order (by index), with their
	// current health.
	Devices() ([]Device, error)
	// WatchHealth sends health events to events until ctx is done or the
	// backend is closed, then returns nil. It returns an error only when
	// health cannot be watched at all.
	WatchHealth(ctx context.Context, events chan<- HealthEvent) error
	// Close releases the backend. Running WatchHealth calls return.
	Close() error
}

// ElsewhereLister is implemented by the backends that know of GPUs nri-vgpu
// does not serve. Both backends implement it.
type ElsewhereLister interface {
	// ServedElsewhere lists, by index, the GPUs in MIG mode: another
	// plugin (NVIDIA's device plugin or DRA driver) serves their MIG
	// devices, so nri-vgpu neither advertises nor allocates them, and
	// shows them as served elsewhere where it lists the node's GPUs.
	ServedElsewhere() ([]Device, error)
}

// ErrNoDriver is wrapped by the errors of the NVML backend when the NVIDIA
// driver (libnvidia-ml.so.1 or the kernel module) is not available.
var ErrNoDriver = errors.New("NVIDIA driver not found")

// ErrClosed is returned by a backend's methods after Close.
var ErrClosed = errors.New("GPU backend is closed")

// New returns the backend that cfg.GPU.Backend names. The NVML backend finds
// and loads libnvidia-ml.so.1 on first use (through the loader, and beneath
// cfg.Driver's driver root in its library_dirs and the usual dirs), so New
// succeeds on a machine without the driver; the first Devices call then
// reports ErrNoDriver, naming every place searched.
func New(cfg *config.Config) (Backend, error) {
	if cfg == nil {
		return nil, errors.New("gpu: no configuration given")
	}
	switch cfg.GPU.Backend {
	// An empty backend is the documented default, for a Config that was
	// built in code rather than read from a file.
	case config.BackendNVML, "":
		return newNVMLForDriver(cfg.Driver), nil
	case config.BackendSimulated:
		s, err := NewSimulated(cfg.GPU.Simulated)
		if err != nil {
			return nil, fmt.Errorf("gpu.simulated: %w", err)
		}
		return s, nil
	default:
		return nil, fmt.Errorf("unknown gpu.backend %q (want %q or %q)",
			cfg.GPU.Backend, config.BackendNVML, config.BackendSimulated)
	}
}

// NormalizePCIBusID returns a PCI address in the form sysfs uses under
// /sys/bus/pci/devices: a domain of at least four hex digits, lower case
// ("0000:07:00.0"). NVML reports an eight-digit domain in upper case
// ("00000000:07:00.0"); a missing domain means domain 0.
func NormalizePCIBusID(s string) (string, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	var domainS, busS, slotS string
	switch len(parts) {
	case 2:
		domainS, busS, slotS = "0", parts[0], parts[1]
	case 3:
		domainS, busS, slotS = parts[0], parts[1], parts[2]
	default:
		return "", fmt.Errorf("PCI bus id %q: want [domain:]bus:device.function", s)
	}
	devS, fnS, ok := strings.Cut(slotS, ".")
	if !ok {
		return "", fmt.Errorf("PCI bus id %q: want [domain:]bus:device.function", s)
	}
	fields := []struct {
		name string
		text string
		bits int
	}{
		{"domain", domainS, 32},
		{"bus", busS, 8},
		{"device", devS, 5},
		{"function", fnS, 3},
	}
	var v [4]uint64
	for i, f := range fields {
		if f.text == "" {
			return "", fmt.Errorf("PCI bus id %q: empty %s", s, f.name)
		}
		n, err := strconv.ParseUint(f.text, 16, f.bits)
		if err != nil {
			return "", fmt.Errorf("PCI bus id %q: bad %s %q (hex, at most %d bits)", s, f.name, f.text, f.bits)
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}
