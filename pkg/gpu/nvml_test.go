package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
)

const a100Memory = 40 << 30 // dgxa100 mock: A100-SXM4-40GB

// newDGX returns the 8×A100 mock with what the mock leaves unset filled in:
// PCI info with the bus id the way the driver formats it (eight-digit domain,
// upper case; buses 0x0a..0x11 so that hex digits are exercised) and support
// for both health event types.
func newDGX(t *testing.T) *server.Server {
	t.Helper()
	srv := dgxa100.New()
	for i := range srv.Devices {
		d := dgxDevice(srv, i)
		bus := 0x0a + i
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range []byte(fmt.Sprintf("%08X:%02X:00.0", 0, bus)) {
				p.BusId[j] = int8(c)
			}
			p.Bus = uint32(bus)
			return p, nvml.SUCCESS
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
				nvml.EventTypeSingleBitEccError | nvml.EventTypePState, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	return srv
}

func dgxDevice(srv *server.Server, i int) *server.Device {
	return srv.Devices[i].(*server.Device)
}

// fakeSysfs returns a sysfs root whose bus/pci/devices holds a link for
// each PCI address in links, to the target given (relative to that
// directory, as the kernel makes them, or absolute).
func fakeSysfs(t *testing.T, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "bus", "pci", "devices")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for bus, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, bus)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNVMLDevices(t *testing.T) {
	srv := newDGX(t)
	var inits atomic.Int32
	srv.InitFunc = func() nvml.Return { inits.Add(1); return nvml.SUCCESS }
	n := NewNVML(srv)
	// GPUs 0 to 3 behind a switch of root complex pci0000:00, 4 to 6
	// directly under pci0000:80; GPU 7 has no sysfs entry.
	links := map[string]string{}
	for i := range 4 {
		links[fmt.Sprintf("0000:%02x:00.0", 0x0a+i)] = fmt.Sprintf("../../../devices/pci0000:00/0000:00:01.0/0000:09:00.0/0000:%02x:00.0", 0x0a+i)
	}
	for i := 4; i < 7; i++ {
		links[fmt.Sprintf("0000:%02x:00.0", 0x0a+i)] = fmt.Sprintf("../../../devices/pci0000:80/0000:%02x:00.0", 0x0a+i)
	}
	n.sysfs = fakeSysfs(t, links)
	t.Cleanup(func() { _ = n.Close() })
	roots := []string{"pci0000:00", "pci0000:00", "pci0000:00", "pci0000:00", "pci0000:80", "pci0000:80", "pci0000:80", ""}

	got, err := n.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(got) != 8 {
		t.Fatalf("Devices: got %d GPUs, want 8", len(got))
	}
	for i, d := range got {
		want := Device{
			Index:    i,
			UUID:     dgxDevice(srv, i).UUID,
			Name:     "Mock NVIDIA A100-SXM4-40GB",
			Memory:   a100Memory,
			Minor:    i,
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x0a+i),
			Healthy:  true,
			// The dgxa100 mock: an Ampere of brand NVIDIA, compute
			// capability 8.0, driver 550.54.15 with CUDA 12040.
			Architecture:          "Ampere",
			Brand:                 "Nvidia",
			CUDAComputeCapability: "8.0",
			DriverVersion:         "550.54.15",
			CUDADriverVersion:     "12.4",
			PCIeRoot:              roots[i],
		}
		if d != want {
			t.Errorf("GPU %d:\n got %+v\nwant %+v", i, d, want)
		}
	}

	// The inventory is read once; NVML is initialized once.
	if _, err := n.Devices(); err != nil {
		t.Fatalf("second Devices: %v", err)
	}
	if c := inits.Load(); c != 1 {
		t.Errorf("nvmlInit called %d times, want 1", c)
	}
}

