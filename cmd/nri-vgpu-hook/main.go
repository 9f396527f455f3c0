// Command nri-vgpu-hook is the pin hook of vGPU containers (Contract 3,
// internal/pin) alone, for where the binary computing the edits is not on
// the host: runc runs "nri-vgpu-hook hook pin" (oci.PinHook) on the host,
// before pivot_root, so the Helm chart copies this file out of its image
// beside the shim and points paths.hook_path at it. It is built without
// cgo and not as a PIE (Makefile) so that it runs on any host, whatever C
// library that host has or lacks.
//
// Run with argv[0] "nvidia-cdi-hook" it is NVIDIA's CDI hook instead
// (internal/cdihook): the hooks of the container edits nri-vgpu generates
// from the driver root (driver.injection = "generate") name this binary.
//
//	nri-vgpu-hook hook pin             (the container's state on stdin)
//	nvidia-cdi-hook update-ldcache ... (argv[0]; internal/cdihook)
package main

import (
	"os"

	"github.com/nri-vgpu/nri-vgpu/internal/cdihook"
	"github.com/nri-vgpu/nri-vgpu/internal/pin"
)

func main() {
	if cdihook.Invoked(os.Args[0]) {
		os.Exit(cdihook.Main(os.Args, os.Stderr))
	}
	os.Exit(pin.Main("nri-vgpu-hook", os.Args[1:], os.Stdin, os.Stderr))
}
