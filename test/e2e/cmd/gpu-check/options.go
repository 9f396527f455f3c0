package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// Modes of --mode.
const (
	modeNVML      = "nvml"
	modeSimulated = "simulated"
)

// options are the command line.
type options struct {
	bundle     string
	mode       string
	logs       string
	python     string
	driverRoot string
	timeout    time.Duration
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("gpu-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bundle, "bundle", "", "the unpacked bundle: bin/, lib/, fake/, test/, scripts/, validate/ (required)")
	fs.StringVar(&o.mode, "mode", "", `"nvml" (a machine with an NVIDIA GPU and driver) or "simulated" (the bundle's fake driver) (required)`)
	fs.StringVar(&o.logs, "logs", "", "directory for the logs of containerd, the daemons and every container (required; created)")
	fs.StringVar(&o.python, "python", "/opt/torch/.venv/bin/python3", "Python with PyTorch (nvml mode): run on the host and bind-mounted read-only into the containers")
	fs.StringVar(&o.driverRoot, "driver-root", "/", "where the NVIDIA driver is installed (nvml mode; simulated mode makes a fake one)")
	fs.DurationVar(&o.timeout, "timeout", 7*time.Minute, "the whole run's limit; each step has a smaller one of its own")
	if err := harness.ParseAll(fs, args); err != nil {
		return nil, err
	}
	var problems []string
	switch o.mode {
	case modeNVML, modeSimulated:
	default:
		problems = append(problems, fmt.Sprintf("--mode %q: want nvml or simulated", o.mode))
	}
	if o.logs == "" {
		problems = append(problems, "--logs is required")
	}
	if o.bundle == "" {
		problems = append(problems, "--bundle is required")
	} else if abs, err := filepath.Abs(o.bundle); err == nil {
		o.bundle = abs
		for _, f := range bundleFiles(o.mode) {
			if _, err := os.Stat(filepath.Join(abs, f)); err != nil {
				problems = append(problems, fmt.Sprintf("the bundle lacks %s", f))
			}
		}
	}
	if o.mode == modeNVML {
		if _, err := os.Stat(o.python); err != nil {
			problems = append(problems, fmt.Sprintf("--python: %v", err))
		}
	}
	if o.timeout <= time.Minute {
		problems = append(problems, fmt.Sprintf("--timeout %v: want more than a minute", o.timeout))
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	if abs, err := filepath.Abs(o.logs); err == nil {
		o.logs = abs
	}
	if err := os.MkdirAll(o.logs, 0o755); err != nil {
		return nil, fmt.Errorf("--logs: %w", err)
	}
	return o, nil
}

// bundleFiles are the bundle's files a run of mode uses (README.md lists
// them too).
func bundleFiles(mode string) []string {
	files := []string{
		"bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr", "bin/runc",
		"bin/nri-vgpu", "bin/nri-vgpu-device-plugin", "bin/pause", "bin/busybox",
		"lib/libvgpu-shim.so", "test/cudaprog", "test/nvmlprocs", "scripts/matmul.py", "scripts/torchmem.py",
	}
	if mode == modeSimulated {
		files = append(files, "fake/libcuda.so.1", "fake/libnvidia-ml.so.1")
	} else {
		files = append(files, "validate/validate.sh")
	}
	return files
}

// report prints one line per check and counts them.
type report struct {
	mu                      sync.Mutex
	w                       io.Writer
	passed, failed, skipped int
}

func (r *report) line(verdict string, count *int, name, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*count++
	// One line per check: whatever a message holds, it stays on it.
	what = strings.Join(strings.Fields(what), " ")
	fmt.Fprintf(r.w, "%s %s: %s\n", verdict, name, what)
}

func (r *report) pass(name, what string) { r.line("PASS", &r.passed, name, what) }
func (r *report) fail(name, what string) { r.line("FAIL", &r.failed, name, what) }
func (r *report) skip(name, why string)  { r.line("SKIP", &r.skipped, name, why) }

// check reports err as a FAIL of name, or seen as its PASS.
func (r *report) check(name, seen string, err error) {
	if err != nil {
		r.fail(name, err.Error())
		return
	}
	r.pass(name, seen)
}

func (r *report) summary(mode, gpu, driver string, elapsed time.Duration) {
	fmt.Fprintf(r.w, "SUMMARY: %d passed, %d failed, %d skipped (%s, %s, driver %s, %.0fs)\n",
		r.passed, r.failed, r.skipped, mode, orUnknown(gpu), orUnknown(driver), elapsed.Seconds())
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
