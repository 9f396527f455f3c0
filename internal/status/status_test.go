package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

const (
	uuidA    = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
	uuidB    = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
	uuidGone = "GPU-cccccccc-0000-4000-8000-000000000003"
)

func prepare(t *testing.T, cfg *config.Config, id, pod string, gpus ...allocation.GPU) {
	t.Helper()
	a := &allocation.Allocation{GPUs: gpus}
	info := &hoststate.Info{ID: id, Name: "ctr-" + id, Pod: pod, GPUs: gpus, Source: "nri"}
	if _, err := hoststate.New(cfg).Provision(info, a.Limits("")); err != nil {
		t.Fatal(err)
	}
}

func TestCollect(t *testing.T) {
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	prepare(t, cfg, "c1", "ml/a", allocation.GPU{UUID: uuidA, Slices: 2, Memory: 8 << 30, Cores: 20})
	prepare(t, cfg, "c2", "ml/b",
		allocation.GPU{UUID: uuidA, Slices: 5, Memory: 20 << 30, Cores: 50},
		allocation.GPU{UUID: uuidGone, Slices: 1, Memory: 4 << 30, Cores: 10})
	// A directory whose limits file is not written yet is skipped quietly.
	if err := os.MkdirAll(hoststate.ContainerDir(cfg, "creating"), 0o755); err != nil {
		t.Fatal(err)
	}
	devices := []gpu.Device{
		{Index: 0, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30},
		{Index: 1, UUID: uuidB, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30},
	}
	usage := func(rec *hoststate.Record) (*region.Usage, error) {
		switch rec.ID {
		case "c1":
			return &region.Usage{
				Devices:   []region.DeviceUsage{{UUID: uuidA, Used: 3 << 30}},
				Processes: []region.ProcessUsage{{PID: 7, Used: []uint64{3 << 30}, Launches: []uint64{0}}},
			}, nil
		case "c2":
			return nil, fmt.Errorf("usage region: %w", fs.ErrNotExist) // a previous release's record, no process ran yet
		}
		return nil, fmt.Errorf("unexpected container %s", rec.ID)
	}
	r, err := Collect(cfg, devices, usage)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings: %v", r.Warnings)
	}
	if len(r.GPUs) != 3 {
		t.Fatalf("GPUs = %+v, want A, B and the one gone from the inventory", r.GPUs)
	}
	a, b, gone := r.GPUs[0], r.GPUs[1], r.GPUs[2]
	if a.UUID != uuidA || len(a.Containers) != 2 || b.UUID != uuidB || len(b.Containers) != 0 || gone.UUID != uuidGone || gone.Index != nil {
		t.Fatalf("GPUs = %+v", r.GPUs)
	}
	c1 := a.Containers[0]
	if c1.ID != "c1" || c1.Pod != "ml/a" || c1.Slices != 2 || c1.MemoryLimit != 8<<30 || c1.Cores != 20 || c1.MemoryUsed == nil || *c1.MemoryUsed != 3<<30 {
		t.Errorf("c1 on A = %+v", c1)
	}
	if c2 := a.Containers[1]; c2.ID != "c2" || c2.MemoryUsed != nil || c2.Slices != 5 {
		t.Errorf("c2 on A = %+v", c2)
	}

	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"GPU 0", uuidA, "containers: 2", "slices in use: 7",
		"CONTAINER", "MEMORY LIMIT", "MEMORY USED",
		"ml/a", "8GiB", "3GiB", "20%",
		"GPU 1", "containers: 0",
		"GPU ?", uuidGone, "(not in the inventory)",
	} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	// The GPU summary line is not padded to the container table's columns,
	// and the container rows line up under their header.
	if want := "GPU 0  " + uuidA + "  NVIDIA A100-SXM4-40GB  40GiB  containers: 2"; !strings.Contains(table.String(), want) {
		t.Errorf("table lacks the summary line %q:\n%s", want, table.String())
	}
	lines := strings.Split(table.String(), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "  CONTAINER") {
			continue
		}
		col := strings.Index(l, "MEMORY LIMIT")
		row := ""
		if i+1 < len(lines) {
			row = lines[i+1]
		}
		if len(row) <= col || row[col] == ' ' || row[col-1] != ' ' {
			t.Errorf("a row's memory limit does not start under its header:\n%s", table.String())
		}
	}

	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.GPUs) != 3 || back.GPUs[1].Containers == nil {
		t.Errorf("JSON round trip = %+v (an idle GPU must list [] containers)", back)
	}
}

func TestCollectWarnsOnBrokenFiles(t *testing.T) {
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	dir := hoststate.ContainerDir(cfg, "bad")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, hoststate.LimitsFileName), []byte("version=99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Collect(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "container bad") {
		t.Errorf("warnings = %v, want one naming container bad", r.Warnings)
	}
}

func TestRegionUsage(t *testing.T) {
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	regionDir := filepath.Join(cfg.Paths.RunDir, "containers", "c1", "region")
	if err := os.MkdirAll(regionDir, 0o777); err != nil {
		t.Fatal(err)
	}
	// usage reads c1's region through the record Scan gives.
	usage := func() (u *region.Usage, err error) {
		t.Helper()
		seen := false
		if err := hoststate.New(cfg).Scan(func(rec *hoststate.Record) error {
			seen = rec.ID == "c1"
			u, err = RegionUsage(rec)
			return nil
		}); err != nil || !seen {
			t.Fatalf("Scan: %v, c1 seen: %v", err, seen)
		}
		return u, err
	}
	if _, err := usage(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RegionUsage without a region = %v, want fs.ErrNotExist (a previous release's record, no process ran yet)", err)
	}
	if err := os.WriteFile(filepath.Join(regionDir, region.FileName), []byte("not a region"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := usage(); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RegionUsage of a broken region = %v, want an error other than not-exist", err)
	}
}

// TestCollectServedElsewhere: a GPU in MIG mode is listed, in index order,
// as served elsewhere, and not as a GPU with free slices.
func TestCollectServedElsewhere(t *testing.T) {
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	prepare(t, cfg, "c1", "ml/a", allocation.GPU{UUID: uuidB, Slices: 1, Memory: 4 << 30, Cores: 10})
	devices := []gpu.Device{
		{Index: 1, UUID: uuidB, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30},
		// As runStatus passes them: the GPUs served elsewhere after the others.
		{Index: 0, UUID: uuidA, Name: "NVIDIA H200", Memory: 141 << 30, MIG: true},
	}
	r, err := Collect(cfg, devices, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 2 || r.GPUs[0].UUID != uuidA || r.GPUs[0].ServedElsewhere != "MIG mode" || r.GPUs[1].ServedElsewhere != "" {
		t.Fatalf("GPUs = %+v, want A (MIG mode) then B", r.GPUs)
	}
	var table bytes.Buffer
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	want := "GPU 0  " + uuidA + "  NVIDIA H200  141GiB  served elsewhere (MIG mode): not shared by nri-vgpu\n"
	if !strings.HasPrefix(table.String(), want) {
		t.Errorf("table does not start with %q:\n%s", want, table.String())
	}
	if strings.Count(table.String(), "slices in use") != 1 {
		t.Errorf("the GPU in MIG mode is shown with slices:\n%s", table.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"servedElsewhere": "MIG mode"`) {
		t.Errorf("JSON lacks servedElsewhere:\n%s", js.String())
	}
}
