package ociruntime

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/admission"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

const (
	uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01"
	uuid1 = "GPU-1f0e2d3c-4b5a-4968-8776-5a4b3c2d1e02"
)

var testGPUs = []gpu.Device{
	{Index: 0, UUID: uuid0, Name: "Sim", Memory: 16 << 30, Minor: 0, Healthy: true},
	{Index: 1, UUID: uuid1, Name: "Sim", Memory: 8 << 30, Minor: 1, Healthy: true},
}

func TestRequestFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     []string
		want    *Request
		wantVar string // the variable an error names
	}{
		{name: "no variables", env: []string{"PATH=/bin"}},
		{name: "void", env: []string{"NVIDIA_VISIBLE_DEVICES=void"}},
		{name: "none", env: []string{"NVIDIA_VISIBLE_DEVICES=none"}},
		{name: "empty", env: []string{"NVIDIA_VISIBLE_DEVICES="}},
		{
			name: "indices with spaces and an empty entry",
			env:  []string{"NVIDIA_VISIBLE_DEVICES= 0, 1,,"},
			want: &Request{Devices: []string{"0", "1"}},
		},
		{
			name: "all with quotas",
			env:  []string{"NVIDIA_VISIBLE_DEVICES=all", "NRI_VGPU_MEMORY=4GiB", "NRI_VGPU_CORES=30"},
			want: &Request{Devices: []string{"all"}, Memory: "4GiB", Cores: "30"},
		},
		{
			name: "the last entry wins",
			env:  []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=" + uuid1},
			want: &Request{Devices: []string{uuid1}},
		},
		{
			name:    "memory without GPUs",
			env:     []string{"NRI_VGPU_MEMORY=4GiB"},
			wantVar: "NRI_VGPU_MEMORY",
		},
		{
			name:    "cores with void",
			env:     []string{"NVIDIA_VISIBLE_DEVICES=void", "NRI_VGPU_CORES=30"},
			wantVar: "NRI_VGPU_CORES",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RequestFromEnv(tt.env)
			checkRequestError(t, err, tt.wantVar)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("RequestFromEnv(%q) = %+v, want %+v", tt.env, got, tt.want)
			}
		})
	}
}

// checkRequestError checks that err is a RequestError naming wantVar, or
// nil when wantVar is "".
func checkRequestError(t *testing.T, err error, wantVar string) {
	t.Helper()
	if wantVar == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T), want a RequestError naming %s", err, err, wantVar)
	}
	if re.Var != wantVar || !strings.HasPrefix(err.Error(), wantVar+"=") {
		t.Fatalf("error %q names %s, want %s", err, re.Var, wantVar)
	}
}

