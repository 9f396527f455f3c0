package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const gib = 1 << 30

// A tenant that holds the region's lock (it can, for ever: the region is
// its to open) does not stall the host's reader, which returns the data.
func TestReadUsageDoesNotWaitForTheLock(t *testing.T) {
	r := validRegion(t)
	path := writeRegion(t, r, 0)
	holder, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.FcntlFlock(holder.Fd(), unix.F_OFD_SETLKW, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		u   *Usage
		err error
	}
	done := make(chan result, 1)
	go func() { u, err := ReadUsage(path); done <- result{u, err} }()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatalf("ReadUsage while a tenant holds the lock: %v", res.err)
		}
		if len(res.u.Devices) != 1 || res.u.Devices[0].Used != 40 {
			t.Errorf("ReadUsage = %+v, want the region's one device with 40 bytes used", res.u)
		}
	case <-time.After(30 * time.Second): // a failure detector, not a timing
		t.Fatal("ReadUsage waited on the tenant's lock")
	}
}

func encode(t *testing.T, r *rawRegion) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, r); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A read that catches a writer between raising a device's total and its
// peak (the shim raises the peak first; a reader may still see them in
// another order) is read again.
func TestReadUsageRereadsATornPeak(t *testing.T) {
	r := validRegion(t) // used 40, peak 60
	path := writeRegion(t, r, 0)
	torn := *r
	torn.Devices[0].Used, torn.Procs[7].Used[0] = 70, 70 // the peak not raised yet
	tornBytes := encode(t, &torn)
	reads := 0
	readAt = func(f *os.File, b []byte, off int64) (int, error) {
		reads++
		if reads == 1 {
			return copy(b, tornBytes), nil
		}
		return f.ReadAt(b, off)
	}
	defer func() { readAt = (*os.File).ReadAt }()
	u, err := ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	if reads != 2 || u.Devices[0].Used != 40 || u.Devices[0].Peak != 60 {
		t.Errorf("%d reads, used %d, peak %d; want a second read giving the settled 40 and 60 bytes", reads, u.Devices[0].Used, u.Devices[0].Peak)
	}
}

// A read that catches a writer between its two stores is read again.
func TestReadUsageRereadsATornSnapshot(t *testing.T) {
	r := validRegion(t)
	path := writeRegion(t, r, 0)
	torn := *r
	torn.Devices[0].Used = 50 // the total stored, the slot not yet
	tornBytes := encode(t, &torn)
	reads := 0
	readAt = func(f *os.File, b []byte, off int64) (int, error) {
		reads++
		if reads == 1 {
			return copy(b, tornBytes), nil
		}
		return f.ReadAt(b, off)
	}
	defer func() { readAt = (*os.File).ReadAt }()
	u, err := ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	if reads != 2 || u.Devices[0].Used != 40 {
		t.Errorf("%d reads, used %d; want a second read giving the settled 40 bytes", reads, u.Devices[0].Used)
	}
	if err := u.Check("GPU-1", 100); err != nil {
		t.Errorf("Check of the settled snapshot: %v", err)
	}
}

