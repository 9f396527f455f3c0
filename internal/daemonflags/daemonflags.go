// Package daemonflags holds the flags the node daemons (the device plugin, the
// DRA driver and the NRI plugin) share, and what each of them does with them before serving:
// parse, answer -h and -version, refuse stray arguments, build the logger,
// serve the metrics endpoint.
package daemonflags

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nri-vgpu/nri-vgpu/internal/health"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/internal/promserver"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Common is the shared flags of one daemon's flag set.
type Common struct {
	name      string
	config    *string
	logLevel  *string
	logFormat *string
	version   *bool
	metrics   *string
}

// Register adds -config, -log-level, -log-format, -version and
// -metrics-listen to fs, for the program called name.
func Register(fs *flag.FlagSet, name string) *Common {
	c := RegisterBase(fs, name)
	c.metrics = fs.String("metrics-listen", "", "serve GET /metrics, /healthz and /readyz on this `host:port`; empty: off")
	return c
}

// RegisterBase adds -config, -log-level, -log-format and -version to fs, for
// a program that serves its metrics its own way: the NRI plugin's
// -metrics-listen stands in for metrics.listen of the configuration, and
// its metrics come from the node's containers rather than from one
// collector. MetricsListen is empty and ServeMetrics does nothing then.
func RegisterBase(fs *flag.FlagSet, name string) *Common {
	return &Common{
		name:      name,
		config:    fs.String("config", "", "configuration `file` (default: $"+config.EnvPath+", else "+config.DefaultPath+")"),
		logLevel:  fs.String("log-level", "info", "log `level`: debug, info, warn or error"),
		logFormat: fs.String("log-format", "text", "log `format`: text or json"),
		version:   fs.Bool("version", false, "print the version and exit"),
	}
}

// Parse parses args into fs. done reports that the program is to exit now
// with code: 0 after -h or -version (the version printed to stderr), 2 for
// bad flags or any argument left over (said on stderr).
func (c *Common) Parse(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", c.name, fs.Args())
		return 2, true
	}
	if *c.version {
		fmt.Fprintf(stderr, "%s %s\n", c.name, version.Version)
		return 0, true
	}
	return 0, false
}

// VersionAsked is -version, for a program that parses fs itself.
func (c *Common) VersionAsked() bool { return *c.version }

// ConfigPath is -config: empty for the default.
func (c *Common) ConfigPath() string { return *c.config }

// Logger builds the logger -log-level and -log-format ask for, writing to
// stderr, and makes it slog's default (the GPU backends log through that).
func (c *Common) Logger(stderr io.Writer) (*slog.Logger, error) {
	logger, err := logging.New(stderr, *c.logLevel, *c.logFormat)
	if err != nil {
		return nil, err
	}
	slog.SetDefault(logger)
	return logger, nil
}

// Setup builds the logger (see Logger) and loads the configuration -config
// names, as each daemon does once its flags are parsed. When either fails,
// it says why (a bad log flag on stderr, the configuration in the log) and
// code is the exit status: 2 for the flag, 1 for the configuration.
func (c *Common) Setup(stderr io.Writer) (logger *slog.Logger, cfg *config.Config, code int) {
	logger, err := c.Logger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", c.name, err)
		return nil, nil, 2
	}
	cfg, err = config.LoadResolved(c.ConfigPath())
	if err != nil {
		logger.Error("cannot load the configuration", "err", err)
		return nil, nil, 1
	}
	return logger, cfg, 0
}

// MetricsListen is -metrics-listen: empty for no metrics endpoint.
func (c *Common) MetricsListen() string {
	if c.metrics == nil {
		return ""
	}
	return *c.metrics
}

// ShutdownTimeout bounds how long a stop waits for scrapes and probes in
// flight.
const ShutdownTimeout = 2 * time.Second

// ServeMetrics serves GET /metrics from a registry of cs (with the Go and
// process collectors and nri_vgpu_build_info) and the health endpoints
// with ready on -metrics-listen, if set. It returns the function that
// stops the server, a no-op when there is none. A port that cannot be
// bound is logged and not fatal: the daemon's work never depends on its
// metrics.
func (c *Common) ServeMetrics(ready health.Ready, logger *slog.Logger, cs ...prometheus.Collector) (stop func()) {
	if c.MetricsListen() == "" {
		return func() {}
	}
	reg := promserver.NewRegistry(append(cs, promserver.BuildInfo())...)
	srv, err := promserver.Start(c.MetricsListen(), "--metrics-listen", reg, ready, logger)
	if err != nil {
		logger.Error("metrics endpoint unavailable", "err", err)
		return func() {}
	}
	logger.Info("serving metrics", "addr", srv.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}
