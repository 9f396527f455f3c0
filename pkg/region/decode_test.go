package region

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"unsafe"
)

// decodeWhole is decode as it was before it skipped the free process
// slots: the whole region through encoding/binary, every slot looked at.
// The fuzz target holds decode to it.
func decodeWhole(b []byte) (*Usage, error) {
	if len(b) != Size {
		return nil, ErrInvalid
	}
	var r rawRegion
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, &r); err != nil {
		return nil, ErrInvalid
	}
	h := r.Header
	if h.Magic != Magic || h.Version < OldestVersion || h.Version > Version ||
		h.Size != uint64(Size) || h.HeaderSize != uint32(unsafe.Offsetof(r.Procs)) ||
		h.DeviceCount > MaxDevices || h.ProcSlots != MaxProcs {
		return nil, ErrInvalid
	}
	nd := int(h.DeviceCount)
	u := &Usage{Version: h.Version, Devices: make([]DeviceUsage, nd)}
	for i := range nd {
		d := &r.Devices[i]
		u.Devices[i] = DeviceUsage{UUID: cString(d.UUID[:]), Limit: d.Limit, Used: d.Used, Cores: d.Cores}
		if h.Version >= 2 {
			u.Devices[i].Peak, u.Devices[i].ThrottledNs = d.Peak, d.ThrottledNs
		}
	}
	for i := range r.Procs {
		p := &r.Procs[i]
		if p.PID == 0 {
			continue
		}
		u.Processes = append(u.Processes, ProcessUsage{
			PID: p.PID, HostPID: p.HostPID, StartTime: p.StartTime,
			Used:     append([]uint64(nil), p.Used[:nd]...),
			Launches: append([]uint64(nil), p.Launches[:nd]...),
		})
	}
	return u, nil
}

// decode, which decodes only the process slots in use, reads what decoding
// the whole region reads: the same devices and the same processes, in slot
// order, from a region with its header and devices as given and process
// slots written at given places (a negative PID included).
func FuzzDecodeMatchesWhole(f *testing.F) {
	const procsOff = int(unsafe.Offsetof(rawRegion{}.Procs))
	const procSize = int(unsafe.Sizeof(rawProc{}))
	two := handBuilt(2)
	f.Add(two[:procsOff], uint16(0), two[procsOff+2*procSize:procsOff+3*procSize], uint16(1023), []byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add(handBuilt(1)[:procsOff], uint16(7), []byte{1, 0, 0, 0, 9}, uint16(7), []byte{})
	f.Fuzz(func(t *testing.T, head []byte, slot1 uint16, proc1 []byte, slot2 uint16, proc2 []byte) {
		b := make([]byte, Size)
		copy(b[:procsOff], head)
		for _, p := range []struct {
			slot uint16
			data []byte
		}{{slot1, proc1}, {slot2, proc2}} {
			o := procsOff + int(p.slot%MaxProcs)*procSize
			copy(b[o:o+procSize], p.data)
		}
		got, gotErr := decode(b)
		want, wantErr := decodeWhole(b)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("decode: %v; decoding the whole region: %v", gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("decode read %+v; decoding the whole region reads %+v", got, want)
		}
	})
}
