package limits

import (
	"math"
	"strings"
	"testing"
)

const (
	GiB = 1 << 30
	// Awkward totals as NVML reports them.
	a100_40GB = 40536 * MiB   // 40536 MiB, 7 does not divide it
	t4Total   = 15843721216   // 15109.75 MiB: not a whole number of MiB
	h100Total = 85520809984   // 81559 MiB
	tinyTotal = 5*MiB + 12345 // simulated toy GPU
)

func TestSliceSize(t *testing.T) {
	tests := []struct {
		name           string
		total          uint64
		split          int
		memScale, cScl float64
		want           Slice
	}{
		{"16GiB/10", 16 * GiB, 10, 1, 1, Slice{1638 * MiB, 10}},
		{"40536MiB/7", a100_40GB, 7, 1, 1, Slice{5790 * MiB, 14}},
		{"T4/4 rounds down to a MiB", t4Total, 4, 1, 1, Slice{3777 * MiB, 25}},
		{"whole GPU as one slice", 16 * GiB, 1, 1, 1, Slice{16 * GiB, 100}},
		{"whole T4 as one slice rounds to a MiB", t4Total, 1, 1, 1, Slice{15109 * MiB, 100}},
		{"memory scaling 2 oversubscribes", 16 * GiB, 10, 2, 1, Slice{3276 * MiB, 10}},
		{"cores scaling 2 oversubscribes", 16 * GiB, 10, 1, 2, Slice{1638 * MiB, 20}},
		{"cores capped at 100", 16 * GiB, 2, 1, 3, Slice{8 * GiB, 100}},
		{"decimal scaling 1.1 is exact", 10 * GiB, 1, 1.1, 1, Slice{11264 * MiB, 100}},
		{"decimal cores scaling 0.29 is 29, not 28", 16 * GiB, 1, 1, 0.29, Slice{16 * GiB, 29}},
		{"decimal cores scaling 0.57 is 57, not 56", 16 * GiB, 1, 1, 0.57, Slice{16 * GiB, 57}},
		{"cores scaling 0.5", 16 * GiB, 10, 1, 0.5, Slice{1638 * MiB, 5}},
		{"1024 slices: at least 1 percent each", 16 * GiB, 1024, 1, 1, Slice{16 * MiB, 1}},
		{"101 slices: at least 1 percent each", 80 * GiB, 101, 1, 1, Slice{811 * MiB, 1}},
		{"100 slices: exactly 1 percent", 80 * GiB, 100, 1, 1, Slice{819 * MiB, 1}},
		{"tiny GPU: at least 1 MiB a slice", tinyTotal, 10, 1, 1, Slice{MiB, 10}},
		{"tinier GPU: the whole scaled memory", 512 << 10, 10, 1, 1, Slice{512 << 10, 10}},
		{"no memory", 0, 10, 1, 1, Slice{0, 10}},
		{"saturates", math.MaxUint64, 1, 10, 1, Slice{math.MaxUint64 &^ (MiB - 1), 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SliceSize(tt.total, tt.split, tt.memScale, tt.cScl)
			if got != tt.want {
				t.Errorf("SliceSize(%d, %d, %v, %v) = %+v, want %+v", tt.total, tt.split, tt.memScale, tt.cScl, got, tt.want)
			}
			if got.Memory%MiB != 0 && got.Memory >= MiB {
				t.Errorf("slice memory %d is not a whole number of MiB", got.Memory)
			}
		})
	}
}

