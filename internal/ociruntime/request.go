package ociruntime

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/admission"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// The container environment variables of a Docker request (Contract 6).
const (
	// EnvDevices names the GPUs: NVML indices ("0,1"), UUIDs, or "all";
	// "void", "none" or empty ask for none. `docker run --gpus` sets it.
	EnvDevices = "NVIDIA_VISIBLE_DEVICES"
	// EnvMemory is the memory limit on each GPU: "4GiB", "4096MiB", "25%".
	EnvMemory = "NRI_VGPU_MEMORY"
	// EnvCores is the SM-time limit on each GPU: "30" or "30%".
	EnvCores = "NRI_VGPU_CORES"
	// EnvCoresPolicy is how that limit is enforced: "hard" or "burst"
	// (limits.cores_policy of the config when unset or empty).
	EnvCoresPolicy = "NRI_VGPU_CORES_POLICY"
)

// Request is what a container asks for in its environment, as written.
type Request struct {
	// Devices are the entries of NVIDIA_VISIBLE_DEVICES ("all" alone, or
	// indices and UUIDs).
	Devices []string
	// Memory, Cores and CoresPolicy are NRI_VGPU_MEMORY, NRI_VGPU_CORES
	// and NRI_VGPU_CORES_POLICY; "" = unset.
	Memory, Cores, CoresPolicy string
}

// RequestError is a request the wrapper cannot honour; its message names
// the variable.
type RequestError struct {
	Var   string // the variable at fault
	Value string
	Err   error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("%s=%q: %v", e.Var, e.Value, e.Err)
}

func (e *RequestError) Unwrap() error { return e.Err }

// lookupEnv returns the value of key in env; the last entry wins, as for
// execve.
func lookupEnv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// RequestFromEnv reads the vGPU request from a container's environment. It
// returns nil (and no error) for a container that asks for no GPU: no
// NVIDIA_VISIBLE_DEVICES, or "void", "none" or "". Quota variables without
// GPUs are an error: they would silently do nothing.
func RequestFromEnv(env []string) (*Request, error) {
	devs, _ := lookupEnv(env, EnvDevices)
	mem, hasMem := lookupEnv(env, EnvMemory)
	cores, hasCores := lookupEnv(env, EnvCores)
	policy, hasPolicy := lookupEnv(env, EnvCoresPolicy)
	var entries []string
	for _, f := range strings.Split(devs, ",") {
		if f = strings.TrimSpace(f); f != "" {
			entries = append(entries, f)
		}
	}
	if len(entries) == 0 || (len(entries) == 1 && (entries[0] == "void" || entries[0] == "none")) {
		for _, v := range []struct {
			name, value string
			set         bool
		}{{EnvMemory, mem, hasMem}, {EnvCores, cores, hasCores}, {EnvCoresPolicy, policy, hasPolicy}} {
			if v.set {
				return nil, &RequestError{Var: v.name, Value: v.value,
					Err: fmt.Errorf("%s names no GPU (%q); set it to GPU indices (\"0,1\"), UUIDs or \"all\"", EnvDevices, devs)}
			}
		}
		return nil, nil
	}
	return &Request{Devices: entries, Memory: mem, Cores: cores, CoresPolicy: policy}, nil
}

// GPUs resolves the request's devices against the node's GPUs, in the order
// asked (for "all", the node's order), without duplicates.
func (r *Request) GPUs(devices []gpu.Device) ([]gpu.Device, error) {
	value := strings.Join(r.Devices, ",")
	fail := func(format string, args ...any) error {
		return &RequestError{Var: EnvDevices, Value: value, Err: fmt.Errorf(format, args...)}
	}
	if len(devices) == 0 {
		return nil, fail("this node has no GPUs")
	}
	if slices.Contains(r.Devices, "all") {
		if len(r.Devices) > 1 {
			return nil, fail(`"all" cannot be combined with other devices`)
		}
		for _, d := range devices {
			if !d.Healthy {
				return nil, fail("GPU %d (%s) is unhealthy", d.Index, d.UUID)
			}
		}
		return slices.Clone(devices), nil
	}
	var out []gpu.Device
	for _, e := range r.Devices {
		var (
			found gpu.Device
			ok    bool
		)
		switch {
		case strings.HasPrefix(e, "MIG-") || strings.Contains(e, ":"):
			return nil, fail("%q is a MIG device; nri-vgpu shares whole GPUs", e)
		case isIndex(e):
			n, err := strconv.Atoi(e)
			if err == nil {
				i := slices.IndexFunc(devices, func(d gpu.Device) bool { return d.Index == n })
				if i >= 0 {
					found, ok = devices[i], true
				}
			}
		default:
			i := slices.IndexFunc(devices, func(d gpu.Device) bool { return strings.EqualFold(d.UUID, e) })
			if i >= 0 {
				found, ok = devices[i], true
			}
		}
		if !ok {
			return nil, fail("no GPU %q on this node (it has %s)", e, describeGPUs(devices))
		}
		if !found.Healthy {
			return nil, fail("GPU %d (%s) is unhealthy", found.Index, found.UUID)
		}
		if !slices.ContainsFunc(out, func(d gpu.Device) bool { return d.UUID == found.UUID }) {
			out = append(out, found)
		}
	}
	return out, nil
}

