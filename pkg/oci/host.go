package oci

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// NVIDIAMajor is the character-device major of /dev/nvidiactl and the
// /dev/nvidia<minor> GPU nodes; other NVIDIA majors (nvidia-uvm, nvidia-caps)
// are assigned by the kernel when the driver loads.
const NVIDIAMajor = 195

// CDIVendor and CDIClass name the CDI devices of NVIDIA GPUs, as
// `nvidia-ctk cdi generate` writes them (kind nvidia.com/gpu).
const (
	CDIVendor = "nvidia.com"
	CDIClass  = "gpu"
	CDIKind   = CDIVendor + "/" + CDIClass
)

// Host is what Compute and Hide need to know about the node.
type Host interface {
	// DeviceNode describes the host's device node at hostPath (an absolute
	// path as seen on the host, such as "/dev/nvidiactl"). The returned
	// device has Path = hostPath. A missing node is an error wrapping
	// fs.ErrNotExist.
	DeviceNode(hostPath string) (specs.LinuxDevice, error)
	// DriverDeviceNode describes the driver's device node that containers
	// see at path (such as "/dev/nvidiactl"); on the host it lies beneath
	// the driver root (driver.driver_root). The returned device has
	// Path = path. A missing node is an error wrapping fs.ErrNotExist.
	DriverDeviceNode(path string) (specs.LinuxDevice, error)
	// NVIDIADeviceNodes lists the driver's NVIDIA device nodes
	// (/dev/nvidia* and /dev/nvidia-caps/* beneath the driver root), sorted
	// by path; each Path is where containers see it ("/dev/nvidia0").
	NVIDIADeviceNodes() ([]specs.LinuxDevice, error)
	// NVIDIAMajors lists the character-device majors of the NVIDIA driver:
	// 195 and the dynamic ones (nvidia-uvm, nvidia-caps, ...), sorted.
	NVIDIAMajors() ([]int64, error)
	// CDISpecs returns the valid CDI specs of kind nvidia.com/gpu, highest
	// priority first. The error reports spec files that failed to load; the
	// specs returned are usable even then.
	CDISpecs() ([]*cdi.Spec, error)
	// GeneratedCDISpec returns the CDI spec of the driver beneath the
	// driver root as NVIDIA's CDI library generates it, devices named by
	// UUID, its hooks run by hook (a host path) as CDIHookName. A driver
	// root without the driver's libraries is an error wrapping
	// ErrNoDriverLibraries.
	GeneratedCDISpec(hook string) (*GeneratedSpec, error)
}

// HostFS is the Host of a real node: device nodes under the configured
// dev_root, /proc/devices, and the CDI spec directories.
type HostFS struct {
	// DevRoot is the host's root as this process sees it ("/" unless the
	// process runs in a container with the host's root mounted elsewhere).
	DevRoot string
	// DriverRoot is the host path of the NVIDIA driver's root, whose dev/
	// holds the driver's device nodes: "/" for a driver installed on the
	// host, "/run/nvidia/driver" for the GPU Operator's driver container.
	DriverRoot string
	// ProcDevices is the kernel's device-major table, /proc/devices.
	ProcDevices string
	// LibraryDirs are searched, beneath the driver root, for the driver's
	// libraries when its loader cache does not name them
	// (driver.library_dirs).
	LibraryDirs []string
	// NewNVML opens the NVML library at a path; nil: go-nvml's. Tests set
	// go-nvml's mock.
	NewNVML func(path string) nvml.Interface
	// Logger gets the CDI library's messages (at debug); nil: slog's default.
	Logger *slog.Logger

	cache *cdi.Cache

	genMu  sync.Mutex
	gen    *GeneratedSpec // the last spec generated, for genKey
	genKey string         // the hook and the driver it was generated for
}

// NewHost returns the Host described by cfg. With watchCDI the CDI spec
// directories are watched and re-read when they change (long-running
// daemons); without it they are read once, now (one-shot commands).
func NewHost(cfg *config.Config, watchCDI bool) *HostFS {
	root := cfg.Driver.DevRoot
	if root == "" {
		root = "/"
	}
	cache, _ := cdi.NewCache( // the error is always nil (documented)
		cdi.WithSpecDirs(cfg.Driver.CDIDirs...),
		cdi.WithAutoRefresh(watchCDI),
	)
	return &HostFS{DevRoot: root, DriverRoot: cmp.Or(cfg.Driver.DriverRoot, "/"), ProcDevices: "/proc/devices",
		LibraryDirs: cfg.Driver.LibraryDirs, cache: cache}
}

// Close stops watching the CDI spec directories.
func (h *HostFS) Close() error {
	return h.cache.Configure(cdi.WithAutoRefresh(false))
}

