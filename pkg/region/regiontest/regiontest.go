// Package regiontest writes usage regions (Contract 5) for tests of the
// region's readers: what the shim would write, or what a tenant could.
package regiontest

import (
	"os"
	"reflect"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Write writes a version 1 usage region at path, as the shim of an earlier
// release lays it out: the header, the devices in order, and each process
// in a slot of its own (slots spread out, as the shim's reaping leaves
// them). Used and Launches of a process are indexed like devs. Version 1
// has no peak and no throttled time: the devices' Peak and ThrottledNs
// must be 0 (WriteV2 writes them). The file is mode 0666, as the shim
// creates it.
func Write(t testing.TB, path string, devs []region.DeviceUsage, procs []region.ProcessUsage) {
	t.Helper()
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
	if 3*len(procs) > region.MaxProcs {
		t.Fatalf("regiontest.Write: %d processes, at most %d", len(procs), region.MaxProcs/3)
	}
	// Process j in slot 3j+1: the slots between stay free.
	slots := make([]region.ProcessUsage, 3*len(procs))
	for j, p := range procs {
		slots[3*j+1] = p
	}
	b, err := region.Encode(&region.Usage{Version: version, Devices: devs, Processes: slots})
	if err != nil {
		t.Fatalf("regiontest.Write: %v", err)
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
