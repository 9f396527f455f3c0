package config

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// exampleFile is the documented example shipped in packages.
const exampleFile = "../../packaging/config.toml"

func ptr[T any](v T) *T { return &v }

func TestDefault(t *testing.T) {
	want := &Config{
		DevicePlugin: DevicePlugin{
			ResourceName:     "nvidia.com/gpu",
			SplitCount:       10,
			MemoryScaling:    1.0,
			CoresScaling:     1.0,
			AllocationPolicy: "binpack",
			SocketDir:        "/var/lib/kubelet/device-plugins",
			FeatureFile:      "/etc/kubernetes/node-feature-discovery/features.d/nri-vgpu",
		},
		GPU: GPU{Backend: "nvml"},
		Driver: Driver{Injection: "auto", CDIDirs: []string{"/etc/cdi", "/var/run/cdi"}, DevRoot: "/", DriverRoot: "/",
			LibraryDirs: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"}},
		Paths: Paths{
			StateDir: "/var/lib/nri-vgpu",
			RunDir:   "/run/nri-vgpu",
			ShimPath: "/usr/lib/nri-vgpu/libvgpu-shim.so",
		},
		NRI:     NRI{PluginIndex: "10", SocketPath: "/var/run/nri/nri.sock", HideUnrequested: true, Confinement: "best-effort"},
		Runtime: Runtime{Next: []string{"nvidia-container-runtime", "runc"}},
		Metrics: Metrics{Listen: ""},
		Limits:  Limits{CoresPolicy: "hard", LogLevel: "warn"},
		DRA:     DRA{DriverName: "gpu.nri-vgpu.io", CDIDir: "/var/run/cdi", UnhealthyTaintEffect: "NoSchedule"},
	}
	got := Default()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Default() =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("Default().Validate(): %v", err)
	}
	// Each call must return an independent value.
	got.Driver.CDIDirs[0] = "/changed"
	if Default().Driver.CDIDirs[0] != "/etc/cdi" {
		t.Fatal("Default() shares its slices between calls")
	}
}

func TestParseEmptyIsDefault(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":         "",
		"comments only": "# nothing set\n\n   # still nothing\n",
		"empty tables":  "[device_plugin]\n[gpu]\n[driver]\n[paths]\n[nri]\n[runtime]\n[metrics]\n[limits]\n",
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse("empty.toml", []byte(doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if cfg.Source != "empty.toml" {
				t.Errorf("Source = %q, want %q", cfg.Source, "empty.toml")
			}
			cfg.Source = ""
			if !reflect.DeepEqual(cfg, Default()) {
				t.Fatalf("Parse(%q) =\n%+v\nwant Default()\n%+v", doc, cfg, Default())
			}
		})
	}
}

