package dra

import (
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

const (
	uuidA = "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"
	uuidB = "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"
	gib   = uint64(1) << 30
	mib   = uint64(1) << 20
)

var (
	gpuA = gpu.Device{Index: 0, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 * gib, Minor: 0, Healthy: true}
	gpuB = gpu.Device{Index: 1, UUID: uuidB, Name: "Tesla T4", Memory: 16 * gib, Minor: 1, Healthy: true}
)

func draConfig() *config.Config {
	cfg := config.Default()
	cfg.DRA.Enabled = true
	return cfg
}

// capacity is what a test expects of one published capacity.
type capacity struct {
	value, def, min, max string // quantities; "" = unset
}

func TestDevices(t *testing.T) {
	tests := []struct {
		name   string
		change func(*config.Config)
		devs   []gpu.Device
		want   map[string]map[string]capacity // device name -> capacity name -> capacity
	}{
		{
			name: "defaults: split_count 10",
			devs: []gpu.Device{gpuA, gpuB},
			want: map[string]map[string]capacity{
				"gpu-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f": {
					// 40 GiB / 10 = 4 GiB; 100 % / 10 = 10 %: a request
					// naming neither takes one slice.
					"memory": {value: "40Gi", def: "4Gi", min: "4Gi"},
					"cores":  {value: "100", def: "10", min: "10", max: "100"},
				},
				"gpu-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a": {
					"memory": {value: "16Gi", def: "1638Mi", min: "1638Mi"}, // 16384 MiB / 10, rounded down to a MiB
					"cores":  {value: "100", def: "10", min: "10", max: "100"},
				},
			},
		},
		{
			name: "scalings and a per-model split",
			change: func(c *config.Config) {
				c.DevicePlugin.MemoryScaling = 1.5
				c.DevicePlugin.CoresScaling = 2
				c.DevicePlugin.Models = []config.ModelOverride{{Name: "Tesla T4", SplitCount: 4}}
			},
			devs: []gpu.Device{gpuB},
			want: map[string]map[string]capacity{
				"gpu-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a": {
					// 1.5 × 16 GiB = 24 GiB, a quarter of it 6 GiB;
					// 200 % shared, at most 100 % per claim, 50 % per slice.
					"memory": {value: "24Gi", def: "6Gi", min: "6Gi"},
					"cores":  {value: "200", def: "50", min: "50", max: "100"},
				},
			},
		},
		{
			name:   "only the listed GPU",
			change: func(c *config.Config) { c.DRA.GPUs = []string{uuidB} },
			devs:   []gpu.Device{gpuA, gpuB},
			want: map[string]map[string]capacity{
				"gpu-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a": {
					"memory": {value: "16Gi", def: "1638Mi", min: "1638Mi"},
					"cores":  {value: "100", def: "10", min: "10", max: "100"},
				},
			},
		},
		{
			name:   "DRA off",
			change: func(c *config.Config) { c.DRA.Enabled = false },
			devs:   []gpu.Device{gpuA, gpuB},
			want:   map[string]map[string]capacity{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := draConfig()
			if tt.change != nil {
				tt.change(cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			got, err := Devices(cfg, tt.devs, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("%d devices published, want %d: %+v", len(got), len(tt.want), got)
			}
			for _, d := range got {
				want, ok := tt.want[d.Name]
				if !ok {
					t.Errorf("device %s published, want none of that name", d.Name)
					continue
				}
				if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
					t.Errorf("%s: allowMultipleAllocations not set: claims could not share it", d.Name)
				}
				if len(d.Capacity) != len(want) {
					t.Errorf("%s: capacities %v, want %v", d.Name, d.Capacity, want)
				}
				for cname, wc := range want {
					checkCapacity(t, d.Name+" "+cname, d.Capacity[resourceapi.QualifiedName(cname)], wc)
				}
			}
		})
	}
}

func checkCapacity(t *testing.T, what string, got resourceapi.DeviceCapacity, want capacity) {
	t.Helper()
	eq := func(field string, q *resource.Quantity, w string) {
		t.Helper()
		switch {
		case w == "" && q != nil:
			t.Errorf("%s: %s = %s, want unset", what, field, q.String())
		case w != "" && q == nil:
			t.Errorf("%s: %s unset, want %s", what, field, w)
		case w != "" && q.Cmp(resource.MustParse(w)) != 0:
			t.Errorf("%s: %s = %s, want %s", what, field, q.String(), w)
		}
	}
	eq("value", &got.Value, want.value)
	p := got.RequestPolicy
	if p == nil || p.ValidRange == nil {
		t.Errorf("%s: request policy %+v, want a default and a valid range", what, p)
		return
	}
	eq("default", p.Default, want.def)
	eq("min", p.ValidRange.Min, want.min)
	eq("max", p.ValidRange.Max, want.max)
}

// attr is what a test expects of one attribute: its type and value.
type attr struct {
	kind  string // "string", "int", "version"
	value string // ints in decimal
}

func attrOf(a resourceapi.DeviceAttribute) attr {
	switch {
	case a.StringValue != nil && a.IntValue == nil && a.VersionValue == nil && a.BoolValue == nil:
		return attr{"string", *a.StringValue}
	case a.IntValue != nil && a.StringValue == nil && a.VersionValue == nil && a.BoolValue == nil:
		return attr{"int", fmt.Sprint(*a.IntValue)}
	case a.VersionValue != nil && a.StringValue == nil && a.IntValue == nil && a.BoolValue == nil:
		return attr{"version", *a.VersionValue}
	}
	return attr{"?", fmt.Sprintf("%+v", a)}
}

func TestDevicesAttributes(t *testing.T) {
	bare := gpuB
	bare.PCIBusID = "0000:3b:00.0"
	tests := []struct {
		name string
		dev  gpu.Device
		want map[resourceapi.QualifiedName]attr
	}{
		{
			// Every attribute, NVIDIA's DRA driver's by its names and
			// types; versions as semantic versions.
			name: "described",
			dev:  describedA100,
			want: map[resourceapi.QualifiedName]attr{
				"uuid":                            {"string", "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f"},
				"model":                           {"string", "NVIDIA A100-SXM4-40GB"},
				"index":                           {"int", "3"},
				"minor":                           {"int", "3"},
				"type":                            {"string", "gpu"},
				"productName":                     {"string", "NVIDIA A100-SXM4-40GB"},
				"brand":                           {"string", "Nvidia"},
				"architecture":                    {"string", "Ampere"},
				"cudaComputeCapability":           {"version", "8.0.0"},
				"driverVersion":                   {"version", "535.104.5"},
				"cudaDriverVersion":               {"version", "12.2.0"},
				"resource.kubernetes.io/pciBusID": {"string", "0000:07:00.0"},
				"resource.kubernetes.io/pcieRoot": {"string", "pci0000:00"},
			},
		},
		{
			// Nothing beyond the inventory known: no made-up values.
			name: "undescribed",
			dev:  bare,
			want: map[resourceapi.QualifiedName]attr{
				"uuid":                            {"string", "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"},
				"model":                           {"string", "Tesla T4"},
				"index":                           {"int", "1"},
				"minor":                           {"int", "1"},
				"type":                            {"string", "gpu"},
				"productName":                     {"string", "Tesla T4"},
				"resource.kubernetes.io/pciBusID": {"string", "0000:3b:00.0"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Devices(draConfig(), []gpu.Device{tt.dev}, nil)
			if err != nil {
				t.Fatal(err)
			}
			attrs := got[0].Attributes
			for name, w := range tt.want {
				a, ok := attrs[name]
				if !ok {
					t.Errorf("attribute %s missing, want %s %q", name, w.kind, w.value)
				} else if g := attrOf(a); g != w {
					t.Errorf("attribute %s = %s %q, want %s %q", name, g.kind, g.value, w.kind, w.value)
				}
			}
			for name, a := range attrs {
				if _, ok := tt.want[name]; !ok {
					t.Errorf("attribute %s = %+v published, want none", name, attrOf(a))
				}
			}
		})
	}
}

// A version NVML reports in a form that is no version is left out, as a
// PCI address the standard attribute cannot hold.
func TestDevicesAttributesUnparsable(t *testing.T) {
	d := describedA100
	d.DriverVersion = "r535"
	d.PCIBusID = "00000000:07:00.0"
	got, err := Devices(draConfig(), []gpu.Device{d}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []resourceapi.QualifiedName{"driverVersion", "resource.kubernetes.io/pciBusID"} {
		if a, ok := got[0].Attributes[name]; ok {
			t.Errorf("attribute %s = %+v published, want none", name, attrOf(a))
		}
	}
	if a := got[0].Attributes["cudaDriverVersion"]; attrOf(a) != (attr{"version", "12.2.0"}) {
		t.Errorf("cudaDriverVersion = %+v, want version 12.2.0", attrOf(a))
	}
}

func TestDevicesErrors(t *testing.T) {
	cfg := draConfig()
	cfg.DevicePlugin.CoresScaling = 0.005
	if _, err := Devices(cfg, []gpu.Device{gpuA}, nil); err == nil || !strings.Contains(err.Error(), "less than 1 % of SM time") {
		t.Errorf("cores_scaling 0.005: %v, want an error about SM time", err)
	}
	clash := gpuB
	clash.UUID = "GPU-8E1C3F5A-0D2B-4C6E-9F71-2A3B4C5D6E7F" // gpuA's in upper case
	if _, err := Devices(draConfig(), []gpu.Device{gpuA, clash}, nil); err == nil || !strings.Contains(err.Error(), "would both be published as") {
		t.Errorf("two GPUs with one device name: %v, want an error naming both", err)
	}
}

// An unhealthy GPU stays published, whole, with a taint whose value is the
// backend's reason made a label value and whose effect is the configured
// one; a healthy GPU has none.
func TestDevicesTaintUnhealthy(t *testing.T) {
	since := time.Date(2026, 11, 29, 4, 5, 6, 700_000_000, time.UTC)
	sick := gpuB
	sick.Healthy = false
	for _, effect := range []string{"NoSchedule", "NoExecute"} {
		t.Run(effect, func(t *testing.T) {
			cfg := draConfig()
			cfg.DRA.UnhealthyTaintEffect = effect
			got, err := Devices(cfg, []gpu.Device{gpuA, sick}, map[string]Unhealthy{uuidB: {Reason: "XID 79: GPU fell off the bus", Since: since}})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("%d devices published, want both GPUs", len(got))
			}
			if got[0].Name != devA || len(got[0].Taints) != 0 {
				t.Errorf("healthy %s: taints %+v, want none", got[0].Name, got[0].Taints)
			}
			if got[1].Name != devB || len(got[1].Taints) != 1 {
				t.Fatalf("unhealthy %s: taints %+v, want one", got[1].Name, got[1].Taints)
			}
			taint := got[1].Taints[0]
			if taint.Key != "nri-vgpu.io/unhealthy" || taint.Value != "XID-79--GPU-fell-off-the-bus" || string(taint.Effect) != effect {
				t.Errorf("taint %s=%s:%s, want nri-vgpu.io/unhealthy=XID-79--GPU-fell-off-the-bus:%s", taint.Key, taint.Value, taint.Effect, effect)
			}
			// Whole seconds, as the API server keeps them: a republished
			// slice then equals the stored one.
			if want := time.Date(2026, 11, 29, 4, 5, 6, 0, time.UTC); taint.TimeAdded == nil || !taint.TimeAdded.Time.Equal(want) {
				t.Errorf("timeAdded %v, want %v", taint.TimeAdded, want)
			}
			if mem := got[1].Capacity["memory"].Value; mem.Cmp(resource.MustParse("16Gi")) != 0 {
				t.Errorf("unhealthy GPU's memory capacity %s, want all 16Gi: its claims keep their share", mem.String())
			}
		})
	}
}

func TestTaintValue(t *testing.T) {
	for _, tt := range []struct{ reason, want string }{
		{"XID 79", "XID-79"},
		{"", ""},
		{" (double-bit ECC error) ", "double-bit-ECC-error"},
		{"health changed in the simulated configuration", "health-changed-in-the-simulated-configuration"},
		{strings.Repeat("x", 70), strings.Repeat("x", 63)},
		{strings.Repeat("x", 62) + " y", strings.Repeat("x", 62)},
		{"GPU é", "GPU"},
	} {
		if got := taintValue(tt.reason); got != tt.want {
			t.Errorf("taintValue(%q) = %q, want %q", tt.reason, got, tt.want)
		}
	}
}
