// Command dashboard writes the chart's Grafana dashboard,
// packaging/helm/nri-vgpu/dashboards/nri-vgpu.json, from its definition in
// dashboard.go (go generate ./hack/dashboard, or go run ./hack/dashboard
// FILE). The test in this directory fails when the committed file differs
// from a fresh generation.
package main

import (
	"fmt"
	"os"
)

//go:generate go run . ../../packaging/helm/nri-vgpu/dashboards/nri-vgpu.json

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard FILE")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
