package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// NVIDIAMajor is the character major of the NVIDIA GPU nodes and nvidiactl.
const NVIDIAMajor = 195

// FakeUVMMajor is the major given to the fake nvidia-uvm nodes: the kernel
// assigns the real one dynamically, and this one is in the dynamic range and
// unused on the machines the tests run on.
const FakeUVMMajor = 511

// MakeFakeNVIDIADevRoot creates fake NVIDIA device nodes under root/dev, as
// a node with the driver loaded has them: nvidia<minor> (195:minor) for each
// minor, nvidiactl (195:255), nvidia-modeset (195:254) and
// nvidia-uvm/-tools (FakeUVMMajor:0 and :1). Opening them fails with ENXIO,
// since no driver serves them; the device-cgroup rules a container gets for
// them can still be checked. Needs CAP_MKNOD.
func MakeFakeNVIDIADevRoot(root string, minors []int) error {
	dev := filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	nodes := map[string][2]uint32{
		"nvidiactl":        {NVIDIAMajor, 255},
		"nvidia-modeset":   {NVIDIAMajor, 254},
		"nvidia-uvm":       {FakeUVMMajor, 0},
		"nvidia-uvm-tools": {FakeUVMMajor, 1},
	}
	for _, m := range minors {
		nodes[fmt.Sprintf("nvidia%d", m)] = [2]uint32{NVIDIAMajor, uint32(m)}
	}
	for name, mm := range nodes {
		p := filepath.Join(dev, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			return fmt.Errorf("harness: mknod %s: %w", p, err)
		}
		// mknod applies the umask.
		if err := os.Chmod(p, 0o666); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	return nil
}

// CudaProgInImage is where BuildCudaTestImage puts the shim's test program;
// its RUNPATH ($ORIGIN/fake) finds the fake driver and NVML next to it.
const CudaProgInImage = "/usr/local/bin/cudaprog"

// TenantNVMLInImage is where BuildCudaTestImage puts a tenant's own
// libnvidia-ml.so.1 (shim/test/evilnvml.c: EVILNVML=fail makes nvmlInit
// fail, EVILNVML=liar lists no process and samples 0 %), for a tenant that
// puts it first on LD_LIBRARY_PATH to steer the shim's NVML reads. The
// image is the tenant's: what it ships, any container can load.
const TenantNVMLInImage = "/opt/tenant/libnvidia-ml.so.1"

// BuildCudaTestImage writes a busybox image named ref into dir (see
// BuildBusyboxImage, with the image environment env) holding the shim's
// test program cudaprog and the fake CUDA driver and NVML it runs against,
// and a tenant's own NVML at TenantNVMLInImage, from shimBuild (shim/build after `make -C shim`), with the glibc libraries
// they and the shim need. It returns the tarball's path.
func BuildCudaTestImage(dir, ref, shimBuild string, env []string) (string, error) {
	files := []image.File{
		{Src: filepath.Join(shimBuild, "cudaprog"), Dst: CudaProgInImage},
		{Src: filepath.Join(shimBuild, "fake", "libcuda.so.1"), Dst: filepath.Dir(CudaProgInImage) + "/fake/libcuda.so.1"},
		{Src: filepath.Join(shimBuild, "fake", "libnvidia-ml.so.1"), Dst: filepath.Dir(CudaProgInImage) + "/fake/libnvidia-ml.so.1"},
		{Src: filepath.Join(shimBuild, "evilnvml", "libnvidia-ml.so.1"), Dst: TenantNVMLInImage},
	}
	libs := map[string]bool{}
	for _, p := range []string{files[0].Src, files[1].Src, files[2].Src, files[3].Src, filepath.Join(shimBuild, "libvgpu-shim.so")} {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("harness: %w (build the shim: make -C shim)", err)
		}
		deps, err := image.SharedLibs(p)
		if err != nil {
			return "", fmt.Errorf("harness: %w", err)
		}
		for _, d := range deps {
			// The fake libraries are placed above, not at their build path.
			if !strings.HasPrefix(d, filepath.Clean(shimBuild)+"/") {
				libs[d] = true
			}
		}
	}
	sorted := make([]string, 0, len(libs))
	for l := range libs {
		sorted = append(sorted, l)
	}
	sort.Strings(sorted)
	for _, l := range sorted {
		files = append(files, image.File{Src: l, Dst: l})
	}
	return BuildBusyboxImage(dir, ref, env, files...)
}

// WriteSimulatedGPU appends one [[gpu.simulated]] entry of a test node's
// config.
func WriteSimulatedGPU(b *strings.Builder, uuid, name string, memory uint64, minor int) {
	fmt.Fprintf(b, "\n[[gpu.simulated]]\nuuid = %q\nname = %q\nmemory = %d\nminor = %d\n", uuid, name, memory, minor)
}

// NodePaths are where a test node keeps what a real node keeps under /dev,
// /var/lib, /run and /usr/lib.
type NodePaths struct {
	DevRoot, StateDir, RunDir, Shim, NRISocket string
	// Driver, when set, is the [driver] table's body in place of
	// injection "none" and dev_root DevRoot.
	Driver string
	// Hook, when set, is paths.hook_path.
	Hook string
}

// WriteNodePaths appends the [driver], [paths] and [nri] sections of a test
// node's config: no driver to inject (the image brings a fake one), the fake
// device nodes under DevRoot, every path in the node's directories.
func WriteNodePaths(b *strings.Builder, p NodePaths) {
	driver := p.Driver
	if driver == "" {
		driver = fmt.Sprintf("injection = \"none\"\ndev_root = %q\n", p.DevRoot)
	}
	hook := ""
	if p.Hook != "" {
		hook = fmt.Sprintf("hook_path = %q\n", p.Hook)
	}
	fmt.Fprintf(b, `
[driver]
%s
[paths]
state_dir = %q
run_dir = %q
shim_path = %q
%s
[nri]
socket_path = %q
`, driver, p.StateDir, p.RunDir, p.Shim, hook, p.NRISocket)
}