func isIndex(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func describeGPUs(devices []gpu.Device) string {
	parts := make([]string, len(devices))
	for i, d := range devices {
		parts[i] = fmt.Sprintf("%d = %s", d.Index, d.UUID)
	}
	return strings.Join(parts, ", ")
}

// Decision is what the wrapper decides for a request: the allocation that pkg/oci turns into the
// container's edits, what the admission record must reserve for it, and the capacity
// of each GPU it asks for.
type Decision struct {
	Allocation   *allocation.Allocation
	Reservations []admission.Reservation
	Capacity     []admission.Capacity
}

// Resolve turns the request into limits on each of its GPUs:
//
//   - memory: NRI_VGPU_MEMORY on each GPU (a percentage is of the GPU's
//     real memory); unset, all of the GPU's memory_scaling × total, as
//     when a pod holds every slice of a GPU. More than that is an error.
//   - cores: NRI_VGPU_CORES on each GPU; unset, 100 (no throttling).
//   - cores policy: NRI_VGPU_CORES_POLICY; unset, limits.cores_policy of
//     the config.
//
// Limits are written even for a whole GPU, so that usage is reported.
// The allocation ID is derived from the container ID.
func (r *Request) Resolve(devices []gpu.Device, cfg *config.Config, containerID string, now time.Time) (*Decision, error) {
	gpus, err := r.GPUs(devices)
	if err != nil {
		return nil, err
	}
	cores := 100
	if r.Cores != "" {
		if cores, err = quantity.ParseCores(r.Cores); err != nil {
			return nil, &RequestError{Var: EnvCores, Value: r.Cores, Err: err}
		}
	}
	policy, err := r.coresPolicy(cfg)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(containerID))
	g := &Decision{Allocation: &allocation.Allocation{
		V:           allocation.Version,
		ID:          hex.EncodeToString(sum[:16]),
		Issued:      now.Unix(),
		CoresPolicy: policy,
	}}
	for _, d := range gpus {
		c, err := admission.CapacityOf(d.Index, d.UUID, d.Memory, cfg.DevicePlugin.MemoryScaling, cfg.DevicePlugin.CoresScaling)
		if err != nil {
			return nil, fmt.Errorf("GPU %d (%s): %w", d.Index, d.UUID, err)
		}
		mem := c.Memory
		if r.Memory != "" {
			if mem, err = quantity.ParseMemory(r.Memory, d.Memory); err != nil {
				return nil, &RequestError{Var: EnvMemory, Value: r.Memory, Err: err}
			}
			if mem > c.Memory {
				return nil, &RequestError{Var: EnvMemory, Value: r.Memory, Err: fmt.Errorf(
					"more than GPU %d (%s) can give: %s (%s × memory_scaling %v)", d.Index, d.UUID,
					quantity.FormatBytes(c.Memory), quantity.FormatBytes(d.Memory), cfg.DevicePlugin.MemoryScaling)}
			}
		}
		a := allocation.GPU{UUID: d.UUID, Minor: d.Minor, Memory: mem, Cores: cores}
		g.Allocation.GPUs = append(g.Allocation.GPUs, a)
		g.Reservations = append(g.Reservations, admission.FromAllocated(a))
		g.Capacity = append(g.Capacity, c)
	}
	return g, nil
}

// coresPolicy is the allocation's cores policy for the request: "burst", or
// "" for hard, as the device plugin signs it.
func (r *Request) coresPolicy(cfg *config.Config) (string, error) {
	policy := r.CoresPolicy
	if policy == "" {
		policy = cfg.Limits.CoresPolicy
	}
	switch policy {
	case limits.CoresPolicyBurst:
		return policy, nil
	case limits.CoresPolicyHard, "":
		return "", nil
	}
	if r.CoresPolicy == "" {
		// Config.Validate refuses this; a Config built in code may not
		// have been through it.
		return "", fmt.Errorf("config limits.cores_policy %q: want %q or %q", policy, limits.CoresPolicyHard, limits.CoresPolicyBurst)
	}
	return "", &RequestError{Var: EnvCoresPolicy, Value: r.CoresPolicy,
		Err: fmt.Errorf("want %q (never more than NRI_VGPU_CORES) or %q (more while the GPU is otherwise idle)", limits.CoresPolicyHard, limits.CoresPolicyBurst)}
}
