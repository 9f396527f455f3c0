package dra

import (
	"context"
	"testing"

	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// describedA100 is an A100 as the NVML backend describes it, with a driver
// version NVML prints with a leading zero.
var describedA100 = gpu.Device{
	Index: 3, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 * gib, Minor: 3,
	PCIBusID: "0000:07:00.0", Healthy: true,
	Architecture: "Ampere", Brand: "Nvidia", CUDAComputeCapability: "8.0",
	DriverVersion: "535.104.05", CUDADriverVersion: "12.2", PCIeRoot: "pci0000:00",
}

// selectorMatches evaluates a CEL device selector on what Devices
// publishes for d, as the scheduler's allocator does (the same compiler,
// with consumable capacity on): the device is of the driver named in cfg.
// An evaluation error is returned and is no match: the allocator fails the
// claim's allocation with it, as a CEL runtime error.
func selectorMatches(t *testing.T, cfg *config.Config, d gpu.Device, expr string) (bool, error) {
	t.Helper()
	devs, err := Devices(cfg, []gpu.Device{d}, nil)
	if err != nil || len(devs) != 1 {
		t.Fatalf("Devices: %v, %d devices", err, len(devs))
	}
	res := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(expr, dracel.Options{})
	if res.Error != nil {
		t.Fatalf("compiling %s: %v", expr, res.Error)
	}
	dev := devs[0]
	ok, _, err := res.DeviceMatches(context.Background(), dracel.Device{
		Driver:                   cfg.DRA.DriverName,
		AllowMultipleAllocations: dev.AllowMultipleAllocations,
		Attributes:               dev.Attributes,
		Capacity:                 dev.Capacity,
	})
	return ok && err == nil, err
}

// Selectors in the forms NVIDIA's DRA driver documents, for each attribute
// both drivers publish: each matches the GPU here once its domain,
// gpu.nvidia.com, names this driver (dra.driver_name, default
// gpu.nri-vgpu.io), and a selector for another value does not. The
// standard attributes' domain, resource.kubernetes.io, stays as it is.
func TestSelectorsInNVIDIAsForms(t *testing.T) {
	tests := []struct {
		attribute string
		nvidia    string // as written for NVIDIA's driver
		ours      string // the same with this driver's domain
		other     string // ours, for a value the GPU does not have
	}{
		{
			"type",
			`device.attributes['gpu.nvidia.com'].type == 'gpu'`,
			`device.attributes['gpu.nri-vgpu.io'].type == 'gpu'`,
			`device.attributes['gpu.nri-vgpu.io'].type == 'mig'`,
		},
		{
			"uuid",
			`device.attributes["gpu.nvidia.com"].uuid == "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"`,
			`device.attributes["gpu.nri-vgpu.io"].uuid == "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"`,
			`device.attributes["gpu.nri-vgpu.io"].uuid == "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"`,
		},
		{
			"productName",
			`device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')`,
			`device.attributes['gpu.nri-vgpu.io'].productName.lowerAscii().matches('^.*a100.*$')`,
			`device.attributes['gpu.nri-vgpu.io'].productName.lowerAscii().matches('^.*h100.*$')`,
		},
		{
			"brand",
			`device.attributes["gpu.nvidia.com"].brand == "Nvidia"`,
			`device.attributes["gpu.nri-vgpu.io"].brand == "Nvidia"`,
			`device.attributes["gpu.nri-vgpu.io"].brand == "GeForce"`,
		},
		{
			"architecture",
			`device.attributes["gpu.nvidia.com"].architecture == "Ampere"`,
			`device.attributes["gpu.nri-vgpu.io"].architecture == "Ampere"`,
			`device.attributes["gpu.nri-vgpu.io"].architecture == "Hopper"`,
		},
		{
			"cudaComputeCapability",
			`device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0`,
			`device.attributes["gpu.nri-vgpu.io"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0`,
			`device.attributes["gpu.nri-vgpu.io"].cudaComputeCapability.compareTo(semver("9.0.0")) >= 0`,
		},
		{
			// 535.104.05 as NVML prints it is the version 535.104.5.
			"driverVersion",
			`device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("535.104.5")) >= 0`,
			`device.attributes["gpu.nri-vgpu.io"].driverVersion.compareTo(semver("535.104.5")) >= 0`,
			`device.attributes["gpu.nri-vgpu.io"].driverVersion.compareTo(semver("535.104.6")) >= 0`,
		},
		{
			"cudaDriverVersion",
			`device.attributes["gpu.nvidia.com"].cudaDriverVersion.isGreaterThan(semver("12.1.0"))`,
			`device.attributes["gpu.nri-vgpu.io"].cudaDriverVersion.isGreaterThan(semver("12.1.0"))`,
			`device.attributes["gpu.nri-vgpu.io"].cudaDriverVersion.isGreaterThan(semver("12.2.0"))`,
		},
		{
			"resource.kubernetes.io/pciBusID",
			`device.attributes["resource.kubernetes.io"].pciBusID == "0000:07:00.0"`,
			`device.attributes["resource.kubernetes.io"].pciBusID == "0000:07:00.0"`,
			`device.attributes["resource.kubernetes.io"].pciBusID == "0000:0f:00.0"`,
		},
		{
			"resource.kubernetes.io/pcieRoot",
			`device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"`,
			`device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"`,
			`device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:80"`,
		},
	}
	cfg := draConfig()
	for _, tt := range tests {
		t.Run(tt.attribute, func(t *testing.T) {
			if ok, err := selectorMatches(t, cfg, describedA100, tt.ours); !ok {
				t.Errorf("%s does not match (%v)", tt.ours, err)
			}
			if ok, _ := selectorMatches(t, cfg, describedA100, tt.other); ok {
				t.Errorf("%s matches", tt.other)
			}
			// NVIDIA's domain names NVIDIA's driver: unchanged, the
			// selector matches no device of this one.
			if tt.nvidia != tt.ours {
				if ok, _ := selectorMatches(t, cfg, describedA100, tt.nvidia); ok {
					t.Errorf("%s matches a device of %s", tt.nvidia, cfg.DRA.DriverName)
				}
			}
		})
	}
}

// A selector names the driver's domain: with dra.driver_name changed, the
// selector follows it.
func TestSelectorsFollowTheDriverName(t *testing.T) {
	cfg := draConfig()
	cfg.DRA.DriverName = "gpu.example.com"
	if ok, err := selectorMatches(t, cfg, describedA100, `device.attributes["gpu.example.com"].architecture == "Ampere"`); !ok {
		t.Errorf("selector on gpu.example.com does not match a device of driver gpu.example.com (%v)", err)
	}
	if ok, _ := selectorMatches(t, cfg, describedA100, `device.attributes["gpu.nri-vgpu.io"].architecture == "Ampere"`); ok {
		t.Error("selector on gpu.nri-vgpu.io matches a device of driver gpu.example.com")
	}
}

// A GPU whose value is unknown has no such attribute: a selector on it
// does not match (the allocator reports the missing key), and one that
// asks first whether it is there is false.
func TestSelectorsOnUnknownValues(t *testing.T) {
	bare := describedA100
	bare.Architecture, bare.Brand, bare.CUDAComputeCapability = "", "", ""
	bare.DriverVersion, bare.CUDADriverVersion, bare.PCIeRoot = "", "", ""
	bare.PCIBusID = "00000000:07:00.0" // not the form the standard attribute takes
	cfg := draConfig()
	for _, expr := range []string{
		`device.attributes["gpu.nri-vgpu.io"].architecture == "Ampere"`,
		`device.attributes["gpu.nri-vgpu.io"].brand == "Nvidia"`,
		`device.attributes["gpu.nri-vgpu.io"].cudaComputeCapability.compareTo(semver("0.0.0")) >= 0`,
		`device.attributes["gpu.nri-vgpu.io"].driverVersion.compareTo(semver("0.0.0")) >= 0`,
		`device.attributes["gpu.nri-vgpu.io"].cudaDriverVersion.compareTo(semver("0.0.0")) >= 0`,
		`device.attributes["resource.kubernetes.io"].pciBusID != ""`,
		`device.attributes["resource.kubernetes.io"].pcieRoot != ""`,
		`"architecture" in device.attributes["gpu.nri-vgpu.io"]`,
		`"pcieRoot" in device.attributes["resource.kubernetes.io"]`,
	} {
		if ok, _ := selectorMatches(t, cfg, bare, expr); ok {
			t.Errorf("%s matches a GPU without the value", expr)
		}
	}
	// What is always known still matches.
	if ok, err := selectorMatches(t, cfg, bare, `device.attributes["gpu.nri-vgpu.io"].type == "gpu" && device.attributes["gpu.nri-vgpu.io"].productName == "NVIDIA A100-SXM4-40GB"`); !ok {
		t.Errorf("type and productName do not match a GPU without a description (%v)", err)
	}
}
