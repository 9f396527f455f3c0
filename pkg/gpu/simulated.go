package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// maxMinor is the largest GPU minor number: the NVIDIA driver gives minor
// 255 to /dev/nvidiactl.
const maxMinor = 254

// Simulated is the backend for machines without NVIDIA GPUs: the GPUs are
// described in config ([[gpu.simulated]]). An entry with mig = true is a GPU
// in MIG mode: listed by ServedElsewhere, never by Devices. It is safe for
// concurrent use.
type Simulated struct {
	mu       sync.Mutex
	devices  []Device // every configured GPU, MIG mode included
	watchers map[*simWatcher]struct{}
	closed   bool
	done     chan struct{}
}

// simWatcher is one WatchHealth call: events are queued under Simulated.mu
// and delivered by the watcher's own goroutine, so Update and SetHealthy
// never wait for a slow consumer.
type simWatcher struct {
	queue  []HealthEvent // guarded by Simulated.mu
	notify chan struct{} // capacity 1: "the queue is not empty"
}

var (
	_ Backend         = (*Simulated)(nil)
	_ ElsewhereLister = (*Simulated)(nil)
)

// NewSimulated returns a backend with the given GPUs; see ValidateSimulated
// for what is rejected.
func NewSimulated(gpus []config.SimulatedGPU) (*Simulated, error) {
	devs, err := simulatedDevices(gpus)
	if err != nil {
		return nil, err
	}
	return &Simulated{
		devices:  devs,
		watchers: make(map[*simWatcher]struct{}),
		done:     make(chan struct{}),
	}, nil
}

// ValidateSimulated checks a [[gpu.simulated]] list: every entry needs a
// unique uuid, a unique minor number in 0..254 and a memory size above zero;
// a pci_bus_id, when given, must be a PCI address and unique.
func ValidateSimulated(gpus []config.SimulatedGPU) error {
	_, err := simulatedDevices(gpus)
	return err
}

func simulatedDevices(gpus []config.SimulatedGPU) ([]Device, error) {
	var errs []error
	uuids := make(map[string]int)
	minors := make(map[int]int)
	buses := make(map[string]int)
	devs := make([]Device, 0, len(gpus))
	for i, g := range gpus {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("entry %d (uuid %q): %s", i, g.UUID, fmt.Sprintf(format, args...)))
		}
		switch prev, dup := uuids[g.UUID]; {
		case g.UUID == "":
			bad("uuid is required")
		case dup:
			bad("uuid already used by entry %d", prev)
		default:
			uuids[g.UUID] = i
		}
		switch prev, dup := minors[g.Minor]; {
		case g.Minor < 0 || g.Minor > maxMinor:
			bad("minor %d out of range 0..%d", g.Minor, maxMinor)
		case dup:
			bad("minor %d already used by entry %d", g.Minor, prev)
		default:
			minors[g.Minor] = i
		}
		if g.Memory == 0 {
			bad("memory must be greater than zero")
		}
		bus := g.PCIBusID
		if bus == "" {
			// Bus 0 is the host bridge on real machines; start at 1.
			bus = fmt.Sprintf("0000:%02x:00.0", g.Minor+1)
		} else {
			norm, err := NormalizePCIBusID(bus)
			if err != nil {
				bad("%v", err)
			}
			bus = norm
		}
		if prev, dup := buses[bus]; dup {
			bad("pci_bus_id %s already used by entry %d", bus, prev)
		} else if bus != "" {
			buses[bus] = i
		}
		devs = append(devs, Device{
			Index:    i,
			UUID:     g.UUID,
			Name:     g.Name,
			Memory:   uint64(g.Memory),
			Minor:    g.Minor,
			PCIBusID: bus,
			Healthy:  g.IsHealthy(),
			MIG:      g.MIG,

			Architecture:          g.Architecture,
			Brand:                 g.Brand,
			CUDAComputeCapability: g.CUDAComputeCapability,
			DriverVersion:         g.DriverVersion,
			CUDADriverVersion:     g.CUDADriverVersion,
			PCIeRoot:              g.PCIeRoot,
		})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return devs, nil
}

// Name returns "simulated".
func (s *Simulated) Name() string { return "simulated" }

