// Command demo is `make demo`: the whole nri-vgpu chain on two simulated
// GPUs, with real parts. It starts containerd (NRI on, nri-vgpu
// pre-registered as an NRI plugin), runs the device plugin against a kubelet
// simulator, runs pods through CRI the way kubelet does, and shows from
// inside the containers what each pod received and that the shim holds a
// program to its slice. Everything it starts lives in temporary directories
// that it removes when it ends, on success, failure or Ctrl-C.
//
// It needs root, what hack/e2e-deps.sh installs (containerd v2.4, runc,
// busybox-static) and what `make build` builds (bin/, shim/build/):
//
//	hack/e2e-deps.sh && make build && go run ./test/e2e/cmd/demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

const name = "demo"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// stop only after the cleanup: a second Ctrl-C must not kill the demo
	// half-way through removing what it started.
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line.
type options struct {
	harness.ChainFlags
	// containerdVersion is what the containerd in containerdBin reports.
	containerdVersion string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	o := &options{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.Register(fs, root)
	if err := harness.ParseAll(fs, args); err != nil {
		return nil, err
	}
	return o, nil
}

// missing lists the files the demo needs that are not there, with what
// makes each.
func (o *options) missing() []string {
	need := []struct{ path, from string }{
		{filepath.Join(o.BinDir, "nri-vgpu"), "make build"},
		{filepath.Join(o.BinDir, "nri-vgpu-device-plugin"), "make build"},
		{filepath.Join(o.ShimBuild, "libvgpu-shim.so"), "make build"},
		{filepath.Join(o.ShimBuild, "cudaprog"), "make build"},
		{filepath.Join(o.ShimBuild, "fake", "libcuda.so.1"), "make build"},
		{filepath.Join(o.ShimBuild, "fake", "libnvidia-ml.so.1"), "make build"},
		{harness.BusyboxPath, "hack/e2e-deps.sh installs busybox-static"},
	}
	var out []string
	for _, n := range need {
		if _, err := os.Stat(n.path); err != nil {
			out = append(out, fmt.Sprintf("%s (%s)", n.path, n.from))
		}
	}
	return out
}

// run is the whole program; it returns the exit status: 0 when every step
// passed, 1 when one failed, 2 for bad usage, 130 when interrupted.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	p := &printer{w: stdout}
	start := time.Now()
	o.containerdVersion = harness.ContainerdVersion
	if v, err := harness.BinaryVersion(o.ContainerdBin); err == nil {
		o.containerdVersion = v
	}
	p.intro(o)

	if err := harness.Preflight(o.ContainerdBin, o.Runc); err != nil {
		fmt.Fprintf(stderr, "\n%s: %v\n", name, err)
		return 1
	}
	if m := o.missing(); len(m) > 0 {
		fmt.Fprintf(stderr, "\n%s: missing %s\n", name, strings.Join(m, ", "))
		return 1
	}
	// A demo killed before it could clean up (kill -9, a closed terminal)
	// leaves its directories and processes; remove them first.
	swept, err := harness.SweepStale(o.Runc)
	for _, d := range swept {
		p.printf("  removed %s, left behind by an earlier run\n", d)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: cleaning up after an earlier run: %v\n", name, err)
		return 1
	}

	p.printf("\nSetting up\n")
	// The logs outlive the node directory, to be read after a failure; the
	// next run (demo or end-to-end tests) sweeps them with the rest.
	logDir, err := harness.MkdirTemp("demo-logs")
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	base, err := harness.MkdirTemp("demo")
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		os.RemoveAll(logDir)
		return 1
	}
	n := newNode(base, logDir)
	d := &demo{opts: o, p: p, n: n}
	p.printf("  node directory %s (config, fake /dev, run_dir, state_dir, images)\n", base)

	runErr := d.run(ctx)
	interrupted := ctx.Err() != nil
	if interrupted {
		p.printf("\ninterrupted; cleaning up\n")
	}
	// The cleanup uses contexts of its own, whatever ended the run.
	closeErr := n.close()
	switch {
	case interrupted && closeErr == nil:
		// Stopped on purpose and cleaned up: nothing to look into.
		fmt.Fprintf(stderr, "%s: interrupted; everything it started is removed\n", name)
		os.RemoveAll(logDir)
		return 130
	case runErr != nil && !interrupted:
		fmt.Fprintf(stderr, "\n%s FAILED: %v\n", name, runErr)
	}
	if closeErr != nil {
		fmt.Fprintf(stderr, "%s: cleaning up: %v\n", name, closeErr)
	}
	if runErr != nil || closeErr != nil {
		fmt.Fprintf(stderr, "%s: component logs kept in %s (containerd.log, nri-%s.log, device-plugin.log, kubeletsim.log)\n", name, logDir, nriPluginName)
		if interrupted {
			return 130
		}
		return 1
	}
	os.RemoveAll(logDir)
	p.printf("\nCleaned up: pods, containerd, device plugin and %s are gone.\n", base)
	p.printf("nri-vgpu demo: all steps passed in %.0fs\n", time.Since(start).Seconds())
	return 0
}

// printer writes the story.
type printer struct{ w io.Writer }

func (p *printer) printf(format string, args ...any) { fmt.Fprintf(p.w, format, args...) }

// section starts a numbered part of the story.
func (p *printer) section(n int, title string) { p.printf("\n[%d] %s\n", n, title) }

// block prints text indented by prefix, one line at a time.
func (p *printer) block(prefix, text string) {
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if strings.TrimSpace(l) == "" {
			p.printf("\n")
			continue
		}
		p.printf("%s%s\n", prefix, l)
	}
}

func (p *printer) intro(o *options) {
	p.printf(`nri-vgpu demo: GPU slices with hard limits, end to end on two simulated GPUs

Uses (hack/e2e-deps.sh installs what is missing; make build builds the rest):
  containerd %s    %s
  runc                 %s
  busybox-static       %s  (the shell of the demo's images)
  nri-vgpu binaries    %s
  shim, fake driver    %s
Starts, each in a temporary directory that is removed at the end (even on
failure or Ctrl-C): containerd with NRI and nri-vgpu, the device plugin, a
kubelet simulator, and pods run through CRI.
`, o.containerdVersion, o.ContainerdBin, o.Runc, harness.BusyboxPath, o.BinDir, o.ShimBuild)
}

// stepError names the step of the demo that failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// progress runs one setup step, printing its name and how it went.
func (p *printer) progress(step string, fn func() error) error {
	p.printf("  %-58s", step)
	t := time.Now()
	if err := fn(); err != nil {
		p.printf(" FAILED\n")
		return &stepError{step: step, err: err}
	}
	p.printf(" ok (%.1fs)\n", time.Since(t).Seconds())
	return nil
}
