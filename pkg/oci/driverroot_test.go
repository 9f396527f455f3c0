package oci

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

// operatorDriverRoot is where the GPU Operator's driver container puts the
// driver, its device nodes included.
const operatorDriverRoot = "/run/nvidia/driver"

// underDriverRoot is ocitest.StandardNodes where the GPU Operator's driver
// container has them: beneath its root, none in the host's /dev.
func underDriverRoot() []ocitest.Node {
	nodes := slices.Clone(ocitest.StandardNodes)
	for i := range nodes {
		nodes[i].Path = strings.TrimPrefix(operatorDriverRoot, "/") + "/" + nodes[i].Path
	}
	return nodes
}

// newDriverRootEnv is newEnv on the GPU Operator's layout, with the CDI spec
// nvidia-ctk writes there and driver.driver_root set.
func newDriverRootEnv(t *testing.T, driverRoot string) env {
	t.Helper()
	e := newEnv(t, config.InjectionCDI, false, underDriverRoot())
	data, err := os.ReadFile("testdata/nvidia-driver-root.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.cfg.Driver.CDIDirs[0], "nvidia.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.cfg.Driver.DriverRoot = driverRoot
	e.host = NewHost(e.cfg, false)
	e.host.ProcDevices = filepath.Join(e.root, "proc-devices")
	return e
}

// A spec generated with --driver-root=/run/nvidia/driver gives a container
// the nodes and files of its GPU at their usual paths, from beneath the
// driver root; the control nodes nri-vgpu adds itself come from there too.
func TestComputeCDIDriverRoot(t *testing.T) {
	e := newDriverRootEnv(t, operatorDriverRoot)
	edits, err := Compute(gpus(gpu1), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int64{
		"/dev/nvidiactl":      {195, 255},
		"/dev/nvidia-uvm":     {ocitest.UVMMajor, 0},
		"/dev/nvidia1":        {195, 1},
		"/dev/dri/card2":      {226, 2},
		"/dev/nvidia-modeset": {195, 254},
	}
	got := map[string][2]int64{}
	for _, d := range edits.Devices {
		got[d.Path] = [2]int64{d.Major, d.Minor}
	}
	for path, mm := range want {
		if got[path] != mm {
			t.Errorf("device %s = %v, want %d:%d (devices %v)", path, got[path], mm[0], mm[1], got)
		}
	}
	for path := range got {
		if path == "/dev/nvidia0" || strings.HasPrefix(path, operatorDriverRoot) {
			t.Errorf("device at %s in the container (devices %v)", path, got)
		}
	}
	if !slices.ContainsFunc(edits.DeviceRules, func(r specs.LinuxDeviceCgroup) bool {
		return r.Allow && r.Major != nil && *r.Major == 195 && r.Minor != nil && *r.Minor == 1
	}) {
		t.Errorf("no allow rule for 195:1 in %+v", edits.DeviceRules)
	}
	for _, lib := range []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/usr/bin/nvidia-smi"} {
		m, ok := findMount(edits.Mounts, lib)
		if !ok || m.Source != operatorDriverRoot+lib {
			t.Errorf("mount at %s = %+v, want one from %s", lib, m, operatorDriverRoot+lib)
		}
	}
	if v, _ := envValue(edits.Env, "NVIDIA_CTK_LIBCUDA_DIR"); v != "/usr/lib/x86_64-linux-gnu" {
		t.Errorf("NVIDIA_CTK_LIBCUDA_DIR = %q, want the spec's", v)
	}
}

// Left at "/", driver_root sends the lookup of the control nodes to the
// host's /dev, where the driver container made none: the container is
// refused with the node named, never started without it.
func TestComputeDriverRootUnset(t *testing.T) {
	e := newDriverRootEnv(t, "/")
	_, err := Compute(gpus(gpu1), e.cfg, e.host, testFiles)
	if err == nil || !strings.Contains(err.Error(), "device node /dev/nvidiactl") {
		t.Fatalf("Compute error = %v, want one naming /dev/nvidiactl", err)
	}
}

// Hiding finds the driver container's nodes too, and names them by their
// path in containers.
func TestHideDriverRoot(t *testing.T) {
	e := newDriverRootEnv(t, operatorDriverRoot)
	edits, err := Hide(e.host, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantNodes := []string{"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"}
	if !slices.Equal(edits.RemoveDevices, wantNodes) {
		t.Errorf("RemoveDevices = %v, want %v", edits.RemoveDevices, wantNodes)
	}
	var majors []int64
	for _, r := range edits.DeviceRules {
		if r.Minor == nil {
			majors = append(majors, *r.Major)
		}
	}
	if want := []int64{195, 510, ocitest.UVMMajor}; !slices.Equal(majors, want) {
		t.Errorf("denied majors = %v, want %v", majors, want)
	}
}