func TestQuota(t *testing.T) {
	tests := []struct {
		name             string
		total            uint64
		split, slices    int
		memScale, cScale float64
		want             Slice
	}{
		{"no slices", 16 * GiB, 10, 0, 1, 1, Slice{}},
		{"one slice", 16 * GiB, 10, 1, 1, 1, Slice{1638 * MiB, 10}},
		{"three slices", 16 * GiB, 10, 3, 1, 1, Slice{3 * 1638 * MiB, 30}},
		{"9 of 10 slices", 16 * GiB, 10, 9, 1, 1, Slice{9 * 1638 * MiB, 90}},
		{"every slice is the whole GPU", 16 * GiB, 10, 10, 1, 1, Slice{16 * GiB, 100}},

		// 7 slices of 40536 MiB: 5790 MiB and 14 percent each; 6 of them are
		// 34740 MiB and 84 percent, all 7 the whole GPU although 7 × 5790 MiB
		// is 40530 MiB and 7 × 14 is 98.
		{"40536MiB 6 of 7", a100_40GB, 7, 6, 1, 1, Slice{34740 * MiB, 84}},
		{"40536MiB 7 of 7", a100_40GB, 7, 7, 1, 1, Slice{a100_40GB, 100}},
		// The cap is not rounded to a MiB: the whole T4 is its whole memory.
		{"T4 3 of 4", t4Total, 4, 3, 1, 1, Slice{3 * 3777 * MiB, 75}},
		{"T4 4 of 4", t4Total, 4, 4, 1, 1, Slice{t4Total, 100}},
		{"H100 7 of 7", h100Total, 7, 7, 1, 1, Slice{h100Total, 100}},
		{"H100 3 of 7", h100Total, 7, 3, 1, 1, Slice{3 * 11651 * MiB, 42}},

		// Oversubscription: memory_scaling 2 on 16 GiB in 10 slices is
		// 3276 MiB a slice; 5 slices already reach 100 percent of SM time
		// with cores_scaling 2.
		{"scaling 2: 1 of 10", 16 * GiB, 10, 1, 2, 2, Slice{3276 * MiB, 20}},
		{"scaling 2: 5 of 10", 16 * GiB, 10, 5, 2, 2, Slice{5 * 3276 * MiB, 100}},
		{"scaling 2: 7 of 10", 16 * GiB, 10, 7, 2, 2, Slice{7 * 3276 * MiB, 100}},
		{"scaling 2: 10 of 10", 16 * GiB, 10, 10, 2, 2, Slice{32 * GiB, 100}},
		{"scaling 2 on T4: 4 of 4", t4Total, 4, 4, 2, 2, Slice{2 * t4Total, 100}},

		// Under-subscription: a GPU whole is still 100 percent, whatever
		// cores_scaling says of its slices.
		{"cores scaling 0.5: 9 of 10", 16 * GiB, 10, 9, 1, 0.5, Slice{9 * 1638 * MiB, 45}},
		{"cores scaling 0.5: 10 of 10", 16 * GiB, 10, 10, 1, 0.5, Slice{16 * GiB, 100}},
		{"memory scaling 0.5: 10 of 10", 16 * GiB, 10, 10, 0.5, 1, Slice{8 * GiB, 100}},

		{"1024 slices: 150 of them", 16 * GiB, 1024, 150, 1, 1, Slice{150 * 16 * MiB, 100}},
		{"1024 slices: 99 of them", 16 * GiB, 1024, 99, 1, 1, Slice{99 * 16 * MiB, 99}},
		{"tiny GPU: capped at its memory", 512 << 10, 10, 3, 1, 1, Slice{512 << 10, 30}},
		{"small GPU: capped at its memory", tinyTotal, 10, 9, 1, 1, Slice{tinyTotal, 90}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Quota(tt.total, tt.split, tt.slices, tt.memScale, tt.cScale)
			if got != tt.want {
				t.Errorf("Quota(%d, %d, %d, %v, %v) = %+v, want %+v", tt.total, tt.split, tt.slices, tt.memScale, tt.cScale, got, tt.want)
			}
		})
	}
}

