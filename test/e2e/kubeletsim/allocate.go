package kubeletsim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Pod is the part of a v1.Pod that the simulator acts on.
type Pod struct {
	Name      string
	Namespace string // default "default"
	UID       string
	// Labels and Annotations are the pod's; kubelet passes them to the
	// sandbox (PodSandboxConfig), not to containers.
	Labels      map[string]string
	Annotations map[string]string
	Containers  []Container
	// HostPID puts the containers in the node's PID namespace (hostPID).
	HostPID bool
	// CgroupParent is the pod's cgroup (LinuxPodSandboxConfig.CgroupParent)
	// as the kubelet's cgroupfs driver names it,
	// "/kubepods/besteffort/pod<UID>"; empty: the runtime's default, as
	// before. Whoever sets it removes the cgroups left behind.
	CgroupParent string
	// TerminationGracePeriod is how long StopContainer waits before SIGKILL;
	// 0 means kubelet's default of 30 s.
	TerminationGracePeriod time.Duration
}

// Container is the part of a v1.Container that the simulator acts on.
type Container struct {
	Name    string
	Image   string
	Command []string // entrypoint; empty = the image's
	Args    []string
	Env     []EnvVar
	// Mounts are the container's volume mounts (host paths, as a hostPath
	// volume gives).
	Mounts []Mount
	// Limits of extended resources, e.g. {"nvidia.com/gpu": 2}. Kubelet's
	// device manager only looks at limits.
	Limits map[string]int
	// Devices are host device nodes passed to the runtime as a device
	// plugin's DeviceSpecs are: tests give a container the GPUs that the
	// NVIDIA runtime would give it on its own (NVIDIA_VISIBLE_DEVICES=all).
	Devices []DeviceMapping
	// ExtraAnnotations are CRI container annotations with no kubelet
	// counterpart: the way tests present annotations that a pod spec cannot
	// set, e.g. a forged allocation. They are applied first, so the device
	// plugin's annotations and then kubelet's own override them, which is
	// kubelet's precedence.
	ExtraAnnotations map[string]string
	// RunAsUser is securityContext.runAsUser (and runAsGroup, the same
	// number); nil runs as the image's user.
	RunAsUser *int64
	// SeccompRuntimeDefault is securityContext.seccompProfile.type =
	// RuntimeDefault; false leaves it unset, which kubelet passes as
	// Unconfined (seccompDefault off).
	SeccompRuntimeDefault bool
	// ReadOnlyRootFilesystem is the container's securityContext field.
	ReadOnlyRootFilesystem bool
}

// EnvVar is one environment variable of a container spec.
type EnvVar struct{ Name, Value string }

// DeviceMapping is a host device node given to a container.
type DeviceMapping struct {
	HostPath, ContainerPath string
	Permissions             string // "rw", "rwm", ...
}

// Mount is a host directory or file mounted into a container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Allocation is what a container received from the device plugins.
type Allocation struct {
	// DeviceIDs maps a resource name to the device IDs allocated to the
	// container, sorted.
	DeviceIDs map[string][]string
	// Responses maps a resource name to the plugin's Allocate response for
	// the container.
	Responses map[string]*pluginapi.ContainerAllocateResponse
}

// Annotations merges the annotations of every response, as kubelet does
// before adding its own (see ContainerConfig).
func (a *Allocation) Annotations() (map[string]string, error) {
	out := map[string]string{}
	for _, res := range sortedKeys((a.Responses)) {
		for k, v := range a.Responses[res].GetAnnotations() {
			if old, ok := out[k]; ok && old != v {
				return nil, fmt.Errorf("kubeletsim: annotation %q has conflicting values from two device plugins", k)
			}
			out[k] = v
		}
	}
	return out, nil
}

// Allocate admits pod: for each of its containers, for each extended resource
// it has a limit for, it picks devices the way kubelet's device manager does
// and calls the plugin's Allocate. On an error nothing stays allocated to the
// pod. The result maps container names to their allocations; a container
// with no extended resources gets an empty Allocation.
//
// Device choice, as in kubelet: available = healthy devices not held by any
// pod; fewer available than requested is an error. When the plugin offers
// GetPreferredAllocation, it is asked (available IDs, nothing that must be
// included, the requested size); kubelet then takes the preferred IDs that
// are actually available, in sorted order, and tops up from the other
// available devices, also sorted. Without it, the first N available, sorted.
func (k *Kubelet) Allocate(ctx context.Context, pod *Pod) (map[string]*Allocation, error) {
	if pod.UID == "" {
		return nil, fmt.Errorf("kubeletsim: pod %q has no UID", pod.Name)
	}
	out := map[string]*Allocation{}
	for i := range pod.Containers {
		c := &pod.Containers[i]
		a := &Allocation{DeviceIDs: map[string][]string{}, Responses: map[string]*pluginapi.ContainerAllocateResponse{}}
		out[c.Name] = a
		for _, res := range sortedKeys((c.Limits)) {
			n := c.Limits[res]
			if n <= 0 {
				continue
			}
			ids, resp, err := k.allocateOne(ctx, pod.UID, c.Name, res, n)
			if err != nil {
				k.Release(pod.UID)
				return nil, fmt.Errorf("kubeletsim: pod %s container %s: %w", pod.Name, c.Name, err)
			}
			a.DeviceIDs[res], a.Responses[res] = ids, resp
		}
	}
	return out, nil
}

