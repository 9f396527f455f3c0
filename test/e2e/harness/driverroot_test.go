package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
)

// needMknod skips a test that makes device nodes where it cannot.
func needMknod(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making device nodes needs root (CAP_MKNOD)")
	}
}

// TestMakeFakeDriverRoot checks the layout a driver install has: the
// versioned files, the links a loader and NVIDIA's tools look for, and the
// device nodes with each GPU's minor.
func TestMakeFakeDriverRoot(t *testing.T) {
	needMknod(t)
	build := t.TempDir()
	if err := os.MkdirAll(filepath.Join(build, "fake"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
		if err := os.WriteFile(filepath.Join(build, "fake", lib), []byte("contents of "+lib), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	r := FakeDriverRoot{LibDir: "/usr/local/nvidia/lib64", Version: "580.159.04", ShimBuild: build, GPUs: []FakeGPU{
		{UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA H200", Memory: 150 << 30, SMs: 132, Minor: 0},
		{UUID: "GPU-66666666-7777-8888-9999-000000000000", Name: "NVIDIA H200", Memory: 150 << 30, SMs: 132, Minor: 5},
	}}
	if err := MakeFakeDriverRoot(root, r); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, "usr/local/nvidia/lib64")
	for file, want := range map[string]string{
		"libcuda.so.580.159.04":      "contents of libcuda.so.1",
		"libnvidia-ml.so.580.159.04": "contents of libnvidia-ml.so.1",
	} {
		fi, err := os.Lstat(filepath.Join(lib, file))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: %v, want a regular file", file, err)
		}
		if b, _ := os.ReadFile(filepath.Join(lib, file)); string(b) != want {
			t.Errorf("%s holds %q, want %q", file, b, want)
		}
	}
	for link, want := range map[string]string{
		"libcuda.so.1":      "libcuda.so.580.159.04",
		"libcuda.so":        "libcuda.so.1",
		"libnvidia-ml.so.1": "libnvidia-ml.so.580.159.04",
	} {
		got, err := os.Readlink(filepath.Join(lib, link))
		if err != nil || got != want {
			t.Errorf("%s -> %q (%v), want -> %q", link, got, err, want)
		}
	}
	for node, want := range map[string][2]uint32{
		"nvidiactl": {195, 255}, "nvidia0": {195, 0}, "nvidia5": {195, 5}, "nvidia-uvm": {FakeUVMMajor, 0},
	} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, "dev", node), &st); err != nil {
			t.Errorf("/dev/%s: %v", node, err)
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != want[0] || unix.Minor(st.Rdev) != want[1] {
			t.Errorf("/dev/%s: mode %o %d:%d, want a character device %d:%d", node, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), want[0], want[1])
		}
	}
	if _, err := os.Stat(filepath.Join(root, "dev", "nvidia1")); err == nil {
		t.Error("/dev/nvidia1 exists, but no GPU has minor 1")
	}

	wantEnv := []string{
		"FAKECUDA_DEVICES=GPU-11111111-2222-3333-4444-555555555555:161061273600:132:NVIDIA H200:0," +
			"GPU-66666666-7777-8888-9999-000000000000:161061273600:132:NVIDIA H200:5",
		"FAKECUDA_DRIVER_VERSION=580.159.04",
	}
	if got := r.Env(); strings.Join(got, "\n") != strings.Join(wantEnv, "\n") {
		t.Errorf("Env() = %q, want %q", got, wantEnv)
	}
}

func TestMakeFakeDriverRootRefuses(t *testing.T) {
	good := FakeGPU{UUID: "GPU-1", Name: "NVIDIA H200", Memory: 1 << 30, SMs: 1}
	for _, tt := range []struct {
		name string
		r    FakeDriverRoot
		want string
	}{
		{"relative lib dir", FakeDriverRoot{LibDir: "lib64", Version: "1", GPUs: []FakeGPU{good}}, `LibDir "lib64"`},
		{"no version", FakeDriverRoot{LibDir: "/l", GPUs: []FakeGPU{good}}, `bad driver version ""`},
		{"no GPU", FakeDriverRoot{LibDir: "/l", Version: "1"}, "0 GPUs"},
		{"colon in name", FakeDriverRoot{LibDir: "/l", Version: "1", GPUs: []FakeGPU{{UUID: "GPU-1", Name: "a:b", Memory: 1, SMs: 1}}}, `name "a:b"`},
		{"minor of nvidiactl", FakeDriverRoot{LibDir: "/l", Version: "1", GPUs: []FakeGPU{{UUID: "GPU-1", Name: "n", Memory: 1, SMs: 1, Minor: 255}}}, "minor 255"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			err := MakeFakeDriverRoot(root, tt.r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("MakeFakeDriverRoot = %v, want an error holding %q", err, tt.want)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 0 {
				t.Errorf("left %d entries in the root after refusing", len(ents))
			}
		})
	}
}

