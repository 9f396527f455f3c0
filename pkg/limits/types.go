package limits

// AnnotationKey is the one annotation the device plugin returns per container.
const AnnotationKey = "nri-vgpu.io/allocation"

// AllocationVersion is the payload version this build issues and accepts.
const AllocationVersion = 1

// Allocation is the signed payload of Contract 2.
type Allocation struct {
	V      int            `json:"v"`
	ID     string         `json:"id"`     // 128-bit random, lower-case hex (32 chars)
	Issued int64          `json:"issued"` // unix seconds
	GPUs   []AllocatedGPU `json:"gpus"`
	// CoresPolicy is the cores.policy of the container's limits file:
	// "burst", or empty for hard. Hard is left out of the payload, so that
	// an allocation without burst is, byte for byte, one that verifiers
	// from before this field accept; they refuse a burst allocation as
	// malformed rather than enforce it as hard.
	CoresPolicy string `json:"cores_policy,omitempty"`
}

// AllocatedGPU is a container's share of one physical GPU.
type AllocatedGPU struct {
	UUID   string `json:"uuid"`
	Minor  int    `json:"minor"`
	Slices int    `json:"slices"`
	Memory uint64 `json:"memory"` // bytes
	Cores  int    `json:"cores"`  // percent of SM time, 1..100
}

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