// TestQuotaInvariants checks, over many splits, what the rest of the system
// relies on: quotas grow with the slice count, never pass the caps, a
// non-empty quota is never 0 (which means "unlimited" downstream), and every
// slice together is the whole scaled GPU.
func TestQuotaInvariants(t *testing.T) {
	totals := []uint64{MiB, tinyTotal, t4Total, 16 * GiB, a100_40GB, h100Total, 141 * GiB}
	scalings := []float64{0.3, 1, 1.1, 2}
	for _, total := range totals {
		for _, split := range []int{1, 2, 3, 7, 10, 13, 64, 100, 101, 333, 1024} {
			for _, ms := range scalings {
				for _, cs := range scalings {
					scaled := scaledMemory(total, ms)
					prev := Slice{}
					for k := 0; k <= split; k++ {
						q := Quota(total, split, k, ms, cs)
						if q.Memory < prev.Memory || q.Cores < prev.Cores {
							t.Fatalf("total %d split %d scaling %v/%v: %d slices %+v < %d slices %+v", total, split, ms, cs, k, q, k-1, prev)
						}
						if q.Memory > scaled || q.Cores > 100 {
							t.Fatalf("total %d split %d scaling %v/%v: %d slices %+v passes the cap (%d bytes, 100)", total, split, ms, cs, k, q, scaled)
						}
						if k > 0 && (q.Memory == 0 || q.Cores == 0) {
							t.Fatalf("total %d split %d scaling %v/%v: %d slices give %+v", total, split, ms, cs, k, q)
						}
						prev = q
					}
					if want := (Slice{scaled, 100}); prev != want {
						t.Fatalf("total %d split %d scaling %v/%v: every slice gives %+v, want %+v", total, split, ms, cs, prev, want)
					}
				}
			}
		}
	}
}

func TestCheckedQuotaErrors(t *testing.T) {
	tests := []struct {
		name          string
		split, slices int
		ms, cs        float64
		want          string
	}{
		{"split 0", 0, 0, 1, 1, "split count 0: must be at least 1"},
		{"split negative", -3, 0, 1, 1, "split count -3: must be at least 1"},
		{"slices negative", 10, -1, 1, 1, "-1 slices of a GPU split into 10: must be 0..10"},
		{"slices above split", 10, 11, 1, 1, "11 slices of a GPU split into 10: must be 0..10"},
		{"memory scaling 0", 10, 1, 0, 1, "memory scaling 0: must be a finite number above 0"},
		{"memory scaling negative", 10, 1, -1, 1, "memory scaling -1: must be a finite number above 0"},
		{"memory scaling NaN", 10, 1, math.NaN(), 1, "memory scaling NaN: must be a finite number above 0"},
		{"cores scaling +Inf", 10, 1, 1, math.Inf(1), "cores scaling +Inf: must be a finite number above 0"},
		{"cores scaling 0", 10, 1, 1, 0, "cores scaling 0: must be a finite number above 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckedQuota(16*GiB, tt.split, tt.slices, tt.ms, tt.cs)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("CheckedQuota: error %v, want %q", err, tt.want)
			}
			assertPanics(t, "limits.Quota: "+tt.want, func() { Quota(16*GiB, tt.split, tt.slices, tt.ms, tt.cs) })
			if err := CheckSplit(tt.split, tt.ms, tt.cs); err != nil {
				assertPanics(t, "limits.SliceSize: "+tt.want, func() { SliceSize(16*GiB, tt.split, tt.ms, tt.cs) })
			}
		})
	}
}

func assertPanics(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want %q", want)
		}
		if s, _ := r.(string); s != want {
			t.Fatalf("panic %v, want %q", r, want)
		}
	}()
	f()
}

func TestDeviceID(t *testing.T) {
	tests := []struct {
		uuid  string
		slice int
		want  string
	}{
		{"GPU-8e1c2a3b-0000-1111-2222-333344445555", 0, "GPU-8e1c2a3b-0000-1111-2222-333344445555::0"},
		{"GPU-x", 9, "GPU-x::9"},
		{"MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0", 1023, "MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0::1023"},
	}
	for _, tt := range tests {
		got := DeviceID(tt.uuid, tt.slice)
		if got != tt.want {
			t.Errorf("DeviceID(%q, %d) = %q, want %q", tt.uuid, tt.slice, got, tt.want)
		}
		uuid, slice, err := ParseDeviceID(got)
		if err != nil || uuid != tt.uuid || slice != tt.slice {
			t.Errorf("ParseDeviceID(%q) = %q, %d, %v; want %q, %d", got, uuid, slice, err, tt.uuid, tt.slice)
		}
	}
}

