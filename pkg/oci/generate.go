package oci

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/nvidialog"
)

// CDIHookName is the argv[0] of the hooks of a generated spec: the binary
// they name (the pin hook's, HostFiles.Hook) runs NVIDIA's CDI hook
// commands when called so (internal/cdihook), as nvidia-cdi-hook would.
const CDIHookName = "nvidia-cdi-hook"

// ErrNoDriverLibraries is wrapped by GeneratedCDISpec when the driver root
// holds no driver libraries to generate from.
var ErrNoDriverLibraries = errors.New("no driver libraries")

// driverLibraries are the libraries a driver root must hold for nri-vgpu to
// generate its CDI spec: NVML, which the generation asks for the GPUs and
// the driver version, and the CUDA driver, which containers need.
var driverLibraries = []string{"libnvidia-ml.so.1", "libcuda.so.1"}

// GeneratedSpec is the CDI spec nri-vgpu generates from the driver root.
type GeneratedSpec struct {
	Spec *cdispec.Spec
	// DriverRoot is the driver root (driver.driver_root), a host path.
	DriverRoot string
	// DriverVersion is the driver's version, as NVML reports it.
	DriverVersion string
	// LibraryDir is where, beneath the driver root, libcuda.so.1 lies;
	// containers see the libraries at the same path.
	LibraryDir string
}

// Describe says where the driver files come from, for logs and status.
func (g *GeneratedSpec) Describe() string {
	return fmt.Sprintf("generated from driver root %s (NVIDIA CDI library; driver %s; libraries in %s)", g.DriverRoot, g.DriverVersion, g.LibraryDir)
}

// located is where the driver libraries of a driver root are, as this
// process sees them (symbolic links resolved), with what identifies the
// driver installed there.
type located struct {
	// searchPaths are the directories (as this process sees them) the CDI
	// library must search for the driver's libraries; nil: the loader
	// cache and the usual directories of the driver root.
	searchPaths []string
	libs        []string // resolved paths of driverLibraries, in order
	key         string   // libs with their modification times
}

// locateDriver finds driverLibraries beneath the driver root: in its loader
// cache and usual directories (as the CDI library looks by default), else in
// libraryDirs (driver.library_dirs), which the CDI library must then be told.
func (h *HostFS) locateDriver() (*located, error) {
	root := h.driverPath("/")
	quiet := nvidialog.New(slog.New(slog.DiscardHandler), slog.LevelDebug)
	var dirs []string
	for _, d := range h.LibraryDirs {
		dirs = append(dirs, filepath.Join(root, filepath.Clean("/"+d)))
	}
	locators := []struct {
		lookup.Locator
		searchPaths []string
	}{
		{lookup.NewLibraryLocator(lookup.WithLogger(quiet), lookup.WithRoot(root)), nil},
	}
	if len(dirs) > 0 {
		// With search paths, the library looks in them alone, as
		// absolute paths.
		locators = append(locators, struct {
			lookup.Locator
			searchPaths []string
		}{lookup.NewLibraryLocator(lookup.WithLogger(quiet), lookup.WithSearchPaths(dirs...)), dirs})
	}
	var missing string
	for _, l := range locators {
		found := &located{searchPaths: l.searchPaths}
		for _, name := range driverLibraries {
			paths, err := l.Locate(name)
			if err != nil || len(paths) == 0 {
				missing = name
				found = nil
				break
			}
			found.libs = append(found.libs, paths[0])
		}
		if found == nil {
			continue
		}
		var key []string
		for _, p := range found.libs {
			st, err := os.Stat(p)
			if err != nil {
				return nil, fmt.Errorf("driver library %s: %w", p, err)
			}
			key = append(key, p+"@"+st.ModTime().UTC().Format(time.RFC3339Nano))
		}
		found.key = strings.Join(key, ",")
		return found, nil
	}
	where := "the loader cache or the usual library directories"
	if len(h.LibraryDirs) > 0 {
		where += " or " + strings.Join(h.LibraryDirs, ", ")
	}
	return nil, fmt.Errorf("driver root %s: %w: no %s in %s", h.DriverRoot, ErrNoDriverLibraries, missing, where)
}

