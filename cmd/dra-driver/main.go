// Command nri-vgpu-dra-driver is the Dynamic Resource Allocation driver of
// nri-vgpu (a kubelet DRA plugin): it publishes the node's DRA GPUs
// (config [dra]) as devices with memory and cores capacities that claims
// share, and prepares each claim the scheduler places on them as host
// state that the NRI plugin turns into device nodes and quotas.
//
// Signals: SIGTERM and SIGINT stop it cleanly (exit 0); SIGHUP reloads the
// simulated GPU list from the configuration file. Prepared claims stay
// prepared across restarts.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/dra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := dra.Main(ctx, os.Args[1:], os.Stderr, hup)
	stop()
	os.Exit(code)
}