// What the driver does not report, names unknown, or that sysfs does not
// resolve, is left empty rather than guessed, and the GPU is still listed.
func TestNVMLUnknownDescriptions(t *testing.T) {
	srv := newDGX(t)
	srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
	srv.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	d0 := dgxDevice(srv, 0)
	d0.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS }
	d0.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return nvml.BRAND_UNKNOWN, nvml.SUCCESS }
	d0.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	d1 := dgxDevice(srv, 1)
	d1.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d1.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	n := NewNVML(srv)
	n.sysfs = fakeSysfs(t, map[string]string{
		// Not under a root complex.
		"0000:0a:00.0": "../../../devices/virtual/0000:0a:00.0",
		// A link to another device.
		"0000:0b:00.0": "../../../devices/pci0000:00/0000:0c:00.0",
	})
	// An absolute link into the same sysfs resolves.
	abs := filepath.Join(n.sysfs, "devices", "pci0000:40", "0000:40:01.0", "0000:0c:00.0")
	if err := os.Symlink(abs, filepath.Join(n.sysfs, "bus", "pci", "devices", "0000:0c:00.0")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })

	got, err := n.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(got) != 8 {
		t.Fatalf("Devices: got %d GPUs, want 8", len(got))
	}
	type described struct{ arch, brand, cc, driver, cuda, root string }
	want := []described{
		{"", "", "", "", "", ""},
		{"", "", "8.0", "", "", ""},
		{"Ampere", "Nvidia", "8.0", "", "", "pci0000:40"},
	}
	for i, w := range want {
		d := got[i]
		if g := (described{d.Architecture, d.Brand, d.CUDAComputeCapability, d.DriverVersion, d.CUDADriverVersion, d.PCIeRoot}); g != w {
			t.Errorf("GPU %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestNVMLSkipsMIG(t *testing.T) {
	srv := newDGX(t)
	dgxDevice(srv, 2).MigMode = nvml.DEVICE_MIG_ENABLE
	// A GPU that is not MIG-capable answers NOT_SUPPORTED: it is kept.
	dgxDevice(srv, 5).GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	n := NewNVML(srv)
	t.Cleanup(func() { _ = n.Close() })

	got, err := n.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	var idx []int
	for _, d := range got {
		idx = append(idx, d.Index)
		if d.UUID == dgxDevice(srv, 2).UUID {
			t.Errorf("MIG-enabled GPU 2 listed: %+v", d)
		}
	}
	if want := []int{0, 1, 3, 4, 5, 6, 7}; !slices.Equal(idx, want) {
		t.Errorf("indices: got %v, want %v", idx, want)
	}

	// The GPU in MIG mode is served elsewhere: listed there, with what
	// status shows of it, even though its memory size cannot be read.
	dgxDevice(srv, 2).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
	n2 := NewNVML(srv)
	t.Cleanup(func() { _ = n2.Close() })
	elsewhere, err := n2.ServedElsewhere()
	if err != nil {
		t.Fatalf("ServedElsewhere: %v", err)
	}
	want := []Device{{Index: 2, UUID: dgxDevice(srv, 2).UUID, Name: "Mock NVIDIA A100-SXM4-40GB", Minor: 2, PCIBusID: "0000:0c:00.0", Healthy: true, MIG: true}}
	if !slices.Equal(elsewhere, want) {
		t.Errorf("ServedElsewhere:\n got %+v\nwant %+v", elsewhere, want)
	}
	// A pending change to MIG mode is not the current mode: served here.
	srv3 := newDGX(t)
	dgxDevice(srv3, 4).GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
	}
	n3 := NewNVML(srv3)
	t.Cleanup(func() { _ = n3.Close() })
	if got, err := n3.ServedElsewhere(); err != nil || len(got) != 0 {
		t.Errorf("ServedElsewhere with a pending MIG change = %+v, %v; want none", got, err)
	}
	if got, err := n3.Devices(); err != nil || len(got) != 8 {
		t.Errorf("Devices with a pending MIG change: %d GPUs, %v; want all 8", len(got), err)
	}
}

func TestNVMLInitErrors(t *testing.T) {
	tests := []struct {
		name         string
		ret          nvml.Return
		wantNoDriver bool
		wantMsg      []string
	}{
		{
			name:         "library not found",
			ret:          nvml.ERROR_LIBRARY_NOT_FOUND,
			wantNoDriver: true,
			wantMsg:      []string{"NVIDIA driver not found", "libnvidia-ml.so.1 could not be loaded", `gpu.backend = "simulated"`},
		},
		{
			name:         "kernel driver not loaded",
			ret:          nvml.ERROR_DRIVER_NOT_LOADED,
			wantNoDriver: true,
			wantMsg:      []string{"NVIDIA driver not found", "kernel driver is not running"},
		},
		{
			name:    "other failure",
			ret:     nvml.ERROR_NO_PERMISSION,
			wantMsg: []string{"initializing NVML", "ERROR_NO_PERMISSION"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newDGX(t)
			srv.InitFunc = func() nvml.Return { return tt.ret }
			var shutdowns atomic.Int32
			srv.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
			n := NewNVML(srv)

			_, devErr := n.Devices()
			watchErr := n.WatchHealth(context.Background(), make(chan HealthEvent))
			for _, err := range []error{devErr, watchErr} {
				if err == nil {
					t.Fatal("got no error")
				}
				if got := errors.Is(err, ErrNoDriver); got != tt.wantNoDriver {
					t.Errorf("errors.Is(%q, ErrNoDriver) = %v, want %v", err, got, tt.wantNoDriver)
				}
				// The driver-missing errors speak for themselves; the
				// others carry NVML's code.
				if !tt.wantNoDriver && !errors.Is(err, tt.ret) {
					t.Errorf("error %q does not wrap %v", err, tt.ret)
				}
				for _, m := range tt.wantMsg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not contain %q", err, m)
					}
				}
			}
			if err := n.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if c := shutdowns.Load(); c != 0 {
				t.Errorf("nvmlShutdown called %d times without a successful init", c)
			}
		})
	}
}

