package region

import (
	"encoding/binary"
	"testing"
)

// FuzzDecodeAndCheck lays arbitrary bytes over the start of a region (the
// header, the device entries, the first slots: what a tenant controls as
// much as the rest) and decodes it. Decoding never panics, and whatever
// Check believes of a version 2 region keeps the invariants it promises:
// a peak at least the memory in use, a throttled time within its bound.
func FuzzDecodeAndCheck(f *testing.F) {
	f.Add(handBuilt(1)[:4096], uint64(1000))
	f.Add(handBuilt(2)[:4096], uint64(0))
	f.Add(handBuilt(2)[:64], uint64(1<<30))
	// What Check must not believe: a peak of 100 below the 300 bytes in
	// use, a throttled time of 2^62 + 1 ns.
	low, long := handBuilt(2)[:4096], handBuilt(2)[:4096]
	binary.LittleEndian.PutUint64(low[64+120:], 100)
	binary.LittleEndian.PutUint64(long[64+128:], 1<<62+1)
	f.Add(low, uint64(1000))
	f.Add(long, uint64(1000))
	f.Fuzz(func(t *testing.T, head []byte, limit uint64) {
		b := make([]byte, Size)
		copy(b, head)
		u, err := decode(b)
		if err != nil {
			return
		}
		if u.Version < OldestVersion || u.Version > Version || len(u.Devices) > MaxDevices {
			t.Fatalf("decoded version %d with %d devices", u.Version, len(u.Devices))
		}
		for i, d := range u.Devices {
			if !u.HasPeakAndThrottle() && (d.Peak != 0 || d.ThrottledNs != 0) {
				t.Fatalf("version %d device %d has peak %d, throttled %d", u.Version, i, d.Peak, d.ThrottledNs)
			}
			if u.Check(d.UUID, limit) != nil || !u.HasPeakAndThrottle() {
				continue
			}
			if d.Peak < d.Used || d.ThrottledNs > 1<<62 {
				t.Fatalf("Check believes device %d: used %d, peak %d, throttled %d ns", i, d.Used, d.Peak, d.ThrottledNs)
			}
			if raw := binary.LittleEndian.Uint64(b[64+i*144+120:]); raw != d.Peak {
				t.Fatalf("device %d: peak %d read from bytes saying %d", i, d.Peak, raw)
			}
		}
	})
}
