//go:build e2e

package docker

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// The node the tests simulate: two 4 GiB GPUs.
const (
	uuid0 = "GPU-0d0c0b0a-0000-4000-8000-000000000000"
	uuid1 = "GPU-1d1c1b1a-1111-4111-8111-111111111111"
)

// busyboxImage is the containers' image.
const busyboxImage = "nri-vgpu.test/docker-busybox:e2e"

// cudaprogDir holds the shim's test program and the fake driver beside it
// (the program's rpath is $ORIGIN/fake), when the image has them.
var cudaprogDir = path.Dir(harness.CudaProgInImage)

// env is what TestMain set up for the tests.
var env struct {
	skip    string // why the tests cannot run, when they cannot
	dir     string
	d       *daemon
	cfg     string // the config file
	wrapper string // nri-vgpu-runtime, as daemon.json names it
	runDir  string
	state   string
	// haveShim: the shim, its fake driver and test program were built
	// (make -C shim) and are in the image.
	haveShim bool
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docker e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Geteuid() != 0 {
		env.skip = "needs root (dockerd, device nodes)"
		return m.Run(), nil
	}
	if err := ensurePackages(func(f string, a ...any) { fmt.Fprintf(os.Stderr, "docker e2e: "+f+"\n", a...) }); err != nil {
		env.skip = "docker.io cannot be installed: " + err.Error()
		return m.Run(), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A short path: dockerd and containerd put unix sockets under it.
	dir, err := os.MkdirTemp("/tmp", "nri-vgpu-docker-")
	if err != nil {
		return 0, err
	}
	env.dir = dir
	defer func() {
		// Region file systems of containers that were not removed.
		if err := mountinfo.UnmountUnder(dir); err != nil {
			fmt.Fprintln(os.Stderr, "docker e2e: cleanup:", err)
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "docker e2e: cleanup:", err)
		}
	}()
	root, err := harness.RepoRoot()
	if err != nil {
		return 0, err
	}

	wrapper := filepath.Join(dir, "bin", "nri-vgpu-runtime")
	env.wrapper = wrapper
	if err := harness.GoBuild(ctx, "./cmd/nri-vgpu-runtime", wrapper, false); err != nil {
		return 0, err
	}
	shimBuild := filepath.Join(root, "shim", "build")
	shim := filepath.Join(shimBuild, "libvgpu-shim.so")
	env.haveShim = allExist(shim, filepath.Join(shimBuild, "cudaprog"),
		filepath.Join(shimBuild, "fake", "libcuda.so.1"), filepath.Join(shimBuild, "fake", "libnvidia-ml.so.1"))
	if !env.haveShim {
		fmt.Fprintln(os.Stderr, "docker e2e: shim/build lacks the shim, its fake driver or cudaprog (make -C shim); the shim is replaced by a placeholder and its test skipped")
		shim = filepath.Join(dir, "libvgpu-shim.so")
		if err := os.WriteFile(shim, []byte("placeholder\n"), 0o755); err != nil {
			return 0, err
		}
	}
	img, err := buildImage(dir, shimBuild)
	if err != nil {
		return 0, err
	}
	devRoot := filepath.Join(dir, "devroot")
	// Fake nodes of the two simulated GPUs: without a driver, opening one
	// fails with ENXIO, but the container gets them and their cgroup rules
	// as on a real node.
	if err := harness.MakeFakeNVIDIADevRoot(devRoot, []int{0, 1}); err != nil {
		return 0, err
	}

	env.runDir = filepath.Join(dir, "run")
	env.state = filepath.Join(dir, "state")
	env.cfg = filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf(`# nri-vgpu docker e2e: two simulated 4 GiB GPUs over fake device nodes.
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = %q
name = "Simulated GPU"
memory = "4GiB"
minor = 0
[[gpu.simulated]]
uuid = %q
name = "Simulated GPU"
memory = "4GiB"
minor = 1

[driver]
dev_root = %q
cdi_dirs = [%q]

[paths]
state_dir = %q
run_dir = %q
shim_path = %q
`, uuid0, uuid1, devRoot, filepath.Join(dir, "cdi"), env.state, env.runDir, shim)
	if err := os.WriteFile(env.cfg, []byte(cfg), 0o644); err != nil {
		return 0, err
	}

	d, err := startDaemon(ctx, dir, wrapper, []string{"NRI_VGPU_CONFIG=" + env.cfg})
	if err != nil {
		return 0, err
	}
	env.d = d
	defer func() {
		if err := d.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "docker e2e: stopping dockerd:", err)
		}
	}()
	if out, err := d.docker(ctx, "load", "-i", img); err != nil {
		return 0, fmt.Errorf("docker load: %w: %s", err, out)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "dockerd log (tail):\n%s\n", d.logTail(40))
	}
	return code, nil
}

func allExist(paths ...string) bool {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// buildImage writes the test image: busybox, and with the shim built, the
// shim's test program with the fake driver and the glibc libraries that it
// and the preloaded shim need.
func buildImage(dir, shimBuild string) (string, error) {
	if env.haveShim {
		return harness.BuildCudaTestImage(dir, busyboxImage, shimBuild, nil)
	}
	return harness.BuildBusyboxImage(dir, busyboxImage, nil)
}
