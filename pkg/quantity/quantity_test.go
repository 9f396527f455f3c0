package quantity

import (
	"math"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"1073741824", 1 << 30},
		{"123B", 123},
		{"123b", 123},
		{"1.0", 1},
		{"512KiB", 512 << 10},
		{"512Ki", 512 << 10},
		{"4096MiB", 4 << 30},
		{"4GiB", 4 << 30},
		{"4gib", 4 << 30},
		{"4Gi", 4 << 30},
		{"2TiB", 2 << 40},
		{"1PiB", 1 << 50},
		{"15EiB", 15 << 60},
		{"1.5GiB", 3 << 29},
		{"0.5MiB", 512 << 10},
		{"1.25GiB", 5 << 28},
		{"0.1KiB", 102}, // 102.4 rounds down to a whole byte
		{"4GB", 4e9},
		{"4gb", 4e9},
		{"1KB", 1000},
		{"2.5TB", 2.5e12},
		{"18EB", 18e18},
		{"007MiB", 7 << 20},
		{" 4GiB ", 4 << 30},
		{"4 GiB", 4 << 30},
		{"18446744073709551615", math.MaxUint64},
		{"18446744073709551615B", math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseBytes(tt.in)
			if err != nil {
				t.Fatalf("ParseBytes(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("ParseBytes(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []struct {
		in   string
		want string // part of the error after the quoted input
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"-1", "negative"},
		{"-4GiB", "negative"},
		{"+4GiB", "must start with a digit"},
		{"GiB", "must start with a digit"},
		{"NaN", "must start with a digit"},
		{"Inf", "must start with a digit"},
		{"+Inf", "must start with a digit"},
		{".5GiB", "must start with a digit"},
		{"1.GiB", "decimal point must be followed by a digit"},
		{"1e9", `unknown unit "e9"`},
		{"0x10", `unknown unit "x10"`},
		{"4XB", `unknown unit "XB"`},
		{"4GiBs", `unknown unit "GiBs"`},
		{"4GiB4", `unknown unit "GiB4"`},
		{"4 G iB", `unknown unit "G iB"`},
		{"1,5GiB", `unknown unit ",5GiB"`},
		{"4G", `ambiguous unit "G": use "GiB" (binary) or "GB" (decimal)`},
		{"4k", `ambiguous unit "k"`},
		{"1.5", "cannot have a fraction"},
		{"1.5B", "cannot have a fraction"},
		{"18446744073709551616", "out of range"},
		{"16EiB", "out of range"},
		{"19EB", "out of range"},
		{"99999999999999999999999999GiB", "out of range"},
		{strings.Repeat("1", 65), "longer than 64"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseBytes(tt.in)
			if err == nil {
				t.Fatalf("ParseBytes(%q) = %d, want an error", tt.in, got)
			}
			msg := err.Error()
			for _, want := range []string{`invalid byte quantity "` + tt.in + `"`, tt.want, `"4GiB"`, `"4096MiB"`} {
				if !strings.Contains(msg, want) {
					t.Errorf("ParseBytes(%q) error %q does not contain %q", tt.in, msg, want)
				}
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	const total = 40 << 30
	tests := []struct {
		in    string
		total uint64
		want  uint64
	}{
		{"4GiB", total, 4 << 30},
		{"4096MiB", total, 4 << 30},
		{"4GB", total, 4e9},
		{"64GiB", total, 64 << 30}, // above total: the caller caps
		{"4GiB", 0, 4 << 30},       // bytes need no total
		{"25%", total, 10 << 30},
		{" 25 % ", total, 10 << 30},
		{"100%", total, total},
		{"12.5%", total, 5 << 30},
		{"33%", 100, 33},
		{"33.9%", 100, 33}, // rounded down
		{"0.0001%", math.MaxUint64, 18446744073709},
		{"100%", math.MaxUint64, math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseMemory(tt.in, tt.total)
			if err != nil {
				t.Fatalf("ParseMemory(%q, %d): %v", tt.in, tt.total, err)
			}
			if got != tt.want {
				t.Fatalf("ParseMemory(%q, %d) = %d, want %d", tt.in, tt.total, got, tt.want)
			}
		})
	}
}

func TestParseMemoryErrors(t *testing.T) {
	tests := []struct {
		in    string
		total uint64
		want  string
	}{
		{"", 1 << 30, "empty"},
		{"0", 1 << 30, "more than 0 bytes"},
		{"0GiB", 1 << 30, "more than 0 bytes"},
		{"0%", 1 << 30, "more than 0 and at most 100"},
		{"0.0%", 1 << 30, "more than 0 and at most 100"},
		{"101%", 1 << 30, "more than 0 and at most 100"},
		{"100.01%", 1 << 30, "more than 0 and at most 100"},
		{"-5%", 1 << 30, "negative"},
		{"%", 1 << 30, "missing number"},
		{"25%%", 1 << 30, `unexpected "%" before %`},
		{"25GiB%", 1 << 30, `unexpected "GiB" before %`},
		{"NaN%", 1 << 30, "must start with a digit"},
		{"25%", 0, "needs the GPU's total memory"},
		{"1%", 50, "rounds down to 0 bytes"},
		{"4G", 1 << 30, "ambiguous unit"},
		{"-4GiB", 1 << 30, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseMemory(tt.in, tt.total)
			if err == nil {
				t.Fatalf("ParseMemory(%q, %d) = %d, want an error", tt.in, tt.total, got)
			}
			msg := err.Error()
			for _, want := range []string{`invalid memory quantity "` + tt.in + `"`, tt.want, `"25%"`} {
				if !strings.Contains(msg, want) {
					t.Errorf("ParseMemory(%q) error %q does not contain %q", tt.in, msg, want)
				}
			}
		})
	}
}

func TestParseCores(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"1", 1},
		{"30", 30},
		{"30%", 30},
		{" 30 % ", 30},
		{"100", 100},
		{"100%", 100},
		{"030", 30},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseCores(tt.in)
			if err != nil {
				t.Fatalf("ParseCores(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("ParseCores(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseCoresErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "empty"},
		{"%", "missing number"},
		{"0", "out of range 1..100"},
		{"0%", "out of range 1..100"},
		{"101", "out of range 1..100"},
		{"99999999999999999999999", "out of range 1..100"},
		{"-30", "negative"},
		{"+30", "must start with a digit"},
		{"30.5", "whole number"},
		{"30%%", `unexpected "%" after the number`},
		{"30 cores", `unexpected " cores" after the number`},
		{"0x1e", `unexpected "x1e" after the number`},
		{"NaN", "must start with a digit"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseCores(tt.in)
			if err == nil {
				t.Fatalf("ParseCores(%q) = %d, want an error", tt.in, got)
			}
			msg := err.Error()
			for _, want := range []string{`invalid cores quantity "` + tt.in + `"`, tt.want, `"30%"`} {
				if !strings.Contains(msg, want) {
					t.Errorf("ParseCores(%q) error %q does not contain %q", tt.in, msg, want)
				}
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   uint64
		want string
	}{
		{0, "0B"},
		{123, "123B"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{1536, "1.5KiB"},
		{1025, "1025B"},
		{512 << 20, "512MiB"},
		{8 << 30, "8GiB"},
		{3 << 29, "1.5GiB"},
		{5 << 28, "1.25GiB"},
		{7 << 28, "1.75GiB"},
		{1025 << 20, "1025MiB"}, // 1.0009765625GiB: exact in MiB only
		{1<<30 + 1, "1073741825B"},
		{40 << 30, "40GiB"},
		{80 << 30, "80GiB"},
		{4e9, "3906250KiB"},
		{15 << 60, "15EiB"},
		{math.MaxUint64, "18446744073709551615B"},
		{math.MaxUint64 - (1<<58 - 1), "15.75EiB"},
	}
	for _, tt := range tests {
		if got := FormatBytes(tt.in); got != tt.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// FormatBytes output is always exact, so it must read back to the same value.
func TestFormatBytesRoundTrip(t *testing.T) {
	values := []uint64{0, 1, 1023, 1024, 1025, 1536, 1 << 20, 3 << 29, 5 << 28, 1<<30 + 1, 4e9, 1 << 62, math.MaxUint64}
	for shift := 0; shift < 64; shift++ {
		values = append(values, 1<<shift, 3<<shift>>1, 5<<shift>>2)
	}
	for _, n := range values {
		s := FormatBytes(n)
		got, err := ParseBytes(s)
		if err != nil || got != n {
			t.Errorf("ParseBytes(FormatBytes(%d) = %q) = %d, %v; want %d", n, s, got, err, n)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{
		"0", "1073741824", "4GiB", "4096MiB", "512KiB", "2TiB", "1.5GiB", "4GB",
		"4G", "-1", "NaN", "1e9", " 4 GiB ", "18446744073709551616", "16EiB",
		"0.1KiB", "1.", ".5", "", "%", "4GiB%", "\x00", "١٢",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err != nil {
			if !strings.Contains(err.Error(), "invalid byte quantity") {
				t.Fatalf("ParseBytes(%q) error %q does not say what was invalid", s, err)
			}
			return
		}
		// Anything accepted formats to a string that reads back exactly.
		out := FormatBytes(n)
		back, err := ParseBytes(out)
		if err != nil || back != n {
			t.Fatalf("ParseBytes(%q) = %d; FormatBytes = %q reads back as %d, %v", s, n, out, back, err)
		}
	})
}

func FuzzParseMemory(f *testing.F) {
	f.Add("25%", uint64(40<<30))
	f.Add("100%", uint64(math.MaxUint64))
	f.Add("0.0001%", uint64(1))
	f.Add("4GiB", uint64(0))
	f.Add("12.5 %", uint64(80<<30))
	f.Add("0", uint64(1<<30))
	f.Fuzz(func(t *testing.T, s string, total uint64) {
		n, err := ParseMemory(s, total)
		if err != nil {
			return
		}
		if n == 0 {
			t.Fatalf("ParseMemory(%q, %d) = 0: a zero limit means unlimited and must be refused", s, total)
		}
		if strings.HasSuffix(strings.TrimSpace(s), "%") && n > total {
			t.Fatalf("ParseMemory(%q, %d) = %d, more than the total", s, total, n)
		}
	})
}

func FuzzParseCores(f *testing.F) {
	for _, s := range []string{"30", "30%", "100", "0", "101", "30.5", " 7 % ", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseCores(s)
		if err == nil && (n < 1 || n > 100) {
			t.Fatalf("ParseCores(%q) = %d, outside 1..100", s, n)
		}
	})
}
