package region

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// Encode lays a region out byte for byte as handBuilt does at the offsets
// of region.h: the devices, the process in its slot, the rest zero.
func TestEncodeMatchesTheLayout(t *testing.T) {
	u := &Usage{
		Version: 2,
		Devices: []DeviceUsage{{UUID: "GPU-7", Limit: 1000, Used: 300, Cores: 40, Peak: 700, ThrottledNs: 9_000_000_000}},
		Processes: []ProcessUsage{{}, {}, {PID: 5, HostPID: 1005, StartTime: 77,
			Used: []uint64{300}, Launches: []uint64{11}}},
	}
	b, err := Encode(u)
	if err != nil {
		t.Fatal(err)
	}
	if want := handBuilt(2); !bytes.Equal(b, want) {
		for i := range want {
			if b[i] != want[i] {
				t.Fatalf("Encode differs from the layout at byte %d: %#x, want %#x", i, b[i], want[i])
			}
		}
		t.Fatalf("Encode wrote %d bytes, want %d", len(b), len(want))
	}
}

// The region the host writes at provision: one device per GPU of the
// limits file, in its order, the UUID NUL-terminated, nothing in use; read
// back as a sound version 2 region of no process.
func TestEmpty(t *testing.T) {
	long := "GPU-" + strings.Repeat("a", limits.MaxUUIDLen-4) // the longest UUID a limits file holds
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{
		{UUID: "GPU-bbbb", Memory: 8 << 30, Cores: 25},
		{UUID: long, Memory: 0, Cores: 100},
	}, LedgerShards: limits.LedgerShards}
	b, err := Empty(lf)
	if err != nil {
		t.Fatal(err)
	}

	// Byte for byte, at the offsets of region.h written out here.
	want := make([]byte, 280896)
	le := binary.LittleEndian
	le.PutUint64(want[0:], 0x3147455255504756)
	le.PutUint32(want[8:], 2)     // version
	le.PutUint32(want[12:], 2368) // header_size
	le.PutUint64(want[16:], 280896)
	le.PutUint32(want[24:], 2)    // device_count
	le.PutUint32(want[28:], 1024) // proc_slots
	copy(want[64:], "GPU-bbbb")
	le.PutUint64(want[64+96:], 8<<30)
	le.PutUint32(want[64+112:], 25)
	copy(want[64+144:], long) // 95 bytes: byte 95 of the field stays NUL
	le.PutUint32(want[64+144+112:], 100)
	if !bytes.Equal(b, want) {
		for i := range want {
			if i < len(b) && b[i] != want[i] {
				t.Fatalf("Empty differs from the layout at byte %d: %#x, want %#x", i, b[i], want[i])
			}
		}
		t.Fatalf("Empty wrote %d bytes, want %d", len(b), len(want))
	}

	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	wantDevs := []DeviceUsage{{UUID: "GPU-bbbb", Limit: 8 << 30, Cores: 25}, {UUID: long, Cores: 100}}
	if u.Version != 2 || !reflect.DeepEqual(u.Devices, wantDevs) || len(u.Processes) != 0 {
		t.Errorf("read back %+v, want version 2, devices %+v, no process", u, wantDevs)
	}
	for _, g := range lf.GPUs {
		if err := u.Check(g.UUID, g.Memory); err != nil {
			t.Errorf("Check: %v", err)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	dev := func(uuid string) DeviceUsage { return DeviceUsage{UUID: uuid} }
	for _, tc := range []struct {
		name string
		u    Usage
		want string
	}{
		{"version 0", Usage{Version: 0}, "version 0"},
		{"version 3", Usage{Version: 3}, "version 3"},
		{"17 devices", Usage{Version: 2, Devices: make([]DeviceUsage, 17)}, "17 devices"},
		{"1025 slots", Usage{Version: 2, Processes: make([]ProcessUsage, 1025)}, "1025 process slots"},
		{"a UUID of 96 bytes", Usage{Version: 2, Devices: []DeviceUsage{dev(strings.Repeat("a", 96))}}, "0..95 bytes"},
		{"a NUL in a UUID", Usage{Version: 2, Devices: []DeviceUsage{dev("GPU-\x00x")}}, "without a NUL"},
		{"a peak in version 1", Usage{Version: 1, Devices: []DeviceUsage{{UUID: "A", Peak: 1}}}, "version 1 cannot hold"},
		{"a process counting more devices", Usage{Version: 2, Devices: []DeviceUsage{dev("A")},
			Processes: []ProcessUsage{{PID: 3, Used: []uint64{1, 2}}}}, "process 3 counts 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Encode(&tc.u); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Encode = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := Empty(&limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: "GPU-1", Cores: 0}}}); err == nil || !strings.Contains(err.Error(), "cores 0") {
		t.Errorf("Empty of a limits file with cores 0 = %v, want its error", err)
	}
}
