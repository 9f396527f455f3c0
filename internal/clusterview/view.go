// Package clusterview is `kubectl nri-vgpu`: the cluster's vGPU state as
// nodes → GPUs → device-plugin containers or DRA claims → pods, from the API
// server (nodes, pods, ResourceSlices, ResourceClaims) and from each node's
// nri-vgpu metrics, which it reads through the API server's pod proxy from
// the NRI plugin pod of the node. No Prometheus is involved.
//
// What the API server knows is shown even where a node's metrics cannot be
// read; such a node carries an error naming what failed. A series the node
// does not serve (an older nri-vgpu, a region of version 1) is shown as "-"
// and left out of the JSON.
package clusterview

// SchemaVersion is View.Version: it changes only when a field of the JSON
// (and YAML) output changes meaning or goes away; fields may be added.
const SchemaVersion = 1

// View is the output of -o json and -o yaml. Fields whose value is not
// known (a series the node does not serve, a node whose metrics could not
// be read) are left out rather than written as 0.
type View struct {
	Version int    `json:"version"`
	Nodes   []Node `json:"nodes"`
}

// Node is one node that offers vGPUs: it advertises the slice resource,
// publishes a ResourceSlice of the DRA driver, runs an NRI plugin pod, or was
// named by --node.
type Node struct {
	Name string `json:"name"`
	// Labels are the node's labels under nvidia.com/ and of nri-vgpu
	// (GPU feature discovery, node feature discovery).
	Labels map[string]string `json:"labels,omitempty"`
	// Resources are the slice resources the node advertises (device plugin).
	Resources []Resource `json:"resources,omitempty"`
	// MetricsPod is the NRI plugin pod whose metrics were read,
	// "namespace/name:port".
	MetricsPod string `json:"metricsPod,omitempty"`
	// Error says why the node's metrics could not be read; the rest of the
	// node is then what the API server knows.
	Error string `json:"error,omitempty"`
	GPUs  []GPU  `json:"gpus"`
	// Unplaced are the node's containers that requested slices but that the
	// node's metrics do not show on a GPU (metrics not read, container not
	// started yet, or finished).
	Unplaced []Container `json:"unplaced,omitempty"`
}

// Resource is an extended resource of the node, in slices.
type Resource struct {
	Name        string `json:"name"`
	Capacity    int64  `json:"capacity"`
	Allocatable int64  `json:"allocatable"`
	// Requested is the sum of the requests of the listed pods bound to the
	// node that have not finished (with --namespace, that namespace's only).
	Requested int64 `json:"requested"`
}

// GPU is one physical GPU of a node, with what it has handed out and what is
// in use (from the node's metrics), and who holds it.
type GPU struct {
	UUID  string `json:"uuid"`
	Index *int   `json:"index,omitempty"`
	Model string `json:"model,omitempty"`
	// DRADevice is the GPU's device in the node's ResourceSlice, when the
	// DRA driver publishes it.
	DRADevice            string   `json:"draDevice,omitempty"`
	MemoryTotalBytes     *uint64  `json:"memoryTotalBytes,omitempty"`
	MemoryAllocatedBytes *uint64  `json:"memoryAllocatedBytes,omitempty"`
	MemoryUsedBytes      *uint64  `json:"memoryUsedBytes,omitempty"`
	SMAllocatedRatio     *float64 `json:"smAllocatedRatio,omitempty"`
	SMUtilizationRatio   *float64 `json:"smUtilizationRatio,omitempty"`
	// Containers are the device-plugin containers holding slices of it.
	Containers []Container `json:"containers"`
	// Claims are the DRA claims allocated on it.
	Claims []Claim `json:"claims"`
}

// Usage is one container's or claim's share of one GPU and its use, from
// the node's metrics (series per the metric contract in docs/metrics.md).
type Usage struct {
	MemoryLimitBytes        *uint64  `json:"memoryLimitBytes,omitempty"` // 0 = no limit
	MemoryUsedBytes         *uint64  `json:"memoryUsedBytes,omitempty"`
	MemoryPeakBytes         *uint64  `json:"memoryPeakBytes,omitempty"`
	SMLimitRatio            *float64 `json:"smLimitRatio,omitempty"` // 1 = not throttled
	SMUtilizationRatio      *float64 `json:"smUtilizationRatio,omitempty"`
	SMShareUtilizationRatio *float64 `json:"smShareUtilizationRatio,omitempty"`
	SMThrottledSeconds      *float64 `json:"smThrottledSecondsTotal,omitempty"`
	KernelLaunches          *uint64  `json:"kernelLaunchesTotal,omitempty"`
	Processes               *uint64  `json:"processes,omitempty"`
	// Suspect is true when the container's usage region holds impossible
	// counters (its used, peak and throttled are then left out).
	Suspect *bool `json:"suspect,omitempty"`
}

// Container is one device-plugin container's share of one GPU.
type Container struct {
	Namespace   string `json:"namespace,omitempty"`
	Pod         string `json:"pod,omitempty"`
	Container   string `json:"container,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	// Phase is the pod's; empty when the API server does not know the pod.
	Phase string `json:"phase,omitempty"`
	// Slices is what the container requested of the slice resource, on all
	// its GPUs together; 0 when the API server does not know the pod.
	Slices int64 `json:"slices,omitempty"`
	Usage
}

// Claim is one DRA claim's share of one GPU: what the scheduler allocated
// (from the ResourceClaim), its use (from the node's metrics), and its pods.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// RecordID is the claim's container_id in the metrics,
	// "claim-<claim UID>".
	RecordID string `json:"recordID,omitempty"`
	// AllocatedMemoryBytes and AllocatedSMRatio are the capacity the
	// allocation consumes of the GPU (absent capacity: the GPU whole).
	AllocatedMemoryBytes *uint64  `json:"allocatedMemoryBytes,omitempty"`
	AllocatedSMRatio     *float64 `json:"allocatedSMRatio,omitempty"`
	Usage
	Pods []ClaimPod `json:"pods"`
}

// ClaimPod is a pod a claim is reserved for.
type ClaimPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase,omitempty"`
	// Containers are the pod's containers that use the claim.
	Containers []string `json:"containers,omitempty"`
}