func TestExampleFile(t *testing.T) {
	cfg, err := Load(exampleFile)
	if err != nil {
		t.Fatalf("Load(%s): %v", exampleFile, err)
	}
	want := Default()
	want.Source = exampleFile
	want.DevicePlugin.Models = []ModelOverride{{Name: "NVIDIA H100 80GB HBM3", SplitCount: 20}}
	want.DRA.GPUs = []string{}
	want.NRI.Exempt = []Exemption{{Namespace: "gpu-operator", RuntimeHandler: "nvidia"}}
	want.NRI.ConfinementExempt = []ConfinementExemption{{Namespace: "ci-builds"}}
	want.GPU = GPU{
		Backend: "simulated",
		Simulated: []SimulatedGPU{
			{
				UUID:     "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a",
				Name:     "NVIDIA A100-SXM4-40GB",
				Memory:   40 << 30,
				Minor:    0,
				PCIBusID: "00000000:07:00.0",
				Healthy:  ptr(true),

				Architecture:          "Ampere",
				Brand:                 "Nvidia",
				CUDAComputeCapability: "8.0",
				DriverVersion:         "550.54.15",
				CUDADriverVersion:     "12.4",
				PCIeRoot:              "pci0000:00",
			},
			{
				UUID:     "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f",
				Name:     "NVIDIA H100 80GB HBM3",
				Memory:   80 << 30,
				Minor:    1,
				PCIBusID: "00000000:0F:00.0",
				Healthy:  ptr(true),

				Architecture:          "Hopper",
				Brand:                 "Nvidia",
				CUDAComputeCapability: "9.0",
				DriverVersion:         "550.54.15",
				CUDADriverVersion:     "12.4",
				PCIeRoot:              "pci0000:00",
			},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Load(%s) =\n%+v\nwant\n%+v", exampleFile, cfg, want)
	}
	if got := cfg.DevicePlugin.SplitCountFor("NVIDIA H100 80GB HBM3"); got != 20 {
		t.Errorf("SplitCountFor(H100) = %d, want 20", got)
	}
	if got := cfg.DevicePlugin.SplitCountFor("NVIDIA A100-SXM4-40GB"); got != 10 {
		t.Errorf("SplitCountFor(A100) = %d, want 10", got)
	}
}

// The example documents every key: each one is written in it, right after a
// comment.
func TestExampleFileHasEveryKey(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	loc := locate(string(data))
	lines := strings.Split(string(data), "\n")
	for _, path := range schemaKeys(reflect.TypeFor[Config](), "") {
		n, ok := loc.lines[path]
		if !ok {
			t.Errorf("%s: key %s is missing", exampleFile, path)
			continue
		}
		// Keys of the simulated GPUs are documented together above them.
		if strings.HasPrefix(path, "gpu.simulated[") || strings.HasPrefix(path, "device_plugin.model[0].") {
			continue
		}
		if prev := strings.TrimSpace(lines[n-2]); !strings.HasPrefix(prev, "#") {
			t.Errorf("%s:%d: key %s has no comment above it", exampleFile, n, path)
		}
	}
	if !strings.Contains(string(data), `backend = "nvml"`) {
		t.Errorf(`%s does not tell GPU nodes to set backend = "nvml"`, exampleFile)
	}
}

// schemaKeys lists the path of every key of the struct type t, taking the
// first element of arrays of tables.
func schemaKeys(t reflect.Type, path string) []string {
	var keys []string
	for name, i := range tomlFields(t) {
		p := joinPath(path, name)
		ft := t.Field(i).Type
		switch {
		case isTable(ft):
			keys = append(keys, schemaKeys(ft, p)...)
		case ft.Kind() == reflect.Slice && isTable(ft.Elem()):
			keys = append(keys, schemaKeys(ft.Elem(), indexPath(p, 0))...)
		default:
			keys = append(keys, p)
		}
	}
	return keys
}

func TestParseOverrides(t *testing.T) {
	doc := `
[device_plugin]
resource_name = "example.com/vgpu"
split_count = 4
memory_scaling = 1.5
cores_scaling = 2
allocation_policy = "spread"
socket_dir = "/tmp/dp"
feature_file = "/tmp/features.d/vgpu"
feature_nvidia_labels = true

[[device_plugin.model]]
name = "NVIDIA A100-SXM4-40GB"
split_count = 7

[[device_plugin.model]]
name = "Tesla T4"
split_count = 2

[gpu]
backend = "simulated"
simulated = [
  { uuid = "GPU-aaaa", name = "Tesla T4", memory = 16106127360, minor = 3, healthy = false },
  { uuid = "GPU-bbbb", name = "NVIDIA A100-SXM4-40GB", memory = "40960MiB", minor = 4, pci_bus_id = "0000:3b:00.0" },
]

[driver]
injection = "cdi"
cdi_dirs = ["/opt/cdi"]
dev_root = "/tmp/dev-root"
driver_root = "/run/nvidia/driver"

[paths]
state_dir = "/tmp/state"
run_dir = "/tmp/run"
shim_path = "/opt/nri-vgpu/libvgpu-shim.so"

[nri]
plugin_index = "05"
socket_path = "/tmp/nri.sock"
hide_unrequested = false
confinement = "required"

[[nri.confinement_exempt]]
namespace = "ci-builds"

[runtime]
next = ["/usr/local/bin/runc"]

[metrics]
listen = "127.0.0.1:9400"

[limits]
cores_policy = "burst"
log_level = "debug"

[dra]
enabled = true
gpus = ["GPU-bbbb"]
driver_name = "vgpu.example.com"
cdi_dir = "/etc/cdi"
unhealthy_taint_effect = "NoExecute"
`
	cfg, err := Parse("override.toml", []byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := &Config{
		DevicePlugin: DevicePlugin{
			ResourceName:     "example.com/vgpu",
			SplitCount:       4,
			MemoryScaling:    1.5,
			CoresScaling:     2,
			AllocationPolicy: "spread",
			SocketDir:        "/tmp/dp",
			FeatureFile:      "/tmp/features.d/vgpu", FeatureNVIDIALabels: true,
			Models: []ModelOverride{
				{Name: "NVIDIA A100-SXM4-40GB", SplitCount: 7},
				{Name: "Tesla T4", SplitCount: 2},
			},
		},
		GPU: GPU{
			Backend: "simulated",
			Simulated: []SimulatedGPU{
				{UUID: "GPU-aaaa", Name: "Tesla T4", Memory: 15 << 30, Minor: 3, Healthy: ptr(false)},
				{UUID: "GPU-bbbb", Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Minor: 4, PCIBusID: "0000:3b:00.0"},
			},
		},
		Driver: Driver{Injection: "cdi", CDIDirs: []string{"/opt/cdi"}, DevRoot: "/tmp/dev-root", DriverRoot: "/run/nvidia/driver",
			LibraryDirs: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"}},
		Paths: Paths{StateDir: "/tmp/state", RunDir: "/tmp/run", ShimPath: "/opt/nri-vgpu/libvgpu-shim.so"},
		NRI: NRI{PluginIndex: "05", SocketPath: "/tmp/nri.sock", HideUnrequested: false,
			Confinement: "required", ConfinementExempt: []ConfinementExemption{{Namespace: "ci-builds"}}},
		Runtime: Runtime{Next: []string{"/usr/local/bin/runc"}},
		Metrics: Metrics{Listen: "127.0.0.1:9400"},
		Limits:  Limits{CoresPolicy: "burst", LogLevel: "debug"},
		DRA:     DRA{Enabled: true, GPUs: []string{"GPU-bbbb"}, DriverName: "vgpu.example.com", CDIDir: "/etc/cdi", UnhealthyTaintEffect: "NoExecute"},
		Source:  "override.toml",
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Parse =\n%+v\nwant\n%+v", cfg, want)
	}
	if cfg.GPU.Simulated[0].IsHealthy() || !cfg.GPU.Simulated[1].IsHealthy() {
		t.Errorf("IsHealthy: got %v, %v; want false, true",
			cfg.GPU.Simulated[0].IsHealthy(), cfg.GPU.Simulated[1].IsHealthy())
	}
}

// Keys left out of a table keep their defaults; a list in the file replaces
// the default list rather than merging with it.
func TestParsePartial(t *testing.T) {
	cfg, err := Parse("partial.toml", []byte("[device_plugin]\nsplit_count = 3\n[driver]\ncdi_dirs = [\"/x\"]\n"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := Default()
	want.Source = "partial.toml"
	want.DevicePlugin.SplitCount = 3
	want.Driver.CDIDirs = []string{"/x"}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Parse =\n%+v\nwant\n%+v", cfg, want)
	}
}

func TestDRAServes(t *testing.T) {
	tests := []struct {
		name string
		dra  DRA
		uuid string
		want bool
	}{
		{"off", DRA{}, "GPU-a", false},
		{"off with a list", DRA{GPUs: []string{"GPU-a"}}, "GPU-a", false},
		{"on, every GPU", DRA{Enabled: true}, "GPU-a", true},
		{"on, listed", DRA{Enabled: true, GPUs: []string{"GPU-b", "GPU-a"}}, "GPU-a", true},
		{"on, not listed", DRA{Enabled: true, GPUs: []string{"GPU-b"}}, "GPU-a", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.dra.Serves(tt.uuid); got != tt.want {
				t.Errorf("%+v.Serves(%q) = %v, want %v", tt.dra, tt.uuid, got, tt.want)
			}
		})
	}
}

func TestSplitCountFor(t *testing.T) {
	dp := DevicePlugin{
		SplitCount: 10,
		Models: []ModelOverride{
			{Name: "NVIDIA A100-SXM4-40GB", SplitCount: 7},
			{Name: "Tesla T4", SplitCount: 2},
		},
	}
	tests := []struct {
		model string
		want  int
	}{
		{"NVIDIA A100-SXM4-40GB", 7},
		{"Tesla T4", 2},
		{"tesla t4", 10}, // exact match only
		{"NVIDIA A100-SXM4-40GB ", 10},
		{"", 10},
		{"NVIDIA H100 80GB HBM3", 10},
	}
	for _, tt := range tests {
		if got := dp.SplitCountFor(tt.model); got != tt.want {
			t.Errorf("SplitCountFor(%q) = %d, want %d", tt.model, got, tt.want)
		}
	}
}

func TestBytes(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want Bytes
	}{
		{"integer", int64(17179869184), 16 << 30},
		{"zero", int64(0), 0},
		{"binary quantity", "16GiB", 16 << 30},
		{"MiB quantity", "16384MiB", 16 << 30},
		{"decimal quantity", "16GB", 16e9},
		{"fraction", "1.5GiB", 3 << 29},
		{"bytes string", "1024", 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Bytes
			if err := b.UnmarshalTOML(tt.in); err != nil {
				t.Fatalf("UnmarshalTOML(%#v): %v", tt.in, err)
			}
			if b != tt.want {
				t.Fatalf("UnmarshalTOML(%#v) = %d, want %d", tt.in, b, tt.want)
			}
			// MarshalText and UnmarshalText are inverse.
			text, err := b.MarshalText()
			if err != nil {
				t.Fatal(err)
			}
			var back Bytes
			if err := back.UnmarshalText(text); err != nil || back != b {
				t.Fatalf("UnmarshalText(%q) = %d, %v; want %d", text, back, err, b)
			}
		})
	}
}

func TestBytesErrors(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"negative", int64(-1), "negative byte count -1"},
		{"bad unit", "16XB", `invalid byte quantity "16XB": unknown unit "XB"`},
		{"ambiguous", "16G", `ambiguous unit "G"`},
		{"empty", "", `invalid byte quantity "": empty`},
		{"float", 1.5e9, "not a float"},
		{"bool", true, "not a boolean"},
		{"array", []any{int64(1)}, "not an array"},
		{"table", map[string]any{}, "not a table"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Bytes(7)
			err := b.UnmarshalTOML(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("UnmarshalTOML(%#v) error = %v, want it to contain %q", tt.in, err, tt.want)
			}
			if b != 7 {
				t.Errorf("UnmarshalTOML(%#v) changed the value to %d on error", tt.in, b)
			}
		})
	}
	var b Bytes
	if err := b.UnmarshalText([]byte("-1GiB")); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf(`UnmarshalText("-1GiB") error = %v, want "negative"`, err)
	}
}

