package allocation

import "github.com/nri-vgpu/nri-vgpu/pkg/limits"

// AnnotationKey is the one annotation the device plugin returns per container.
const AnnotationKey = "nri-vgpu.io/allocation"

// Version is the payload version this build issues and accepts.
const Version = 1

// Allocation is what one container is granted: an ID, when it was issued,
// its share of each GPU, and its cores policy. The device plugin signs it
// into the annotation of Contract 2 (Sign), since the NRI plugin that
// applies it learns it through the pod spec; the runtime wrapper (Contract
// 6) resolves and applies its own, and so never signs it.
type Allocation struct {
	V      int    `json:"v"`
	ID     string `json:"id"`     // 128-bit random, lower-case hex (32 chars)
	Issued int64  `json:"issued"` // unix seconds
	GPUs   []GPU  `json:"gpus"`
	// CoresPolicy is the cores.policy of the container's limits file:
	// "burst", or empty for hard. Hard is left out of the payload, so that
	// an allocation without burst is, byte for byte, one that verifiers
	// from before this field accept; they refuse a burst allocation as
	// malformed rather than enforce it as hard.
	CoresPolicy string `json:"cores_policy,omitempty"`
}

// GPU is a container's share of one physical GPU: of an allocation, of a
// Docker request, or of a claim (container.json records it in this form).
type GPU struct {
	UUID   string `json:"uuid"`
	Minor  int    `json:"minor"`
	Slices int    `json:"slices"`
	Memory uint64 `json:"memory"` // bytes
	Cores  int    `json:"cores"`  // percent of SM time, 1..100
}

// Limits is the limits file (Contract 4) for a container holding a: its
// GPUs in the allocation's order, with a's cores policy. An empty logLevel
// takes the default.
func (a *Allocation) Limits(logLevel string) *limits.LimitsFile {
	policy := a.CoresPolicy
	if policy == "" {
		policy = limits.DefaultCoresPolicy
	}
	if logLevel == "" {
		logLevel = limits.DefaultLogLevel
	}
	f := &limits.LimitsFile{CoresPolicy: policy, LogLevel: logLevel}
	for _, g := range a.GPUs {
		f.GPUs = append(f.GPUs, limits.GPULimit{UUID: g.UUID, Memory: g.Memory, Cores: g.Cores})
	}
	return f
}
