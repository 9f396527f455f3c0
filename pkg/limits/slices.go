package limits

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MiB is the granularity of a slice's memory (Contract 1).
const MiB = 1 << 20

// MaxUUIDLen is the longest GPU UUID accepted anywhere: NVML's largest UUID
// buffer is 96 bytes including the terminating NUL.
const MaxUUIDLen = 95

// deviceIDSep separates the GPU UUID from the slice index in a device ID.
const deviceIDSep = "::"

// Slice is what a number of slices of one GPU is worth: bytes of GPU memory
// and percent of SM time.
type Slice struct {
	Memory uint64 // bytes
	Cores  int    // percent, 0..100
}

// CheckSplit reports whether a split of a GPU is computable: splitCount must
// be at least 1 and both scalings finite and positive. SliceSize and Quota
// panic on input that fails this check; callers holding unvalidated values
// use CheckSplit (or CheckedQuota) first.
func CheckSplit(splitCount int, memoryScaling, coresScaling float64) error {
	if splitCount < 1 {
		return fmt.Errorf("split count %d: must be at least 1", splitCount)
	}
	if math.IsNaN(memoryScaling) || math.IsInf(memoryScaling, 0) || memoryScaling <= 0 {
		return fmt.Errorf("memory scaling %v: must be a finite number above 0", memoryScaling)
	}
	if math.IsNaN(coresScaling) || math.IsInf(coresScaling, 0) || coresScaling <= 0 {
		return fmt.Errorf("cores scaling %v: must be a finite number above 0", coresScaling)
	}
	return nil
}

// SliceSize is what one slice of a GPU with totalMemory bytes is worth when
// the GPU is split into splitCount slices (Contract 1):
//
//	memory = floor(memoryScaling × totalMemory / splitCount), rounded down to a whole MiB
//	cores  = floor(100 × coresScaling / splitCount) percent, at most 100
//
// Two floors would give a slice worth nothing, and a zero quota would not
// mean "nothing" downstream (memory 0 is "no memory limit" in the limits
// file; cores 0 is not a valid quota). So a slice is worth at least 1 percent
// of SM time, and at least 1 MiB of memory (or all of the scaled memory when
// that is less). With split counts above 100 × coresScaling this oversubscribes
// SM time, which the per-container cap of 100 percent and the shim's
// time-slicing absorb; 1024 containers at 1 percent each is still a usable
// share, while 0 percent would throttle a container to nothing.
//
// The scalings are used as the decimal numbers they print as (1.1 is 11/10,
// not the binary float nearest to it), so 0.29 × 100 is 29, not 28.
//
// SliceSize panics when CheckSplit fails.
func SliceSize(totalMemory uint64, splitCount int, memoryScaling, coresScaling float64) Slice {
	if err := CheckSplit(splitCount, memoryScaling, coresScaling); err != nil {
		panic("limits.SliceSize: " + err.Error())
	}
	scaled := scaledMemory(totalMemory, memoryScaling)
	mem := (scaled / uint64(splitCount)) &^ (MiB - 1)
	if mem == 0 {
		mem = min(MiB, scaled)
	}

	// floor(100 × coresScaling / splitCount), exactly.
	c := new(big.Rat).Mul(decimalRat(coresScaling), big.NewRat(100, int64(splitCount)))
	cores := 100
	if fl := floorRat(c); fl.IsInt64() && fl.Int64() < 100 {
		cores = max(int(fl.Int64()), 1)
	}
	return Slice{Memory: mem, Cores: cores}
}

// Quota is what a container holding `slices` slices of one GPU receives
// (Contract 1): the sum over its slices, cores capped at 100 percent and memory
// at the GPU's scaled memory, floor(memoryScaling × totalMemory) bytes. The
// memory cap is not rounded to a MiB, so that a container holding every slice
// of a GPU with memory_scaling 1 is limited to exactly the GPU's memory.
//
// A container holding every slice gets the GPU whole: exactly 100 percent and
// all of the scaled memory, whatever the rounding of single slices lost (and
// even when coresScaling is below 1). Zero slices are worth nothing.
//
// Quota panics when CheckSplit fails or slices is outside 0..splitCount; use
// CheckedQuota for values that have not been validated.
func Quota(totalMemory uint64, splitCount, slices int, memoryScaling, coresScaling float64) Slice {
	q, err := CheckedQuota(totalMemory, splitCount, slices, memoryScaling, coresScaling)
	if err != nil {
		panic("limits.Quota: " + err.Error())
	}
	return q
}

// CheckedQuota is Quota returning an error instead of panicking on a bad
// split or a slice count outside 0..splitCount.
func CheckedQuota(totalMemory uint64, splitCount, slices int, memoryScaling, coresScaling float64) (Slice, error) {
	if err := CheckSplit(splitCount, memoryScaling, coresScaling); err != nil {
		return Slice{}, err
	}
	if slices < 0 || slices > splitCount {
		return Slice{}, fmt.Errorf("%d slices of a GPU split into %d: must be 0..%d", slices, splitCount, splitCount)
	}
	scaled := scaledMemory(totalMemory, memoryScaling)
	switch slices {
	case 0:
		return Slice{}, nil
	case splitCount:
		return Slice{Memory: scaled, Cores: 100}, nil
	}
	one := SliceSize(totalMemory, splitCount, memoryScaling, coresScaling)
	hi, mem := bits.Mul64(one.Memory, uint64(slices))
	if hi != 0 || mem > scaled {
		mem = scaled
	}
	// one.Cores is at least 1, so 100 or more slices reach the cap; below
	// that the product cannot overflow.
	cores := 100
	if slices < 100 {
		cores = min(one.Cores*slices, 100)
	}
	return Slice{Memory: mem, Cores: cores}, nil
}

