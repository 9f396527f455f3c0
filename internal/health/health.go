// Package health serves the daemons' health endpoints for Kubernetes probes
// and monitoring: GET /healthz answers while the process serves HTTP (a
// liveness probe), GET /readyz answers 200 only while the daemon does its
// job (the device plugin registered with the kubelet, the NRI plugin
// connected to the runtime) and 503 with the reason otherwise (a readiness
// probe, which also paces a DaemonSet's rolling update).
//
// Liveness deliberately ignores readiness: both daemons reconnect by
// themselves, and a restart would only add the container's back-off to the
// time they are away.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Ready reports nil while the daemon is ready, else why it is not.
type Ready func() error

// Register adds GET /healthz and GET /readyz to mux. ready nil means always
// ready.
func Register(mux *http.ServeMux, ready Ready) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			if err := ready(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}

// Handler serves only the two endpoints.
func Handler(ready Ready) http.Handler {
	mux := http.NewServeMux()
	Register(mux, ready)
	return mux
}

// The endpoints answer at once; anything slower is a client to cut off.
var limits = Limits{
	ReadHeader:     5 * time.Second,
	Read:           5 * time.Second,
	Write:          10 * time.Second,
	Idle:           time.Minute,
	MaxHeaderBytes: 8 << 10,
}

// Limits bound what a client can make a server wait for or hold.
type Limits struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
}

// Server is an HTTP server of the daemons' endpoints (health here, metrics
// in package promserver).
type Server struct {
	name string
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Start listens on addr ("host:port"; port 0 picks a free one) and serves
// Handler(ready) until Shutdown. Listening happens before Start returns, so
// an address in use is reported to the caller; flag names the option that
// set addr, for the error.
func Start(addr, flag string, ready Ready, logger *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health: listen on %q (%s): %w", addr, flag, err)
	}
	return Serve(ln, Handler(ready), limits, "health", logger), nil
}

// Serve serves h on ln, within lim, until Shutdown; name starts its log
// lines and errors.
func Serve(ln net.Listener, h http.Handler, lim Limits, name string, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Server{
		name: name,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: lim.ReadHeader,
			ReadTimeout:       lim.Read,
			WriteTimeout:      lim.Write,
			IdleTimeout:       lim.Idle,
			MaxHeaderBytes:    lim.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(name+": server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Shutdown stops accepting connections and waits, until ctx is done, for
// requests in flight; then it closes whatever is left.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		// ctx ran out: cut the connections still open.
		err = errors.Join(fmt.Errorf("%s: shutdown: %w", s.name, err), s.srv.Close())
	}
	<-s.done
	return err
}