func TestParseDeviceIDRejects(t *testing.T) {
	tests := []struct {
		id, want string
	}{
		{"", `device ID "": want <gpu-uuid>::<slice>`},
		{"GPU-x", `device ID "GPU-x": want <gpu-uuid>::<slice>`},
		{"GPU-x:3", `device ID "GPU-x:3": want <gpu-uuid>::<slice>`},
		{"::3", `device ID "::3": empty GPU UUID`},
		{"GPU-x::", `device ID "GPU-x::": slice index: empty number`},
		{"GPU-x::-1", `device ID "GPU-x::-1": slice index: "-1" is not a non-negative decimal integer`},
		{"GPU-x::+1", `device ID "GPU-x::+1": slice index: "+1" is not a non-negative decimal integer`},
		{"GPU-x::01", `device ID "GPU-x::01": slice index: "01" has a leading zero`},
		{"GPU-x:: 1", `device ID "GPU-x:: 1": slice index: " 1" is not a non-negative decimal integer`},
		{"GPU-x::1 ", `device ID "GPU-x::1 ": slice index: "1 " is not a non-negative decimal integer`},
		{"GPU-x::1::2", `device ID "GPU-x::1::2": slice index: "1::2" is not a non-negative decimal integer`},
		{"GPU-x:::1", `device ID "GPU-x:::1": slice index: ":1" is not a non-negative decimal integer`},
		{"GPU-x::0x1", `device ID "GPU-x::0x1": slice index: "0x1" is not a non-negative decimal integer`},
		{"GPU-x::99999999999999999999", `device ID "GPU-x::99999999999999999999": slice index: "99999999999999999999" out of range`},
		{"GPU x::1", `device ID "GPU x::1": GPU UUID "GPU x": character ' ' at offset 3 is not one of A-Z a-z 0-9 - _ . : /`},
		{"GPU#x::1", `device ID "GPU#x::1": GPU UUID "GPU#x": character '#' at offset 3 is not one of A-Z a-z 0-9 - _ . : /`},
	}
	for _, tt := range tests {
		uuid, slice, err := ParseDeviceID(tt.id)
		if err == nil || err.Error() != tt.want {
			t.Errorf("ParseDeviceID(%q) = %q, %d, %v; want error %q", tt.id, uuid, slice, err, tt.want)
		}
	}
}

func TestValidateUUID(t *testing.T) {
	valid := []string{
		"GPU-8e1c2a3b-0000-1111-2222-333344445555",
		"MIG-8e1c2a3b-0000-1111-2222-333344445555",
		"MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0",
		"sim_gpu.0",
		"a:b",
		strings.Repeat("a", MaxUUIDLen),
	}
	for _, u := range valid {
		if err := ValidateUUID(u); err != nil {
			t.Errorf("ValidateUUID(%q): %v", u, err)
		}
	}
	invalid := map[string]string{
		"":                                "empty GPU UUID",
		strings.Repeat("a", MaxUUIDLen+1): "GPU UUID is 96 bytes, at most 95",
		"GPU-1=2":                         `GPU UUID "GPU-1=2": character '=' at offset 5 is not one of A-Z a-z 0-9 - _ . : /`,
		"GPU-\t":                          `GPU UUID "GPU-\t": character '\t' at offset 4 is not one of A-Z a-z 0-9 - _ . : /`,
		"GPU-é":                           `GPU UUID "GPU-é": character byte 0xc3 at offset 4 is not one of A-Z a-z 0-9 - _ . : /`,
		"a::b":                            `GPU UUID "a::b" contains "::"`,
		"GPU:":                            `GPU UUID "GPU:" ends in ':'`,
	}
	for u, want := range invalid {
		if err := ValidateUUID(u); err == nil || err.Error() != want {
			t.Errorf("ValidateUUID(%q) = %v, want %q", u, err, want)
		}
	}
}

func TestScaledCores(t *testing.T) {
	tests := []struct {
		scaling float64
		want    int
	}{
		{1, 100},
		{0.29, 29}, // 0.29 × 100 in binary floating point is 28.999…
		{0.005, 0}, // less than a percent
		{1.5, 150},
		{10, 1000},
	}
	for _, tt := range tests {
		if got := ScaledCores(tt.scaling); got != tt.want {
			t.Errorf("ScaledCores(%v) = %d, want %d", tt.scaling, got, tt.want)
		}
	}
}
