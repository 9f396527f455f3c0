// Command nri-vgpu-runtime is the OCI runtime wrapper that gives Docker
// containers their vGPU. Register it in /etc/docker/daemon.json:
//
//	{"runtimes": {"nri-vgpu": {"path": "/usr/bin/nri-vgpu-runtime"}}}
//
// and run `docker run --runtime nri-vgpu -e NVIDIA_VISIBLE_DEVICES=0
// -e NRI_VGPU_MEMORY=4GiB -e NRI_VGPU_CORES=30 …`. It takes runc's command
// line (Docker passes it), so its configuration file comes from
// $NRI_VGPU_CONFIG or /etc/nri-vgpu/config.toml, not from a flag. Run with
// argv[0] "nvidia-cdi-hook" it runs NVIDIA's CDI hooks (internal/cdihook):
// the hooks of the driver edits it generates (driver.injection =
// "generate") name this binary unless paths.hook_path names another.
package main

import (
	"os"

	"github.com/nri-vgpu/nri-vgpu/internal/cdihook"
	"github.com/nri-vgpu/nri-vgpu/internal/ociruntime"
)

func main() {
	if cdihook.Invoked(os.Args[0]) {
		os.Exit(cdihook.Main(os.Args, os.Stderr))
	}
	os.Exit(ociruntime.Main(os.Args, os.Stderr))
}