func TestResolve(t *testing.T) {
	cfg := config.Default()
	scaled := config.Default()
	scaled.DevicePlugin.MemoryScaling = 1.5
	scaled.DevicePlugin.CoresScaling = 2
	unhealthy := append([]gpu.Device(nil), testGPUs...)
	unhealthy[1].Healthy = false

	tests := []struct {
		name    string
		req     Request
		cfg     *config.Config
		gpus    []gpu.Device
		want    []allocation.GPU
		wantRes []admission.Reservation
		wantCap []admission.Capacity
		wantVar string
		wantErr string
	}{
		{
			name:    "whole GPU by index: all of its memory, not throttled",
			req:     Request{Devices: []string{"1"}},
			want:    []allocation.GPU{{UUID: uuid1, Minor: 1, Memory: 8 << 30, Cores: 100}},
			wantRes: []admission.Reservation{{UUID: uuid1, Memory: 8 << 30}},
			wantCap: []admission.Capacity{{Index: 1, UUID: uuid1, Memory: 8 << 30, Total: 8 << 30, Cores: 100}},
		},
		{
			name:    "memory and cores by UUID, any case",
			req:     Request{Devices: []string{strings.ToLower(uuid0)}, Memory: "4GiB", Cores: "30%"},
			want:    []allocation.GPU{{UUID: uuid0, Minor: 0, Memory: 4 << 30, Cores: 30}},
			wantRes: []admission.Reservation{{UUID: uuid0, Memory: 4 << 30, Cores: 30}},
		},
		{
			name: "a percentage is of each GPU's own memory",
			req:  Request{Devices: []string{"all"}, Memory: "25%"},
			want: []allocation.GPU{
				{UUID: uuid0, Minor: 0, Memory: 4 << 30, Cores: 100},
				{UUID: uuid1, Minor: 1, Memory: 2 << 30, Cores: 100},
			},
		},
		{
			name: "order as asked, duplicates once",
			req:  Request{Devices: []string{"1", uuid0, "0", uuid1}, Cores: "100"},
			want: []allocation.GPU{
				{UUID: uuid1, Minor: 1, Memory: 8 << 30, Cores: 100},
				{UUID: uuid0, Minor: 0, Memory: 16 << 30, Cores: 100},
			},
		},
		{
			name:    "scaling raises what may be asked for",
			cfg:     scaled,
			req:     Request{Devices: []string{"1"}, Memory: "10GiB", Cores: "50"},
			want:    []allocation.GPU{{UUID: uuid1, Minor: 1, Memory: 10 << 30, Cores: 50}},
			wantCap: []admission.Capacity{{Index: 1, UUID: uuid1, Memory: 12 << 30, Total: 8 << 30, Cores: 200}},
		},
		{name: "more memory than the GPU has", req: Request{Devices: []string{"1"}, Memory: "9GiB"}, wantVar: EnvMemory, wantErr: "more than GPU 1"},
		{name: "bad memory", req: Request{Devices: []string{"0"}, Memory: "4G"}, wantVar: EnvMemory, wantErr: "ambiguous unit"},
		{name: "zero memory", req: Request{Devices: []string{"0"}, Memory: "0"}, wantVar: EnvMemory},
		{name: "bad cores", req: Request{Devices: []string{"0"}, Cores: "150"}, wantVar: EnvCores},
		{name: "fractional cores", req: Request{Devices: []string{"0"}, Cores: "2.5"}, wantVar: EnvCores},
		{name: "unknown index", req: Request{Devices: []string{"7"}}, wantVar: EnvDevices, wantErr: "0 = " + uuid0},
		{name: "unknown UUID", req: Request{Devices: []string{"GPU-nope"}}, wantVar: EnvDevices, wantErr: `no GPU "GPU-nope"`},
		{name: "MIG by index", req: Request{Devices: []string{"0:1"}}, wantVar: EnvDevices, wantErr: "MIG"},
		{name: "MIG by UUID", req: Request{Devices: []string{"MIG-1234"}}, wantVar: EnvDevices, wantErr: "MIG"},
		{name: "all and more", req: Request{Devices: []string{"all", "0"}}, wantVar: EnvDevices},
		{name: "unhealthy GPU", gpus: unhealthy, req: Request{Devices: []string{"1"}}, wantVar: EnvDevices, wantErr: "unhealthy"},
		{name: "all with an unhealthy GPU", gpus: unhealthy, req: Request{Devices: []string{"all"}}, wantVar: EnvDevices, wantErr: "unhealthy"},
		{name: "no GPUs on the node", gpus: []gpu.Device{}, req: Request{Devices: []string{"all"}}, wantVar: EnvDevices},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			if c == nil {
				c = cfg
			}
			gpus := tt.gpus
			if gpus == nil {
				gpus = testGPUs
			}
			g, err := tt.req.Resolve(gpus, c, "ctr-1", time.Unix(100, 0))
			checkRequestError(t, err, tt.wantVar)
			if err != nil {
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				return
			}
			a := g.Allocation
			if a.V != allocation.Version || a.Issued != 100 || len(a.ID) != 32 {
				t.Errorf("allocation header %+v", a)
			}
			if !reflect.DeepEqual(a.GPUs, tt.want) {
				t.Errorf("GPUs\n got %+v\nwant %+v", a.GPUs, tt.want)
			}
			if tt.wantRes != nil && !reflect.DeepEqual(g.Reservations, tt.wantRes) {
				t.Errorf("reservations %+v, want %+v", g.Reservations, tt.wantRes)
			}
			if tt.wantCap != nil && !reflect.DeepEqual(g.Capacity, tt.wantCap) {
				t.Errorf("capacity %+v, want %+v", g.Capacity, tt.wantCap)
			}
			if len(g.Reservations) != len(a.GPUs) || len(g.Capacity) != len(a.GPUs) {
				t.Errorf("%d reservations and %d capacities for %d GPUs", len(g.Reservations), len(g.Capacity), len(a.GPUs))
			}
		})
	}
}

func TestResolveAllocationIDFollowsContainer(t *testing.T) {
	req := Request{Devices: []string{"0"}}
	now := time.Unix(1, 0)
	a, err := req.Resolve(testGPUs, config.Default(), "ctr-a", now)
	if err != nil {
		t.Fatal(err)
	}
	again, err := req.Resolve(testGPUs, config.Default(), "ctr-a", now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := req.Resolve(testGPUs, config.Default(), "ctr-b", now)
	if err != nil {
		t.Fatal(err)
	}
	if a.Allocation.ID != again.Allocation.ID || a.Allocation.ID == b.Allocation.ID {
		t.Errorf("allocation IDs %s, %s (same container), %s (another)", a.Allocation.ID, again.Allocation.ID, b.Allocation.ID)
	}
}