// ScaledCores is floor(100 × coresScaling): the SM time, in percent, that
// the claims on one GPU share when the DRA driver serves it (Contract 8),
// with coresScaling read as the decimal it prints as. It panics unless
// coresScaling is finite and above 0 (CheckSplit).
func ScaledCores(coresScaling float64) int {
	if err := CheckSplit(1, 1, coresScaling); err != nil {
		panic("limits.ScaledCores: " + err.Error())
	}
	fl := floorRat(new(big.Rat).Mul(decimalRat(coresScaling), big.NewRat(100, 1)))
	if !fl.IsInt64() || fl.Int64() > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(fl.Int64())
}

// scaledMemory is floor(scaling × total) bytes, saturating at the largest
// uint64.
func scaledMemory(total uint64, scaling float64) uint64 {
	p := new(big.Rat).Mul(decimalRat(scaling), new(big.Rat).SetInt(new(big.Int).SetUint64(total)))
	fl := floorRat(p)
	if !fl.IsUint64() {
		return math.MaxUint64
	}
	return fl.Uint64()
}

// decimalRat is f as the shortest decimal that parses back to f: the number
// a person wrote in the config file, not its binary approximation.
func decimalRat(f float64) *big.Rat {
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if !ok {
		// Unreachable for finite f: FormatFloat output always parses.
		panic(fmt.Sprintf("limits: cannot represent %v as a rational", f))
	}
	return r
}

// floorRat is floor(r) for r >= 0.
func floorRat(r *big.Rat) *big.Int {
	return new(big.Int).Quo(r.Num(), r.Denom())
}

// DeviceID is the kubelet device ID of slice `slice` of the GPU with the
// given UUID: "<uuid>::<slice>". The UUID must satisfy ValidateUUID.
func DeviceID(uuid string, slice int) string {
	return uuid + deviceIDSep + strconv.Itoa(slice)
}

// ParseDeviceID splits a device ID made by DeviceID. The UUID must satisfy
// ValidateUUID, and the slice index must be a non-negative decimal integer
// without sign or leading zeros, so that every accepted ID is exactly what
// DeviceID prints for its parts.
func ParseDeviceID(id string) (uuid string, slice int, err error) {
	uuid, index, ok := strings.Cut(id, deviceIDSep)
	if !ok {
		return "", 0, fmt.Errorf("device ID %q: want <gpu-uuid>%s<slice>", id, deviceIDSep)
	}
	if err := ValidateUUID(uuid); err != nil {
		return "", 0, fmt.Errorf("device ID %q: %w", id, err)
	}
	slice, err = parseIndex(index)
	if err != nil {
		return "", 0, fmt.Errorf("device ID %q: slice index: %w", id, err)
	}
	return uuid, slice, nil
}

// parseIndex parses a canonical non-negative decimal int: digits only, no
// sign, no leading zeros.
func parseIndex(s string) (int, error) {
	if err := canonicalDecimal(s); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q out of range", s)
	}
	return n, nil
}

// canonicalDecimal checks that s is a non-empty string of decimal digits
// without a leading zero (except "0" itself).
func canonicalDecimal(s string) error {
	if s == "" {
		return errors.New("empty number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return fmt.Errorf("%q is not a non-negative decimal integer", s)
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return fmt.Errorf("%q has a leading zero", s)
	}
	return nil
}

// ValidateUUID checks a GPU UUID as every format of nri-vgpu carries it
// (device IDs, the allocation, the limits file): 1..MaxUUIDLen characters
// from A-Z a-z 0-9 and "-_.:/" (NVML prints "GPU-<hex groups>", and MIG
// devices "MIG-<uuid>" or "MIG-GPU-<uuid>/<gi>/<ci>"), without "::" (the
// device-ID separator) and not ending in ":" (which would run into it).
// The small alphabet keeps the limits file free of comment characters,
// '=' and whitespace.
func ValidateUUID(uuid string) error {
	switch {
	case uuid == "":
		return errors.New("empty GPU UUID")
	case len(uuid) > MaxUUIDLen:
		return fmt.Errorf("GPU UUID is %d bytes, at most %d", len(uuid), MaxUUIDLen)
	}
	for i := 0; i < len(uuid); i++ {
		c := uuid[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == ':' || c == '/') {
			return fmt.Errorf("GPU UUID %q: character %s at offset %d is not one of A-Z a-z 0-9 - _ . : /", uuid, quoteByte(c), i)
		}
	}
	if strings.Contains(uuid, deviceIDSep) {
		return fmt.Errorf("GPU UUID %q contains %q", uuid, deviceIDSep)
	}
	if strings.HasSuffix(uuid, ":") {
		return fmt.Errorf("GPU UUID %q ends in ':'", uuid)
	}
	return nil
}

// quoteByte quotes one byte of a string for an error message: a Go character
// literal for ASCII, its hex value for a byte of a multi-byte character.
func quoteByte(c byte) string {
	if c < utf8.RuneSelf {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
