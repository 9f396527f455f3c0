package limits

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Log levels of the limits file, most to least severe.
const (
	LogLevelError = "error"
	LogLevelWarn  = "warn"
	LogLevelInfo  = "info"
	LogLevelDebug = "debug"
)

// Defaults for the optional keys of the limits file.
const (
	DefaultCoresPolicy = CoresPolicyHard
	DefaultLogLevel    = LogLevelWarn
)

// limitsHeader is the comment Marshal writes first.
const limitsHeader = "# written by nri-vgpu; read by libvgpu-shim.so\n"

// ValidCoresPolicy reports whether p is a cores.policy value.
func ValidCoresPolicy(p string) bool { return p == CoresPolicyHard || p == CoresPolicyBurst }

// ValidLogLevel reports whether l is a log.level value.
func ValidLogLevel(l string) bool {
	switch l {
	case LogLevelError, LogLevelWarn, LogLevelInfo, LogLevelDebug:
		return true
	}
	return false
}

// Validate checks f against Contract 4: 1..MaxLimitsGPUs GPUs with valid,
// distinct UUIDs and cores in 1..100, a known cores policy and log level
// (empty means the default), and ledger shards 0 (none) or
// 1..MaxLedgerShards.
func (f *LimitsFile) Validate() error {
	if len(f.GPUs) == 0 {
		return errors.New("no GPUs")
	}
	if len(f.GPUs) > MaxLimitsGPUs {
		return fmt.Errorf("%d GPUs, at most %d", len(f.GPUs), MaxLimitsGPUs)
	}
	for i, g := range f.GPUs {
		if err := ValidateUUID(g.UUID); err != nil {
			return fmt.Errorf("gpu %d: %w", i, err)
		}
		for j, prev := range f.GPUs[:i] {
			if prev.UUID == g.UUID {
				return fmt.Errorf("gpu %d: GPU %s is also gpu %d", i, g.UUID, j)
			}
		}
		if g.Cores < 1 || g.Cores > 100 {
			return fmt.Errorf("gpu %d (%s): cores %d outside 1..100", i, g.UUID, g.Cores)
		}
	}
	if f.CoresPolicy != "" && !ValidCoresPolicy(f.CoresPolicy) {
		return fmt.Errorf("cores policy %q: want %s or %s", f.CoresPolicy, CoresPolicyHard, CoresPolicyBurst)
	}
	if f.LogLevel != "" && !ValidLogLevel(f.LogLevel) {
		return fmt.Errorf("log level %q: want error, warn, info or debug", f.LogLevel)
	}
	if f.LedgerShards < 0 || f.LedgerShards > MaxLedgerShards {
		return fmt.Errorf("ledger shards %d outside 1..%d (0: none)", f.LedgerShards, MaxLedgerShards)
	}
	return nil
}

// Marshal validates f and encodes it in the Contract 4 format: a header
// comment, version=1, then gpu.<n>.uuid, .memory and .cores for n = 0.., then
// cores.policy and log.level (defaults written out when empty), and
// ledger.shards when f has ledger shards.
func (f *LimitsFile) Marshal() ([]byte, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	policy, level := f.CoresPolicy, f.LogLevel
	if policy == "" {
		policy = DefaultCoresPolicy
	}
	if level == "" {
		level = DefaultLogLevel
	}
	var b bytes.Buffer
	b.WriteString(limitsHeader)
	fmt.Fprintf(&b, "version=%d\n", LimitsVersion)
	for i, g := range f.GPUs {
		fmt.Fprintf(&b, "gpu.%d.uuid=%s\n", i, g.UUID)
		fmt.Fprintf(&b, "gpu.%d.memory=%d\n", i, g.Memory)
		fmt.Fprintf(&b, "gpu.%d.cores=%d\n", i, g.Cores)
	}
	fmt.Fprintf(&b, "cores.policy=%s\n", policy)
	fmt.Fprintf(&b, "log.level=%s\n", level)
	if f.LedgerShards != 0 {
		fmt.Fprintf(&b, "ledger.shards=%d\n", f.LedgerShards)
	}
	if b.Len() > MaxLimitsSize {
		// Unreachable with MaxUUIDLen and MaxLimitsGPUs as they are; kept so
		// that changing either cannot produce a file the shim refuses.
		return nil, fmt.Errorf("limits file: %d bytes, at most %d", b.Len(), MaxLimitsSize)
	}
	return b.Bytes(), nil
}

