// Package reload re-reads a daemon's configuration on a signal and applies
// what can change while it runs: the simulated GPU list, so that a test (or
// an operator of a simulated node) can change GPU health without a restart.
// Everything else takes effect on restart, and a warning says so.
package reload

import (
	"context"
	"log/slog"
	"os"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// Watcher applies re-read configurations to one running daemon.
type Watcher struct {
	// ConfigPath is the file to re-read ("" resolves as at start).
	ConfigPath string
	// Current is the configuration the daemon runs with.
	Current *config.Config
	// Backend is the daemon's GPU backend; only a simulated one is updated.
	Backend gpu.Backend
	// RestartOnly names what differs between the running and the re-read
	// configuration that only a restart applies; "" when nothing does.
	RestartOnly func(current, next *config.Config) string
	// Applied, when set, runs after the simulated GPUs were updated (the
	// device plugin re-reads its devices there); an error is logged.
	Applied func() error
	Logger  *slog.Logger
}

// Run reloads on every value from sig until ctx ends.
func (w Watcher) Run(ctx context.Context, sig <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		w.Once()
	}
}

// Once re-reads the configuration and applies it; it reports whether the
// simulated GPUs were updated. A configuration that does not load or
// validate leaves everything as it runs.
func (w Watcher) Once() bool {
	cfg, err := config.LoadResolved(w.ConfigPath)
	if err != nil {
		w.Logger.Error("reload: keeping the running configuration", "err", err)
		return false
	}
	if w.RestartOnly != nil {
		if what := w.RestartOnly(w.Current, cfg); what != "" {
			w.Logger.Warn("reload: " + what + " changes take effect on restart")
		}
	}
	sim, ok := w.Backend.(*gpu.Simulated)
	if !ok || cfg.GPU.Backend != config.BackendSimulated {
		w.Logger.Info("reload: nothing to apply live (only simulated GPUs are reloaded)")
		return false
	}
	if err := gpu.ValidateSimulated(cfg.GPU.Simulated); err != nil {
		w.Logger.Error("reload: invalid gpu.simulated; keeping the running GPUs", "err", err)
		return false
	}
	sim.Update(cfg.GPU.Simulated)
	if w.Applied != nil {
		if err := w.Applied(); err != nil {
			w.Logger.Error("reload: re-reading the GPUs failed", "err", err)
			return false
		}
	}
	w.Logger.Info("reload: simulated GPUs updated", "gpus", len(cfg.GPU.Simulated))
	return true
}
