// Package regiontest writes usage regions (Contract 5) for tests of the
// region's readers: what the shim would write, or what a tenant could.
package regiontest

import (
	"encoding/binary"
	"os"
	"reflect"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Offsets of shim/include/region.h; pkg/region's test holds its Go mirror
// to the C compiler's view, and Write checks itself against pkg/region's
// reader.
const (
	deviceSize = 144
	procSize   = 272
	devicesOff = 64
	procsOff   = devicesOff + region.MaxDevices*deviceSize
)

// Write writes a version 1 usage region at path, as the shim of an earlier
// release lays it out: the header, the devices in order, and each process
// in a slot of its own (slots spread out, as the shim's reaping leaves
// them). Used and Launches of a process are indexed like devs. Version 1
// has no peak and no throttled time: the devices' Peak and ThrottledNs
// must be 0. The file is mode 0666, as the shim creates it.
func Write(t testing.TB, path string, devs []region.DeviceUsage, procs []region.ProcessUsage) {
	t.Helper()
	for _, d := range devs {
		if d.Peak != 0 || d.ThrottledNs != 0 {
			t.Fatalf("regiontest.Write: device %s has a peak or a throttled time, which version 1 cannot hold (WriteV2)", d.UUID)
		}
	}
	write(t, path, 1, devs, procs)
}

// WriteV2 is Write for a version 2 region, the layout today's shim writes:
// the devices' Peak and ThrottledNs go in as given.
func WriteV2(t testing.TB, path string, devs []region.DeviceUsage, procs []region.ProcessUsage) {
	t.Helper()
	write(t, path, 2, devs, procs)
}

func write(t testing.TB, path string, version uint32, devs []region.DeviceUsage, procs []region.ProcessUsage) {
	t.Helper()
	b := make([]byte, region.Size)
	le := binary.LittleEndian
	le.PutUint64(b[0:], region.Magic)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[12:], procsOff)
	le.PutUint64(b[16:], uint64(region.Size))
	le.PutUint32(b[24:], uint32(len(devs)))
	le.PutUint32(b[28:], region.MaxProcs)
	for i, d := range devs {
		o := devicesOff + i*deviceSize
		copy(b[o:o+region.UUIDLen], d.UUID)
		le.PutUint64(b[o+96:], d.Limit)
		le.PutUint64(b[o+104:], d.Used)
		le.PutUint32(b[o+112:], d.Cores)
		le.PutUint64(b[o+120:], d.Peak)
		le.PutUint64(b[o+128:], d.ThrottledNs)
	}
	if 3*len(procs) > region.MaxProcs {
		t.Fatalf("regiontest.Write: %d processes, at most %d", len(procs), region.MaxProcs/3)
	}
	for j, p := range procs {
		o := procsOff + (3*j+1)*procSize
		le.PutUint32(b[o:], uint32(p.PID))
		le.PutUint32(b[o+4:], uint32(p.HostPID))
		le.PutUint64(b[o+8:], p.StartTime)
		for i := range p.Used {
			le.PutUint64(b[o+16+8*i:], p.Used[i])
		}
		for i := range p.Launches {
			le.PutUint64(b[o+144+8*i:], p.Launches[i])
		}
	}
	if err := os.WriteFile(path, b, 0o666); err != nil {
		t.Fatal(err)
	}
	got, err := region.ReadUsage(path)
	if err != nil {
		t.Fatalf("regiontest.Write disagrees with pkg/region: %v", err)
	}
	sameDevices := len(got.Devices) == 0 && len(devs) == 0 || reflect.DeepEqual(got.Devices, devs)
	if !sameDevices || len(got.Processes) != len(procs) || got.Version != version {
		t.Fatalf("regiontest.Write disagrees with pkg/region: wrote %+v %+v, read %+v", devs, procs, got)
	}
}
