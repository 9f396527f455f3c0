package region

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unsafe"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// Encode lays u out as a region file of u.Version: the header, u.Devices in
// order, and u.Processes[i] in process slot i, where a PID of 0 leaves the
// slot free (all zero). Everything else is zero. It refuses what the layout
// cannot hold: an unknown version, more than MaxDevices devices or MaxProcs
// slots, a UUID of UUIDLen bytes or more or with a NUL in it (the shim keeps
// it NUL-terminated), a process counting more devices than u has, and a
// peak or throttled time in version 1, which has neither.
func Encode(u *Usage) ([]byte, error) {
	switch {
	case u.Version < OldestVersion || u.Version > Version:
		return nil, fmt.Errorf("encoding usage region: version %d, this build writes %d to %d", u.Version, OldestVersion, Version)
	case len(u.Devices) > MaxDevices:
		return nil, fmt.Errorf("encoding usage region: %d devices, at most %d", len(u.Devices), MaxDevices)
	case len(u.Processes) > MaxProcs:
		return nil, fmt.Errorf("encoding usage region: %d process slots, at most %d", len(u.Processes), MaxProcs)
	}
	const procsOff = int(unsafe.Offsetof(rawRegion{}.Procs))
	const procSize = int(unsafe.Sizeof(rawProc{}))
	var front struct {
		Header  rawHeader
		Devices [MaxDevices]rawDevice
	}
	front.Header = rawHeader{Magic: Magic, Version: u.Version, HeaderSize: uint32(procsOff), Size: uint64(Size),
		DeviceCount: uint32(len(u.Devices)), ProcSlots: MaxProcs}
	for i, d := range u.Devices {
		if len(d.UUID) >= UUIDLen || strings.IndexByte(d.UUID, 0) >= 0 {
			return nil, fmt.Errorf("encoding usage region: device %d: UUID %q is not 0..%d bytes without a NUL", i, d.UUID, UUIDLen-1)
		}
		if u.Version < 2 && (d.Peak != 0 || d.ThrottledNs != 0) {
			return nil, fmt.Errorf("encoding usage region: device %d (%s): a peak or a throttled time, which version %d cannot hold", i, d.UUID, u.Version)
		}
		r := &front.Devices[i]
		copy(r.UUID[:], d.UUID)
		r.Limit, r.Used, r.Cores, r.Peak, r.ThrottledNs = d.Limit, d.Used, d.Cores, d.Peak, d.ThrottledNs
	}
	b := make([]byte, Size)
	if _, err := binary.Encode(b[:procsOff], binary.LittleEndian, &front); err != nil {
		return nil, fmt.Errorf("encoding usage region: %w", err)
	}
	for i, p := range u.Processes {
		if p.PID == 0 {
			continue
		}
		if len(p.Used) > len(u.Devices) || len(p.Launches) > len(u.Devices) {
			return nil, fmt.Errorf("encoding usage region: process %d counts %d and %d devices, the region has %d", p.PID, len(p.Used), len(p.Launches), len(u.Devices))
		}
		r := rawProc{PID: p.PID, HostPID: p.HostPID, StartTime: p.StartTime}
		copy(r.Used[:], p.Used)
		copy(r.Launches[:], p.Launches)
		if _, err := binary.Encode(b[procsOff+i*procSize:procsOff+(i+1)*procSize], binary.LittleEndian, &r); err != nil {
			return nil, fmt.Errorf("encoding usage region: %w", err)
		}
	}
	return b, nil
}

// Empty returns the region of a container none of whose processes has
// used a GPU yet, as the host writes it when it provisions the record: the
// current Version, one device per GPU of the limits file lf in its order
// with the GPU's UUID, memory limit and cores, nothing in use, no process.
// It is what the shim's check of the region (the header, and each device
// against the limits file) finds sound, so the container's first process
// maps it and takes its slot without rebuilding the region from the ledger.
// A limits file that is not valid (limits.LimitsFile.Validate) is refused.
func Empty(lf *limits.LimitsFile) ([]byte, error) {
	if err := lf.Validate(); err != nil {
		return nil, fmt.Errorf("encoding usage region: %w", err)
	}
	u := &Usage{Version: Version, Devices: make([]DeviceUsage, len(lf.GPUs))}
	for i, g := range lf.GPUs {
		u.Devices[i] = DeviceUsage{UUID: g.UUID, Limit: g.Memory, Cores: uint32(g.Cores)}
	}
	return Encode(u)
}