// TestFakeNVMLThroughGoNVML loads the fake NVML of a fake driver root with
// NVIDIA's Go bindings, as the device plugin and the CDI library do, and
// checks what they read against the GPUs configured here. The fake keeps
// its GPUs for the life of the process: this is the only test of this
// package that initializes it.
func TestFakeNVMLThroughGoNVML(t *testing.T) {
	needMknod(t)
	build := t.TempDir()
	if err := BuildFakeDriver("../../../shim", build); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	r := FakeDriverRoot{LibDir: "/usr/local/nvidia/lib64", Version: "580.159.04", ShimBuild: build, GPUs: []FakeGPU{
		{UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA H200", Memory: 150 << 30, SMs: 132, Minor: 0},
		{UUID: "GPU-66666666-7777-8888-9999-000000000000", Name: "NVIDIA H100 80GB HBM3", Memory: 80 << 30, SMs: 132, Minor: 5},
	}}
	if err := MakeFakeDriverRoot(root, r); err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	xid := filepath.Join(t.TempDir(), "xid")
	t.Setenv("FAKECUDA_XID", xid)

	lib := nvml.New(nvml.WithLibraryPath(filepath.Join(root, "usr/local/nvidia/lib64/libnvidia-ml.so.1")))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	defer lib.Shutdown()

	if v, ret := lib.SystemGetDriverVersion(); ret != nvml.SUCCESS || v != "580.159.04" {
		t.Errorf("SystemGetDriverVersion = %q, %v; want 580.159.04", v, ret)
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS || v != 12080 {
		t.Errorf("SystemGetCudaDriverVersion = %d, %v; want 12080 (the fake driver's default)", v, ret)
	}
	if n, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS || n != 2 {
		t.Fatalf("DeviceGetCount = %d, %v; want 2", n, ret)
	}
	want := []struct {
		uuid, name, busID string
		memory            uint64
		minor             int
	}{
		{"GPU-11111111-2222-3333-4444-555555555555", "NVIDIA H200", "00000000:10:00.0", 161061273600, 0},
		{"GPU-66666666-7777-8888-9999-000000000000", "NVIDIA H100 80GB HBM3", "00000000:11:00.0", 85899345920, 5},
	}
	devs := make([]nvml.Device, len(want))
	for i, w := range want {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
		devs[i] = d
		if got, ret := d.GetUUID(); got != w.uuid || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: UUID %q, %v; want %q", i, got, ret, w.uuid)
		}
		if got, ret := d.GetName(); got != w.name || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: name %q, %v; want %q", i, got, ret, w.name)
		}
		if got, ret := d.GetMemoryInfo(); got.Total != w.memory || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: memory %d, %v; want %d", i, got.Total, ret, w.memory)
		}
		if got, ret := d.GetMinorNumber(); got != w.minor || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: minor %d, %v; want %d", i, got, ret, w.minor)
		}
		if got, ret := d.GetIndex(); got != i || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: index %d, %v", i, got, ret)
		}
		pci, ret := d.GetPciInfo()
		busID := string(bytesUntilNUL(pci.BusId[:]))
		if ret != nvml.SUCCESS || busID != w.busID || pci.Bus != uint32(0x10+i) || pci.Domain != 0 {
			t.Errorf("GPU %d: PCI %q bus %#x domain %d, %v; want %s", i, busID, pci.Bus, pci.Domain, ret, w.busID)
		}
		if h, ret := lib.DeviceGetHandleByPciBusId(strings.TrimPrefix(w.busID, "0000")); ret != nvml.SUCCESS {
			t.Errorf("DeviceGetHandleByPciBusId(%s): %v", w.busID, ret)
		} else if u, _ := h.GetUUID(); u != w.uuid {
			t.Errorf("DeviceGetHandleByPciBusId(%s) is %s, want %s", w.busID, u, w.uuid)
		}
		if _, _, ret := d.GetMigMode(); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GPU %d: GetMigMode = %v, want NOT_SUPPORTED", i, ret)
		}
		if isMig, ret := d.IsMigDeviceHandle(); isMig || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: IsMigDeviceHandle = %v, %v", i, isMig, ret)
		}
		if major, minor, ret := d.GetCudaComputeCapability(); major != 9 || minor != 0 || ret != nvml.SUCCESS {
			t.Errorf("GPU %d: compute capability %d.%d, %v; want 9.0", i, major, minor, ret)
		}
	}
	if _, ret := lib.DeviceGetHandleByPciBusId("00000000:12:00.0"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("a bus id no GPU has: %v, want NOT_FOUND", ret)
	}

	// Events: registration within the supported types, the timeout, and an
	// XID written while the set waits.
	if got, ret := devs[0].GetSupportedEventTypes(); got != 0xf || ret != nvml.SUCCESS {
		t.Errorf("GetSupportedEventTypes = %#x, %v; want 0xf", got, ret)
	}
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	defer set.Free()
	if ret := devs[1].RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set); ret != nvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	if ret := devs[0].RegisterEvents(nvml.EventMigConfigChange, set); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("RegisterEvents of an unsupported type: %v, want NOT_SUPPORTED", ret)
	}
	start := time.Now()
	if _, ret := set.Wait(100); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait with nothing pending: %v, want TIMEOUT", ret)
	}
	if el := time.Since(start); el < 90*time.Millisecond {
		t.Errorf("Wait(100 ms) returned after %v", el)
	}
	// An XID on the GPU that registered for none is not this set's.
	if err := os.WriteFile(xid, []byte("GPU-11111111-2222-3333-4444-555555555555:79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ret := set.Wait(50); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("Wait after an XID on an unregistered GPU: %v, want TIMEOUT", ret)
	}
	if err := os.WriteFile(xid, []byte("GPU-66666666-7777-8888-9999-000000000000:48\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, ret := set.Wait(1000)
	if ret != nvml.SUCCESS {
		t.Fatalf("Wait after an XID: %v", ret)
	}
	if u, _ := ev.Device.GetUUID(); u != "GPU-66666666-7777-8888-9999-000000000000" || ev.EventType != nvml.EventTypeXidCriticalError || ev.EventData != 48 {
		t.Errorf("event on %s type %#x data %d, want XID 48 on GPU-66666666-...", u, ev.EventType, ev.EventData)
	}
	if _, ret := set.Wait(50); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("the same XID came twice: %v", ret)
	}
}

func bytesUntilNUL[T int8 | uint8](b []T) []byte {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return out
}
