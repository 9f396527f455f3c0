// Package dra is nri-vgpu's Dynamic Resource Allocation driver (Contract 8):
// it publishes the node's DRA GPUs as shareable devices with memory and
// cores capacities, and prepares the claims the scheduler placed on them
// as host state (a limits file, a usage region) and a CDI spec whose only
// edit is the claim's marker, which the NRI plugin turns into the edits of
// Contract 3.
package dra

import (
	"fmt"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// The capacities and attributes of a published GPU.
const (
	CapacityMemory = "memory" // bytes
	CapacityCores  = "cores"  // percent of SM time

	AttributeUUID  = "uuid"
	AttributeModel = "model"
	AttributeIndex = "index"
	AttributeMinor = "minor"

	// The attributes NVIDIA's DRA driver publishes for a full GPU, by its
	// names and types, so that a selector written for it matches here
	// once it names this driver (Contract 8).
	AttributeType                  = "type"                  // "gpu"
	AttributeProductName           = "productName"           // as model
	AttributeBrand                 = "brand"                 // "Nvidia", "Tesla", ...
	AttributeArchitecture          = "architecture"          // "Ampere", "Hopper", ...
	AttributeCUDAComputeCapability = "cudaComputeCapability" // version "8.0.0"
	AttributeDriverVersion         = "driverVersion"         // version "550.54.15"
	AttributeCUDADriverVersion     = "cudaDriverVersion"     // version "12.4.0"

	// TypeGPU is the type attribute of a full GPU.
	TypeGPU = "gpu"
)

// TaintUnhealthy is the key of the taint an unhealthy GPU is published
// with; its value is the reason, its effect dra.unhealthy_taint_effect.
const TaintUnhealthy = "nri-vgpu.io/unhealthy"

// Unhealthy is what the driver knows of a GPU's ill health: why, and
// since when (the taint's TimeAdded, which stays while the GPU does).
type Unhealthy struct {
	Reason string // as the GPU backend said it; "" when unknown
	Since  time.Time
}

// DeviceName is the name a GPU is published under (draclaim.DeviceName).
func DeviceName(uuid string) (string, error) { return draclaim.DeviceName(uuid) }

// served is a GPU the driver publishes, with what it is worth.
type served struct {
	gpu.Device
	Name string // DeviceName
	// Memory is the memory capacity: floor(memory_scaling × total), the
	// cap of Contract 1.
	Memory uint64
	// Cores is the cores capacity, floor(100 × cores_scaling); one claim
	// gets at most MaxCores of it.
	Cores int
	// MinMemory and MinCores are one slice of the GPU's model (Contract
	// 1): the least a claim consumes, so that at most split_count claims
	// share the GPU.
	MinMemory uint64
	MinCores  int
}

// MaxCores is the most SM time one claim receives on a GPU.
func (s served) MaxCores() int { return min(s.Cores, 100) }

// servedGPUs returns the GPUs of devs that the driver serves (config.DRA),
// healthy or not, in devs' order: an unhealthy GPU stays published with a
// taint, and the claims already on it can still be prepared.
func servedGPUs(cfg *config.Config, devs []gpu.Device) ([]served, error) {
	dp := cfg.DevicePlugin
	var out []served
	names := map[string]string{}
	for _, d := range devs {
		if !cfg.DRA.Serves(d.UUID) {
			continue
		}
		name, err := DeviceName(d.UUID)
		if err != nil {
			return nil, err
		}
		if other, dup := names[name]; dup {
			return nil, fmt.Errorf("GPUs %s and %s would both be published as %s", other, d.UUID, name)
		}
		names[name] = d.UUID
		split := dp.SplitCountFor(d.Name)
		whole, err := limits.CheckedQuota(d.Memory, split, split, dp.MemoryScaling, dp.CoresScaling)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %w", d.UUID, err)
		}
		one := limits.SliceSize(d.Memory, split, dp.MemoryScaling, dp.CoresScaling)
		cores := limits.ScaledCores(dp.CoresScaling)
		if cores < 1 {
			return nil, fmt.Errorf("device_plugin.cores_scaling %v leaves less than 1 %% of SM time to share", dp.CoresScaling)
		}
		out = append(out, served{
			Device: d, Name: name,
			Memory: whole.Memory, Cores: cores,
			MinMemory: one.Memory, MinCores: min(one.Cores, cores),
		})
	}
	return out, nil
}