// What a tenant can write into its region, and whether Check believes it.
func TestCheck(t *testing.T) {
	dev := func(uuid string, used uint64) DeviceUsage { return DeviceUsage{UUID: uuid, Used: used} }
	proc := func(pid int32, used, launches uint64) ProcessUsage {
		return ProcessUsage{PID: pid, Used: []uint64{used}, Launches: []uint64{launches}}
	}
	v2 := func(used, peak, throttled uint64, procs ...ProcessUsage) Usage {
		return Usage{Version: 2, Devices: []DeviceUsage{{UUID: "A", Used: used, Peak: peak, ThrottledNs: throttled}}, Processes: procs}
	}
	full := make([]ProcessUsage, MaxProcs)
	for i := range full {
		full[i] = proc(int32(i+1), 1, 0)
	}
	tests := []struct {
		name    string
		u       Usage
		limit   uint64
		suspect string // "" = believable
	}{
		{"as the shim writes it", Usage{Devices: []DeviceUsage{dev("A", 3*gib)}, Processes: []ProcessUsage{proc(1, gib, 5), proc(2, 2*gib, 7)}}, 8 * gib, ""},
		{"no process yet", Usage{Devices: []DeviceUsage{dev("A", 0)}}, 8 * gib, ""},
		{"a context counted past the limit", Usage{Devices: []DeviceUsage{dev("A", 8*gib+512<<20)}, Processes: []ProcessUsage{proc(1, 8*gib+512<<20, 0)}}, 8 * gib, ""},
		{"no limit, a lot in use", Usage{Devices: []DeviceUsage{dev("A", 100*gib)}, Processes: []ProcessUsage{proc(1, 100*gib, 0)}}, 0, ""},
		{"every slot taken, one more process without a slot", Usage{Devices: []DeviceUsage{dev("A", MaxProcs+5)}, Processes: full}, 8 * gib, ""},
		{"0 B shown while 3 GiB is held", Usage{Devices: []DeviceUsage{dev("A", 0)}, Processes: []ProcessUsage{proc(1, 3*gib, 0)}}, 8 * gib, "not the sum"},
		{"more shown than the processes hold", Usage{Devices: []DeviceUsage{dev("A", 5*gib)}, Processes: []ProcessUsage{proc(1, 3*gib, 0)}}, 8 * gib, "not the sum"},
		{"9.2e18 bytes, consistent", Usage{Devices: []DeviceUsage{dev("A", 1<<63-1)}, Processes: []ProcessUsage{proc(1, 1<<63-1, 0)}}, 8 * gib, "more than the limit"},
		{"9.2e18 bytes without a limit", Usage{Devices: []DeviceUsage{dev("A", 1<<63-1)}, Processes: []ProcessUsage{proc(1, 1<<63-1, 0)}}, 0, "more than any machine"},
		{"used above the limit", Usage{Devices: []DeviceUsage{dev("A", 20*gib)}, Processes: []ProcessUsage{proc(1, 20*gib, 0)}}, 8 * gib, "more than the limit"},
		{"slots that overflow", Usage{Devices: []DeviceUsage{dev("A", 4)}, Processes: []ProcessUsage{proc(1, 1<<63, 0), proc(2, 1<<63+4, 0)}}, 0, "overflow"},
		{"a forged launch counter", Usage{Devices: []DeviceUsage{dev("A", gib)}, Processes: []ProcessUsage{proc(1, gib, 1<<63)}}, 8 * gib, "kernel launches"},
		{"the GPU listed twice", Usage{Devices: []DeviceUsage{dev("A", 0), dev("A", 0)}}, 8 * gib, "listed 2 times"},
		{"the GPU missing", Usage{Devices: []DeviceUsage{dev("B", 0)}}, 8 * gib, "missing"},

		// Version 2: the peak and the throttled time.
		{"v2 as the shim writes it", v2(3*gib, 5*gib, 7_000_000_000, proc(1, gib, 5), proc(2, 2*gib, 7)), 8 * gib, ""},
		{"v2 peak equal to used", v2(3*gib, 3*gib, 0, proc(1, 3*gib, 0)), 8 * gib, ""},
		{"v2 peak reached by processes gone since", v2(gib, 8*gib+3*gib, 0, proc(1, gib, 0)), 8 * gib, ""},
		{"v2 peak with every slot's context past the limit", v2(gib, 8*gib+1024*gib, 0, proc(1, gib, 0)), 8 * gib, ""},
		{"v2 no limit, a large peak", v2(gib, 1<<50, 0, proc(1, gib, 0)), 0, ""},
		{"v2 throttled at the bound", v2(gib, gib, 1<<62, proc(1, gib, 0)), 8 * gib, ""},
		{"v1 knows no peak", Usage{Version: 1, Devices: []DeviceUsage{dev("A", 3*gib)}, Processes: []ProcessUsage{proc(1, 3*gib, 0)}}, 8 * gib, ""},
		{"v2 peak below used", v2(3*gib, 2*gib, 0, proc(1, 3*gib, 0)), 8 * gib, "a peak of 2147483648 bytes, below the 3221225472 bytes in use"},
		{"v2 peak 0 while memory is held", v2(3*gib, 0, 0, proc(1, 3*gib, 0)), 8 * gib, "below the"},
		{"v2 peak beyond the limit with every slot's context", v2(gib, 8*gib+1024*gib+1, 0, proc(1, gib, 0)), 8 * gib, "a peak of 1108101562369 bytes, more than the limit"},
		{"v2 9.2e18 bytes peak", v2(gib, 1<<63, 0, proc(1, gib, 0)), 8 * gib, "more than the limit"},
		{"v2 no limit, peak beyond any machine", v2(gib, 1<<50+1, 0, proc(1, gib, 0)), 0, "a peak of 1125899906842625 bytes, more than any machine"},
		{"v2 throttled past the bound", v2(gib, gib, 1<<62+1, proc(1, gib, 0)), 8 * gib, "4611686018427387905 ns throttled"},
		{"v2 throttled -1 as int64", v2(gib, gib, 1<<64-1, proc(1, gib, 0)), 0, "ns throttled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.u.Check("A", tt.limit)
			if tt.suspect == "" {
				if err != nil {
					t.Errorf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrSuspect) || !strings.Contains(err.Error(), tt.suspect) || !strings.Contains(err.Error(), "GPU A") {
				t.Errorf("Check = %v, want ErrSuspect naming GPU A and saying %q", err, tt.suspect)
			}
		})
	}
}