// A failed init is not remembered: a driver installed later is picked up.
func TestNVMLInitRetriesAfterFailure(t *testing.T) {
	srv := newDGX(t)
	var calls atomic.Int32
	srv.InitFunc = func() nvml.Return {
		if calls.Add(1) == 1 {
			return nvml.ERROR_LIBRARY_NOT_FOUND
		}
		return nvml.SUCCESS
	}
	n := NewNVML(srv)
	t.Cleanup(func() { _ = n.Close() })
	if _, err := n.Devices(); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("first Devices: got %v, want ErrNoDriver", err)
	}
	got, err := n.Devices()
	if err != nil || len(got) != 8 {
		t.Fatalf("second Devices: got %d GPUs, %v; want 8, nil", len(got), err)
	}
}

// The real library on this machine: without the driver, the error must be
// ErrNoDriver; with one, the GPUs must be listed.
func TestNVMLRealLibrary(t *testing.T) {
	n := NewNVML(nvml.New())
	defer func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	devs, err := n.Devices()
	switch {
	case errors.Is(err, ErrNoDriver):
		t.Logf("no driver on this machine: %v", err)
		if !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
			t.Errorf("error %q does not name the library", err)
		}
	case err != nil:
		t.Fatalf("Devices: %v", err)
	default:
		for _, d := range devs {
			if !strings.HasPrefix(d.UUID, "GPU-") || d.Memory == 0 {
				t.Errorf("implausible GPU: %+v", d)
			}
			if _, err := NormalizePCIBusID(d.PCIBusID); err != nil {
				t.Errorf("GPU %s: %v", d.UUID, err)
			}
		}
		t.Logf("GPUs: %+v", devs)
	}
}

// step is one scripted result of EventSet.Wait.
type step struct {
	ev  nvml.EventData
	ret nvml.Return
}

func xid(d nvml.Device, code uint64) step {
	return step{ev: nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: code}}
}