func (k *Kubelet) allocateOne(ctx context.Context, podUID, container, res string, n int) ([]string, *pluginapi.ContainerAllocateResponse, error) {
	k.mu.Lock()
	r := k.resources[res]
	if r == nil || !r.connected {
		k.mu.Unlock()
		return nil, nil, fmt.Errorf("no device plugin is registered for %s", res)
	}
	var available []string
	for _, id := range r.healthyLocked() {
		if _, held := r.allocated[id]; !held {
			available = append(available, id)
		}
	}
	sort.Strings(available)
	if len(available) < n {
		k.mu.Unlock()
		return nil, nil, fmt.Errorf("requested number of devices unavailable for %s: requested %d, available %d", res, n, len(available))
	}
	// The lock is not held across RPCs: the choice is checked again before
	// it is recorded, so concurrent admissions never share a device.
	client, opts := r.client, r.options
	k.mu.Unlock()

	chosen := available[:n]
	if opts.GetGetPreferredAllocationAvailable() {
		resp, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: available,
				AllocationSize:     int32(n),
			}},
		})
		if err != nil {
			return nil, nil, fmt.Errorf("calling GetPreferredAllocation for %s: %w", res, err)
		}
		if got := len(resp.GetContainerResponses()); got != 1 {
			return nil, nil, fmt.Errorf("calling GetPreferredAllocation for %s: got %d container responses, want 1", res, got)
		}
		chosen = pickPreferred(resp.ContainerResponses[0].DeviceIDs, available, n)
	}

	k.mu.Lock()
	for _, id := range chosen {
		if holder, held := r.allocated[id]; held || r.devices[id] == nil || r.devices[id].Health != pluginapi.Healthy {
			k.mu.Unlock()
			return nil, nil, fmt.Errorf("device %s of %s became unavailable during admission (holder %q)", id, res, holder)
		}
	}
	for _, id := range chosen {
		r.allocated[id] = podUID
	}
	k.notifyLocked()
	k.mu.Unlock()

	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: chosen}},
	})
	if err == nil && len(resp.GetContainerResponses()) != 1 {
		err = fmt.Errorf("returned %d container responses, want 1", len(resp.GetContainerResponses()))
	}
	if err != nil {
		k.mu.Lock()
		for _, id := range chosen {
			delete(r.allocated, id)
		}
		k.notifyLocked()
		k.mu.Unlock()
		return nil, nil, fmt.Errorf("calling Allocate with %v of %s: %w", chosen, res, err)
	}
	k.log.Info("allocated devices", "pod", podUID, "container", container, "resource", res, "devices", chosen)
	return chosen, resp.ContainerResponses[0], nil
}

// pickPreferred is kubelet's use of a preferred allocation: the preferred IDs
// that are available, in sorted order, topped up from the rest of available
// (sorted), n in all. IDs the plugin invented are ignored, as kubelet does.
func pickPreferred(preferred, available []string, n int) []string {
	avail := map[string]bool{}
	for _, id := range available {
		avail[id] = true
	}
	pref := slices.Clone(preferred)
	sort.Strings(pref)
	var out []string
	taken := map[string]bool{}
	for _, list := range [][]string{pref, available} {
		for _, id := range list {
			if len(out) == n {
				return out
			}
			if avail[id] && !taken[id] {
				out = append(out, id)
				taken[id] = true
			}
		}
	}
	return out
}

// Release frees every device held by the pod, as kubelet does once a pod is
// terminated.
func (k *Kubelet) Release(podUID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, r := range k.resources {
		for id, holder := range r.allocated {
			if holder == podUID {
				delete(r.allocated, id)
			}
		}
	}
	k.notifyLocked()
}

// preStart calls PreStartContainer for every resource of a whose plugin asked
// for it, with kubelet's timeout.
func (k *Kubelet) preStart(ctx context.Context, a *Allocation) error {
	for _, res := range sortedKeys((a.DeviceIDs)) {
		k.mu.Lock()
		r := k.resources[res]
		var client pluginapi.DevicePluginClient
		if r != nil && r.connected && r.options.GetPreStartRequired() {
			client = r.client
		}
		k.mu.Unlock()
		if client == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, pluginapi.KubeletPreStartContainerRPCTimeoutInSecs*time.Second)
		_, err := client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: a.DeviceIDs[res]})
		cancel()
		if err != nil {
			return fmt.Errorf("calling PreStartContainer for %s: %w", res, err)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
