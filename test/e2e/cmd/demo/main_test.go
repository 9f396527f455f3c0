package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// TestConfigIsValid: the demo's config is one the binaries accept, with the
// split the story tells (4 slices of the A100, 8 of the H100, 10 GiB each).
func TestConfigIsValid(t *testing.T) {
	n := newNode("/tmp/nri-vgpu-e2e-demo-x", "/tmp/logs")
	cfg, err := config.Parse("demo.toml", []byte(n.configTOML("/opt/libvgpu-shim.so")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GPU.Backend != config.BackendSimulated || len(cfg.GPU.Simulated) != len(demoGPUs) {
		t.Fatalf("gpu = %+v", cfg.GPU)
	}
	if cfg.DevicePlugin.SocketDir != n.kubeletDir || cfg.Paths.RunDir != n.runDir || cfg.Paths.StateDir != n.stateDir ||
		cfg.Driver.DevRoot != n.devRoot || cfg.NRI.SocketPath != n.nriSocket || cfg.Paths.ShimPath != "/opt/libvgpu-shim.so" {
		t.Errorf("paths not taken from the node: %+v %+v %+v %+v", cfg.DevicePlugin, cfg.Paths, cfg.Driver, cfg.NRI)
	}
	for _, tt := range []struct {
		gpu   simGPU
		split int
	}{{demoGPUs[0], 4}, {demoGPUs[1], 8}} {
		split := cfg.DevicePlugin.SplitCountFor(tt.gpu.Name)
		s := limits.SliceSize(tt.gpu.Memory, split, cfg.DevicePlugin.MemoryScaling, cfg.DevicePlugin.CoresScaling)
		if split != tt.split || s.Memory != 10<<30 {
			t.Errorf("%s: %d slices of %s, want %d of 10GiB", tt.gpu.Name, split, quantity.FormatBytes(s.Memory), tt.split)
		}
	}
}

func TestParseDeviceNodes(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		wantErr  bool
	}{
		{"none", "", nil, false},
		{"hex majors and minors", "/dev/nvidia0 c3 0\n/dev/nvidiactl c3 ff\n/dev/nvidia-uvm 1ff 1\n",
			[]string{"/dev/nvidia0 (195:0)", "/dev/nvidiactl (195:255)", "/dev/nvidia-uvm (511:1)"}, false},
		{"short line", "/dev/nvidia0 c3\n", nil, true},
		{"not hex", "/dev/nvidia0 zz 0\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDeviceNodes(tt.in)
			if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
				t.Errorf("parseDeviceNodes(%q) = %v, %v; want %v (error %v)", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestCompactIDs(t *testing.T) {
	a, b := demoGPUs[0].UUID, demoGPUs[1].UUID
	tests := []struct {
		ids  []string
		want string
	}{
		{[]string{a + "::0", a + "::1"}, a + "::0 ::1"},
		{[]string{a + "::3", b + "::0", b + "::5"}, a + "::3 " + b + "::0 ::5"},
		{[]string{"other", a + "::2"}, "other " + a + "::2"},
	}
	for _, tt := range tests {
		if got := compactIDs(tt.ids); got != tt.want {
			t.Errorf("compactIDs(%v) = %q, want %q", tt.ids, got, tt.want)
		}
	}
}

// TestRenderCudaprog: results are taken from cudaprog's lines in order, the
// checked return codes from the script.
func TestRenderCudaprog(t *testing.T) {
	steps := []cudaStep{
		{op: "init", label: "cuInit", result: "CUDA_SUCCESS"},
		{op: "info:8GiB:8GiB", label: "cuMemGetInfo", note: "the slice"},
		{op: "nvml:0:8GiB", label: "nvml"},
		{op: "alloc:16GiB:2", label: "cuMemAlloc", result: "CUDA_ERROR_OUT_OF_MEMORY", note: "refused"},
		{op: "info:0:8GiB", label: "cuMemGetInfo"},
	}
	stdout := "info free=8589934592 total=8589934592\n" +
		"nvml total=8589934592 used=0 free=8589934592\n" +
		"nvml_v2 total=8589934592 used=0 free=8589934592 reserved=0\n" +
		"info free=0 total=8589934592\nok\n"
	got, err := renderCudaprog(steps, stdout)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"cuInit\tCUDA_SUCCESS",
		"cuMemGetInfo\tfree 8GiB of 8GiB\tthe slice",
		"nvml\tused 0 of 8GiB",
		"cuMemAlloc\tCUDA_ERROR_OUT_OF_MEMORY\trefused",
		"cuMemGetInfo\tfree 0 of 8GiB",
	}
	if !slices.Equal(got, want) {
		t.Errorf("renderCudaprog =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := renderCudaprog(steps, "info free=1 total=1\nok\n"); err == nil || !strings.Contains(err.Error(), `no "nvml" line`) {
		t.Errorf("output missing a line: error = %v", err)
	}
}

func TestFakeDriverEnv(t *testing.T) {
	a := &allocation.Allocation{GPUs: []allocation.GPU{{UUID: demoGPUs[1].UUID}, {UUID: demoGPUs[0].UUID}}}
	want := "FAKECUDA_DEVICES=" + demoGPUs[1].UUID + ":81920MiB:132," + demoGPUs[0].UUID + ":40960MiB:108 FAKECUDA_STATE=/tmp"
	if got := fakeDriverEnv(a); got != want {
		t.Errorf("fakeDriverEnv = %q, want %q", got, want)
	}
}
