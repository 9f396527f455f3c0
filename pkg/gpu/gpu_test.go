package gpu

import (
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

func TestNew(t *testing.T) {
	tests := []struct {
		name     string
		cfg      *config.Config
		wantName string
		wantErr  []string
	}{
		{name: "nvml", cfg: &config.Config{GPU: config.GPU{Backend: config.BackendNVML}}, wantName: "nvml"},
		{name: "empty means nvml", cfg: &config.Config{}, wantName: "nvml"},
		{
			name: "simulated",
			cfg: &config.Config{GPU: config.GPU{
				Backend:   config.BackendSimulated,
				Simulated: []config.SimulatedGPU{simGPU("GPU-a", 0)},
			}},
			wantName: "simulated",
		},
		{
			name: "simulated, invalid",
			cfg: &config.Config{GPU: config.GPU{
				Backend:   config.BackendSimulated,
				Simulated: []config.SimulatedGPU{simGPU("GPU-a", 0), simGPU("GPU-a", 1)},
			}},
			wantErr: []string{"gpu.simulated", "uuid already used"},
		},
		{
			name:    "unknown backend",
			cfg:     &config.Config{GPU: config.GPU{Backend: "rocm"}},
			wantErr: []string{`unknown gpu.backend "rocm"`},
		},
		{name: "no config", cfg: nil, wantErr: []string{"no configuration"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.cfg)
			if tt.wantErr != nil {
				if err == nil {
					_ = b.Close()
					t.Fatalf("got backend %q, want an error", b.Name())
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer func() {
				if err := b.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			if b.Name() != tt.wantName {
				t.Errorf("Name: got %q, want %q", b.Name(), tt.wantName)
			}
		})
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "00000000:07:00.0", want: "0000:07:00.0"},
		{in: "00000000:3B:00.0", want: "0000:3b:00.0"},
		{in: "0000:af:1f.7", want: "0000:af:1f.7"},
		{in: "07:00.0", want: "0000:07:00.0"},
		{in: " 0001:C1:00.1 ", want: "0001:c1:00.1"},
		{in: "10000:01:00.0", want: "10000:01:00.0"},
		{in: "", wantErr: true},
		{in: "0000:07:00", wantErr: true},
		{in: "0000:07:20.0", wantErr: true}, // device is 5 bits
		{in: "0000:07:00.8", wantErr: true}, // function is 3 bits
		{in: "0000:100:00.0", wantErr: true},
		{in: "0000::00.0", wantErr: true},
		{in: "a:b:c:d.0", wantErr: true},
		{in: "zz:00.0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := NormalizePCIBusID(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				if !strings.Contains(err.Error(), "PCI bus id") {
					t.Errorf("error %q does not say what was wrong", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
