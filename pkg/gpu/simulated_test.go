package gpu

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

func ptr[T any](v T) *T { return &v }

func simGPU(uuid string, minor int) config.SimulatedGPU {
	return config.SimulatedGPU{UUID: uuid, Name: "Simulated A100", Memory: 16 << 30, Minor: minor}
}

func TestNewSimulated(t *testing.T) {
	gpus := []config.SimulatedGPU{
		simGPU("GPU-a", 3),
		{UUID: "GPU-b", Name: "Simulated T4", Memory: 8 << 30, Minor: 0, PCIBusID: "00000000:3B:00.0", Healthy: ptr(false)},
		{UUID: "GPU-c", Memory: 1, Minor: 254},
	}
	s, err := NewSimulated(gpus)
	if err != nil {
		t.Fatalf("NewSimulated: %v", err)
	}
	got, err := s.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	want := []Device{
		{Index: 0, UUID: "GPU-a", Name: "Simulated A100", Memory: 16 << 30, Minor: 3, PCIBusID: "0000:04:00.0", Healthy: true},
		{Index: 1, UUID: "GPU-b", Name: "Simulated T4", Memory: 8 << 30, Minor: 0, PCIBusID: "0000:3b:00.0", Healthy: false},
		{Index: 2, UUID: "GPU-c", Memory: 1, Minor: 254, PCIBusID: "0000:ff:00.0", Healthy: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Devices:\n got %+v\nwant %+v", got, want)
	}

	// Devices returns a copy.
	got[0].Healthy = false
	again, _ := s.Devices()
	if !again[0].Healthy {
		t.Error("changing the returned slice changed the backend")
	}

	// The description is the configuration's, as given.
	described := simGPU("GPU-d", 1)
	described.Architecture, described.Brand, described.CUDAComputeCapability = "Hopper", "Nvidia", "9.0"
	described.DriverVersion, described.CUDADriverVersion, described.PCIeRoot = "550.54.15", "12.4", "pci0000:40"
	s2, err := NewSimulated([]config.SimulatedGPU{described})
	if err != nil {
		t.Fatalf("NewSimulated: %v", err)
	}
	devs, _ := s2.Devices()
	wantD := Device{
		Index: 0, UUID: "GPU-d", Name: "Simulated A100", Memory: 16 << 30, Minor: 1, PCIBusID: "0000:02:00.0", Healthy: true,
		Architecture: "Hopper", Brand: "Nvidia", CUDAComputeCapability: "9.0",
		DriverVersion: "550.54.15", CUDADriverVersion: "12.4", PCIeRoot: "pci0000:40",
	}
	if len(devs) != 1 || devs[0] != wantD {
		t.Errorf("Devices with a description:\n got %+v\nwant %+v", devs, wantD)
	}
}

func TestSimulatedMIG(t *testing.T) {
	mig := simGPU("GPU-mig", 1)
	mig.MIG = true
	s, err := NewSimulated([]config.SimulatedGPU{simGPU("GPU-a", 0), mig, simGPU("GPU-c", 2)})
	if err != nil {
		t.Fatalf("NewSimulated: %v", err)
	}
	devs, err := s.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, d := range devs {
		uuids = append(uuids, d.UUID)
	}
	if want := []string{"GPU-a", "GPU-c"}; !slices.Equal(uuids, want) {
		t.Errorf("Devices = %v, want %v (the GPU in MIG mode left out)", uuids, want)
	}
	elsewhere, err := s.ServedElsewhere()
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{{Index: 1, UUID: "GPU-mig", Name: "Simulated A100", Memory: 16 << 30, Minor: 1, PCIBusID: "0000:02:00.0", Healthy: true, MIG: true}}
	if !slices.Equal(elsewhere, want) {
		t.Errorf("ServedElsewhere:\n got %+v\nwant %+v", elsewhere, want)
	}

	// A reload that puts GPU-a in MIG mode takes it away from the
	// consumers of Devices, as a removal would.
	events := make(chan HealthEvent, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.WatchHealth(ctx, events) }()
	waitWatchers(t, s, 1)
	a := simGPU("GPU-a", 0)
	a.MIG = true
	s.Update([]config.SimulatedGPU{a, mig, simGPU("GPU-c", 2)})
	select {
	case ev := <-events:
		if want := (HealthEvent{UUID: "GPU-a", Healthy: false, Reason: "put in MIG mode: served elsewhere"}); ev != want {
			t.Errorf("event = %+v, want %+v", ev, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event for the GPU put in MIG mode")
	}
	if devs, _ := s.Devices(); len(devs) != 1 || devs[0].UUID != "GPU-c" {
		t.Errorf("Devices after the reload = %+v, want GPU-c only", devs)
	}
}

func TestValidateSimulated(t *testing.T) {
	tests := []struct {
		name string
		gpus []config.SimulatedGPU
		want []string // substrings of the error; nil = valid
	}{
		{name: "empty list", gpus: nil},
		{name: "valid", gpus: []config.SimulatedGPU{simGPU("GPU-a", 0), simGPU("GPU-b", 1)}},
		{
			name: "uuid missing",
			gpus: []config.SimulatedGPU{simGPU("", 0)},
			want: []string{"entry 0", "uuid is required"},
		},
		{
			name: "uuid duplicated",
			gpus: []config.SimulatedGPU{simGPU("GPU-a", 0), simGPU("GPU-a", 1)},
			want: []string{`entry 1 (uuid "GPU-a")`, "uuid already used by entry 0"},
		},
		{
			name: "minor duplicated",
			gpus: []config.SimulatedGPU{simGPU("GPU-a", 2), simGPU("GPU-b", 2)},
			want: []string{`entry 1 (uuid "GPU-b")`, "minor 2 already used by entry 0"},
		},
		{
			name: "minor negative",
			gpus: []config.SimulatedGPU{simGPU("GPU-a", -1)},
			want: []string{"minor -1 out of range 0..254"},
		},
		{
			name: "minor of nvidiactl",
			gpus: []config.SimulatedGPU{simGPU("GPU-a", 255)},
			want: []string{"minor 255 out of range"},
		},
		{
			name: "memory zero",
			gpus: []config.SimulatedGPU{{UUID: "GPU-a"}},
			want: []string{"memory must be greater than zero"},
		},
		{
			name: "bad pci bus id",
			gpus: []config.SimulatedGPU{{UUID: "GPU-a", Memory: 1, PCIBusID: "07:00"}},
			want: []string{`PCI bus id "07:00"`},
		},
		{
			name: "pci bus id duplicated, also against a derived one",
			gpus: []config.SimulatedGPU{simGPU("GPU-a", 0), {UUID: "GPU-b", Memory: 1, Minor: 1, PCIBusID: "0000:01:00.0"}},
			want: []string{"pci_bus_id 0000:01:00.0 already used by entry 0"},
		},
		{
			name: "every problem is reported",
			gpus: []config.SimulatedGPU{{UUID: "", Minor: -3}, simGPU("GPU-b", 0)},
			want: []string{"uuid is required", "minor -3", "memory must be greater than zero"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateSimulated(tt.gpus)
			_, newErr := NewSimulated(tt.gpus)
			if tt.want == nil {
				if err != nil || newErr != nil {
					t.Fatalf("got %v / %v, want no error", err, newErr)
				}
				return
			}
			if err == nil || newErr == nil {
				t.Fatalf("got %v / %v, want an error containing %q", err, newErr, tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// waitWatchers waits until n WatchHealth calls are registered, so that a
// change made next is seen by all of them.
func waitWatchers(t *testing.T, s *Simulated, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		got := len(s.watchers)
		s.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d watchers registered, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSimulatedHealthEvents(t *testing.T) {
	base := []config.SimulatedGPU{simGPU("GPU-a", 0), simGPU("GPU-b", 1), simGPU("GPU-c", 2)}

	tests := []struct {
		name        string
		change      func(t *testing.T, s *Simulated)
		want        []HealthEvent
		wantHealthy map[string]bool // health after the change, by uuid
	}{
		{
			name: "SetHealthy false then true",
			change: func(t *testing.T, s *Simulated) {
				mustSet(t, s, "GPU-b", false, "XID 79")
				mustSet(t, s, "GPU-b", true, "")
			},
			want: []HealthEvent{
				{UUID: "GPU-b", Healthy: false, Reason: "XID 79"},
				{UUID: "GPU-b", Healthy: true, Reason: "marked healthy"},
			},
			wantHealthy: map[string]bool{"GPU-a": true, "GPU-b": true, "GPU-c": true},
		},
		{
			name: "SetHealthy without a change sends nothing",
			change: func(t *testing.T, s *Simulated) {
				mustSet(t, s, "GPU-a", true, "")
				mustSet(t, s, "GPU-c", false, "")
				mustSet(t, s, "GPU-c", false, "again")
			},
			want:        []HealthEvent{{UUID: "GPU-c", Healthy: false, Reason: "marked unhealthy"}},
			wantHealthy: map[string]bool{"GPU-a": true, "GPU-b": true, "GPU-c": false},
		},
		{
			name: "Update changes health",
			change: func(t *testing.T, s *Simulated) {
				gpus := slices.Clone(base)
				gpus[0].Healthy = ptr(false)
				gpus[2].Memory = 32 << 30 // not a health change
				s.Update(gpus)
			},
			want:        []HealthEvent{{UUID: "GPU-a", Healthy: false, Reason: "health changed in the simulated configuration"}},
			wantHealthy: map[string]bool{"GPU-a": false, "GPU-b": true, "GPU-c": true},
		},
		{
			name: "Update adds and removes GPUs",
			change: func(t *testing.T, s *Simulated) {
				s.Update([]config.SimulatedGPU{base[2], simGPU("GPU-d", 7), base[0]})
			},
			want: []HealthEvent{
				{UUID: "GPU-d", Healthy: true, Reason: "added to the simulated configuration"},
				{UUID: "GPU-b", Healthy: false, Reason: "removed from the simulated configuration"},
			},
			wantHealthy: map[string]bool{"GPU-c": true, "GPU-d": true, "GPU-a": true},
		},
		{
			name: "configuration is authoritative over SetHealthy",
			change: func(t *testing.T, s *Simulated) {
				mustSet(t, s, "GPU-a", false, "XID 48")
				s.Update(base)
			},
			want: []HealthEvent{
				{UUID: "GPU-a", Healthy: false, Reason: "XID 48"},
				{UUID: "GPU-a", Healthy: true, Reason: "health changed in the simulated configuration"},
			},
			wantHealthy: map[string]bool{"GPU-a": true, "GPU-b": true, "GPU-c": true},
		},
		{
			name: "invalid Update is ignored",
			change: func(t *testing.T, s *Simulated) {
				s.Update([]config.SimulatedGPU{simGPU("GPU-a", 0), simGPU("GPU-a", 1)})
			},
			wantHealthy: map[string]bool{"GPU-a": true, "GPU-b": true, "GPU-c": true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSimulated(base)
			if err != nil {
				t.Fatalf("NewSimulated: %v", err)
			}
			t.Cleanup(func() { _ = s.Close() })

			// Two watchers: both receive every event, in order.
			watchers := []*watcher{watch(t, s), watch(t, s)}
			waitWatchers(t, s, len(watchers))
			tt.change(t, s)
			// A last change whose event, once received, means that
			// everything before it was delivered.
			sentinel := addSentinel(t, s)
			want := append(slices.Clone(tt.want), sentinel)
			for i, w := range watchers {
				w.waitUntil(t, func(got []HealthEvent) bool { return slices.Contains(got, sentinel) })
				if got := w.stop(t); !slices.Equal(got, want) {
					t.Errorf("watcher %d events:\n got %+v\nwant %+v", i+1, got, want)
				}
			}

			devs, err := s.Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			gotHealthy := make(map[string]bool)
			for _, d := range devs {
				if d.UUID != "GPU-sentinel" {
					gotHealthy[d.UUID] = d.Healthy
				}
			}
			if len(gotHealthy) != len(tt.wantHealthy) {
				t.Errorf("GPUs: got %v, want %v", gotHealthy, tt.wantHealthy)
			}
			for u, h := range tt.wantHealthy {
				if g, ok := gotHealthy[u]; !ok || g != h {
					t.Errorf("GPU %s healthy: got %v (present %v), want %v", u, g, ok, h)
				}
			}
		})
	}
}

func mustSet(t *testing.T, s *Simulated, uuid string, healthy bool, reason string) {
	t.Helper()
	if err := s.SetHealthy(uuid, healthy, reason); err != nil {
		t.Fatalf("SetHealthy(%s, %v): %v", uuid, healthy, err)
	}
}

// addSentinel adds a GPU and returns the event the addition produces.
func addSentinel(t *testing.T, s *Simulated) HealthEvent {
	t.Helper()
	devs, err := s.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	var gpus []config.SimulatedGPU
	for _, d := range devs {
		gpus = append(gpus, config.SimulatedGPU{
			UUID: d.UUID, Name: d.Name, Memory: config.Bytes(d.Memory), Minor: d.Minor,
			PCIBusID: d.PCIBusID, Healthy: ptr(d.Healthy),
		})
	}
	s.Update(append(gpus, simGPU("GPU-sentinel", 200)))
	return HealthEvent{UUID: "GPU-sentinel", Healthy: true, Reason: "added to the simulated configuration"}
}

func TestSimulatedSetHealthyUnknown(t *testing.T) {
	s, err := NewSimulated([]config.SimulatedGPU{simGPU("GPU-a", 0)})
	if err != nil {
		t.Fatal(err)
	}
	err = s.SetHealthy("GPU-x", false, "")
	if err == nil || !strings.Contains(err.Error(), `"GPU-x"`) {
		t.Errorf("SetHealthy of an unknown GPU: got %v, want an error naming it", err)
	}
}

func TestSimulatedClose(t *testing.T) {
	s, err := NewSimulated([]config.SimulatedGPU{simGPU("GPU-a", 0)})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	// An unbuffered channel nobody reads: Close must still end the watch.
	events := make(chan HealthEvent)
	go func() { errc <- s.WatchHealth(context.Background(), events) }()
	waitWatchers(t, s, 1)
	mustSet(t, s, "GPU-a", false, "")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("WatchHealth: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchHealth did not return after Close")
	}
	if _, err := s.Devices(); !errors.Is(err, ErrClosed) {
		t.Errorf("Devices after Close: got %v, want ErrClosed", err)
	}
	if err := s.SetHealthy("GPU-a", true, ""); !errors.Is(err, ErrClosed) {
		t.Errorf("SetHealthy after Close: got %v, want ErrClosed", err)
	}
	if err := s.WatchHealth(context.Background(), events); !errors.Is(err, ErrClosed) {
		t.Errorf("WatchHealth after Close: got %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