func TestBytesString(t *testing.T) {
	if got := Bytes(40 << 30).String(); got != "40GiB" {
		t.Errorf("String() = %q, want 40GiB", got)
	}
}

// simulatedDoc is a valid two-GPU simulated setup that validation tests
// append to or edit.
const simulatedDoc = `[gpu]
backend = "simulated"

[[gpu.simulated]]
uuid = "GPU-00000000-0000-0000-0000-000000000000"
name = "NVIDIA A100-SXM4-40GB"
memory = "40GiB"
minor = 0

[[gpu.simulated]]
uuid = "GPU-11111111-1111-1111-1111-111111111111"
name = "NVIDIA H100 80GB HBM3"
memory = "80GiB"
minor = 1
`

func TestSimulatedDocIsValid(t *testing.T) {
	if _, err := Parse("sim.toml", []byte(simulatedDoc)); err != nil {
		t.Fatalf("Parse(simulatedDoc): %v", err)
	}
}

// Each invalid value is reported as "file:line: key: problem".
func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		line int
		key  string
		want string
	}{
		{"split_count 0", "[device_plugin]\nsplit_count = 0\n", 2, "device_plugin.split_count", "must be from 1 to 1024, not 0"},
		{"split_count too big", "[device_plugin]\n\nsplit_count = 1025\n", 3, "device_plugin.split_count", "not 1025"},
		{"split_count negative", "device_plugin.split_count = -2\n", 1, "device_plugin.split_count", "not -2"},
		{"memory_scaling 0", "[device_plugin]\nmemory_scaling = 0.0\n", 2, "device_plugin.memory_scaling", "more than 0 and at most 10, not 0"},
		{"memory_scaling negative", "[device_plugin]\nmemory_scaling = -1.0\n", 2, "device_plugin.memory_scaling", "not -1"},
		{"memory_scaling nan", "[device_plugin]\nmemory_scaling = nan\n", 2, "device_plugin.memory_scaling", "not NaN"},
		{"cores_scaling above 10", "[device_plugin]\ncores_scaling = 10.5\n", 2, "device_plugin.cores_scaling", "not 10.5"},
		{"cores_scaling inf", "[device_plugin]\ncores_scaling = inf\n", 2, "device_plugin.cores_scaling", "not +Inf"},
		{"policy", "[device_plugin]\nallocation_policy = \"pack\"\n", 2, "device_plugin.allocation_policy", `must be one of "binpack", "spread", not "pack"`},
		{"resource name without domain", "[device_plugin]\nresource_name = \"gpu\"\n", 2, "device_plugin.resource_name", `want exactly one "/"`},
		{"resource name upper-case domain", "[device_plugin]\nresource_name = \"NVIDIA.com/gpu\"\n", 2, "device_plugin.resource_name", "lower-case DNS name"},
		{"resource name reserved", "[device_plugin]\nresource_name = \"kubernetes.io/gpu\"\n", 2, "device_plugin.resource_name", "reserved"},
		{"resource name bad name", "[device_plugin]\nresource_name = \"nvidia.com/gpu!\"\n", 2, "device_plugin.resource_name", "the name must be"},
		{"socket_dir relative", "[device_plugin]\nsocket_dir = \"device-plugins\"\n", 2, "device_plugin.socket_dir", `must be an absolute path, not "device-plugins"`},
		{"feature_file relative", "[device_plugin]\nfeature_file = \"nri-vgpu\"\n", 2, "device_plugin.feature_file", `must be an absolute path, not "nri-vgpu"`},
		{"feature_file hidden", "[device_plugin]\nfeature_file = \"/etc/kubernetes/node-feature-discovery/features.d/.nri-vgpu\"\n", 2, "device_plugin.feature_file", `must not name a hidden file (".nri-vgpu")`},
		{"nvidia labels without a feature file", "[device_plugin]\nfeature_file = \"\"\nfeature_nvidia_labels = true\n", 3, "device_plugin.feature_nvidia_labels", "needs device_plugin.feature_file"},
		{"model without name", "[[device_plugin.model]]\nsplit_count = 4\n", 1, "device_plugin.model[0].name", "must be set"},
		{"model split_count left out", "[[device_plugin.model]]\nname = \"T4\"\n", 1, "device_plugin.model[0].split_count", "not 0"},
		{"model split_count", "[[device_plugin.model]]\nname = \"T4\"\nsplit_count = 2\n[[device_plugin.model]]\nname = \"L4\"\nsplit_count = 0\n", 6, "device_plugin.model[1].split_count", "not 0"},
		{"model duplicate", "[[device_plugin.model]]\nname = \"T4\"\nsplit_count = 2\n[[device_plugin.model]]\nname = \"T4\"\nsplit_count = 3\n", 5, "device_plugin.model[1].name", `"T4" is already overridden by device_plugin.model[0]`},
		{"dra gpu not a UUID", "[dra]\nenabled = true\ngpus = [\"0\"]\n", 3, "dra.gpus[0]", `"0"`},
		{"dra gpu twice", "[dra]\nenabled = true\ngpus = [\"GPU-a\",\n \"GPU-a\"]\n", 4, "dra.gpus[1]", `"GPU-a" is already listed as dra.gpus[0]`},
		{"dra gpus while off", "[dra]\ngpus = [\"GPU-a\"]\n", 2, "dra.gpus", "dra.enabled is false"},
		{"dra driver name upper case", "[dra]\ndriver_name = \"GPU.example.com\"\n", 2, "dra.driver_name", `not "GPU.example.com"`},
		{"dra driver name too long", "[dra]\ndriver_name = \"" + strings.Repeat("a", 64) + "\"\n", 2, "dra.driver_name", "1 to 63 characters"},
		{"dra cdi_dir relative", "[dra]\ncdi_dir = \"cdi\"\n", 2, "dra.cdi_dir", `must be an absolute path, not "cdi"`},
		{"dra taint effect unknown", "[dra]\nunhealthy_taint_effect = \"PreferNoSchedule\"\n", 2, "dra.unhealthy_taint_effect", `must be one of "NoSchedule", "NoExecute", not "PreferNoSchedule"`},
		{"backend", "[gpu]\nbackend = \"cuda\"\n", 2, "gpu.backend", `must be one of "nvml", "simulated", not "cuda"`},
		{"simulated without GPUs", "[gpu]\nbackend = \"simulated\"\n", 2, "gpu.backend", "no [[gpu.simulated]] GPU is described"},
		{"uuid prefix", strings.Replace(simulatedDoc, `"GPU-11111111`, `"gpu-11111111`, 1), 11, "gpu.simulated[1].uuid", `not "gpu-11111111-1111-1111-1111-111111111111"`},
		{"uuid empty", strings.Replace(simulatedDoc, `"GPU-11111111-1111-1111-1111-111111111111"`, `""`, 1), 11, "gpu.simulated[1].uuid", `not ""`},
		{"uuid too long", strings.Replace(simulatedDoc, `"GPU-11111111-1111`, `"GPU-`+strings.Repeat("1", 92)+`-1111`, 1), 11, "gpu.simulated[1].uuid", "at most 95"},
		{"uuid with separator", strings.Replace(simulatedDoc, `"GPU-11111111-1111`, `"GPU-11111111::1111`, 1), 11, "gpu.simulated[1].uuid", "must look like"},
		{"uuid duplicate", strings.Replace(simulatedDoc, "GPU-11111111-1111-1111-1111-111111111111", "GPU-00000000-0000-0000-0000-000000000000", 1), 11, "gpu.simulated[1].uuid", "already used by gpu.simulated[0]"},
		{"minor duplicate", strings.Replace(simulatedDoc, "minor = 1", "minor = 0", 1), 14, "gpu.simulated[1].minor", "0 is already used by gpu.simulated[0]"},
		{"minor negative", strings.Replace(simulatedDoc, "minor = 1", "minor = -1", 1), 14, "gpu.simulated[1].minor", "must be from 0 to 254, not -1"},
		{"minor is nvidiactl", strings.Replace(simulatedDoc, "minor = 1", "minor = 255", 1), 14, "gpu.simulated[1].minor", "not 255"},
		{"minor left out twice", strings.Replace(simulatedDoc, "minor = 1\n", "", 1), 10, "gpu.simulated[1].minor", "already used"},
		{"name empty", strings.Replace(simulatedDoc, `"NVIDIA H100 80GB HBM3"`, `" "`, 1), 12, "gpu.simulated[1].name", "must be set"},
		{"memory zero", strings.Replace(simulatedDoc, `"80GiB"`, "0", 1), 13, "gpu.simulated[1].memory", "must be more than 0"},
		{"memory too small to split", strings.Replace(simulatedDoc, `"80GiB"`, `"9MiB"`, 1), 13, "gpu.simulated[1].memory", "9MiB split into 10 slices (memory_scaling 1) leaves less than 1MiB per slice"},
		{"memory too small for model override", simulatedDoc + "[[device_plugin.model]]\nname = \"NVIDIA A100-SXM4-40GB\"\nsplit_count = 1024\n" +
			"[[gpu.simulated]]\nuuid = \"GPU-2\"\nname = \"NVIDIA A100-SXM4-40GB\"\nmemory = \"512MiB\"\nminor = 2\n", 21, "gpu.simulated[2].memory", "split into 1024 slices"},
		{"pci bus id", simulatedDoc + "pci_bus_id = \"07:00.0\"\n", 15, "gpu.simulated[1].pci_bus_id", `must look like "00000000:07:00.0", not "07:00.0"`},
		{"pci bus id duplicate", strings.Replace(simulatedDoc, "minor = 0\n", "minor = 0\npci_bus_id = \"00000000:07:00.0\"\n", 1) + "pci_bus_id = \"00000000:07:00.0\"\n", 16, "gpu.simulated[1].pci_bus_id", "already used by gpu.simulated[0]"},
		{"architecture padded", simulatedDoc + "architecture = \"Hopper \"\n", 15, "gpu.simulated[1].architecture", `without leading or trailing spaces, not "Hopper "`},
		{"brand too long", simulatedDoc + "brand = \"" + strings.Repeat("b", 65) + "\"\n", 15, "gpu.simulated[1].brand", "at most 64 characters"},
		{"compute capability without minor", simulatedDoc + "cuda_compute_capability = \"9\"\n", 15, "gpu.simulated[1].cuda_compute_capability", `must be major.minor such as "8.0", not "9"`},
		{"cuda driver version with patch", simulatedDoc + "cuda_driver_version = \"12.4.1\"\n", 15, "gpu.simulated[1].cuda_driver_version", `such as "12.4", not "12.4.1"`},
		{"driver version", simulatedDoc + "driver_version = \"r550\"\n", 15, "gpu.simulated[1].driver_version", `such as "550.54.15", not "r550"`},
		{"pcie root as a bus id", simulatedDoc + "pcie_root = \"0000:00\"\n", 15, "gpu.simulated[1].pcie_root", `such as "pci0000:00", not "0000:00"`},
		{"injection", "[driver]\ninjection = \"cdi-only\"\n", 2, "driver.injection", `must be one of "auto", "cdi", "generate", "nvidia-runtime", "none", not "cdi-only"`},
		{"cdi without dirs", "[driver]\ninjection = \"cdi\"\ncdi_dirs = []\n", 3, "driver.cdi_dirs", "is empty"},
		{"cdi dir relative", "[driver]\ncdi_dirs = [\n  \"/etc/cdi\",\n  \"cdi\",\n]\n", 4, "driver.cdi_dirs[1]", `must be an absolute path, not "cdi"`},
		{"dev_root relative", "[driver]\ndev_root = \"\"\n", 2, "driver.dev_root", `must be an absolute path, not ""`},
		{"driver_root relative", "[driver]\ndriver_root = \"run/nvidia/driver\"\n", 2, "driver.driver_root", `must be an absolute path, not "run/nvidia/driver"`},
		{"state_dir relative", "[paths]\nstate_dir = \"var/lib/nri-vgpu\"\n", 2, "paths.state_dir", "absolute"},
		{"run_dir relative", "[paths]\nrun_dir = \"./run\"\n", 2, "paths.run_dir", "absolute"},
		{"shim_path relative", "[paths]\nshim_path = \"libvgpu-shim.so\"\n", 2, "paths.shim_path", "absolute"},
		{"hook_path relative", "[paths]\nhook_path = \"nri-vgpu\"\n", 2, "paths.hook_path", `must be an absolute path, not "nri-vgpu"`},
		{"plugin_index one digit", "[nri]\nplugin_index = \"5\"\n", 2, "nri.plugin_index", `must be two digits such as "10"`},
		{"plugin_index letters", "[nri]\nplugin_index = \"ab\"\n", 2, "nri.plugin_index", `not "ab"`},
		{"plugin_index three digits", "[nri]\nplugin_index = \"100\"\n", 2, "nri.plugin_index", `not "100"`},
		{"nri socket relative", "[nri]\nsocket_path = \"nri.sock\"\n", 2, "nri.socket_path", "absolute"},
		{"exempt without keys", "[nri]\n[[nri.exempt]]\n", 2, "nri.exempt[0]", "sets neither namespace nor runtime_handler"},
		{"exempt empty namespace", "[[nri.exempt]]\nnamespace = \"\"\n", 1, "nri.exempt[0]", "sets neither"},
		{"exempt namespace upper case", "[[nri.exempt]]\nnamespace = \"ok\"\n[[nri.exempt]]\n\nnamespace = \"GPU-Operator\"\n", 5, "nri.exempt[1].namespace", `"GPU-Operator" is not a Kubernetes namespace name`},
		{"exempt namespace too long", "[[nri.exempt]]\nnamespace = \"" + strings.Repeat("n", 64) + "\"\n", 2, "nri.exempt[0].namespace", "at most 63"},
		{"exempt handler", "[[nri.exempt]]\nnamespace = \"gpu-operator\"\nruntime_handler = \"nvidia.cdi\"\n", 3, "nri.exempt[0].runtime_handler", `"nvidia.cdi" is not a RuntimeClass handler name`},
		{"exempt duplicate", "[[nri.exempt]]\nnamespace = \"gpu-operator\"\n[[nri.exempt]]\nnamespace = \"gpu-operator\"\n", 3, "nri.exempt[1]", "repeats nri.exempt[0]"},
		{"confinement", "[nri]\nconfinement = \"strict\"\n", 2, "nri.confinement", `must be one of "best-effort", "required", not "strict"`},
		{"confinement case", "[nri]\n\nconfinement = \"Required\"\n", 3, "nri.confinement", `not "Required"`},
		{"confinement_exempt without namespace", "[nri]\n[[nri.confinement_exempt]]\n", 2, "nri.confinement_exempt[0].namespace", "must be set"},
		{"confinement_exempt namespace", "[[nri.confinement_exempt]]\nnamespace = \"ci\"\n[[nri.confinement_exempt]]\nnamespace = \"CI_builds\"\n", 4, "nri.confinement_exempt[1].namespace", `"CI_builds" is not a Kubernetes namespace name`},
		{"confinement_exempt duplicate", "[[nri.confinement_exempt]]\nnamespace = \"ci\"\n[[nri.confinement_exempt]]\nnamespace = \"ci\"\n", 4, "nri.confinement_exempt[1].namespace", `"ci" is already exempt by nri.confinement_exempt[0]`},
		{"runtime.next empty", "[runtime]\nnext = []\n", 2, "runtime.next", "is empty"},
		{"runtime.next empty name", "[runtime]\nnext = [\"runc\", \"\"]\n", 2, "runtime.next[1]", `not ""`},
		{"runtime.next relative", "[runtime]\nnext = [\"bin/runc\"]\n", 2, "runtime.next[0]", "relative path"},
		{"runtime.next itself", "[runtime]\nnext = [\"/usr/bin/nri-vgpu-runtime\", \"runc\"]\n", 2, "runtime.next[0]", "this wrapper itself"},
		{"metrics listen no port", "[metrics]\nlisten = \"localhost\"\n", 2, "metrics.listen", `must be "host:port" or ":port"`},
		{"metrics listen bad port", "[metrics]\nlisten = \":http\"\n", 2, "metrics.listen", `port "http" of ":http" is not a number`},
		{"metrics listen port range", "[metrics]\nlisten = \":65536\"\n", 2, "metrics.listen", "from 0 to 65535"},
		{"cores_policy", "[limits]\n\ncores_policy = \"soft\"\n", 3, "limits.cores_policy", `must be one of "hard", "burst", not "soft"`},
		{"cores_policy case", "[limits]\ncores_policy = \"Burst\"\n", 2, "limits.cores_policy", `not "Burst"`},
		{"cores_policy empty", "[limits]\ncores_policy = \"\"\n", 2, "limits.cores_policy", `not ""`},
		{"log_level", "[limits]\nlog_level = \"trace\"\n", 2, "limits.log_level", `must be one of "error", "warn", "info", "debug", not "trace"`},
		{"log_level dotted", "limits.log_level = \"verbose\"\n", 1, "limits.log_level", `not "verbose"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("bad.toml", []byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded with %+v; want an error about %s", cfg, tt.key)
			}
			want := "bad.toml:" + strconv.Itoa(tt.line) + ": " + tt.key + ": "
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n%v\nwant it to contain %q and %q", err, want, tt.want)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.File != "bad.toml" || ce.Line != tt.line || ce.Key != tt.key {
				t.Fatalf("errors.As(*Error) = %+v; want File bad.toml, Line %d, Key %s", ce, tt.line, tt.key)
			}
		})
	}
}

func TestUnknownKeys(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		line int
		want string
	}{
		{"misspelt", "[device_plugin]\nsplitcount = 4\n", 2, `unknown key "device_plugin.splitcount" (did you mean "split_count"?)`},
		{"wrong case", "[device_plugin]\nSplit_Count = 4\n", 2, `unknown key "device_plugin.Split_Count" (did you mean "split_count"?)`},
		{"unknown table", "\n[devices]\nsplit_count = 4\n", 2, `unknown key "devices"`},
		{"top-level key", "split_count = 4\n", 1, `unknown key "split_count"`},
		{"dotted key", "gpu.backends = \"nvml\"\n", 1, `unknown key "gpu.backends" (did you mean "backend"?)`},
		{"in second simulated GPU", simulatedDoc + "healty = false\n", 15, `unknown key "gpu.simulated[1].healty"`},
		{"in inline table", "[gpu]\nsimulated = [\n  { uuid = \"GPU-1\", name = \"x\", memory = 1 },\n  { uuid = \"GPU-2\", nmae = \"x\", memory = 1 },\n]\n", 4, `unknown key "gpu.simulated[1].nmae"`},
		{"under a model", "[[device_plugin.model]]\nname = \"T4\"\nsplit-count = 2\n", 3, `unknown key "device_plugin.model[0].split-count" (did you mean "split_count"?)`},
		{"quoted key", "[nri]\n\"plugin index\" = \"10\"\n", 2, `unknown key "nri.\"plugin index\""`},
		{"source is not a key", "Source = \"x\"\n", 1, `unknown key "Source"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("unknown.toml", []byte(tt.doc))
			if err == nil {
				t.Fatal("Parse succeeded; want an unknown key error")
			}
			want := "unknown.toml:" + strconv.Itoa(tt.line) + ": " + tt.want
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error:\n%v\nwant it to contain %q", err, want)
			}
			if !errors.Is(err, ErrUnknownKey) {
				t.Errorf("error does not wrap ErrUnknownKey: %v", err)
			}
		})
	}
}