// scriptedEventSet returns the steps in order, then closes drained and
// times out from then on. Wait is called again only after the previous event
// was handled (sent), so drained means every step was processed.
func scriptedEventSet(steps []step, drained chan<- struct{}, freed *atomic.Bool) *mock.EventSet {
	var mu sync.Mutex
	next := 0
	return &mock.EventSet{
		WaitFunc: func(timeout uint32) (nvml.EventData, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			if next < len(steps) {
				s := steps[next]
				next++
				return s.ev, s.ret
			}
			if next == len(steps) {
				next++
				close(drained)
			}
			time.Sleep(time.Millisecond)
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { freed.Store(true); return nvml.SUCCESS },
	}
}

func TestNVMLWatchHealth(t *testing.T) {
	lost := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}

	tests := []struct {
		name  string
		setup func(srv *server.Server) // optional changes to the mock
		steps func(srv *server.Server) []step
		// want lists (device index, reason) per event; index -1 means one
		// event per GPU.
		want          []wantEvent
		wantUnhealthy []int
	}{
		{
			name:          "XID 79 on GPU 3",
			steps:         func(s *server.Server) []step { return []step{xid(s.Devices[3], 79)} },
			want:          []wantEvent{{3, "XID 79"}},
			wantUnhealthy: []int{3},
		},
		{
			name:  "application XID 13 is ignored",
			steps: func(s *server.Server) []step { return []step{xid(s.Devices[3], 13)} },
		},
		{
			name: "every application XID is ignored, then a real one counts",
			steps: func(s *server.Server) []step {
				var st []step
				for _, code := range IgnoredXIDs {
					st = append(st, xid(s.Devices[1], code))
				}
				return append(st, xid(s.Devices[6], 48))
			},
			want:          []wantEvent{{6, "XID 48"}},
			wantUnhealthy: []int{6},
		},
		{
			name: "double-bit ECC error",
			steps: func(s *server.Server) []step {
				return []step{{ev: nvml.EventData{Device: s.Devices[5], EventType: nvml.EventTypeDoubleBitEccError}}}
			},
			want:          []wantEvent{{5, "double-bit ECC error"}},
			wantUnhealthy: []int{5},
		},
		{
			name: "other event types are ignored",
			steps: func(s *server.Server) []step {
				return []step{{ev: nvml.EventData{Device: s.Devices[2], EventType: nvml.EventTypePState}}}
			},
		},
		{
			name: "an unhealthy GPU stays unhealthy and every error is reported",
			steps: func(s *server.Server) []step {
				return []step{xid(s.Devices[0], 79), xid(s.Devices[0], 13), xid(s.Devices[0], 94)}
			},
			want:          []wantEvent{{0, "XID 79"}, {0, "XID 94"}},
			wantUnhealthy: []int{0},
		},
		{
			name:          "an XID for no GPU marks all unhealthy",
			steps:         func(*server.Server) []step { return []step{xid(nil, 79)} },
			want:          []wantEvent{{-1, "XID 79"}},
			wantUnhealthy: all,
		},
		{
			name:          "an XID on a GPU that cannot be identified marks all unhealthy",
			steps:         func(*server.Server) []step { return []step{xid(lost, 62)} },
			want:          []wantEvent{{-1, "XID 62"}},
			wantUnhealthy: all,
		},
		{
			name: "failed waits mark all unhealthy, reported once per run of failures",
			steps: func(*server.Server) []step {
				return []step{{ret: nvml.ERROR_UNKNOWN}, {ret: nvml.ERROR_UNKNOWN}, {ret: nvml.ERROR_UNKNOWN}}
			},
			want:          []wantEvent{{-1, "NVML event wait failed: ERROR_UNKNOWN"}},
			wantUnhealthy: all,
		},
		{
			name: "a GPU without event support is not monitored and stays healthy",
			setup: func(s *server.Server) {
				dgxDevice(s, 4).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				dgxDevice(s, 4).RegisterEventsFunc = nil // must not be called: the mock panics
			},
		},
		{
			name: "a GPU whose registration fails is unhealthy",
			setup: func(s *server.Server) {
				dgxDevice(s, 7).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_UNKNOWN }
			},
			want:          []wantEvent{{7, "health events unavailable: registering xid_critical_error: ERROR_UNKNOWN"}},
			wantUnhealthy: []int{7},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newDGX(t)
			if tt.setup != nil {
				tt.setup(srv)
			}
			var steps []step
			if tt.steps != nil {
				steps = tt.steps(srv)
			}
			drained := make(chan struct{})
			var freed atomic.Bool
			set := scriptedEventSet(steps, drained, &freed)
			srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }

			n := NewNVML(srv)
			n.eventTimeout = 5 * time.Millisecond
			t.Cleanup(func() { _ = n.Close() })

			w := watch(t, n)
			select {
			case <-drained:
			case <-time.After(10 * time.Second):
				t.Fatal("the event script was not consumed")
			}
			got := w.stop(t)
			if !freed.Load() {
				t.Error("the event set was not freed")
			}

			var want []HealthEvent
			for _, w := range tt.want {
				if w.index < 0 {
					for i := range srv.Devices {
						want = append(want, HealthEvent{UUID: dgxDevice(srv, i).UUID, Reason: w.reason})
					}
					continue
				}
				want = append(want, HealthEvent{UUID: dgxDevice(srv, w.index).UUID, Reason: w.reason})
			}
			if !slices.Equal(got, want) {
				t.Errorf("events:\n got %+v\nwant %+v", got, want)
			}

			devs, err := n.Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			var unhealthy []int
			for _, d := range devs {
				if !d.Healthy {
					unhealthy = append(unhealthy, d.Index)
				}
			}
			if !slices.Equal(unhealthy, tt.wantUnhealthy) {
				t.Errorf("unhealthy GPUs: got %v, want %v", unhealthy, tt.wantUnhealthy)
			}
		})
	}
}

