package deviceplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	fakedriver "github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// mockGPU is one GPU of the go-nvml mock behind the inventory.
type mockGPU struct {
	uuid, name, busID string
	memory            uint64
	minor             int
	events            uint64 // supported event types
}

// useMockNVML makes the inventory's backend an NVML backend on a go-nvml
// mock of gpus, for the rest of the test.
func useMockNVML(t *testing.T, gpus []mockGPU, countRet nvml.Return) {
	t.Helper()
	devs := make([]nvml.Device, len(gpus))
	for i, g := range gpus {
		devs[i] = &mock.Device{
			GetUUIDFunc:    func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS },
			GetMigModeFunc: func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED },
			GetNameFunc:    func() (string, nvml.Return) { return g.name, nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: g.memory, Free: g.memory}, nvml.SUCCESS
			},
			GetMinorNumberFunc: func() (int, nvml.Return) { return g.minor, nvml.SUCCESS },
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
				var p nvml.PciInfo
				for j, c := range []byte(g.busID) {
					p.BusId[j] = int8(c) // []int8 since go-nvml v0.13.4
				}
				return p, nvml.SUCCESS
			},
			GetSupportedEventTypesFunc: func() (uint64, nvml.Return) { return g.events, nvml.SUCCESS },
			RegisterEventsFunc:         func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS },
			GetArchitectureFunc: func() (nvml.DeviceArchitecture, nvml.Return) {
				return nvml.DEVICE_ARCH_HOPPER, nvml.SUCCESS
			},
			GetBrandFunc:                 func() (nvml.BrandType, nvml.Return) { return nvml.BRAND_NVIDIA, nvml.SUCCESS },
			GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS },
		}
	}
	lib := &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 12040, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), countRet },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return devs[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return &mock.EventSet{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
		},
	}
	prev := newBackend
	newBackend = func(*config.Config) (gpu.Backend, error) { return gpu.NewNVML(lib), nil }
	t.Cleanup(func() { newBackend = prev })
}

// The exact output: another program (gpu-check) parses it.
func TestInventoryNVMLMock(t *testing.T) {
	useMockNVML(t, []mockGPU{
		{"GPU-0a000000-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:1B:00.0", 150 << 30, 3,
			nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypePState},
		{"GPU-0b000000-0000-0000-0000-000000000000", "NVIDIA H200", "00000000:2C:00.0", 140 << 30, 0,
			nvml.EventTypeXidCriticalError},
	}, nvml.SUCCESS)
	var stdout, stderr bytes.Buffer
	if code := Main(t.Context(), []string{"inventory", "--config", filepath.Join(t.TempDir(), "absent.toml")}, &stdout, &stderr, nil); code != 1 {
		t.Fatalf("a missing --config file: exit %d, want 1; stderr:\n%s", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	t.Setenv(config.EnvPath, "")
	path := filepath.Join(t.TempDir(), "config.toml")
	writeConfig(t, path, "[gpu]\nbackend = \"nvml\"\n")
	if code := Main(t.Context(), []string{"inventory", "-config", path}, &stdout, &stderr, nil); code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, stderr.String())
	}
	want := `[
  {
    "index": 0,
    "uuid": "GPU-0a000000-0000-0000-0000-000000000000",
    "name": "NVIDIA H200",
    "memory_bytes": 161061273600,
    "minor": 3,
    "pci_bus_id": "0000:1b:00.0",
    "healthy": true,
    "health_events": {
      "accepted": [
        "xid_critical_error",
        "double_bit_ecc_error"
      ],
      "unsupported": []
    }
  },
  {
    "index": 1,
    "uuid": "GPU-0b000000-0000-0000-0000-000000000000",
    "name": "NVIDIA H200",
    "memory_bytes": 150323855360,
    "minor": 0,
    "pci_bus_id": "0000:2c:00.0",
    "healthy": true,
    "health_events": {
      "accepted": [
        "xid_critical_error"
      ],
      "unsupported": [
        "double_bit_ecc_error"
      ]
    }
  }
]
`
	if stdout.String() != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", stdout.String(), want)
	}
}

func TestInventoryErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	writeConfig(t, path, "[gpu]\nbackend = \"nvml\"\n")
	for _, tt := range []struct {
		name string
		args []string
		code int
		say  string
	}{
		{"stray argument", []string{"inventory", "-config", path, "now"}, 2, `unexpected arguments ["now"]`},
		{"NVML fails", []string{"inventory", "-config", path}, 1, `msg="cannot list the GPUs" backend=nvml err="NVML: counting GPUs: ERROR_UNKNOWN"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			useMockNVML(t, nil, nvml.ERROR_UNKNOWN)
			var stdout, stderr bytes.Buffer
			if code := Main(t.Context(), tt.args, &stdout, &stderr, nil); code != tt.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tt.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.say) {
				t.Errorf("stderr does not say %q:\n%s", tt.say, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}

func TestInventorySimulated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	writeConfig(t, path, `[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-aaaa"
name = "Sim"
memory = "16GiB"
minor = 4
pci_bus_id = "0000:3a:00.0"
healthy = false
[[gpu.simulated]]
uuid = "GPU-bbbb"
name = "Sim"
memory = "16GiB"
minor = 5
mig = true
`)
	var stdout, stderr bytes.Buffer
	if code := Main(t.Context(), []string{"inventory", "-config", path}, &stdout, &stderr, nil); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	var got []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	want := []map[string]any{{"index": 0.0, "uuid": "GPU-aaaa", "name": "Sim", "memory_bytes": 17179869184.0,
		"minor": 4.0, "pci_bus_id": "0000:3a:00.0", "healthy": false},
		// The GPU in MIG mode is listed, saying it is served elsewhere.
		{"index": 1.0, "uuid": "GPU-bbbb", "name": "Sim", "memory_bytes": 17179869184.0,
			"minor": 5.0, "pci_bus_id": "0000:06:00.0", "healthy": true, "served_elsewhere": "MIG mode"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("inventory %v, want %v", got, want)
	}
}

// fakeDriverNode lays out a fake driver root with gpus, its NVML in
// /usr/local/nvidia/lib64 (which the loader does not know), and returns
// that directory and the environment of a child process (the test binary
// as the program, see TestMain) that sees exactly those GPUs: the fake NVML
// keeps its GPUs for a process's life, so each run is a child.
func fakeDriverNode(t *testing.T, gpus []fakedriver.FakeGPU) (libDir string, env []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making the driver root's device nodes needs root")
	}
	if out, _ := exec.Command("ldconfig", "-p").Output(); strings.Contains(string(out), "libnvidia-ml.so.1") {
		t.Skip("this machine's loader finds a real libnvidia-ml.so.1, which would come first")
	}
	build := t.TempDir()
	if err := fakedriver.BuildFakeDriver("../../shim", build); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	r := fakedriver.FakeDriverRoot{LibDir: "/usr/local/nvidia/lib64", Version: "580.159.04", ShimBuild: build, GPUs: gpus}
	if err := fakedriver.MakeFakeDriverRoot(root, r); err != nil {
		t.Fatal(err)
	}
	env = append([]string{asProgram + "=1"}, r.Env()...)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "LD_LIBRARY_PATH" && !strings.HasPrefix(k, "FAKECUDA_") && k != config.EnvPath {
			env = append(env, kv)
		}
	}
	return filepath.Join(root, "usr/local/nvidia/lib64"), env
}

// TestInventoryFakeDriverRoot runs the inventory command on a node whose
// NVML is the fake driver under its real file names in a driver root's
// library dir: only driver.library_dirs finds it.
func TestInventoryFakeDriverRoot(t *testing.T) {
	libDir, env := fakeDriverNode(t, []fakedriver.FakeGPU{
		{UUID: "GPU-5e1ec7ed-0000-4000-8000-000000000001", Name: "NVIDIA H200", Memory: 143771 << 20, SMs: 132, Minor: 2},
		{UUID: "GPU-5e1ec7ed-0000-4000-8000-000000000002", Name: "NVIDIA H200", Memory: 143771 << 20, SMs: 132, Minor: 7},
	})
	path := filepath.Join(t.TempDir(), "config.toml")
	writeConfig(t, path, fmt.Sprintf("[gpu]\nbackend = \"nvml\"\n[driver]\nlibrary_dirs = [%q]\n", libDir))

	cmd := exec.Command(os.Args[0], "inventory", "-config", path)
	// XID critical errors and P-state changes only: no ECC events.
	cmd.Env = append(env, "FAKECUDA_NVML_EVENT_TYPES=0xc")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v; stderr:\n%s", err, stderr.String())
	}
	var got []inventoryGPU
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	events := &gpu.HealthEventTypes{Accepted: []string{"xid_critical_error"}, Unsupported: []string{"double_bit_ecc_error"}}
	want := []inventoryGPU{
		{Index: 0, UUID: "GPU-5e1ec7ed-0000-4000-8000-000000000001", Name: "NVIDIA H200", MemoryBytes: 150754820096, Minor: 2,
			PCIBusID: "0000:10:00.0", Healthy: true, HealthEvents: events},
		{Index: 1, UUID: "GPU-5e1ec7ed-0000-4000-8000-000000000002", Name: "NVIDIA H200", MemoryBytes: 150754820096, Minor: 7,
			PCIBusID: "0000:11:00.0", Healthy: true, HealthEvents: events},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("inventory:\n%s\nwant %+v", stdout.String(), want)
	}
	loaded := fmt.Sprintf(`msg="loaded NVML" library=%s/libnvidia-ml.so.580.159.04 found_by=%s/libnvidia-ml.so.1`, libDir, libDir)
	if !strings.Contains(stderr.String(), loaded) {
		t.Errorf("stderr does not say %q:\n%s", loaded, stderr.String())
	}
}
