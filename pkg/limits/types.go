package limits

// LimitsVersion is the limits-file format version (Contract 4).
const LimitsVersion = 1

// Core policies of the limits file.
const (
	CoresPolicyHard  = "hard"
	CoresPolicyBurst = "burst"
)

// MaxLimitsGPUs and MaxLimitsSize bound the limits file (Contract 4).
const (
	MaxLimitsGPUs = 16
	MaxLimitsSize = 4096
)

// LedgerShards is how many ledger shards a record gets: the files 0 ..
// LedgerShards-1 of <record>/ledger/, over which the shim spreads the
// ledger's locks so that each inode's lock list stays short (Contract 5).
// Readers accept 1..MaxLedgerShards.
const (
	LedgerShards    = 64
	MaxLedgerShards = 256
)

// LimitsFile is the content of <run_dir>/containers/<id>/limits, read by the
// shim at /run/nri-vgpu/limits.
type LimitsFile struct {
	GPUs        []GPULimit
	CoresPolicy string // default "hard"
	LogLevel    string // default "warn"
	// LedgerShards is ledger.shards: how many ledger shards the record's
	// ledger directory holds; 0 (no key) for a record without one, whose
	// ledger lives on the limits file alone.
	LedgerShards int
}

// GPULimit is one gpu.<n>.* group of the limits file.
type GPULimit struct {
	UUID   string
	Memory uint64 // bytes; 0 = no memory limit
	Cores  int    // 1..100; 100 = no throttling
}