type wantEvent struct {
	index  int
	reason string
}

// watcher runs b.WatchHealth in the background and collects its events.
type watcher struct {
	cancel context.CancelFunc
	errc   chan error
	mu     sync.Mutex
	got    []HealthEvent
	done   chan struct{} // closed when every event is collected
}

func watch(t *testing.T, b Backend) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, errc: make(chan error, 1), done: make(chan struct{})}
	events := make(chan HealthEvent)
	go func() {
		err := b.WatchHealth(ctx, events)
		close(events) // only WatchHealth sends, and it has returned
		w.errc <- err
	}()
	go func() {
		defer close(w.done)
		for ev := range events {
			w.mu.Lock()
			w.got = append(w.got, ev)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return w
}

// waitUntil waits until the events collected so far satisfy ok.
func (w *watcher) waitUntil(t *testing.T, ok func([]HealthEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		done := ok(w.got)
		w.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not seen in time; got %+v", w.events())
		}
		time.Sleep(time.Millisecond)
	}
}

func (w *watcher) events() []HealthEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}

// stop cancels the watch, checks that WatchHealth returned nil and returns
// every event it sent.
func (w *watcher) stop(t *testing.T) []HealthEvent {
	t.Helper()
	w.cancel()
	select {
	case err := <-w.errc:
		if err != nil {
			t.Errorf("WatchHealth: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchHealth did not return after cancel")
	}
	<-w.done
	return w.events()
}

// TestNVMLRegistersHealthEvents checks that each health event type is
// registered where the GPU lists it, that a type the driver refuses is
// reported as unsupported rather than failing the GPU, and what the log and
// HealthEventTypes say about it.
func TestNVMLRegistersHealthEvents(t *testing.T) {
	srv := newDGX(t)
	// GPU 6 does not list ECC events (ECC disabled); GPU 5 lists them but
	// the driver refuses their registration.
	dgxDevice(srv, 6).GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypePState, nvml.SUCCESS
	}
	var mu sync.Mutex
	masks := make(map[int]uint64)
	for i := range srv.Devices {
		dgxDevice(srv, i).RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			if i == 5 && mask&nvml.EventTypeDoubleBitEccError != 0 {
				return nvml.ERROR_NOT_SUPPORTED
			}
			mu.Lock()
			masks[i] |= mask
			mu.Unlock()
			return nvml.SUCCESS
		}
	}
	drained := make(chan struct{})
	var freed atomic.Bool
	set := scriptedEventSet(nil, drained, &freed)
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	n := NewNVML(srv)
	n.eventTimeout = 5 * time.Millisecond
	t.Cleanup(func() { _ = n.Close() })

	var logs syncbuf.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	w := watch(t, n)
	<-drained
	if got := w.stop(t); len(got) != 0 {
		t.Errorf("unexpected events: %+v", got)
	}
	mu.Lock()
	for i := range srv.Devices {
		want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
		if i == 5 || i == 6 {
			want = nvml.EventTypeXidCriticalError
		}
		if masks[i] != want {
			t.Errorf("GPU %d registered mask %#x, want %#x", i, masks[i], want)
		}
	}
	mu.Unlock()

	uuid := func(i int) string { return dgxDevice(srv, i).UUID }
	for i, want := range map[int]string{
		0: "gpu=" + uuid(0) + " accepted=[xid_critical_error,double_bit_ecc_error] unsupported=[]",
		5: "gpu=" + uuid(5) + " accepted=[xid_critical_error] unsupported=[double_bit_ecc_error]",
		6: "gpu=" + uuid(6) + " accepted=[xid_critical_error] unsupported=[double_bit_ecc_error]",
	} {
		line := `msg="health watch registered" ` + want
		if c := strings.Count(logs.String(), line); c != 1 {
			t.Errorf("GPU %d: the log holds %q %d times, want once; log:\n%s", i, line, c, logs.String())
		}
	}

	got, err := n.HealthEventTypes()
	if err != nil {
		t.Fatal(err)
	}
	both := HealthEventTypes{Accepted: []string{"xid_critical_error", "double_bit_ecc_error"}, Unsupported: []string{}}
	xidOnly := HealthEventTypes{Accepted: []string{"xid_critical_error"}, Unsupported: []string{"double_bit_ecc_error"}}
	for i := range srv.Devices {
		want := both
		if i == 5 || i == 6 {
			want = xidOnly
		}
		if !reflect.DeepEqual(got[uuid(i)], want) {
			t.Errorf("HealthEventTypes[GPU %d] = %+v, want %+v", i, got[uuid(i)], want)
		}
	}
}

