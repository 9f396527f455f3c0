package limits

import (
	"reflect"
	"testing"
)

// FuzzParseLimits: ParseLimits never panics, and whatever it accepts
// Marshal writes out again and ParseLimits reads back the same.
func FuzzParseLimits(f *testing.F) {
	for _, seed := range []string{
		testLimitsText,
		"",
		"version=1\n",
		"version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=0\ngpu.0.cores=100",
		"version = 1 # c\n\ngpu.0.uuid = GPU-a#\n\tgpu.0.memory=1\ngpu.0.cores=1\nlog.level=debug\n",
		"version=1\ngpu.1.uuid=GPU-b\ngpu.1.memory=1\ngpu.1.cores=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=1\ngpu.0.cores=1\n",
		"version=1\ngpu.0.uuid=GPU-a\ngpu.0.uuid=GPU-a\n",
		"version=1\ngpu.15.uuid=x\n",
		"version=1\r\ngpu.0.uuid=GPU-a\r\n",
		"version=1\ngpu.0.memory=18446744073709551616\n",
		"version=1\ngpu.0.uuid=GPU-a\ngpu.0.memory=0\ngpu.0.cores=100\nledger.shards=64\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lf, err := ParseLimits(data)
		if err != nil {
			return
		}
		out, err := lf.Marshal()
		if err != nil {
			t.Fatalf("ParseLimits accepted %q as %+v, which Marshal refuses: %v", data, lf, err)
		}
		again, err := ParseLimits(out)
		if err != nil {
			t.Fatalf("ParseLimits refuses Marshal's output %q: %v", out, err)
		}
		if !reflect.DeepEqual(again, lf) {
			t.Fatalf("round trip of %q: %+v, then %+v", data, lf, again)
		}
	})
}

// FuzzParseDeviceID: ParseDeviceID never panics, and whatever it accepts is
// exactly what DeviceID prints for the parts.
func FuzzParseDeviceID(f *testing.F) {
	for _, seed := range []string{
		"GPU-8e1c2a3b-0000-1111-2222-333344445555::0",
		"GPU-x::1023",
		"MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0::3",
		"",
		"::",
		"::0",
		"GPU-x::",
		"GPU-x:::0",
		"GPU-x::00",
		"GPU-x::-0",
		"GPU-x::1::2",
		"GPU-x::9223372036854775808",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		uuid, slice, err := ParseDeviceID(id)
		if err != nil {
			return
		}
		if slice < 0 {
			t.Fatalf("ParseDeviceID(%q) = slice %d", id, slice)
		}
		if again := DeviceID(uuid, slice); again != id {
			t.Fatalf("ParseDeviceID(%q) = %q, %d; DeviceID of those is %q", id, uuid, slice, again)
		}
	})
}
