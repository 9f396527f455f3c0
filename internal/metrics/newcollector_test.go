package metrics

import (
	"log/slog"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// NewCollector returns a collector over cfg's run_dir and inv, without SM
// utilisation; inv and logger may be nil (see Options). The daemon builds
// its collector with NewCollectorWith; the tests that need no utilisation
// use this shorthand.
func NewCollector(cfg *config.Config, inv Inventory, logger *slog.Logger) *Collector {
	return NewCollectorWith(cfg, Options{Inventory: inv, Logger: logger})
}
