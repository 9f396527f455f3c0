package quantity

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Quantities are written by people (config files, NRI_VGPU_MEMORY and
// NRI_VGPU_CORES), so the parsers are strict: anything that could be read two
// ways is rejected with a message that shows the accepted forms, rather than
// silently guessed.

// quantityHint lists the accepted byte forms; it ends every ParseBytes error.
const quantityHint = `write a number of bytes ("1073741824") or a number with a unit: ` +
	`"4GiB", "4096MiB", "512KiB", "1.5GiB" (binary: KiB MiB GiB TiB PiB EiB, the B optional) ` +
	`or "4GB" (decimal: KB MB GB TB PB EB)`

// memoryHint lists the accepted forms of ParseMemory.
const memoryHint = `write "4GiB", "4096MiB", "1.5GiB", "4GB" or a share of the GPU such as "25%"`

// coresHint lists the accepted forms of ParseCores.
const coresHint = `write a whole percentage of SM time from 1 to 100, e.g. "30" or "30%"`

// maxQuantityLen bounds the input so that big-number arithmetic on hostile
// input stays cheap; no meaningful quantity is this long.
const maxQuantityLen = 64

// byteUnits maps a lower-cased unit to its size in bytes. Binary units take
// an optional "B"; decimal (SI) units require it, so that "4GB" is 4e9 bytes
// as in Kubernetes and disk vendors, and "4GiB" is 4×2^30.
var byteUnits = map[string]uint64{
	"": 1, "b": 1,
	"ki": 1 << 10, "kib": 1 << 10,
	"mi": 1 << 20, "mib": 1 << 20,
	"gi": 1 << 30, "gib": 1 << 30,
	"ti": 1 << 40, "tib": 1 << 40,
	"pi": 1 << 50, "pib": 1 << 50,
	"ei": 1 << 60, "eib": 1 << 60,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "eb": 1e18,
}

// errAmbiguousUnit is returned for a bare "K", "M", "G", ... : Kubernetes reads
// "4G" as 4e9 bytes and Docker as 4GiB, and a quota must not depend on which
// convention the reader had in mind.
var errAmbiguousUnit = errors.New("ambiguous unit")

// ParseBytes parses a byte quantity: a bare integer number of bytes
// ("1073741824"), or a decimal number followed by a binary unit ("4GiB",
// "4096MiB", "1.5GiB", "2Ti") or a decimal unit ("4GB" = 4,000,000,000).
// Units are case-insensitive; a bare "4G" is rejected as ambiguous. Fractional
// results are rounded down to a whole byte; a fractional number of bytes
// ("1.5" or "1.5B") is an error.
func ParseBytes(s string) (uint64, error) {
	n, err := parseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("invalid byte quantity %q: %w; %s", s, err, quantityHint)
	}
	return n, nil
}

func parseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	if err := checkLength(t); err != nil {
		return 0, err
	}
	num, rest, err := parseDecimal(t)
	if err != nil {
		return 0, err
	}
	unit := strings.TrimSpace(rest)
	mult, ok := byteUnits[strings.ToLower(unit)]
	if !ok {
		if len(unit) == 1 && strings.ContainsRune("kmgtpeKMGTPE", rune(unit[0])) {
			return 0, fmt.Errorf("%w %q: use %q (binary) or %q (decimal)",
				errAmbiguousUnit, unit, unit+"iB", unit+"B")
		}
		return 0, fmt.Errorf("unknown unit %q", unit)
	}
	if mult == 1 && !num.IsInt() {
		return 0, errors.New("a number of bytes cannot have a fraction")
	}
	v := new(big.Rat).Mul(num, new(big.Rat).SetUint64(mult))
	return ratFloorUint64(v)
}

// ParseMemory parses a memory request: a byte quantity as ParseBytes accepts,
// or a percentage of total ("25%", "12.5%"; more than 0 and at most 100),
// rounded down to a whole byte. The result is never 0, because a memory limit
// of 0 means "unlimited" in the limits file and a request must not turn into
// that by accident. A result above total is returned as is: capping is the
// caller's decision.
func ParseMemory(s string, total uint64) (uint64, error) {
	n, err := parseMemory(s, total)
	if err != nil {
		return 0, fmt.Errorf("invalid memory quantity %q: %w; %s", s, err, memoryHint)
	}
	return n, nil
}