// ParseLimits decodes a limits file (Contract 4). The format is strict, as the
// shim reads it too:
//
//   - at most MaxLimitsSize bytes; lines end in LF; no control characters
//     other than tab;
//   - "#" starts a comment that runs to the end of the line; blank lines are
//     skipped; spaces and tabs around keys and values are ignored;
//   - every other line is key=value, the first one version=1;
//   - keys: gpu.<n>.uuid, gpu.<n>.memory (bytes, 0 = no limit), gpu.<n>.cores
//     (1..100), all three required for each n, n = 0..count-1 without gaps,
//     count <= MaxLimitsGPUs; cores.policy (hard|burst, default hard);
//     log.level (error|warn|info|debug, default warn); ledger.shards
//     (1..MaxLedgerShards; absent: no ledger shards);
//   - numbers are decimal without sign or leading zeros; every key at most once.
//
// Errors name the line.
func ParseLimits(data []byte) (*LimitsFile, error) {
	if len(data) > MaxLimitsSize {
		return nil, fmt.Errorf("%d bytes, at most %d", len(data), MaxLimitsSize)
	}
	type gpuKeys struct {
		line                int // first line naming this GPU
		uuid, memory, cores bool
		limit               GPULimit
	}
	var (
		gpus       [MaxLimitsGPUs]gpuKeys
		count      int // highest index seen + 1
		seen       = map[string]int{}
		sawVersion bool
		f          = &LimitsFile{CoresPolicy: DefaultCoresPolicy, LogLevel: DefaultLogLevel}
	)
	text := string(data)
	for n := 1; text != ""; n++ {
		var line string
		line, text, _ = strings.Cut(text, "\n")
		for i := 0; i < len(line); i++ {
			if c := line[i]; c < 0x20 && c != '\t' || c == 0x7f {
				return nil, fmt.Errorf("line %d: control character %s", n, quoteByte(c))
			}
		}
		line, _, _ = strings.Cut(line, "#")
		line = strings.Trim(line, " \t")
		if line == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not key=value", n, line)
		}
		key, value = strings.Trim(key, " \t"), strings.Trim(value, " \t")
		if first, dup := seen[key]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %s (first on line %d)", n, key, first)
		}
		seen[key] = n
		if !sawVersion {
			if key != "version" {
				return nil, fmt.Errorf("line %d: the first key must be version, got %s", n, key)
			}
			if value != strconv.Itoa(LimitsVersion) {
				return nil, fmt.Errorf("line %d: unsupported version %q, want %d", n, value, LimitsVersion)
			}
			sawVersion = true
			continue
		}
		switch key {
		case "cores.policy":
			if !ValidCoresPolicy(value) {
				return nil, fmt.Errorf("line %d: cores.policy %q: want %s or %s", n, value, CoresPolicyHard, CoresPolicyBurst)
			}
			f.CoresPolicy = value
			continue
		case "log.level":
			if !ValidLogLevel(value) {
				return nil, fmt.Errorf("line %d: log.level %q: want error, warn, info or debug", n, value)
			}
			f.LogLevel = value
			continue
		case "ledger.shards":
			k, err := parseIndex(value)
			if err != nil || k < 1 || k > MaxLedgerShards {
				return nil, fmt.Errorf("line %d: ledger.shards: %q is not an integer in 1..%d", n, value, MaxLedgerShards)
			}
			f.LedgerShards = k
			continue
		}
		rest, ok := strings.CutPrefix(key, "gpu.")
		if !ok {
			return nil, fmt.Errorf("line %d: unknown key %q", n, key)
		}
		idxStr, field, ok := strings.Cut(rest, ".")
		if !ok {
			return nil, fmt.Errorf("line %d: unknown key %q", n, key)
		}
		idx, err := parseIndex(idxStr)
		if err != nil {
			return nil, fmt.Errorf("line %d: key %s: GPU index: %w", n, key, err)
		}
		if idx >= MaxLimitsGPUs {
			return nil, fmt.Errorf("line %d: key %s: GPU index %d, at most %d GPUs", n, key, idx, MaxLimitsGPUs)
		}
		g := &gpus[idx]
		switch field {
		case "uuid":
			if err := ValidateUUID(value); err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, key, err)
			}
			g.limit.UUID, g.uuid = value, true
		case "memory":
			if err := canonicalDecimal(value); err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, key, err)
			}
			m, err := strconv.ParseUint(value, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: %q out of range", n, key, value)
			}
			g.limit.Memory, g.memory = m, true
		case "cores":
			c, err := parseIndex(value)
			if err != nil || c < 1 || c > 100 {
				return nil, fmt.Errorf("line %d: %s: %q is not an integer in 1..100", n, key, value)
			}
			g.limit.Cores, g.cores = c, true
		default:
			return nil, fmt.Errorf("line %d: unknown key %q", n, key)
		}
		if g.line == 0 {
			g.line = n
		}
		count = max(count, idx+1)
	}
	if !sawVersion {
		return nil, errors.New("no version=1 line")
	}
	if count == 0 {
		return nil, errors.New("no GPUs")
	}
	for i := range count {
		g := &gpus[i]
		switch {
		case g.line == 0:
			return nil, fmt.Errorf("no keys for gpu.%d, but gpu.%d exists: GPU indices must be 0..%d without gaps", i, count-1, count-1)
		case !g.uuid:
			return nil, fmt.Errorf("line %d: gpu.%d has no uuid", g.line, i)
		case !g.memory:
			return nil, fmt.Errorf("line %d: gpu.%d has no memory", g.line, i)
		case !g.cores:
			return nil, fmt.Errorf("line %d: gpu.%d has no cores", g.line, i)
		}
		for j := range i {
			if gpus[j].limit.UUID == g.limit.UUID {
				return nil, fmt.Errorf("line %d: gpu.%d.uuid %s is also gpu.%d.uuid (line %d)", seen[fmt.Sprintf("gpu.%d.uuid", i)], i, g.limit.UUID, j, seen[fmt.Sprintf("gpu.%d.uuid", j)])
			}
		}
		f.GPUs = append(f.GPUs, g.limit)
	}
	return f, nil
}
