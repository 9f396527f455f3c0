package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"

	"github.com/nri-vgpu/nri-vgpu/internal/daemonflags"
	"github.com/nri-vgpu/nri-vgpu/internal/health"
	"github.com/nri-vgpu/nri-vgpu/internal/reload"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// ProgramName is the device plugin's program, cmd/device-plugin.
const ProgramName = "nri-vgpu-device-plugin"

const usage = `usage: nri-vgpu-device-plugin [flags]             serve the kubelet device plugin
       nri-vgpu-device-plugin inventory [flags]   print the GPUs as JSON and exit

flags:
`

// Main is the whole program, given its arguments (less the program name) and
// the signals that reload the configuration; ctx ends it. It returns the
// exit status: 0 after a clean stop, 1 when it cannot serve, 2 for bad
// usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, reloadSig <-chan os.Signal) int {
	if len(args) > 0 && args[0] == "inventory" {
		return inventoryMain(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet(ProgramName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	common := daemonflags.Register(fs, ProgramName)
	healthListen := fs.String("health-listen", "", "serve GET /healthz and /readyz (registered with the kubelet) on this host:port; empty: off (-metrics-listen serves them too)")
	if code, done := common.Parse(fs, args, stderr); done {
		return code
	}
	logger, cfg, code := common.Setup(stderr)
	if logger == nil {
		return code
	}
	logger.Info("starting", "program", ProgramName, "version", version.Version, "config", cmp.Or(cfg.Source, "(defaults)"),
		"resource", cfg.DevicePlugin.ResourceName, "backend", cfg.GPU.Backend, "socket_dir", cfg.DevicePlugin.SocketDir)

	backend, err := newBackend(cfg)
	if err != nil {
		logger.Error("cannot set up the GPU backend", "err", err)
		return 1
	}
	defer backend.Close()

	plugin, err := New(Options{Config: cfg, Backend: backend, Logger: logger})
	if errors.Is(err, gpu.ErrNoDriver) {
		logger.Error("no NVIDIA driver on this node; nothing to advertise. Install the driver, or set gpu.backend = \"simulated\" to test without GPUs", "err", err)
		return 1
	}
	if err != nil {
		logger.Error("cannot start the device plugin", "err", err)
		return 1
	}

	defer common.ServeMetrics(plugin.Ready, logger, plugin.Collector())()
	// The metrics endpoint serves the probes too: the same address names
	// one server.
	if *healthListen != "" && *healthListen != common.MetricsListen() {
		srv, err := health.Start(*healthListen, "--health-listen", plugin.Ready, logger)
		if err != nil {
			// Not fatal: the probes fail and say so; the node's GPUs are
			// still advertised.
			logger.Error("health endpoint unavailable", "err", err)
		} else {
			logger.Info("serving health endpoints", "addr", srv.Addr().String())
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), daemonflags.ShutdownTimeout)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
		}
	}

	go reload.Watcher{ConfigPath: common.ConfigPath(), Current: cfg, Backend: backend, Logger: logger,
		RestartOnly: restartOnly, Applied: plugin.Refresh}.Run(ctx, reloadSig)

	if err := plugin.Run(ctx); err != nil {
		logger.Error("device plugin failed", "err", err)
		return 1
	}
	logger.Info("stopped")
	return 0
}

// restartOnly names what a reload does not apply to the device plugin.
func restartOnly(current, next *config.Config) string {
	if !reflect.DeepEqual(next.DevicePlugin, current.DevicePlugin) || next.Paths.StateDir != current.Paths.StateDir ||
		next.GPU.Backend != current.GPU.Backend {
		return "device_plugin, paths.state_dir and gpu.backend"
	}
	return ""
}
