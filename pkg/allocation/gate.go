package allocation

// The gate makes a container whose allocation nri-vgpu did not handle fail
// to start, on every containerd version (Contract 2, "Failing closed").
//
// The device plugin's Allocate response mounts GateHostPath at
// GateContainerPath besides the allocation annotation. runc refuses any bind
// mount inside /proc (other than the few files lxcfs emulates), so a
// container that still has the mount when it reaches runc fails to be
// created, with an error that names the path. nri-vgpu removes the mount from
// every container it handles at CreateContainer (NRI passes mount removals
// on to the runtime), so only a container that NRI did not give to nri-vgpu
// — the plugin crashed, was stopped, or never connected — keeps it.
const (
	// GateContainerPath reads as the reason in the runtime's error.
	GateContainerPath = "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin"
	// GateHostPath exists on every node, so the kubelet and containerd
	// accept the mount; it is never reached.
	GateHostPath = "/dev/null"
)
