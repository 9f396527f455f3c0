// Package nrivgpu is the program nri-vgpu, which cmd/nri-vgpu runs: the NRI
// plugin, and the node's status, configure, version and pin hook commands.
package nrivgpu

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/cdihook"
	"github.com/nri-vgpu/nri-vgpu/internal/configure"
	"github.com/nri-vgpu/nri-vgpu/internal/daemonflags"
	"github.com/nri-vgpu/nri-vgpu/internal/health"
	"github.com/nri-vgpu/nri-vgpu/internal/metrics"
	"github.com/nri-vgpu/nri-vgpu/internal/nriplugin"
	"github.com/nri-vgpu/nri-vgpu/internal/pin"
	"github.com/nri-vgpu/nri-vgpu/internal/status"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

const name = "nri-vgpu"

const usage = `usage: nri-vgpu [global flags]                 run the NRI plugin
       nri-vgpu [global flags] status [-o table|json]
                                                 per GPU, the vGPU containers with their
                                                 slices, memory limit, memory used, cores
       nri-vgpu configure containerd|docker [flags]
                                                 prepare the container runtime
       nri-vgpu version
       nri-vgpu hook pin                         the createContainer hook of vGPU containers
                                                 (run by the container runtime)

global flags:
`

// Main is the program, given its whole command line (argv[0] included: run
// as nvidia-cdi-hook, it is that hook); SIGTERM and SIGINT stop it. It
// returns the exit status.
func Main(argv []string, stdout, stderr io.Writer) int {
	if cdihook.Invoked(argv[0]) {
		return cdihook.Main(argv, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, argv[1:], stdout, stderr)
}

// run is the whole program; it returns the exit status: 0 on success or a
// clean stop, 1 on failure, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	common := daemonflags.RegisterBase(fs, name)
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus metrics on this `host:port`, in place of metrics.listen of the configuration")
	healthListen := fs.String("health-listen", "", "serve GET /healthz and /readyz (connected to the runtime) on this `host:port`; empty: off")
	hookPath := fs.String("hook-path", "", "host `path` of the binary the container runtime runs as the pin hook of vGPU containers (nri-vgpu-hook), in place of paths.hook_path of the configuration")
	hostProc := fs.String("host-proc", "/proc", "`directory` where the host's /proc is: the metrics map the GPU processes NVML reports, by host pid, to their containers")
	// Not common.Parse: the arguments left are the command, and -version
	// prints to stdout, as the version command does.
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *hookPath != "" && !filepath.IsAbs(*hookPath) {
		// runc would look a relative path up in a directory of its own.
		fmt.Fprintf(stderr, "%s: --hook-path must be an absolute path, not %q\n", name, *hookPath)
		return 2
	}
	rest := fs.Args()
	cmd := ""
	if len(rest) > 0 {
		cmd, rest = rest[0], rest[1:]
	}
	if common.VersionAsked() {
		cmd = "version"
	}
	switch cmd {
	case "version":
		fmt.Fprintf(stdout, "%s %s\n", name, version.Version)
		return 0
	case "configure":
		return configure.Main(rest, stdout, stderr)
	case "hook":
		return pin.Main(name, fs.Args(), os.Stdin, stderr)
	case "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	case "status", "":
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n", name, cmd)
		fs.Usage()
		return 2
	}

	logOut := stderr
	if cmd == "" {
		logOut = pluginLogSink(stderr, nriplugin.StartedByRuntime())
	}
	logger, err := common.Logger(logOut)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	cfg, err := config.LoadResolved(common.ConfigPath())
	if err != nil {
		if logOut != stderr {
			// Started by containerd: stderr goes nowhere.
			logger.Error("cannot load the configuration", "err", err)
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	if cmd == "status" {
		return runStatus(cfg, rest, stdout, stderr)
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", name, rest)
		return 2
	}
	if *metricsListen != "" {
		cfg.Metrics.Listen = *metricsListen
	}
	if *hookPath != "" {
		// The Helm chart's: its copy of nri-vgpu-hook beside the shim on
		// the host, whatever config the release gives.
		cfg.Paths.HookPath = *hookPath
	}
	if err := runPlugin(ctx, cfg, *healthListen, *hostProc, logger); err != nil {
		logger.Error("stopped", "err", err)
		return 1
	}
	return 0
}

// setNRILogger routes the NRI library's process-wide logger; tests, which
// run several plugins and runtimes in one process, leave it alone.
var setNRILogger = nriplugin.SetNRILogger

// metricsShutdownTimeout bounds how long a stop waits for scrapes in flight.
const metricsShutdownTimeout = 5 * time.Second

// runPlugin runs the NRI plugin, with its metrics endpoint when
// cfg.Metrics.Listen is set (reading processes' cgroups under hostProc)
// and its health endpoints on healthListen when that is.
func runPlugin(ctx context.Context, cfg *config.Config, healthListen, hostProc string, logger *slog.Logger) error {
	setNRILogger(logger)
	logger.Info("starting", "program", name, "version", version.Version, "config", cmp.Or(cfg.Source, "(defaults)"),
		"started_by_runtime", nriplugin.StartedByRuntime(), "socket", cfg.NRI.SocketPath, "hook_path", cmp.Or(cfg.Paths.HookPath, "(this binary)"), "injection", cfg.Driver.Injection,
		"hide_unrequested", cfg.NRI.HideUnrequested, "exempt", cfg.NRI.Exempt)
	if _, err := os.Stat(cfg.Paths.ShimPath); err != nil {
		// Not fatal: containers without allocation must still be handled.
		logger.Error("shim library missing: vGPU containers will be refused until it exists", "shim_path", cfg.Paths.ShimPath, "err", err)
	}
	if cfg.Paths.HookPath != "" {
		if _, err := os.Stat(cfg.Paths.HookPath); err != nil {
			// Seen here when the host path is mounted into this pod, as
			// the chart does.
			logger.Error("pin hook missing: the runtime will fail to create vGPU containers until it exists", "hook_path", cfg.Paths.HookPath, "err", err)
		}
	}
	key, err := allockey.LoadOrCreate(cfg.Paths.StateDir)
	if err != nil {
		return fmt.Errorf("allocation key: %w", err)
	}
	host := oci.NewHost(cfg, true)
	defer host.Close()
	inv := nriplugin.NewBackendInventory(cfg)
	defer inv.Close()
	if devs, err := inv.Devices(); err != nil {
		logger.Error("cannot list GPUs; allocations are refused until it works", "err", err)
	} else {
		logger.Info("GPU inventory", "backend", cfg.GPU.Backend, "gpus", len(devs))
	}
	p, err := nriplugin.New(nriplugin.Options{Config: cfg, Key: key, Host: host, Inventory: inv, Logger: logger})
	if err != nil {
		return err
	}
	// Neither endpoint is fatal: without the plugin, containers would start
	// without their limits, and GPUs would not be hidden from the others.
	if cfg.Metrics.Listen != "" {
		opts := metrics.Options{Inventory: inv, Logger: logger}
		// Set only when there is one: a nil *utilization.NVML would be a
		// non-nil Source.
		if util := utilizationSource(cfg, hostProc, logger); util != nil {
			defer util.Close()
			opts.Utilization = util
		}
		srv, err := metrics.Start(cfg.Metrics.Listen, metrics.NewCollectorWith(cfg, opts), p.Ready, logger)
		if err != nil {
			logger.Error("metrics endpoint unavailable", "err", err)
		} else {
			logger.Info("serving metrics", "addr", srv.Addr().String())
			defer shutdown(srv.Shutdown, "metrics", logger)
		}
	}
	if healthListen != "" {
		srv, err := health.Start(healthListen, "--health-listen", p.Ready, logger)
		if err != nil {
			logger.Error("health endpoint unavailable", "err", err)
		} else {
			logger.Info("serving health endpoints", "addr", srv.Addr().String())
			defer shutdown(srv.Shutdown, "health", logger)
		}
	}
	if err := p.Run(ctx); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// shutdown stops an HTTP endpoint, waiting metricsShutdownTimeout at most for
// the requests in flight.
func shutdown(stop func(context.Context) error, what string, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
	defer cancel()
	if err := stop(ctx); err != nil {
		logger.Warn("stopping the "+what+" endpoint", "err", err)
	}
}

func runStatus(cfg *config.Config, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name+" status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("o", "table", "output `format`: table or json")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s status: unexpected arguments %q\n", name, fs.Args())
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "%s status: -o %q: want table or json\n", name, *output)
		return 2
	}
	var devices []gpu.Device
	if b, err := gpu.New(cfg); err != nil {
		fmt.Fprintf(stderr, "%s status: GPU inventory unavailable, listing GPUs by UUID only: %v\n", name, err)
	} else {
		devices, err = b.Devices()
		if err != nil {
			fmt.Fprintf(stderr, "%s status: GPU inventory unavailable, listing GPUs by UUID only: %v\n", name, err)
		} else if l, ok := b.(gpu.ElsewhereLister); ok {
			elsewhere, err := l.ServedElsewhere()
			if err != nil {
				fmt.Fprintf(stderr, "%s status: cannot list the GPUs served elsewhere (MIG mode): %v\n", name, err)
			}
			devices = append(devices, elsewhere...)
		}
		b.Close()
	}
	report, err := status.Collect(cfg, devices, status.RegionUsage)
	if err != nil {
		fmt.Fprintf(stderr, "%s status: %v\n", name, err)
		return 1
	}
	if *output == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s status: %v\n", name, strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}