func TestNVMLEventSetCreateFails(t *testing.T) {
	srv := newDGX(t)
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	n := NewNVML(srv)
	t.Cleanup(func() { _ = n.Close() })
	err := n.WatchHealth(context.Background(), make(chan HealthEvent))
	if !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || !strings.Contains(err.Error(), "event set") {
		t.Errorf("WatchHealth: got %v, want an event set error wrapping ERROR_NOT_SUPPORTED", err)
	}
}

func TestNVMLClose(t *testing.T) {
	srv := newDGX(t)
	var shutdowns atomic.Int32
	srv.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
	drained := make(chan struct{})
	var freed atomic.Bool
	set := scriptedEventSet(nil, drained, &freed)
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	n := NewNVML(srv)
	n.eventTimeout = 5 * time.Millisecond

	errc := make(chan error, 1)
	go func() { errc <- n.WatchHealth(context.Background(), make(chan HealthEvent)) }()
	<-drained

	// Close stops the watcher (whose context is never cancelled) before it
	// shuts NVML down.
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The watcher freed its event set before Close returned.
	if !freed.Load() {
		t.Error("the event set was not freed before Close returned")
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("WatchHealth after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchHealth did not return after Close")
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if c := shutdowns.Load(); c != 1 {
		t.Errorf("nvmlShutdown called %d times, want 1", c)
	}
	if _, err := n.Devices(); !errors.Is(err, ErrClosed) {
		t.Errorf("Devices after Close: got %v, want ErrClosed", err)
	}
	if err := n.WatchHealth(context.Background(), make(chan HealthEvent)); !errors.Is(err, ErrClosed) {
		t.Errorf("WatchHealth after Close: got %v, want ErrClosed", err)
	}
}

func TestNVMLShutdownError(t *testing.T) {
	srv := newDGX(t)
	srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	n := NewNVML(srv)
	if _, err := n.Devices(); err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if err := n.Close(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Close: got %v, want ERROR_UNKNOWN", err)
	}
}