func (h *HostFS) hostPath(p string) string {
	return filepath.Join(h.DevRoot, filepath.Clean("/"+p))
}

// driverPath is where this process sees the driver's file that containers
// see at p.
func (h *HostFS) driverPath(p string) string {
	return h.hostPath(filepath.Join(cmp.Or(h.DriverRoot, "/"), filepath.Clean("/"+p)))
}

// DriverDeviceNode implements Host.
func (h *HostFS) DriverDeviceNode(path string) (specs.LinuxDevice, error) {
	d, err := h.DeviceNode(filepath.Join(cmp.Or(h.DriverRoot, "/"), filepath.Clean("/"+path)))
	d.Path = path
	return d, err
}

// DeviceNode implements Host.
func (h *HostFS) DeviceNode(hostPath string) (specs.LinuxDevice, error) {
	full := h.hostPath(hostPath)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return specs.LinuxDevice{}, &fs.PathError{Op: "stat device node", Path: full, Err: err}
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	case unix.S_IFIFO:
		typ = "p"
	default:
		return specs.LinuxDevice{}, fmt.Errorf("%s: not a device node", full)
	}
	mode := os.FileMode(st.Mode & 0o777)
	uid, gid := st.Uid, st.Gid
	d := specs.LinuxDevice{
		Path:     hostPath,
		Type:     typ,
		FileMode: &mode,
		UID:      &uid,
		GID:      &gid,
	}
	if typ != "p" {
		rdev := uint64(st.Rdev) //nolint:unconvert // Rdev is uint32 on some architectures
		d.Major, d.Minor = int64(unix.Major(rdev)), int64(unix.Minor(rdev))
	}
	return d, nil
}

// NVIDIADeviceNodes implements Host.
func (h *HostFS) NVIDIADeviceNodes() ([]specs.LinuxDevice, error) {
	var paths []string
	for _, pattern := range []string{"/dev/nvidia*", "/dev/nvidia-caps/*"} {
		m, err := filepath.Glob(h.driverPath(pattern))
		if err != nil {
			return nil, fmt.Errorf("list NVIDIA device nodes: %w", err)
		}
		paths = append(paths, m...)
	}
	var devs []specs.LinuxDevice
	root := h.driverPath("/")
	for _, full := range paths {
		rel, err := filepath.Rel(root, full)
		if err != nil {
			return nil, fmt.Errorf("list NVIDIA device nodes: %w", err)
		}
		d, err := h.DriverDeviceNode("/" + rel)
		if err != nil {
			continue // directories (nvidia-caps) and nodes that vanished
		}
		if d.Type == "c" {
			devs = append(devs, d)
		}
	}
	slices.SortFunc(devs, func(a, b specs.LinuxDevice) int { return strings.Compare(a.Path, b.Path) })
	return devs, nil
}

// NVIDIAMajors implements Host.
func (h *HostFS) NVIDIAMajors() ([]int64, error) {
	majors := []int64{NVIDIAMajor}
	data, err := os.ReadFile(h.ProcDevices)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read device majors: %w", err)
	}
	majors = append(majors, parseProcDevices(data)...)
	nodes, err := h.NVIDIADeviceNodes()
	if err != nil {
		return nil, err
	}
	for _, d := range nodes {
		majors = append(majors, d.Major)
	}
	slices.Sort(majors)
	return slices.Compact(majors), nil
}

// parseProcDevices returns the majors of the character devices whose driver
// name starts with "nvidia" in /proc/devices content.
func parseProcDevices(data []byte) []int64 {
	var majors []int64
	inChar := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		}
		if !inChar {
			continue
		}
		num, name, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(strings.TrimSpace(name), "nvidia") {
			continue
		}
		if m, err := strconv.ParseInt(num, 10, 64); err == nil {
			majors = append(majors, m)
		}
	}
	return majors
}

// CDISpecs implements Host.
func (h *HostFS) CDISpecs() ([]*cdi.Spec, error) {
	if err := h.cache.Refresh(); err != nil {
		// Refresh reports every broken spec file; the valid ones are still
		// in the cache, so carry on and report the error with the result.
		return h.gpuSpecs(), fmt.Errorf("CDI spec directories: %w", err)
	}
	return h.gpuSpecs(), nil
}

func (h *HostFS) gpuSpecs() []*cdi.Spec {
	var out []*cdi.Spec
	for _, s := range h.cache.GetVendorSpecs(CDIVendor) {
		if s.GetClass() == CDIClass {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *cdi.Spec) int { return b.GetPriority() - a.GetPriority() })
	return out
}
