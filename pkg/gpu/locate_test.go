package gpu

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// opener records which libraries a search opens and answers each one's
// Init with results[path] (LIBRARY_NOT_FOUND when not listed), through a
// DGX mock that lists 8 GPUs once initialized.
type opener struct {
	t       *testing.T
	results map[string]nvml.Return
	opened  []string
	inits   map[string]int
}

func (o *opener) open(path string) nvml.Interface {
	o.opened = append(o.opened, path)
	srv := newDGX(o.t)
	srv.InitFunc = func() nvml.Return {
		o.inits[path]++
		if r, ok := o.results[path]; ok {
			return r
		}
		return nvml.ERROR_LIBRARY_NOT_FOUND
	}
	srv.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	return srv
}

func newOpener(t *testing.T, results map[string]nvml.Return) *opener {
	return &opener{t: t, results: results, inits: map[string]int{}}
}

// writeLib creates a file (or, with target set, a link) at root+path.
func writeLib(t *testing.T, root, path, target string) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if target != "" {
		err = os.Symlink(target, p)
	} else {
		err = os.WriteFile(p, []byte("ELF"), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A driver root other than "/": its files come before the loader (which
// would find this root's library, not the driver's), library_dirs before the
// usual dirs, and links resolve as they do on the host.
func TestLibrarySearchDriverRoot(t *testing.T) {
	devRoot := t.TempDir()
	driver := config.Driver{DevRoot: devRoot, DriverRoot: "/run/nvidia/driver", LibraryDirs: []string{"/opt/drv/lib", "/usr/local/nvidia/lib64"}}
	root := filepath.Join(devRoot, "run/nvidia/driver")
	// The usual dir has a library too: library_dirs win.
	writeLib(t, root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "")
	writeLib(t, root, "usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", "")
	writeLib(t, root, "usr/local/nvidia/lib64/libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04")
	want := filepath.Join(root, "usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04")
	o := newOpener(t, map[string]nvml.Return{want: nvml.SUCCESS})

	n := newNVMLForDriver(driver)
	n.search.open = o.open
	t.Cleanup(func() { _ = n.Close() })
	devs, err := n.Devices()
	if err != nil || len(devs) != 8 {
		t.Fatalf("Devices: %d GPUs, %v; want 8", len(devs), err)
	}
	if !slices.Equal(o.opened, []string{want}) {
		t.Errorf("opened %q, want only %q", o.opened, want)
	}
}

func TestLibrarySearchNothingFound(t *testing.T) {
	devRoot := t.TempDir()
	driver := config.Driver{DevRoot: devRoot, DriverRoot: "/opt/driver", LibraryDirs: []string{"/usr/local/nvidia/lib64"}}
	devRoot = filepath.Join(devRoot, "opt/driver") // where the files are looked for
	// Present but not loadable (another architecture, say): searched, then passed over.
	writeLib(t, devRoot, "usr/local/nvidia/lib64/libnvidia-ml.so.1", "")
	o := newOpener(t, nil)
	n := newNVMLForDriver(driver)
	n.search.open = o.open
	t.Cleanup(func() { _ = n.Close() })

	_, err := n.Devices()
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Devices: %v, want ErrNoDriver", err)
	}
	msg := err.Error()
	for _, want := range []string{
		filepath.Join(devRoot, "usr/local/nvidia/lib64/libnvidia-ml.so.1") + " (present but could not be loaded)",
		filepath.Join(devRoot, "usr/lib64/libnvidia-ml.so.1") + " (absent)",
		filepath.Join(devRoot, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1") + " (absent)",
		filepath.Join(devRoot, "lib64/libnvidia-ml.so.1") + " (absent)",
		filepath.Join(devRoot, "lib/libnvidia-ml.so.1") + " (absent), the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache)",
		`gpu.backend = "simulated"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not name %q:\n%s", want, msg)
		}
	}
	if !slices.Equal(o.opened, []string{filepath.Join(devRoot, "usr/local/nvidia/lib64/libnvidia-ml.so.1"), ""}) {
		t.Errorf("opened %q, want the present file, then the loader's", o.opened)
	}
}

// A library that loads but whose nvmlInit fails is final: its symbols are
// bound, so no other file is tried, and a retry initializes the same one.
func TestLibrarySearchLoadedButInitFails(t *testing.T) {
	devRoot := t.TempDir()
	first := filepath.Join(devRoot, "usr/local/nvidia/lib64/libnvidia-ml.so.1")
	writeLib(t, devRoot, "usr/local/nvidia/lib64/libnvidia-ml.so.1", "")
	writeLib(t, devRoot, "usr/lib64/libnvidia-ml.so.1", "")
	o := newOpener(t, map[string]nvml.Return{first: nvml.ERROR_DRIVER_NOT_LOADED})
	n := newNVMLForDriver(config.Driver{DevRoot: devRoot, LibraryDirs: []string{"/usr/local/nvidia/lib64"}})
	n.search.open = o.open
	t.Cleanup(func() { _ = n.Close() })

	for range 2 {
		if _, err := n.Devices(); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "kernel driver is not running") {
			t.Fatalf("Devices: %v, want ErrNoDriver saying the kernel driver is not running", err)
		}
	}
	// The driver root is "/": the loader (finding nothing here) first.
	if !slices.Equal(o.opened, []string{"", first}) || o.inits[first] != 2 {
		t.Errorf("opened %q with %d inits of %s, want the loader's then it, initialized twice", o.opened, o.inits[first], first)
	}
}

// The driver in this process's root: the loader first, then the files.
func TestLibrarySearchLoaderFirst(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "libnvidia-ml.so.1")
	writeLib(t, dir, "libnvidia-ml.so.1", "")

	t.Run("loader finds it", func(t *testing.T) {
		o := newOpener(t, map[string]nvml.Return{"": nvml.SUCCESS, file: nvml.SUCCESS})
		s := &librarySearch{root: "/", paths: []string{"", file}, open: o.open}
		if lib, err := s.init(); err != nil || lib == nil {
			t.Fatalf("init: %v", err)
		}
		if !slices.Equal(o.opened, []string{""}) {
			t.Errorf("opened %q, want only the loader's", o.opened)
		}
	})
	t.Run("loader does not", func(t *testing.T) {
		o := newOpener(t, map[string]nvml.Return{file: nvml.SUCCESS})
		s := &librarySearch{root: "/", paths: []string{"", file}, open: o.open}
		if lib, err := s.init(); err != nil || lib == nil {
			t.Fatalf("init: %v", err)
		}
		if !slices.Equal(o.opened, []string{"", file}) {
			t.Errorf("opened %q, want the loader's, then %s", o.opened, file)
		}
	})
	t.Run("neither", func(t *testing.T) {
		o := newOpener(t, nil)
		s := &librarySearch{root: "/", paths: []string{"", file}, open: o.open}
		_, err := s.init()
		if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache)") ||
			!strings.Contains(err.Error(), file+" (present but could not be loaded)") {
			t.Errorf("init: %v, want ErrNoDriver naming the loader and %s", err, file)
		}
	})
}

func TestNewLibrarySearchPaths(t *testing.T) {
	s := newLibrarySearch(config.Driver{DevRoot: "/host", DriverRoot: "/run/nvidia/driver", LibraryDirs: []string{"/usr/local/nvidia/lib64", "/usr/lib64"}})
	want := []string{
		"/host/run/nvidia/driver/usr/local/nvidia/lib64/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1", // listed once though also a usual dir
		"/host/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/lib64/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/usr/lib/libnvidia-ml.so.1",
		"/host/run/nvidia/driver/lib/libnvidia-ml.so.1",
		"", // the loader last
	}
	if !slices.Equal(s.paths, want) {
		t.Errorf("paths\n%q\nwant\n%q", s.paths, want)
	}
	// The chart's NRI plugin: dev_root /host, the host's own driver, which
	// the toolkit puts into the pod: the loader first.
	s = newLibrarySearch(config.Driver{DevRoot: "/host", DriverRoot: "/", LibraryDirs: []string{"/usr/local/nvidia/lib64"}})
	if len(s.paths) < 2 || s.paths[0] != "" || s.paths[1] != "/host/usr/local/nvidia/lib64/libnvidia-ml.so.1" {
		t.Errorf("dev_root /host: paths %q, want the loader's, then /host/usr/local/nvidia/lib64/libnvidia-ml.so.1", s.paths)
	}
}

// NVMLLibraryPresent: a library file beneath the driver root, in
// library_dirs or a usual dir, through a link that resolves beneath the
// root; not a dangling link, not a directory, not the loader's.
func TestNVMLLibraryPresent(t *testing.T) {
	devRoot := t.TempDir()
	driver := config.Driver{DevRoot: devRoot, DriverRoot: "/drv", LibraryDirs: []string{"/opt/lib"}}
	root := filepath.Join(devRoot, "drv")
	if NVMLLibraryPresent(driver) {
		t.Fatal("present in an empty driver root")
	}
	// A link whose absolute target is the host's, absent beneath the root.
	writeLib(t, root, "opt/lib/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.580.159.04")
	if err := os.MkdirAll(filepath.Join(root, "usr/lib/libnvidia-ml.so.1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if NVMLLibraryPresent(driver) {
		t.Fatal("present with a dangling link and a directory")
	}
	writeLib(t, root, "usr/lib64/libnvidia-ml.so.580.159.04", "")
	if !NVMLLibraryPresent(driver) {
		t.Fatal("not present with a link resolving beneath the root")
	}
}