// GeneratedCDISpec implements Host. Generating opens NVML and walks the
// driver root (its loader cache, library and firmware directories), too
// much for every container, so the spec is kept until the driver changes:
// an upgrade replaces the versioned files libcuda.so.1 and
// libnvidia-ml.so.1 resolve to (another name, or at least another
// modification time), and the spec names those files and the version, so
// a spec of the old driver would mount files that are gone.
func (h *HostFS) GeneratedCDISpec(hook string) (*GeneratedSpec, error) {
	loc, err := h.locateDriver()
	if err != nil {
		return nil, err
	}
	key := hook + "|" + loc.key
	h.genMu.Lock()
	defer h.genMu.Unlock()
	if h.gen != nil && h.genKey == key {
		return h.gen, nil
	}
	g, err := h.generate(hook, loc)
	if err != nil {
		return nil, err
	}
	h.gen, h.genKey = g, key
	return g, nil
}

// generate runs NVIDIA's CDI library on the driver root as
// `nvidia-ctk cdi generate --mode nvml --device-name-strategy uuid` would.
func (h *HostFS) generate(hook string, loc *located) (*GeneratedSpec, error) {
	root := h.driverPath("/")
	newNVML := h.NewNVML
	if newNVML == nil {
		newNVML = func(lib string) nvml.Interface { return nvml.New(nvml.WithLibraryPath(lib)) }
	}
	nvmllib := newNVML(loc.libs[0])
	if ret := nvmllib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("driver root %s: NVML (%s): %v", h.DriverRoot, loc.libs[0], ret)
	}
	version, ret := nvmllib.SystemGetDriverVersion()
	_ = nvmllib.Shutdown()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("driver root %s: NVML (%s): driver version: %v", h.DriverRoot, loc.libs[0], ret)
	}
	// Devices are named by UUID, as findCDIDevice looks them up.
	namer, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyUUID)
	if err != nil {
		return nil, err
	}
	logger := h.Logger
	if logger == nil {
		logger = slog.Default()
	}
	lib, err := nvcdi.New(
		nvcdi.WithLogger(nvidialog.New(logger.With("component", "nvcdi"), slog.LevelDebug)),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(nvmllib),
		nvcdi.WithDeviceNamers(namer),
		nvcdi.WithDriverRoot(root),
		nvcdi.WithDevRoot(root),
		nvcdi.WithLibrarySearchPaths(loc.searchPaths),
		nvcdi.WithNVIDIACDIHookPath(hook),
		// nvsandboxutils would be loaded into this long-running
		// process for what NVML tells as well (device nodes, paths).
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		// apply-cuda-memory-limits would load NVML into the runtime's
		// hook to set limits from variables the container sets itself;
		// nri-vgpu limits memory (the shim), and its hook stays static.
		nvcdi.WithDisabledHooks(nvcdi.HookName("apply-cuda-memory-limits")),
	)
	if err != nil {
		return nil, fmt.Errorf("driver root %s: NVIDIA CDI library: %w", h.DriverRoot, err)
	}
	spec, err := lib.GetSpec("all")
	if err != nil {
		return nil, fmt.Errorf("driver root %s: generate CDI spec: %w", h.DriverRoot, err)
	}
	raw := spec.Raw()
	// Host paths as the runtime sees them: beneath driver.driver_root, not
	// beneath where this process sees it (dev_root).
	if err := transformroot.New(transformroot.WithRoot(root), transformroot.WithTargetRoot(h.DriverRoot)).Transform(raw); err != nil {
		return nil, fmt.Errorf("driver root %s: generated CDI spec: %w", h.DriverRoot, err)
	}
	forEachHook(raw, func(hk *cdispec.Hook) {
		if hk.Path == hook && len(hk.Args) > 0 {
			hk.Args[0] = CDIHookName
		}
	})
	libDir, err := filepath.Rel(root, filepath.Dir(loc.libs[1]))
	if err != nil {
		return nil, err
	}
	return &GeneratedSpec{Spec: raw, DriverRoot: h.DriverRoot, DriverVersion: version, LibraryDir: filepath.Join("/", libDir)}, nil
}

// forEachHook calls f on every hook of spec.
func forEachHook(spec *cdispec.Spec, f func(*cdispec.Hook)) {
	all := []*cdispec.ContainerEdits{&spec.ContainerEdits}
	for i := range spec.Devices {
		all = append(all, &spec.Devices[i].ContainerEdits)
	}
	for _, ce := range all {
		for _, hk := range ce.Hooks {
			f(hk)
		}
	}
}
