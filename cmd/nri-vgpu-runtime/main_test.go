package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/pin/pintest"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// TestRunsNVIDIACDIHooks: the wrapper is the hook binary of the driver
// edits it generates when paths.hook_path is empty, so run as
// nvidia-cdi-hook (argv[0], as those hooks name it) it runs NVIDIA's hook
// commands instead of taking runc's command line: create-symlinks makes
// its link in the container's root given by the state on stdin.
func TestRunsNVIDIACDIHooks(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nri-vgpu-runtime")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bundle := t.TempDir()
	lib := filepath.Join(bundle, "rootfs", "usr", "lib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	cmd := &exec.Cmd{Path: bin, Args: []string{oci.CDIHookName, "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"},
		Stdin: strings.NewReader(`{"ociVersion":"1.2.0","id":"c1","status":"creating","bundle":"` + bundle + `"}`)}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nvidia-cdi-hook create-symlinks: %v\n%s", err, out)
	}
	if target, err := os.Readlink(filepath.Join(lib, "libcuda.so")); err != nil || target != "libcuda.so.1" {
		t.Errorf("link %q, %v; want libcuda.so.1", target, err)
	}
}
