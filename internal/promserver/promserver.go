// Package promserver is the HTTP side of the node daemons' Prometheus
// endpoints, shared by the NRI plugin (package metrics), the device plugin
// and the DRA driver: a registry with the Go and process collectors and
// nri_vgpu_build_info, GET /metrics served from it next to the health
// endpoints (package health), and the server's limits.
package promserver

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
	"github.com/nri-vgpu/nri-vgpu/internal/version"
)

// HTTP limits. A scrape of the NRI plugin reads every container's files,
// never waiting on a region's lock (a container can hold it for ever), so
// scrapeTimeout only leaves room for a slow disk without letting a stuck
// scrape hold a connection for ever; writeTimeout must outlast it so that
// the 503 promhttp answers with still reaches the client. The daemons'
// scrapes read memory only and are far inside these bounds.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	scrapeTimeout     = 30 * time.Second
	writeTimeout      = scrapeTimeout + 5*time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 16 << 10
	// More than a few scrapes in flight only queue up.
	maxInFlight = 4
)

// Limits are the server limits of every metrics endpoint.
var Limits = health.Limits{
	ReadHeader:     readHeaderTimeout,
	Read:           readTimeout,
	Write:          writeTimeout,
	Idle:           idleTimeout,
	MaxHeaderBytes: maxHeaderBytes,
}

// NewRegistry returns a registry holding cs and the standard Go runtime and
// process collectors (go_*, process_*).
func NewRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	return reg
}

// BuildInfo is nri_vgpu_build_info, for the daemons whose own collector
// does not export it (the NRI plugin's collector does).
func BuildInfo() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "nri_vgpu_build_info",
		Help:        "Always 1; the version label is that of the running build.",
		ConstLabels: prometheus.Labels{"version": version.Version},
	}, func() float64 { return 1 })
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

// Start listens on addr ("host:port"; port 0 picks a free one) and serves
// Handler(reg, ready) within Limits until Shutdown. Listening happens
// before Start returns, so an address in use is reported to the caller;
// option names what set addr, for the error.
func Start(addr, option string, reg *prometheus.Registry, ready health.Ready, logger *slog.Logger) (*health.Server, error) {
	if logger == nil {
		logger = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %q (%s): %w", addr, option, err)
	}
	return health.Serve(ln, Handler(reg, ready, logger), Limits, "metrics", logger), nil
}
