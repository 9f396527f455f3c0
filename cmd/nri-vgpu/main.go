// Command nri-vgpu is the NRI plugin of nri-vgpu and its operator tool.
//
// Without a command it runs the NRI plugin: started by containerd from its
// plugin directory (as "10-nri-vgpu", with no arguments) it serves the
// connection containerd hands it; started by hand or by systemd it connects
// to nri.socket_path and reconnects whenever containerd restarts. SIGTERM and
// SIGINT stop it cleanly.
//
//	nri-vgpu [--config FILE] [--log-level LEVEL] [--log-format text|json]
//	         [--metrics-listen ADDR] [--health-listen ADDR] [--hook-path FILE]
//	         [--host-proc DIR]
//	nri-vgpu [--config FILE] status [-o table|json]
//	nri-vgpu configure containerd|docker [flags]
//	nri-vgpu version
//	nri-vgpu hook pin   (run by the container runtime: internal/pin)
//	nvidia-cdi-hook ... (argv[0]; the hooks of generated driver edits:
//	                    internal/cdihook)
package main

import (
	"os"

	"github.com/nri-vgpu/nri-vgpu/internal/nrivgpu"
)

func main() { os.Exit(nrivgpu.Main(os.Args, os.Stdout, os.Stderr)) }
