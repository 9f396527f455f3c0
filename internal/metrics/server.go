package metrics

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nri-vgpu/nri-vgpu/internal/health"
)

// HTTP limits. A scrape reads every container's files, never waiting on a
// region's lock (a container can hold it for ever), so scrapeTimeout only
// leaves room for a slow disk without letting a stuck scrape hold a
// connection for ever; writeTimeout must outlast it so that the 503
// promhttp answers with still reaches the client.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	scrapeTimeout     = 30 * time.Second
	writeTimeout      = scrapeTimeout + 5*time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 16 << 10
	// Scrapes are serialised by the Collector; more than a few in flight
	// only queue up.
	maxInFlight = 4
)

// NewRegistry returns a registry holding c and the standard Go runtime and
// process collectors (go_*, process_*).
func NewRegistry(c *Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves GET /metrics from reg, and the health endpoints (GET
// /healthz and GET /readyz, see package health) with ready.
func Handler(reg *prometheus.Registry, ready health.Ready, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: promLogger{logger},
		// A collector error (none is expected: unreadable files are
		// counted, not returned) must not cost the whole scrape.
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            reg, // promhttp_metric_handler_errors_total
		MaxRequestsInFlight: maxInFlight,
		Timeout:             scrapeTimeout,
	}))
	health.Register(mux, ready)
	return mux
}

// promLogger routes promhttp's error log to slog.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) {
	p.l.Error("metrics: serving a scrape", "err", fmt.Sprint(v...))
}

// Server is the metrics HTTP server.
type Server = health.Server

// Start listens on addr ("host:port"; port 0 picks a free one) and serves
// Handler(NewRegistry(c), ready) until Shutdown. Listening happens before
// Start returns, so an address in use is reported to the caller.
func Start(addr string, c *Collector, ready health.Ready, logger *slog.Logger) (*Server, error) {
	if logger == nil {
		logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %q (metrics.listen, or --metrics-listen): %w", addr, err)
	}
	return health.Serve(ln, Handler(NewRegistry(c), ready, logger), health.Limits{
		ReadHeader:     readHeaderTimeout,
		Read:           readTimeout,
		Write:          writeTimeout,
		Idle:           idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
	}, "metrics", logger), nil
}
