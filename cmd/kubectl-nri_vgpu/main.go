// Command kubectl-nri_vgpu is `kubectl nri-vgpu`, the cluster view of
// nri-vgpu; kubectl finds it on the PATH by its name. For each node that
// offers vGPUs it lists each GPU with the memory and SM time it has handed
// out and in use, and under it the device-plugin containers and the DRA
// claims (with their pods) that hold it: memory used, limit and peak, SM
// utilisation and limit, and the time the limiter held each back.
//
//	kubectl nri-vgpu [-o wide|json|yaml] [-n NAMESPACE | -A] [--node NAME]
//	                 [--kubeconfig FILE] [--context NAME] [kubectl's other connection flags]
//
// It reads nodes, pods, ResourceSlices and ResourceClaims from the API
// server, and each node's nri-vgpu metrics through the API server's proxy to
// the node's NRI plugin pod (the Helm chart's metrics.enabled=true). Its
// user needs to list nodes, pods, resourceslices and resourceclaims and to
// get pods/proxy in the chart's namespace. Without --namespace it lists
// every namespace's pods and claims, whatever the kubeconfig context's
// namespace.
//
// A value that is not known is "-": a series the node does not serve, or a
// node whose metrics could not be read. Such a node is listed with what the
// API server knows, and an error naming the node and what failed goes to
// standard error. The exit status is 0 when the view was printed, even if
// some node's metrics could not be read; 1 when the API server could not be
// read; 2 for bad usage. -o json and -o yaml print the structure
// documented in docs/kubectl-plugin.md.
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
