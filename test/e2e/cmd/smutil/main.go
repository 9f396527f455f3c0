// Command smutil prints the per-container SM utilisation that nri-vgpu
// measures on the host (internal/utilization) over one window, as JSON: it
// asks once (the window's start), waits -window, asks again and prints the
// second answer. The end-to-end tests run it on the host against the fake
// driver's NVML and state (FAKECUDA_STATE, FAKECUDA_DEVICES, and
// FAKECUDA_HOST_PIDS=1 so that the fake reports host pids, as the real
// driver does).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

func main() {
	libDir := flag.String("library-dir", "", "the `dir` holding libnvidia-ml.so.1")
	procRoot := flag.String("proc", "/proc", "the host's /proc")
	window := flag.Duration("window", 3*time.Second, "how long to measure")
	flag.Parse()
	src := utilization.New(config.Driver{DevRoot: "/", DriverRoot: "/", LibraryDirs: []string{*libDir}}, *procRoot)
	defer src.Close()
	if _, err := src.Samples(); err != nil {
		fmt.Fprintln(os.Stderr, "smutil:", err)
		os.Exit(1)
	}
	time.Sleep(*window)
	samples, err := src.Samples()
	if err != nil {
		fmt.Fprintln(os.Stderr, "smutil:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(samples); err != nil {
		fmt.Fprintln(os.Stderr, "smutil:", err)
		os.Exit(1)
	}
}
