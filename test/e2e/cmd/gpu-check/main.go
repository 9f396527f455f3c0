// Command gpu-check runs the whole nri-vgpu chain from a bundle (make
// gpu-bundle) and checks what a GPU node must show: the device plugin's
// inventory, a GPU container made through CRI -> containerd -> NRI, SM
// shares, a container without a GPU, the fail-closed gate, and the shim's
// own validation. --mode nvml runs on a machine with an NVIDIA GPU and
// driver; --mode simulated runs the same checks against the fake driver.
// See README.md beside this file.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	// The context ends on SIGINT/SIGTERM; the cleanup runs on its own
	// contexts afterwards, so a signal never leaves the node dirty.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program: 0 when every check passed, 1 when one failed or
// the chain could not be started, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-check: %v\n", err)
		return 2
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	r := &report{w: stdout}
	var n *node
	safely(r, "setup", func() {
		var err error
		if n, err = startNode(ctx, o, r); err != nil {
			r.fail("setup", err.Error())
			return
		}
		runChecks(ctx, n, r)
	})
	if ctx.Err() != nil && context.Cause(ctx) != context.DeadlineExceeded {
		r.fail("interrupted", "a signal stopped the run; cleaning up")
	}
	if n == nil {
		n = &node{}
	}
	if cerr := n.close(); cerr != nil {
		r.fail("cleanup", cerr.Error())
	}
	r.summary(o.mode, n.gpuName, n.driverVersion, time.Since(start))
	if r.failed > 0 {
		fmt.Fprintf(stderr, "gpu-check: logs in %s\n", o.logs)
		return 1
	}
	return 0
}

// safely runs fn; a panic in it is a FAIL of name, and the cleanup after
// it still runs.
func safely(r *report, name string, fn func()) {
	defer func() {
		if p := recover(); p != nil {
			r.fail(name, fmt.Sprintf("panic: %v", p))
		}
	}()
	fn()
}