// Devices is what the driver publishes in its ResourceSlice for devs: one
// device per served GPU, which allows multiple allocations, each consuming
// memory and cores (Contract 8). A capacity a request does not name is one
// slice's (Contract 1): the claim the scheduler makes for a pod asking for
// `nvidia.com/gpu: 1` through a DeviceClass's extendedResourceName names
// none, and gets what a device-plugin slice gets.
// An unhealthy GPU carries the taint TaintUnhealthy, with what unhealthy
// says of it (keyed by UUID; a GPU missing there has no known reason and
// the taint is added now).
func Devices(cfg *config.Config, devs []gpu.Device, unhealthy map[string]Unhealthy) ([]resourceapi.Device, error) {
	gpus, err := servedGPUs(cfg, devs)
	if err != nil {
		return nil, err
	}
	out := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		maxCores := int64(g.MaxCores())
		out = append(out, resourceapi.Device{
			Name:       g.Name,
			Attributes: attributes(g.Device),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityMemory: {
					Value: *bytesQuantity(g.Memory),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    bytesQuantity(g.MinMemory),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: bytesQuantity(g.MinMemory)},
					},
				},
				CapacityCores: {
					Value: *resource.NewQuantity(int64(g.Cores), resource.DecimalSI),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: resource.NewQuantity(int64(g.MinCores), resource.DecimalSI),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  resource.NewQuantity(int64(g.MinCores), resource.DecimalSI),
							Max:  resource.NewQuantity(maxCores, resource.DecimalSI),
							Step: resource.NewQuantity(1, resource.DecimalSI),
						},
					},
				},
			},
			AllowMultipleAllocations: ptr.To(true),
		})
		if !g.Healthy {
			u, ok := unhealthy[g.UUID]
			if !ok {
				u.Since = time.Now()
			}
			out[len(out)-1].Taints = []resourceapi.DeviceTaint{{
				Key:       TaintUnhealthy,
				Value:     taintValue(u.Reason),
				Effect:    resourceapi.DeviceTaintEffect(cfg.DRA.UnhealthyTaintEffect),
				TimeAdded: &metav1.Time{Time: u.Since.Truncate(time.Second)},
			}}
		}
	}
	return out, nil
}

// taintValue is reason as a taint's value, which must be a label value:
// at most 63 letters, digits, '-', '_' or '.', starting and ending with a
// letter or digit. Every other character becomes '-': "XID 79" is
// "XID-79".
func taintValue(reason string) string {
	v := []byte(reason)
	for i, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			v[i] = '-'
		}
	}
	s := string(v[:min(len(v), 63)])
	return strings.TrimFunc(s, func(r rune) bool { return r == '-' || r == '_' || r == '.' })
}

// attributes are what a selector can match of d: ours, NVIDIA's DRA
// driver's, and the standard PCI ones. An attribute whose value the
// inventory does not know is left out, so that a selector on it does not
// match rather than match a made-up value.
func attributes(d gpu.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttributeUUID:        {StringValue: ptr.To(d.UUID)},
		AttributeModel:       {StringValue: ptr.To(d.Name)},
		AttributeIndex:       {IntValue: ptr.To(int64(d.Index))},
		AttributeMinor:       {IntValue: ptr.To(int64(d.Minor))},
		AttributeType:        {StringValue: ptr.To(TypeGPU)},
		AttributeProductName: {StringValue: ptr.To(d.Name)},
	}
	for name, v := range map[resourceapi.QualifiedName]string{
		AttributeBrand:        d.Brand,
		AttributeArchitecture: d.Architecture,
	} {
		if v != "" {
			attrs[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	for name, v := range map[resourceapi.QualifiedName]string{
		AttributeCUDAComputeCapability: d.CUDAComputeCapability,
		AttributeDriverVersion:         d.DriverVersion,
		AttributeCUDADriverVersion:     d.CUDADriverVersion,
	} {
		if v, ok := semverOf(v); ok {
			attrs[name] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
		}
	}
	if a, err := deviceattribute.GetPCIBusIDAttribute(d.PCIBusID); err == nil {
		attrs[a.Name] = a.Value
	}
	if d.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(d.PCIeRoot)}
	}
	return attrs
}

// semverOf turns a version as NVML reports it ("8.0", "550.54.15",
// "535.104.05") into the semantic version a version attribute must be
// ("8.0.0", "550.54.15", "535.104.5"), by the library and rules NVIDIA's
// DRA driver uses, so that the same comparisons hold on both drivers.
func semverOf(v string) (string, bool) {
	if v == "" {
		return "", false
	}
	sv, err := semver.NewVersion(v)
	if err != nil {
		return "", false
	}
	return sv.String(), true
}

func bytesQuantity(b uint64) *resource.Quantity {
	return resource.NewQuantity(int64(min(b, 1<<63-1)), resource.BinarySI)
}
