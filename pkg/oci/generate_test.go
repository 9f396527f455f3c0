package oci

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

// fakeDriverVersion is the version of the driver the tests install: the
// suffix of its versioned library files, and what the mock NVML reports.
const fakeDriverVersion = "580.159.04"

// installDriver puts driver libraries under their real names into dir
// beneath root: libX.so.<version> files and libX.so.1 links to them.
func installDriver(t *testing.T, root, dir, version string) {
	t.Helper()
	full := filepath.Join(root, dir)
	if err := os.MkdirAll(full, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"} {
		file := lib + "." + version
		if err := os.WriteFile(filepath.Join(full, file), []byte("\x7fELF "+file), 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(full, lib+".1")
		os.Remove(link)
		if err := os.Symlink(file, link); err != nil {
			t.Fatal(err)
		}
	}
}

// mockNVML is NVML with the GPUs of ocitest.StandardNodes (uuid0 at minor
// 0, uuid1 at minor 1); opens counts how often the host opened it.
type mockNVML struct {
	*mock.Interface
	opens   int
	version string
}

func newMockNVML() *mockNVML {
	m := &mockNVML{version: fakeDriverVersion}
	devices := []*mock.Device{}
	for i, uuid := range []string{uuid0, uuid1} {
		d := &mock.Device{}
		d.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		d.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		d.GetMinorNumberFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		d.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS }
		d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
		d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range []byte("00000000:1" + string(rune('0'+i)) + ":00.0") {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		devices = append(devices, d)
	}
	m.Interface = &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			return m.version, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return devices[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for _, d := range devices {
				if u, _ := d.GetUUID(); u == uuid {
					return d, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
	}
	return m
}

// newGenerateEnv is newEnv with the driver's libraries beneath the fake
// root in /usr/local/nvidia/lib64 (outside the loader's view) and NVML
// mocked; the path NVML was opened at is recorded in *opened.
func newGenerateEnv(t *testing.T, injection string) (env, *mockNVML, *string) {
	t.Helper()
	e := newEnv(t, injection, false, ocitest.StandardNodes)
	installDriver(t, e.root, "usr/local/nvidia/lib64", fakeDriverVersion)
	m := newMockNVML()
	opened := new(string)
	e.host.NewNVML = func(path string) nvml.Interface { m.opens++; *opened = path; return m }
	return e, m, opened
}

// With driver.injection = "generate", a container gets the driver's files
// as NVIDIA's CDI library lists them, from the library directory where
// they are (driver.library_dirs), its GPU's node, and NVIDIA's hooks, run
// by the pin hook's binary as nvidia-cdi-hook, before the pin hook.
func TestComputeGenerate(t *testing.T) {
	e, _, opened := newGenerateEnv(t, config.InjectionGenerate)
	edits, err := Compute(gpus(gpu1), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(e.root, "usr/local/nvidia/lib64/libnvidia-ml.so."+fakeDriverVersion); *opened != want {
		t.Errorf("NVML opened at %q, want %q", *opened, want)
	}
	// Host paths as the runtime sees them: beneath driver_root "/", not
	// beneath the dev_root this process sees the host at.
	for _, lib := range []string{"libcuda.so.", "libnvidia-ml.so.", "libnvidia-ptxjitcompiler.so."} {
		p := "/usr/local/nvidia/lib64/" + lib + fakeDriverVersion
		m, ok := findMount(edits.Mounts, p)
		if !ok || m.Source != p {
			t.Errorf("mount of %s: %+v (found %v); mounts %v", p, m, ok, edits.Mounts)
		}
	}
	paths := devicePaths(edits.Devices)
	if !slices.Contains(paths, "/dev/nvidia1") || slices.Contains(paths, "/dev/nvidia0") {
		t.Errorf("devices %v: want /dev/nvidia1 and not /dev/nvidia0", paths)
	}
	if v, _ := envValue(edits.Env, EnvVisibleDevices); v != "void" {
		t.Errorf("%s = %q, want void", EnvVisibleDevices, v)
	}
	hooks := edits.Hooks.CreateContainer
	if len(hooks) < 2 {
		t.Fatalf("createContainer hooks %+v: want NVIDIA's and the pin hook", hooks)
	}
	checkPinHook(t, hooks[len(hooks)-1])
	var commands []string
	for _, h := range hooks[:len(hooks)-1] {
		if h.Path != testFiles.Hook || len(h.Args) < 2 || h.Args[0] != "nvidia-cdi-hook" {
			t.Errorf("hook %+v: want %s run as nvidia-cdi-hook", h, testFiles.Hook)
			continue
		}
		commands = append(commands, h.Args[1])
		if h.Args[1] == "update-ldcache" && !slices.Contains(h.Args, "/usr/local/nvidia/lib64") {
			t.Errorf("update-ldcache hook %v does not add /usr/local/nvidia/lib64", h.Args)
		}
		// libcuda.so.1 itself is made by ldconfig (update-ldcache).
		if h.Args[1] == "create-symlinks" && !strings.Contains(strings.Join(h.Args, " "), "libcuda.so.1::/usr/local/nvidia/lib64/libcuda.so") {
			t.Errorf("create-symlinks hook %v does not link libcuda.so", h.Args)
		}
	}
	for _, want := range []string{"update-ldcache", "create-symlinks", "enable-cuda-compat", "disable-device-node-modification"} {
		if !slices.Contains(commands, want) {
			t.Errorf("hook commands %v: no %s", commands, want)
		}
	}
	if slices.Contains(commands, "apply-cuda-memory-limits") {
		t.Errorf("hook commands %v: apply-cuda-memory-limits is left out", commands)
	}
	if len(edits.Hooks.CreateRuntime) != 0 {
		t.Errorf("createRuntime hooks %+v, want none", edits.Hooks.CreateRuntime)
	}
	want := "generated from driver root / (NVIDIA CDI library; driver " + fakeDriverVersion + "; libraries in /usr/local/nvidia/lib64)"
	if edits.DriverFiles.Mode != config.InjectionGenerate || edits.DriverFiles.Source != want {
		t.Errorf("driver files %+v, want generate, %q", edits.DriverFiles, want)
	}
}

// The generated spec is kept while the driver stays: NVML is opened once
// for many containers, and again when the driver's libraries change.
func TestGeneratedSpecCache(t *testing.T) {
	e, m, _ := newGenerateEnv(t, config.InjectionGenerate)
	for range 3 {
		if _, err := Compute(gpus(gpu0), e.cfg, e.host, testFiles); err != nil {
			t.Fatal(err)
		}
	}
	if m.opens != 1 {
		t.Fatalf("NVML opened %d times for 3 containers, want 1", m.opens)
	}
	// Another hook binary (the Docker wrapper's) gets hooks naming it.
	other := testFiles
	other.Hook = "/usr/bin/nri-vgpu-runtime"
	edits, err := Compute(gpus(gpu0), e.cfg, e.host, other)
	if err != nil {
		t.Fatal(err)
	}
	if h := edits.Hooks.CreateContainer[0]; h.Path != other.Hook {
		t.Errorf("first hook %+v, want one run by %s", h, other.Hook)
	}
	opens := m.opens
	// The same files rewritten in place by a reinstall: new mtime.
	lib := filepath.Join(e.root, "usr/local/nvidia/lib64/libcuda.so."+fakeDriverVersion)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(lib, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := Compute(gpus(gpu0), e.cfg, e.host, other); err != nil {
		t.Fatal(err)
	}
	if m.opens != opens+1 {
		t.Errorf("NVML opened %d times after the driver changed, want %d", m.opens, opens+1)
	}
	// An upgrade: new versioned files, the links moved to them.
	const upgraded = "590.10.01"
	installDriver(t, e.root, "usr/local/nvidia/lib64", upgraded)
	m.version = upgraded
	edits, err = Compute(gpus(gpu0), e.cfg, e.host, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := findMount(edits.Mounts, "/usr/local/nvidia/lib64/libcuda.so."+upgraded); !ok {
		t.Errorf("after the upgrade no mount of libcuda.so.%s: %v", upgraded, edits.Mounts)
	}
	if !strings.Contains(edits.DriverFiles.Source, "driver "+upgraded) {
		t.Errorf("driver files %q after the upgrade", edits.DriverFiles.Source)
	}
}

// "auto" without a CDI spec: the generated spec where the driver root has
// the driver's libraries, else nvidia-container-runtime, saying why.
func TestComputeAutoFallbacks(t *testing.T) {
	e, _, _ := newGenerateEnv(t, config.InjectionAuto)
	edits, err := Compute(gpus(gpu0), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	if edits.DriverFiles.Mode != config.InjectionGenerate {
		t.Errorf("auto with driver libraries: %+v, want generate", edits.DriverFiles)
	}

	bare := newEnv(t, config.InjectionAuto, false, ocitest.StandardNodes)
	edits, err = Compute(gpus(gpu0), bare.cfg, bare.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	want := "nvidia-runtime (no CDI spec, no driver libraries under /)"
	if edits.DriverFiles.Mode != config.InjectionNVIDIARuntime || edits.DriverFiles.Source != want {
		t.Errorf("auto without driver libraries: %+v, want %q", edits.DriverFiles, want)
	}
	if v, _ := envValue(edits.Env, EnvVisibleDevices); v != uuid0 {
		t.Errorf("%s = %q, want %s", EnvVisibleDevices, v, uuid0)
	}

	// A driver whose NVML fails: the fallback, with a warning naming why.
	broken, m, _ := newGenerateEnv(t, config.InjectionAuto)
	m.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	edits, err = Compute(gpus(gpu0), broken.cfg, broken.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	if edits.DriverFiles.Mode != config.InjectionNVIDIARuntime || !strings.Contains(edits.DriverFiles.Source, "generating from the driver root failed") ||
		!slices.ContainsFunc(edits.Warnings, func(w string) bool { return strings.Contains(w, "NVML") }) {
		t.Errorf("auto with a broken NVML: %+v, warnings %q", edits.DriverFiles, edits.Warnings)
	}

	// A host CDI spec still comes first.
	withSpec := newEnv(t, config.InjectionAuto, true, ocitest.StandardNodes)
	installDriver(t, withSpec.root, "usr/local/nvidia/lib64", fakeDriverVersion)
	withSpec.host.NewNVML = func(string) nvml.Interface { t.Error("NVML opened although a CDI spec is there"); return newMockNVML() }
	edits, err = Compute(gpus(gpu0), withSpec.cfg, withSpec.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	if want := "CDI spec " + filepath.Join(withSpec.cfg.Driver.CDIDirs[0], "nvidia.yaml"); edits.DriverFiles.Mode != config.InjectionCDI || edits.DriverFiles.Source != want {
		t.Errorf("auto with a CDI spec: %+v, want cdi, %q", edits.DriverFiles, want)
	}
}

// "generate" where the driver root has no driver libraries is refused,
// naming the library and where it was looked for.
func TestComputeGenerateNoDriver(t *testing.T) {
	e := newEnv(t, config.InjectionGenerate, false, ocitest.StandardNodes)
	_, err := Compute(gpus(gpu0), e.cfg, e.host, testFiles)
	want := `driver.injection = "generate": driver root /: no driver libraries: no libnvidia-ml.so.1 in the loader cache or the usual library directories or /usr/local/nvidia/lib64, /usr/local/nvidia/lib`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one containing %q", err, want)
	}
	// libnvidia-ml without libcuda is not a driver to generate from.
	installDriver(t, e.root, "usr/local/nvidia/lib", fakeDriverVersion)
	os.Remove(filepath.Join(e.root, "usr/local/nvidia/lib/libcuda.so.1"))
	_, err = Compute(gpus(gpu0), e.cfg, e.host, testFiles)
	if err == nil || !strings.Contains(err.Error(), "no libcuda.so.1 in") {
		t.Errorf("error %v, want one naming libcuda.so.1", err)
	}
}

// A driver root elsewhere (the GPU Operator's /run/nvidia/driver), seen by
// this process beneath dev_root: the spec's host paths are the runtime's,
// beneath driver_root.
func TestComputeGenerateDriverRoot(t *testing.T) {
	e := newEnv(t, config.InjectionGenerate, false, underDriverRoot())
	installDriver(t, filepath.Join(e.root, operatorDriverRoot), "usr/lib/x86_64-linux-gnu", fakeDriverVersion)
	e.cfg.Driver.DriverRoot = operatorDriverRoot
	e.host = NewHost(e.cfg, false)
	e.host.ProcDevices = filepath.Join(e.root, "proc-devices")
	e.host.NewNVML = func(string) nvml.Interface { return newMockNVML() }
	edits, err := Compute(gpus(gpu1), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	lib := "/usr/lib/x86_64-linux-gnu/libcuda.so." + fakeDriverVersion
	m, ok := findMount(edits.Mounts, lib)
	if want := operatorDriverRoot + lib; !ok || m.Source != want {
		t.Errorf("mount of %s: %+v (found %v), want source %s", lib, m, ok, want)
	}
	for _, m := range edits.Mounts {
		if strings.HasPrefix(m.Source, e.root) {
			t.Errorf("mount %+v names this process's view of the host", m)
		}
	}
	if !slices.ContainsFunc(edits.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/nvidia1" && d.Major == 195 && d.Minor == 1 }) {
		t.Errorf("devices %v: no /dev/nvidia1 195:1", edits.Devices)
	}
}