// Values of the wrong type are reported with the line of the exact array
// element, which the TOML library alone does not give.
func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"string for int", "[device_plugin]\nsplit_count = \"ten\"\n", `bad.toml:2: device_plugin.split_count: incompatible types: TOML value has type string; destination has type integer`},
		{"int for string", "[nri]\nplugin_index = 10\n", `bad.toml:2: nri.plugin_index: incompatible types`},
		{"scalar for table", "gpu = 5\n", `bad.toml:1: gpu: want a table, not an integer`},
		{"scalar for array element", "[gpu]\nsimulated = [1]\n", `bad.toml:2: gpu.simulated[0]: want a table, not an integer`},
		{"table for array of tables", "[gpu.simulated]\nuuid = \"GPU-1\"\n", `bad.toml:1: gpu.simulated: want an array of tables ([[gpu.simulated]]), not a table`},
		{"table for scalar", "[gpu.backend]\nx = 1\n", `bad.toml:1: gpu.backend: `},
		{"string for list", "[runtime]\nnext = \"runc\"\n", `bad.toml:2: runtime.next: `},
		{"int out of range", "[device_plugin]\nsplit_count = 99999999999999999999\n", "bad.toml:2:"},
		{"bad memory in first of two", strings.Replace(simulatedDoc, `"40GiB"`, `"40XB"`, 1), `bad.toml:7: gpu.simulated[0].memory: invalid byte quantity "40XB": unknown unit "XB"`},
		{"bad memory in second of two", strings.Replace(simulatedDoc, `"80GiB"`, `"80G"`, 1), `bad.toml:13: gpu.simulated[1].memory: invalid byte quantity "80G": ambiguous unit "G"`},
		{"float memory", strings.Replace(simulatedDoc, `"80GiB"`, `8.5e10`, 1), `bad.toml:13: gpu.simulated[1].memory: want an integer number of bytes or a quantity string such as "16GiB", not a float`},
		{"negative memory", strings.Replace(simulatedDoc, `"40GiB"`, `-1`, 1), `bad.toml:7: gpu.simulated[0].memory: negative byte count -1`},
		{"string for bool", strings.Replace(simulatedDoc, "minor = 1", "minor = 1\nhealthy = \"yes\"", 1), `bad.toml:15: gpu.simulated[1].healthy: incompatible types`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("bad.toml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n%v\nwant it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "toml: line") {
				t.Errorf("error repeats the library's location: %v", err)
			}
		})
	}
}

