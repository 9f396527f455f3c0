//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// driverVersion is the version the fake driver root's files carry.
const driverVersion = "580.159.04"

// driverLibDir is where the fake driver root holds its libraries: outside
// the loader's usual directories, as on the GPU machine.
const driverLibDir = "/usr/local/nvidia/lib64"

// noDriverImage holds busybox, the glibc libraries, and cudaprog-norpath
// (cudaprog without its rpath to the fake driver): no NVIDIA file at all.
const noDriverImage = "nri-vgpu.test/no-driver:e2e"

// buildNoDriverImage writes noDriverImage into dir.
func buildNoDriverImage(t *testing.T, dir string) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	build := filepath.Join(root, "shim", "build")
	prog := filepath.Join(build, "cudaprog-norpath")
	files := []image.File{{Src: prog, Dst: "/usr/local/bin/cudaprog-norpath", Mode: 0o755}}
	libs := map[string]bool{}
	// The glibc libraries of the program, of the shim and of the driver
	// the container will get, resolved through the rpath build.
	for _, p := range []string{filepath.Join(build, "cudaprog"), filepath.Join(build, "libvgpu-shim.so"),
		filepath.Join(build, "fake", "libcuda.so.1"), filepath.Join(build, "fake", "libnvidia-ml.so.1")} {
		deps, err := image.SharedLibs(p)
		if err != nil {
			t.Fatalf("%v (build the shim: make -C shim)", err)
		}
		for _, d := range deps {
			if !strings.HasPrefix(d, build+"/") {
				libs[d] = true
			}
		}
	}
	if _, err := os.Stat(prog); err != nil {
		t.Fatalf("%v (build the shim: make -C shim)", err)
	}
	sorted := make([]string, 0, len(libs))
	for l := range libs {
		sorted = append(sorted, l)
	}
	sort.Strings(sorted)
	for _, l := range sorted {
		if strings.Contains(l, "nvidia") || strings.Contains(l, "libcuda") {
			t.Fatalf("the image would hold %s", l)
		}
		files = append(files, image.File{Src: l, Dst: l})
	}
	out, err := harness.BuildBusyboxImage(dir, noDriverImage, nil, files...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDriverFilesGenerated: on a node without the NVIDIA container toolkit
// and without a CDI spec, driver.injection = "auto" generates the driver's
// edits from the driver root with NVIDIA's CDI library. A GPU container
// from an image with no NVIDIA file gets the driver's libraries from the
// root's /usr/local/nvidia/lib64 (not a directory the loader knows), and
// NVIDIA's hooks, run by the static nri-vgpu-hook as nvidia-cdi-hook, put
// them into the container's loader cache: a CUDA program without rpath
// finds libcuda.so.1 and sees its GPU. `nri-vgpu status` says where the
// driver files come from.
func TestDriverFilesGenerated(t *testing.T) {
	// The hooks run by the chart's static nri-vgpu-hook (paths.hook_path),
	// and by nri-vgpu itself where no hook_path is set (the packages).
	t.Run("nri-vgpu-hook", func(t *testing.T) {
		if binaries.hookErr != nil {
			t.Fatalf("nri-vgpu-hook: %v", binaries.hookErr)
		}
		testDriverFilesGenerated(t, binaries.hook, binaries.hook)
	})
	t.Run("nri-vgpu", func(t *testing.T) { testDriverFilesGenerated(t, "", binaries.nriPlugin) })
}

// testDriverFilesGenerated runs the scenario with paths.hook_path set to
// hookPath; hookBin is the binary the hooks must name.
func testDriverFilesGenerated(t *testing.T, hookPath, hookBin string) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	driverRoot := filepath.Join(base, "driver")
	fake := harness.FakeDriverRoot{LibDir: driverLibDir, Version: driverVersion, ShimBuild: filepath.Join(root, "shim", "build")}
	for _, g := range testGPUs {
		fake.GPUs = append(fake.GPUs, harness.FakeGPU{UUID: g.UUID, Name: g.Name, Memory: g.Memory, SMs: 108, Minor: g.Minor})
	}
	if err := harness.MakeFakeDriverRoot(driverRoot, fake); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(base, "cdi") // empty: no host CDI spec
	if err := os.Mkdir(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	v := startVGPU(t, harness.ContainerdVersion, vgpuOptions{
		driver:   fmt.Sprintf("injection = \"auto\"\ndev_root = \"/\"\ndriver_root = %q\ncdi_dirs = [%q]\n", driverRoot, cdiDir),
		hookPath: hookPath,
		// What the fake NVML presents to nri-vgpu's generation.
		nriEnv: fake.Env(),
	})
	ctx := testContext(t, 3*time.Minute)
	if err := v.c.Import(ctx, buildNoDriverImage(t, t.TempDir())); err != nil {
		t.Fatal(err)
	}
	pod := gpuPod("driver-files", 1)
	pod.Containers[0].Image = noDriverImage
	rp := v.mustRun(t, ctx, pod)
	id := rp.ContainerID("main")
	uuid := v.allocationOf(t, rp, "main").GPUs[0].UUID

	t.Run("libraries", func(t *testing.T) {
		if got := strings.TrimSpace(v.sh(t, ctx, id, "readlink "+driverLibDir+"/libcuda.so.1")); got != "libcuda.so."+driverVersion {
			t.Errorf("%s/libcuda.so.1 -> %q, want libcuda.so.%s", driverLibDir, got, driverVersion)
		}
		// The container's loader cache, written by update-ldcache.
		for _, lib := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
			res, err := v.c.Exec(ctx, id, "grep", "-c", driverLibDir+"/"+lib, "/etc/ld.so.cache")
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 {
				t.Errorf("/etc/ld.so.cache of the container does not name %s/%s (exit %d, %s)", driverLibDir, lib, res.ExitCode, res.Stderr)
			}
		}
	})

	t.Run("CUDA without rpath", func(t *testing.T) {
		// Linked against libcuda.so.1 (the loader finds it through the
		// cache), then the cudart way (dlopen); the slice is what the
		// shim shows, and NVML (dlopen libnvidia-ml.so.1) sees the GPU.
		for _, mode := range []string{"direct", "rt12"} {
			script := fmt.Sprintf("%s cudaprog-norpath -m %s init info:4GiB:4GiB nvml:0:4GiB:0:4GiB alloc:1GiB info:3GiB:4GiB", fakeDriverEnv(uuid, "/tmp"), mode)
			res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", script)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 {
				t.Errorf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr)
			}
		}
	})

	t.Run("hooks", func(t *testing.T) {
		spec := v.runtimeSpec(t, ctx, id)
		var commands []string
		for _, h := range spec.Hooks.CreateContainer {
			if len(h.Args) > 1 && h.Args[0] == "nvidia-cdi-hook" {
				if h.Path != hookBin {
					t.Errorf("hook %v runs %s, want %s", h.Args, h.Path, hookBin)
				}
				commands = append(commands, h.Args[1])
			}
		}
		t.Logf("NVIDIA CDI hooks of the container: %v", commands)
		for _, want := range []string{"update-ldcache", "create-symlinks", "enable-cuda-compat", "disable-device-node-modification"} {
			if !strings.Contains(" "+strings.Join(commands, " ")+" ", " "+want+" ") {
				t.Errorf("no %s hook among %v", want, commands)
			}
		}
	})

	t.Run("status", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, binaries.nriPlugin, "--config", v.configPath, "status").CombinedOutput()
		if err != nil {
			t.Fatalf("nri-vgpu status: %v\n%s", err, out)
		}
		want := fmt.Sprintf("driver files: generated from driver root %s (NVIDIA CDI library; driver %s; libraries in %s)\n", driverRoot, driverVersion, driverLibDir)
		if !strings.Contains(string(out), want) {
			t.Errorf("nri-vgpu status:\n%s\nwant the line %q", out, want)
		}
	})
}