// Devices lists the GPUs not in MIG mode, in configuration order.
func (s *Simulated) Devices() ([]Device, error) {
	return s.list(false)
}

// ServedElsewhere lists the GPUs in MIG mode (mig = true), in configuration
// order.
func (s *Simulated) ServedElsewhere() ([]Device, error) {
	return s.list(true)
}

func (s *Simulated) list(mig bool) ([]Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	out := []Device{}
	for _, d := range s.devices {
		if d.MIG == mig {
			out = append(out, d)
		}
	}
	return out, nil
}

// Update replaces the GPUs after a configuration reload. The configuration
// is authoritative, health included. Watchers receive an event for every GPU
// whose health changed, for every GPU that is new (with its health) and for
// every GPU that is gone (as unhealthy), so that a consumer knows to re-read
// Devices. An invalid list is logged and leaves the GPUs as they were; use
// ValidateSimulated first to report it to the user.
func (s *Simulated) Update(gpus []config.SimulatedGPU) {
	devs, err := simulatedDevices(gpus)
	if err != nil {
		slog.Error("ignoring invalid simulated GPU configuration; keeping the previous GPUs", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	// Events are about the GPUs Devices lists: one that went into MIG
	// mode is gone from it, one that left MIG mode is new.
	old := make(map[string]Device, len(s.devices))
	for _, d := range s.devices {
		if !d.MIG {
			old[d.UUID] = d
		}
	}
	var events []HealthEvent
	toMIG := map[string]bool{}
	for _, d := range devs {
		if d.MIG {
			toMIG[d.UUID] = true
			continue
		}
		prev, ok := old[d.UUID]
		delete(old, d.UUID)
		switch {
		case !ok:
			events = append(events, HealthEvent{UUID: d.UUID, Healthy: d.Healthy, Reason: "added to the simulated configuration"})
		case prev.Healthy != d.Healthy:
			events = append(events, HealthEvent{UUID: d.UUID, Healthy: d.Healthy, Reason: "health changed in the simulated configuration"})
		}
	}
	// Removed GPUs, in their former order.
	for _, d := range s.devices {
		if _, gone := old[d.UUID]; gone {
			reason := "removed from the simulated configuration"
			if toMIG[d.UUID] {
				reason = "put in MIG mode: served elsewhere"
			}
			events = append(events, HealthEvent{UUID: d.UUID, Healthy: false, Reason: reason})
		}
	}
	s.devices = devs
	s.broadcastLocked(events)
}

// SetHealthy sets the health of the GPU with the given uuid, as NVML would on
// an XID error; watchers receive an event if it changed. An empty reason
// becomes "marked healthy" or "marked unhealthy".
func (s *Simulated) SetHealthy(uuid string, healthy bool, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	for i := range s.devices {
		d := &s.devices[i]
		if d.UUID != uuid {
			continue
		}
		if d.Healthy == healthy {
			return nil
		}
		d.Healthy = healthy
		if reason == "" {
			reason = "marked unhealthy"
			if healthy {
				reason = "marked healthy"
			}
		}
		s.broadcastLocked([]HealthEvent{{UUID: uuid, Healthy: healthy, Reason: reason}})
		return nil
	}
	return fmt.Errorf("simulated GPU %q not found", uuid)
}

func (s *Simulated) broadcastLocked(events []HealthEvent) {
	if len(events) == 0 {
		return
	}
	for w := range s.watchers {
		w.queue = append(w.queue, events...)
		select {
		case w.notify <- struct{}{}:
		default: // already signalled
		}
	}
}

// WatchHealth delivers the health changes made by Update and SetHealthy,
// in order, until ctx is done or the backend is closed; then it returns nil.
// Changes made before the call are not reported.
func (s *Simulated) WatchHealth(ctx context.Context, events chan<- HealthEvent) error {
	w := &simWatcher{notify: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	}()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return nil
		case <-w.notify:
		}
		s.mu.Lock()
		batch := w.queue
		w.queue = nil
		s.mu.Unlock()
		for _, ev := range batch {
			select {
			case events <- ev:
			case <-ctx.Done():
				return nil
			case <-s.done:
				return nil
			}
		}
	}
}

// Close makes running WatchHealth calls return; later calls fail with
// ErrClosed.
func (s *Simulated) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	return nil
}
