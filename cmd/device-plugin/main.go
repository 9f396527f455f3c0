// Command nri-vgpu-device-plugin is the kubelet device plugin of nri-vgpu: it
// advertises every GPU of the node as slices of the configured resource and
// answers each allocation with a signed annotation that the NRI plugin turns
// into device nodes and quotas.
//
// Signals: SIGTERM and SIGINT stop it cleanly (exit 0); SIGHUP reloads the
// simulated GPU list from the configuration file.
//
// The inventory command prints the GPUs the configured backend sees (the
// daemon's own backend code) as JSON and exits, to compare with nvidia-smi.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/deviceplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := deviceplugin.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, hup)
	stop()
	os.Exit(code)
}