// All problems come back at once, in file order within each pass.
func TestParseCollectsAllProblems(t *testing.T) {
	t.Run("decode", func(t *testing.T) {
		doc := "[device_plugin]\nsplitcount = 4\nsplit_count = \"x\"\n[nri]\nplugin_index = 10\nbogus = true\n"
		_, err := Parse("many.toml", []byte(doc))
		want := []string{
			`many.toml:2: unknown key "device_plugin.splitcount"`,
			`many.toml:3: device_plugin.split_count: incompatible types`,
			`many.toml:5: nri.plugin_index: incompatible types`,
			`many.toml:6: unknown key "nri.bogus"`,
		}
		checkLines(t, err, want)
	})
	t.Run("validate", func(t *testing.T) {
		doc := "[device_plugin]\nsplit_count = 0\nmemory_scaling = 0.0\n[gpu]\nbackend = \"x\"\n[nri]\nplugin_index = \"1\"\n"
		_, err := Parse("many.toml", []byte(doc))
		want := []string{
			`many.toml:2: device_plugin.split_count: `,
			`many.toml:3: device_plugin.memory_scaling: `,
			`many.toml:5: gpu.backend: `,
			`many.toml:7: nri.plugin_index: `,
		}
		checkLines(t, err, want)
	})
}

func checkLines(t *testing.T, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

func TestSyntaxError(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"unterminated array", "[runtime]\nnext = [\"runc\",\n", "syntax.toml:2:16: invalid TOML: unexpected EOF"},
		{"missing value", "[nri]\nplugin_index =\n", "syntax.toml:2:15: invalid TOML: "},
		{"duplicate key", "[nri]\nplugin_index = \"10\"\nplugin_index = \"11\"\n", "syntax.toml:3:"},
		{"bad header", "[device_plugin\nsplit_count = 1\n", "syntax.toml:2:15: invalid TOML: expected '.' or ']' to end table name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("syntax.toml", []byte(tt.doc))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("error = %v, want prefix %q", err, tt.want)
			}
		})
	}
}

