package gpu

import (
	"bufio"
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// nvmlSoname is the file name the driver's NVML library is loaded by.
const nvmlSoname = "libnvidia-ml.so.1"

// usualLibraryDirs are where distributions and NVIDIA's installer put the
// driver's libraries, searched beneath the driver root after
// driver.library_dirs; the list NVIDIA's container toolkit searches.
var usualLibraryDirs = []string{
	"/usr/lib64",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu",
	"/lib64",
	"/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu",
	"/usr/lib",
	"/lib",
}

// librarySearch finds and initializes libnvidia-ml.so.1 the way NVIDIA's
// tools do. Where driver.driver_root is "/", the host's own driver: first
// through the dynamic loader (which also finds the libraries the NVIDIA
// container toolkit puts into a pod), then as a file beneath dev_root in
// driver.library_dirs and the usual dirs. Where the driver root is elsewhere
// (the GPU Operator's /run/nvidia/driver), the files beneath it come first
// and the loader last, for a pod that gets the driver only from the
// toolkit.
type librarySearch struct {
	root string // the driver root as this process sees it: dev_root + driver_root
	// paths are the candidate files in order; "" is the loader's search by
	// soname.
	paths []string
	// open makes the binding for one library (path "" for the loader's).
	// openNVML in production; tests give mocks.
	open func(path string) nvml.Interface
}

func newLibrarySearch(d config.Driver) *librarySearch {
	driverRoot := filepath.Clean(cmp.Or(d.DriverRoot, "/"))
	s := &librarySearch{root: filepath.Join(cmp.Or(d.DevRoot, "/"), driverRoot), open: openNVML}
	if driverRoot == "/" {
		s.paths = append(s.paths, "")
	}
	for _, dir := range slices.Concat(d.LibraryDirs, usualLibraryDirs) {
		p := filepath.Join(s.root, dir, nvmlSoname)
		if !slices.Contains(s.paths, p) {
			s.paths = append(s.paths, p)
		}
	}
	if driverRoot != "/" {
		s.paths = append(s.paths, "")
	}
	return s
}

func openNVML(path string) nvml.Interface {
	if path == "" {
		return nvml.New()
	}
	return nvml.New(nvml.WithLibraryPath(path))
}

// init loads and initializes the first library found. It moves on to the
// next candidate only when a library could not be loaded at all: once one
// is loaded, its symbols are the process's (go-nvml binds them globally), so
// its nvmlInit result is final. The returned library is nil only when none
// could be loaded; the error then wraps ErrNoDriver and names every place
// searched.
func (s *librarySearch) init() (nvml.Interface, error) {
	var searched []string
	for _, p := range s.paths {
		file := ""
		if p != "" {
			var err error
			if file, err = resolveUnder(s.root, p); err != nil {
				searched = append(searched, p+" (absent)")
				continue
			}
		}
		lib := s.open(file)
		ret := lib.Init()
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			if p == "" {
				searched = append(searched, "the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache) for "+nvmlSoname)
			} else {
				searched = append(searched, p+" (present but could not be loaded)")
			}
			continue
		}
		if ret == nvml.SUCCESS {
			foundBy := cmp.Or(p, "the dynamic loader")
			slog.Info("loaded NVML", "library", cmp.Or(mappedFile(nvmlSoname), file, nvmlSoname), "found_by", foundBy)
		}
		return lib, initError(ret)
	}
	return nil, fmt.Errorf("%w: %s not found; searched %s %s", ErrNoDriver, nvmlSoname, strings.Join(searched, ", "), noDriverHint)
}

// resolveUnder follows the links of path's last component the way they
// resolve on the host: an absolute target is beneath root (a driver root's
// libnvidia-ml.so.1 -> /usr/lib/... means root/usr/lib/...). It returns the
// file to load, or an error when there is none.
func resolveUnder(root, path string) (string, error) {
	for range 16 {
		fi, err := os.Lstat(path)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			if !fi.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", path)
			}
			return path, nil
		}
		target, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			path = filepath.Join(root, target)
		} else {
			path = filepath.Join(filepath.Dir(path), target)
		}
	}
	return "", fmt.Errorf("%s: too many levels of links", path)
}

// mappedFile returns the path of the first file mapped into this process
// whose name starts with prefix: which file the loader chose. "" if none.
func mappedFile(prefix string) string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.HasPrefix(filepath.Base(fields[5]), strings.TrimSuffix(prefix, ".1")) {
			return fields[5]
		}
	}
	return ""
}

// LoadNVML loads and initializes the libnvidia-ml.so.1 of the driver d
// describes, searched as the NVML backend searches it (see librarySearch),
// for another user of NVML in this process (the per-container utilisation
// of internal/utilization). NVML counts its initializations: each user's
// Shutdown ends only its own. The library is nil only when none could be
// loaded; it comes back with the error when it loaded but nvmlInit failed,
// so that a later lib.Init() can retry it (go-nvml binds the first library
// loaded for the whole process).
func LoadNVML(d config.Driver) (nvml.Interface, error) {
	return newLibrarySearch(d).init()
}

// NVMLLibraryPresent reports whether a libnvidia-ml.so.1 exists as a file
// beneath the driver root that d describes, in driver.library_dirs or the
// usual dirs (the dynamic loader's search is not asked): where the
// simulated backend runs on a driver root that has an NVML, as the fake
// driver roots of the tests do.
func NVMLLibraryPresent(d config.Driver) bool {
	s := newLibrarySearch(d)
	for _, p := range s.paths {
		if p == "" {
			continue
		}
		if _, err := resolveUnder(s.root, p); err == nil {
			return true
		}
	}
	return false
}
