package harness

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// FakeGPU is one GPU of a fake driver root, as the fake CUDA driver and fake
// NVML (shim/test/fake) present it.
type FakeGPU struct {
	UUID   string // "GPU-..."
	Name   string // what NVML and CUDA call it; no ':' or ','
	Memory uint64 // bytes
	SMs    int
	Minor  int // N of /dev/nvidiaN
}

// FakeDriverRoot describes a node's NVIDIA driver installation made of the
// fake driver: the libraries under their real file names in LibDir, and the
// device nodes.
type FakeDriverRoot struct {
	LibDir    string // where the driver's libraries are, inside the root: "/usr/local/nvidia/lib64"
	Version   string // the driver version the file names carry: "580.159.04"
	ShimBuild string // shim/build, holding fake/libcuda.so.1 and fake/libnvidia-ml.so.1
	GPUs      []FakeGPU
}

// MakeFakeDriverRoot lays out r under root as a driver install does:
// <root><LibDir>/libcuda.so.<Version> and libnvidia-ml.so.<Version> (copies
// of the fake libraries), the links libcuda.so.1 -> libcuda.so.<Version>,
// libcuda.so -> libcuda.so.1 and libnvidia-ml.so.1 -> libnvidia-ml.so.<Version>,
// and the device nodes under <root>/dev (MakeFakeNVIDIADevRoot, with each
// GPU's minor). The libraries show the GPUs only in a process with r.Env().
// Needs CAP_MKNOD.
func MakeFakeDriverRoot(root string, r FakeDriverRoot) error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("harness: fake driver root: %w", err)
	}
	libDir := filepath.Join(root, r.LibDir)
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	for _, lib := range []struct{ soname, dev string }{
		{"libcuda.so.1", "libcuda.so"},
		{"libnvidia-ml.so.1", ""},
	} {
		base := strings.TrimSuffix(lib.soname, ".1")
		file := base + "." + r.Version
		if err := copyFile(filepath.Join(r.ShimBuild, "fake", lib.soname), filepath.Join(libDir, file)); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		links := [][2]string{{lib.soname, file}}
		if lib.dev != "" {
			links = append(links, [2]string{lib.dev, lib.soname})
		}
		for _, l := range links {
			if err := os.Symlink(l[1], filepath.Join(libDir, l[0])); err != nil {
				return fmt.Errorf("harness: %w", err)
			}
		}
	}
	minors := make([]int, len(r.GPUs))
	for i, g := range r.GPUs {
		minors[i] = g.Minor
	}
	return MakeFakeNVIDIADevRoot(root, minors)
}

// Env returns the variables that make the fake libraries of r present
// exactly r's GPUs and driver version (shim/test/fake/fakestate.c):
// FAKECUDA_DEVICES and FAKECUDA_DRIVER_VERSION. A process sharing one fake
// machine's state with others also needs FAKECUDA_STATE.
func (r FakeDriverRoot) Env() []string {
	devs := make([]string, len(r.GPUs))
	for i, g := range r.GPUs {
		devs[i] = strings.Join([]string{g.UUID, strconv.FormatUint(g.Memory, 10), strconv.Itoa(g.SMs), g.Name, strconv.Itoa(g.Minor)}, ":")
	}
	return []string{
		"FAKECUDA_DEVICES=" + strings.Join(devs, ","),
		"FAKECUDA_DRIVER_VERSION=" + r.Version,
	}
}

// validate refuses what the fake libraries could not present as given.
func (r FakeDriverRoot) validate() error {
	if !filepath.IsAbs(r.LibDir) {
		return fmt.Errorf("LibDir %q is not an absolute path", r.LibDir)
	}
	if r.Version == "" || strings.ContainsAny(r.Version, "/ ") {
		return fmt.Errorf("bad driver version %q", r.Version)
	}
	if len(r.GPUs) == 0 || len(r.GPUs) > 16 {
		return fmt.Errorf("%d GPUs: the fake driver has 1 to 16", len(r.GPUs))
	}
	var errs []error
	for i, g := range r.GPUs {
		if !strings.HasPrefix(g.UUID, "GPU-") || strings.ContainsAny(g.UUID, ":,") {
			errs = append(errs, fmt.Errorf("GPU %d: bad UUID %q", i, g.UUID))
		}
		if g.Name == "" || strings.ContainsAny(g.Name, ":,") {
			errs = append(errs, fmt.Errorf("GPU %d: name %q is empty or holds ':' or ','", i, g.Name))
		}
		if g.Memory == 0 || g.SMs <= 0 {
			errs = append(errs, fmt.Errorf("GPU %d: memory %d and SMs %d must be positive", i, g.Memory, g.SMs))
		}
		if g.Minor < 0 || g.Minor > 253 {
			errs = append(errs, fmt.Errorf("GPU %d: minor %d is outside 0..253 (254 and 255 are nvidia-modeset and nvidiactl)", i, g.Minor))
		}
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

// BuildFakeDriver builds the fake libcuda.so.1 and libnvidia-ml.so.1 from
// shimDir (the repository's shim/) into out/fake, with the shim's own
// Makefile rules, so out can be a FakeDriverRoot's ShimBuild. A private out
// lets tests of several packages build at once without sharing files.
func BuildFakeDriver(shimDir, out string) error {
	out, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	cmd := exec.Command("make", "-s", "-C", shimDir, "B="+out,
		filepath.Join(out, "fake", "libcuda.so.1"), filepath.Join(out, "fake", "libnvidia-ml.so.1"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: building the fake driver: %w\n%s", err, b)
	}
	return nil
}
