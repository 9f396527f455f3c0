package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nri-vgpu/nri-vgpu/internal/health"
	"github.com/nri-vgpu/nri-vgpu/internal/promserver"
)

// NewRegistry returns a registry holding c and the standard Go runtime and
// process collectors (go_*, process_*).
func NewRegistry(c *Collector) *prometheus.Registry { return promserver.NewRegistry(c) }

// Server is the metrics HTTP server.
type Server = health.Server

// Start listens on addr ("host:port"; port 0 picks a free one) and serves
// Handler(NewRegistry(c), ready) until Shutdown. Listening happens before
// Start returns, so an address in use is reported to the caller.
func Start(addr string, c *Collector, ready health.Ready, logger *slog.Logger) (*Server, error) {
	return promserver.Start(addr, "metrics.listen, or --metrics-listen", NewRegistry(c), ready, logger)
}
