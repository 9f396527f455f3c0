// Command kubectl-nri_vgpu is `kubectl nri-vgpu`, the cluster view of
// nri-vgpu: nodes, their GPUs, and the device-plugin containers and DRA
// claims that hold them, with their limits and use, from the API server and
// each node's nri-vgpu metrics read through the API server's pod proxy
// (internal/clusterview). kubectl finds it on the PATH by its name.
//
//	kubectl nri-vgpu [-o wide|json|yaml] [-n NAMESPACE | -A] [--node NAME]
//	                 [--kubeconfig FILE] [--context NAME] [kubectl's other connection flags]
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/clusterview"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := clusterview.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