func parseMemory(s string, total uint64) (uint64, error) {
	t := strings.TrimSpace(s)
	if err := checkLength(t); err != nil {
		return 0, err
	}
	if p, ok := strings.CutSuffix(t, "%"); ok {
		num, rest, err := parseDecimal(strings.TrimSpace(p))
		if err != nil {
			return 0, err
		}
		if rest != "" {
			return 0, fmt.Errorf("unexpected %q before %%", rest)
		}
		if num.Sign() <= 0 || num.Cmp(big.NewRat(100, 1)) > 0 {
			return 0, errors.New("a percentage must be more than 0 and at most 100")
		}
		if total == 0 {
			return 0, errors.New("a percentage needs the GPU's total memory, which is unknown (0)")
		}
		v := new(big.Rat).Mul(num, new(big.Rat).SetFrac(new(big.Int).SetUint64(total), big.NewInt(100)))
		n, err := ratFloorUint64(v)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, fmt.Errorf("%s of %d bytes rounds down to 0 bytes", t, total)
		}
		return n, nil
	}
	n, err := parseBytes(t)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, errors.New("must be more than 0 bytes")
	}
	return n, nil
}

// ParseCores parses an SM-time share: a whole percentage from 1 to 100, with
// or without a trailing "%" ("30", "30%").
func ParseCores(s string) (int, error) {
	n, err := parseCores(s)
	if err != nil {
		return 0, fmt.Errorf("invalid cores quantity %q: %w; %s", s, err, coresHint)
	}
	return n, nil
}

func parseCores(s string) (int, error) {
	t := strings.TrimSpace(s)
	if err := checkLength(t); err != nil {
		return 0, err
	}
	if p, ok := strings.CutSuffix(t, "%"); ok {
		t = strings.TrimSpace(p)
	}
	num, rest, err := parseDecimal(t)
	if err != nil {
		return 0, err
	}
	if rest != "" {
		return 0, fmt.Errorf("unexpected %q after the number", rest)
	}
	if !num.IsInt() {
		return 0, errors.New("must be a whole number")
	}
	if num.Sign() <= 0 || num.Cmp(big.NewRat(100, 1)) > 0 {
		return 0, errors.New("out of range 1..100")
	}
	return int(num.Num().Int64()), nil
}

// checkLength rejects empty and absurdly long input.
func checkLength(t string) error {
	switch {
	case t == "":
		return errors.New("empty")
	case len(t) > maxQuantityLen:
		return fmt.Errorf("longer than %d characters", maxQuantityLen)
	}
	return nil
}

// parseDecimal reads a non-negative decimal number ("12", "1.5", "007")
// from the start of t and returns it exactly, with the unparsed rest. Signs,
// exponents, hex, "NaN" and "Inf" are not numbers here.
func parseDecimal(t string) (*big.Rat, string, error) {
	if t == "" {
		return nil, "", errors.New("missing number")
	}
	if t[0] == '-' {
		return nil, "", errors.New("negative quantities are not allowed")
	}
	i := 0
	for i < len(t) && isDigit(t[i]) {
		i++
	}
	if i == 0 {
		return nil, "", errors.New("must start with a digit")
	}
	end := i
	if i < len(t) && t[i] == '.' {
		j := i + 1
		for j < len(t) && isDigit(t[j]) {
			j++
		}
		if j == i+1 {
			return nil, "", errors.New("a decimal point must be followed by a digit")
		}
		end = j
	}
	num, ok := new(big.Rat).SetString(t[:end])
	if !ok { // unreachable: t[:end] is digits with at most one inner point
		return nil, "", fmt.Errorf("malformed number %q", t[:end])
	}
	return num, t[end:], nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// ratFloorUint64 rounds a non-negative v down and checks that it fits.
func ratFloorUint64(v *big.Rat) (uint64, error) {
	q := new(big.Int).Quo(v.Num(), v.Denom())
	if !q.IsUint64() {
		return 0, fmt.Errorf("out of range (at most %d bytes, 16EiB)", uint64(math.MaxUint64))
	}
	return q.Uint64(), nil
}

// formatUnits are the units FormatBytes uses, largest first.
var formatUnits = []struct {
	name string
	size uint64
}{
	{"EiB", 1 << 60}, {"PiB", 1 << 50}, {"TiB", 1 << 40},
	{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
}

// FormatBytes writes n for people, exactly: in the largest binary unit in
// which n is a whole number or has at most two decimals ("8GiB", "1.5GiB",
// "1.25GiB", "512MiB"), else in bytes ("123B", "1073741825B"). ParseBytes
// reads every result back to n.
func FormatBytes(n uint64) string {
	for _, u := range formatUnits {
		// With a power-of-two unit, two decimals are exact only for
		// quarters: n must be a multiple of size/4.
		if n < u.size || n%(u.size/4) != 0 {
			continue
		}
		whole, quarters := n/u.size, (n%u.size)/(u.size/4)
		switch quarters {
		case 0:
			return fmt.Sprintf("%d%s", whole, u.name)
		case 2:
			return fmt.Sprintf("%d.5%s", whole, u.name)
		default:
			return fmt.Sprintf("%d.%d%s", whole, quarters*25, u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}
