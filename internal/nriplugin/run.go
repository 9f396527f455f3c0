package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// PluginName is the name the plugin registers under; containerd's plugin
// directory holds it as "<index>-nri-vgpu".
const PluginName = "nri-vgpu"

// Reconnection backoff of an external plugin.
const (
	backoffMin = 500 * time.Millisecond
	backoffMax = 30 * time.Second
	// A connection that lasted this long resets the backoff.
	backoffReset = time.Minute
)

// StartedByRuntime reports whether the runtime started this process from its
// plugin directory and handed it a connection (NRI_PLUGIN_SOCKET).
func StartedByRuntime() bool {
	return os.Getenv(api.PluginSocketEnvVar) != ""
}

// Run serves the runtime until ctx is done. Started by the runtime, it serves
// the connection it was given and returns when that closes (the runtime
// starts it again). Started by hand or by systemd, it dials
// nri.socket_path and, whenever the connection is lost (containerd
// restarted), dials again with exponential backoff.
func (p *Plugin) Run(ctx context.Context) error {
	// A CDI spec generated from the driver root is ready, or under way,
	// before the runtime's first container.
	go p.resolveDriverFiles()
	byRuntime := StartedByRuntime()
	backoff := backoffMin
	for {
		started := time.Now()
		err := p.serveOnce(ctx, byRuntime)
		if ctx.Err() != nil {
			return nil
		}
		if byRuntime {
			if err != nil {
				return fmt.Errorf("nri connection: %w", err)
			}
			p.log.Info("runtime closed the connection")
			return nil
		}
		if time.Since(started) > backoffReset {
			backoff = backoffMin
		}
		p.log.Warn("NRI connection lost or refused; reconnecting", "socket", p.cfg.NRI.SocketPath, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// serveOnce connects once and serves until the connection closes or ctx is
// done.
func (p *Plugin) serveOnce(ctx context.Context, byRuntime bool) error {
	opts := []stub.Option{
		stub.WithLogger(slogAdapter{p.log}),
		// A runtime that knows failure policies fails a container whose
		// creation this plugin could not handle (timeout, lost connection)
		// instead of starting it without its limits.
		stub.WithFailurePolicy(&api.FailurePolicy{FailRequest: true}),
		stub.WithOnClose(func() { p.connected.Store(false) }),
	}
	if !byRuntime {
		opts = append(opts,
			stub.WithPluginName(PluginName),
			stub.WithPluginIdx(p.cfg.NRI.PluginIndex),
			stub.WithSocketPath(p.cfg.NRI.SocketPath),
		)
	}
	s, err := stub.New(p, opts...)
	if err != nil {
		return fmt.Errorf("create NRI stub: %w", err)
	}
	p.mu.Lock()
	p.stub = s
	p.mu.Unlock()
	defer p.connected.Store(false)
	return s.Run(ctx)
}

// Ready reports nil while the plugin is connected to the runtime and
// synchronized with it, that is while containerd hands it every container
// creation; else why not. It answers the readiness probe.
func (p *Plugin) Ready() error {
	if p.connected.Load() {
		return nil
	}
	if StartedByRuntime() {
		return errors.New("not synchronized with the runtime yet")
	}
	return fmt.Errorf("not connected to the runtime's NRI socket %s", p.cfg.NRI.SocketPath)
}

// slogAdapter routes the NRI library's logging to slog.
type slogAdapter struct{ l *slog.Logger }

var _ nrilog.Logger = slogAdapter{}

func (a slogAdapter) Debugf(ctx context.Context, format string, args ...any) {
	a.l.DebugContext(ctx, fmt.Sprintf(format, args...), "component", "nri")
}

func (a slogAdapter) Infof(ctx context.Context, format string, args ...any) {
	a.l.InfoContext(ctx, fmt.Sprintf(format, args...), "component", "nri")
}

func (a slogAdapter) Warnf(ctx context.Context, format string, args ...any) {
	a.l.WarnContext(ctx, fmt.Sprintf(format, args...), "component", "nri")
}

func (a slogAdapter) Errorf(ctx context.Context, format string, args ...any) {
	a.l.ErrorContext(ctx, fmt.Sprintf(format, args...), "component", "nri")
}

// SetNRILogger makes the NRI library log through l everywhere (also code
// paths that do not take a logger option).
func SetNRILogger(l *slog.Logger) { nrilog.Set(slogAdapter{l}) }

// BackendInventory is an Inventory over the configured GPU backend, opened
// on first use and again after a failure, so that the plugin starts (and
// hides GPUs from containers that did not ask for one) even while the
// driver is not loaded yet.
type BackendInventory struct {
	cfg *config.Config
	mu  sync.Mutex
	b   gpu.Backend
}

// NewBackendInventory returns an inventory over cfg's GPU backend.
func NewBackendInventory(cfg *config.Config) *BackendInventory {
	return &BackendInventory{cfg: cfg}
}

// Devices implements Inventory.
func (i *BackendInventory) Devices() ([]gpu.Device, error) {
	return i.list(func(b gpu.Backend) ([]gpu.Device, error) { return b.Devices() })
}

// ServedElsewhere implements gpu.ElsewhereLister: the GPUs in MIG mode, for
// the metrics.
func (i *BackendInventory) ServedElsewhere() ([]gpu.Device, error) {
	return i.list(func(b gpu.Backend) ([]gpu.Device, error) {
		l, ok := b.(gpu.ElsewhereLister)
		if !ok {
			return nil, nil
		}
		return l.ServedElsewhere()
	})
}

// list asks the backend, opened if it is not (first use, or closed after a
// failure), for a list of devices; a backend that says it is closed is
// opened again at the next call.
func (i *BackendInventory) list(ask func(gpu.Backend) ([]gpu.Device, error)) ([]gpu.Device, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.b == nil {
		b, err := gpu.New(i.cfg)
		if err != nil {
			return nil, fmt.Errorf("GPU backend %q: %w", i.cfg.GPU.Backend, err)
		}
		i.b = b
	}
	devs, err := ask(i.b)
	if err != nil {
		if errors.Is(err, gpu.ErrClosed) {
			i.b = nil
		}
		return nil, fmt.Errorf("GPU backend %q: %w", i.cfg.GPU.Backend, err)
	}
	return devs, nil
}

// Close closes the backend.
func (i *BackendInventory) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.b == nil {
		return nil
	}
	err := i.b.Close()
	i.b = nil
	return err
}
