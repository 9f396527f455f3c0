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

// LimitsFile is the content of <run_dir>/containers/<id>/limits, read by the
// shim at /run/nri-vgpu/limits.
type LimitsFile struct {
	GPUs        []GPULimit
	CoresPolicy string // default "hard"
	LogLevel    string // default "warn"
}

// GPULimit is one gpu.<n>.* group of the limits file.
type GPULimit struct {
	UUID   string
	Memory uint64 // bytes; 0 = no memory limit
	Cores  int    // 1..100; 100 = no throttling
}
