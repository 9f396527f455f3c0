// Command nri-vgpu-device-plugin is the kubelet device plugin of nri-vgpu: it
// advertises every GPU of the node as slices of the configured resource and
// answers each allocation with a signed annotation that the NRI plugin turns
// into device nodes and quotas.
//
// Signals: SIGTERM and SIGINT stop it cleanly (exit 0); SIGHUP reloads the
// simulated GPU list from the configuration file.
//
// The inventory command prints the GPUs the configured backend sees (the
// daemon's own backend code) as JSON and exits, to compare with nvidia-smi.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/daemonflags"
	"github.com/nri-vgpu/nri-vgpu/internal/deviceplugin"
	"github.com/nri-vgpu/nri-vgpu/internal/health"
	"github.com/nri-vgpu/nri-vgpu/internal/reload"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

const name = "nri-vgpu-device-plugin"

const usage = `usage: nri-vgpu-device-plugin [flags]             serve the kubelet device plugin
       nri-vgpu-device-plugin inventory [flags]   print the GPUs as JSON and exit

flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, hup)
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit status: 0 after a clean
// stop, 1 when it cannot serve, 2 for bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, reloadSig <-chan os.Signal) int {
	if len(args) > 0 && args[0] == "inventory" {
		return inventory(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	common := daemonflags.Register(fs, name)
	healthListen := fs.String("health-listen", "", "serve GET /healthz and /readyz (registered with the kubelet) on this host:port; empty: off (-metrics-listen serves them too)")
	if code, done := common.Parse(fs, args, stderr); done {
		return code
	}
	logger, cfg, code := common.Setup(stderr)
	if logger == nil {
		return code
	}
	logger.Info("starting", "program", name, "version", version.Version, "config", cmp.Or(cfg.Source, "(defaults)"),
		"resource", cfg.DevicePlugin.ResourceName, "backend", cfg.GPU.Backend, "socket_dir", cfg.DevicePlugin.SocketDir)

	backend, err := newBackend(cfg)
	if err != nil {
		logger.Error("cannot set up the GPU backend", "err", err)
		return 1
	}
	defer backend.Close()

	plugin, err := deviceplugin.New(deviceplugin.Options{Config: cfg, Backend: backend, Logger: logger})
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