func TestValidateInCode(t *testing.T) {
	cfg := Default()
	cfg.DevicePlugin.SplitCount = 0
	cfg.Runtime.Next = nil
	err := cfg.Validate()
	checkLines(t, err, []string{
		"config: device_plugin.split_count: must be from 1 to 1024, not 0",
		"config: runtime.next: is empty",
	})
	cfg.Source = "/etc/nri-vgpu/config.toml"
	checkLines(t, cfg.Validate(), []string{
		"/etc/nri-vgpu/config.toml: device_plugin.split_count: ",
		"/etc/nri-vgpu/config.toml: runtime.next: ",
	})
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestResolve(t *testing.T) {
	t.Setenv(EnvPath, "")
	if path, origin := resolve(""); path != "/etc/nri-vgpu/config.toml" || origin != "" {
		t.Errorf("resolve(\"\") without env = %q, %q; want the default path, no origin", path, origin)
	}
	t.Setenv(EnvPath, "/env/config.toml")
	if path, origin := resolve(""); path != "/env/config.toml" || origin != "$NRI_VGPU_CONFIG" {
		t.Errorf("resolve(\"\") with env = %q, %q; want the env path from $NRI_VGPU_CONFIG", path, origin)
	}
	if path, origin := resolve("/flag/config.toml"); path != "/flag/config.toml" || origin != "--config" {
		t.Errorf("resolve(flag) with env = %q, %q; want the flag path from --config", path, origin)
	}
}

func TestLoadResolved(t *testing.T) {
	dir := t.TempDir()
	flagFile := writeFile(t, dir, "flag.toml", "[device_plugin]\nsplit_count = 3\n")
	envFile := writeFile(t, dir, "env.toml", "[device_plugin]\nsplit_count = 5\n")
	missing := filepath.Join(dir, "missing.toml")

	t.Run("flag wins over env", func(t *testing.T) {
		t.Setenv(EnvPath, envFile)
		cfg, err := LoadResolved(flagFile)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Source != flagFile || cfg.DevicePlugin.SplitCount != 3 {
			t.Fatalf("got Source %q split_count %d; want %q and 3", cfg.Source, cfg.DevicePlugin.SplitCount, flagFile)
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv(EnvPath, envFile)
		cfg, err := LoadResolved("")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Source != envFile || cfg.DevicePlugin.SplitCount != 5 {
			t.Fatalf("got Source %q split_count %d; want %q and 5", cfg.Source, cfg.DevicePlugin.SplitCount, envFile)
		}
	})
	t.Run("missing flag file", func(t *testing.T) {
		t.Setenv(EnvPath, envFile)
		_, err := LoadResolved(missing)
		if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--config") ||
			!errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error = %v; want a not-exist error naming %s and --config", err, missing)
		}
	})
	t.Run("missing env file", func(t *testing.T) {
		t.Setenv(EnvPath, missing)
		_, err := LoadResolved("")
		if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "$"+EnvPath) {
			t.Fatalf("error = %v; want an error naming %s and $%s", err, missing, EnvPath)
		}
	})
	t.Run("invalid file", func(t *testing.T) {
		bad := writeFile(t, dir, "bad.toml", "[nri]\nplugin_index = \"x\"\n")
		_, err := LoadResolved(bad)
		if err == nil || !strings.Contains(err.Error(), bad+":2: nri.plugin_index") {
			t.Fatalf("error = %v; want it to name %s:2", err, bad)
		}
	})
	t.Run("default path", func(t *testing.T) {
		t.Setenv(EnvPath, "")
		cfg, err := LoadResolved("")
		if _, statErr := os.Stat(DefaultPath); statErr == nil {
			// A machine with nri-vgpu installed: the real file is read.
			if err != nil || cfg.Source != DefaultPath {
				t.Fatalf("LoadResolved with %s present: %+v, %v", DefaultPath, cfg, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("LoadResolved without %s: %v", DefaultPath, err)
		}
		if !reflect.DeepEqual(cfg, Default()) || cfg.Source != "" {
			t.Fatalf("LoadResolved without %s = %+v, want Default() with empty Source", DefaultPath, cfg)
		}
	})
}

func TestLoad(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.toml") {
		t.Fatalf("Load(missing) error = %v; want a not-exist error naming the file", err)
	}
	_, err = Load(t.TempDir())
	if err == nil {
		t.Fatal("Load(directory) succeeded")
	}
}

func TestScalingBoundaries(t *testing.T) {
	for _, v := range []float64{math.SmallestNonzeroFloat64, 0.5, 1, 10} {
		cfg := Default()
		cfg.DevicePlugin.MemoryScaling = v
		cfg.DevicePlugin.CoresScaling = v
		if err := cfg.Validate(); err != nil {
			t.Errorf("scaling %g: %v", v, err)
		}
	}
}

// TestSimulatedMemorySplitBoundary: the smallest-slice check uses the same
// exact arithmetic as the device plugin, so a GPU whose slices come to exactly
// 1MiB is accepted even where floating point falls just short of it, and one
// byte less is not.
func TestSimulatedMemorySplitBoundary(t *testing.T) {
	doc := func(memory string) string {
		return "[device_plugin]\nsplit_count = 63\nmemory_scaling = 0.7\n" +
			"[gpu]\nbackend = \"simulated\"\n" +
			"[[gpu.simulated]]\nuuid = \"GPU-1\"\nname = \"x\"\nmemory = " + memory + "\n"
	}
	// 0.7 × 90MiB = 63MiB: exactly 1MiB per slice.
	if _, err := Parse("ok.toml", []byte(doc(`"90MiB"`))); err != nil {
		t.Errorf("90MiB in 63 slices at 0.7: %v", err)
	}
	_, err := Parse("small.toml", []byte(doc(strconv.Itoa(90<<20-2))))
	if err == nil || !strings.Contains(err.Error(), "leaves less than 1MiB per slice") {
		t.Errorf("90MiB-2B in 63 slices at 0.7: %v, want less than 1MiB per slice", err)
	}
}

// An exemption matches a pod only when every key it sets matches; one that
// sets none (refused by Validate) matches nothing.
func TestExemptionFor(t *testing.T) {
	nri := NRI{Exempt: []Exemption{
		{Namespace: "gpu-operator"},
		{Namespace: "monitoring", RuntimeHandler: "nvidia"},
		{RuntimeHandler: "nvidia-exporter"},
		{},
	}}
	tests := []struct {
		namespace, handler string
		want               int // index into nri.Exempt; -1: not exempt
	}{
		{"gpu-operator", "", 0},
		{"gpu-operator", "nvidia", 0},
		{"gpu-operator-tenant", "", -1},
		{"monitoring", "nvidia", 1},
		{"monitoring", "", -1},
		{"monitoring", "runc", -1},
		{"default", "nvidia", -1},
		{"default", "nvidia-exporter", 2},
		{"default", "", -1},
		{"", "", -1},
	}
	for _, tt := range tests {
		got, ok := nri.ExemptionFor(tt.namespace, tt.handler)
		switch {
		case tt.want < 0 && ok:
			t.Errorf("ExemptionFor(%q, %q) = %+v, want none", tt.namespace, tt.handler, got)
		case tt.want >= 0 && (!ok || got != nri.Exempt[tt.want]):
			t.Errorf("ExemptionFor(%q, %q) = %+v, %v; want %+v", tt.namespace, tt.handler, got, ok, nri.Exempt[tt.want])
		}
	}
}
