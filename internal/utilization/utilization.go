// Package utilization measures each container's SM utilisation of each GPU
// on the host, where the tenant cannot forge it: NVML's per-process SM
// utilisation samples (nvmlDeviceGetProcessUtilization), read by nri-vgpu,
// with each host pid mapped to its container by the host's
// /proc/<pid>/cgroup. No usage region is involved.
//
// # Window
//
// NVML keeps a few seconds of samples per GPU, each the percent of the
// sampling period (about 1/6 s on current GPUs) the process had kernels
// running, stamped with the wall-clock time in microseconds. Every call
// reads the samples of the last Window, whoever calls and however often:
// a gauge that two Prometheus servers, a kubectl nri-vgpu and an operator's
// curl all see alike, none of them using up what the others would have
// seen (a window that started at the previous call would split the samples
// among the callers). A process's utilisation over the window is the mean
// of its samples in it, as the shim's SM limiter takes it
// (shim/src/limiter.c); a container's is the sum over its processes,
// capped at 1 (the whole GPU). NVML_ERROR_NOT_FOUND means no samples in the
// window: nothing ran, and no Sample is returned for that GPU.
//
// # What a tenant can and cannot do
//
// The adversary is a default Kubernetes pod: root in its container with
// containerd's default capabilities (no CAP_SYS_ADMIN), seccomp
// Unconfined, any image. It cannot change which container a process is
// counted to: the cgroup path is what the runtime made, and the container's
// cgroup file system is mounted read-only, while a user namespace it makes
// (unshare -U) gives it no write permission on the host-owned cgroup files,
// so no process of it can move to another cgroup. Should a process be able
// to make cgroups (a privileged pod, a delegated subtree), it can make them
// only below its own container's cgroup, and the OUTERMOST container ID of
// the path is the one read (ownerOfPath): a sub-cgroup named after a
// victim's ID is not. It cannot change what NVML reports: samples come from
// the driver, per host pid, and nothing the container writes (its usage
// region, its own NVML calls through the shim) is read. A tenant that forks
// many processes is summed over all of them, capped at 1 per GPU. What it
// can do is use the GPU: that is what is measured.
//
// # NVML
//
// The library is found and initialized once, lazily, at the first call
// (gpu.LoadNVML: beneath the driver root and driver.library_dirs). GPU
// handles are fetched at every call, so none outlives a driver reload; a
// call that fails with NVML_ERROR_UNINITIALIZED or
// NVML_ERROR_DRIVER_NOT_LOADED shuts the library down and initializes it
// again at the next call.
package utilization

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// Sample is one container's SM utilisation of one GPU over the window.
type Sample struct {
	ContainerID string
	PodUID      string  // "" for a container of no Kubernetes pod
	UUID        string  // the GPU's
	SM          float64 // 0–1 of the GPU
}

// Source gives the per-container SM utilisation over the last Window.
type Source interface {
	Samples() ([]Sample, error)
}

// Window is how far back each call looks: a few of NVML's sampling periods
// at the least, and no longer than the shortest scrape interval in common
// use (15 s), so that a scrape shows the time since about the previous one.
const Window = 10 * time.Second

// NVML is the Source on the driver's NVML.
type NVML struct {
	// load finds and initializes the library (gpu.LoadNVML; tests give a
	// mock). It returns the library, if one could be loaded, with any error.
	load func() (nvml.Interface, error)
	// procRoot is the host's /proc.
	procRoot string
	now      func() time.Time

	mu          sync.Mutex
	lib         nvml.Interface
	initialized bool
	// unsupported are the GPUs whose driver said per-process utilisation
	// is not supported, logged once each.
	unsupported map[string]bool
}

var _ Source = (*NVML)(nil)

// New returns the Source on the NVML of the driver d describes, reading
// host processes' cgroups under procRoot ("/proc" on a host, or in a pod
// with the host's pid namespace). Nothing is loaded until the first call.
func New(d config.Driver, procRoot string) *NVML {
	return newNVML(func() (nvml.Interface, error) { return gpu.LoadNVML(d) }, procRoot)
}

func newNVML(load func() (nvml.Interface, error), procRoot string) *NVML {
	return &NVML{load: load, procRoot: procRoot, now: time.Now,
		unsupported: map[string]bool{}}
}

// readyLocked initializes NVML if it is not. A failure is not remembered:
// the next call tries again.
func (s *NVML) readyLocked() error {
	if s.initialized {
		return nil
	}
	if s.lib == nil {
		lib, err := s.load()
		// A library that loaded stays (its symbols are bound for the
		// process): a retry initializes it again.
		s.lib = lib
		if err != nil {
			return fmt.Errorf("NVML: %w", err)
		}
	} else if ret := s.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: initializing: %w", ret)
	}
	s.initialized = true
	return nil
}

// lostLocked notes an error that says NVML is no longer initialized (the
// driver was unloaded or reloaded): the next call initializes it again.
func (s *NVML) lostLocked(ret nvml.Return) {
	if ret != nvml.ERROR_UNINITIALIZED && ret != nvml.ERROR_DRIVER_NOT_LOADED {
		return
	}
	_ = s.lib.Shutdown() // ours, if any is left: NVML counts initializations
	s.initialized = false
}

// Samples returns, for each container with processes that NVML sampled on
// a GPU in the last Window, its SM utilisation of that GPU. On a
// failure on some GPUs it returns the samples of the others with an error
// naming each GPU that failed.
func (s *NVML) Samples() ([]Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.readyLocked(); err != nil {
		return nil, err
	}
	count, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		s.lostLocked(ret)
		return nil, fmt.Errorf("NVML: counting GPUs: %w", ret)
	}
	// Per GPU, per host pid: its mean utilisation in percent.
	type gpuProcs struct {
		uuid string
		util map[uint32]float64
	}
	var (
		gpus []gpuProcs
		errs []error
	)
	for i := range count {
		uuid, util, err := s.deviceLocked(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(util) > 0 {
			gpus = append(gpus, gpuProcs{uuid, util})
		}
	}

	owners := map[uint32]*Owner{} // nil: in no container
	type key struct{ id, uuid string }
	sums := map[key]*Sample{}
	for _, g := range gpus {
		for pid, pct := range g.util {
			o, seen := owners[pid]
			if !seen {
				found, ok, err := ownerOf(s.procRoot, pid)
				if err != nil {
					errs = append(errs, fmt.Errorf("GPU %s: process %d: reading its cgroup: %w", g.uuid, pid, err))
				}
				if ok {
					o = &found
				}
				owners[pid] = o
			}
			if o == nil {
				continue
			}
			k := key{o.ContainerID, g.uuid}
			sm := sums[k]
			if sm == nil {
				sm = &Sample{ContainerID: o.ContainerID, PodUID: o.PodUID, UUID: g.uuid}
				sums[k] = sm
			}
			sm.SM += pct / 100
		}
	}
	out := make([]Sample, 0, len(sums))
	for _, sm := range sums {
		sm.SM = min(sm.SM, 1)
		out = append(out, *sm)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UUID != out[j].UUID {
			return out[i].UUID < out[j].UUID
		}
		return out[i].ContainerID < out[j].ContainerID
	})
	return out, errors.Join(errs...)
}

// deviceLocked reads the samples of GPU index i newer than the previous
// call's and returns each sampled process's mean utilisation in percent.
func (s *NVML) deviceLocked(i int) (string, map[uint32]float64, error) {
	h, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		s.lostLocked(ret)
		return "", nil, fmt.Errorf("NVML: GPU %d: getting its handle: %w", i, ret)
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		s.lostLocked(ret)
		return "", nil, fmt.Errorf("NVML: GPU %d: getting its UUID: %w", i, ret)
	}
	// NVML hands out the samples at or after lastSeenTimeStamp. Their own
	// stamps are not compared with it here: NVML's clock is its own to
	// choose (the test driver's is monotonic).
	since := uint64(s.now().Add(-Window).UnixMicro())
	samples, ret := h.GetProcessUtilization(since)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND:
		return uuid, nil, nil // no samples in the window
	case nvml.ERROR_NOT_SUPPORTED:
		// Permanent for the GPU (MIG mode, some older GPUs): said once,
		// not counted as a failure at every scrape.
		if !s.unsupported[uuid] {
			s.unsupported[uuid] = true
			slog.Warn("NVML gives no per-process utilisation on this GPU; its containers have no SM utilisation", "gpu", uuid)
		}
		return uuid, nil, nil
	default:
		s.lostLocked(ret)
		return "", nil, fmt.Errorf("NVML: GPU %d (%s): getting per-process utilisation: %w", i, uuid, ret)
	}
	type acc struct{ sum, n float64 }
	per := map[uint32]*acc{}
	for _, x := range samples {
		a := per[x.Pid]
		if a == nil {
			a = &acc{}
			per[x.Pid] = a
		}
		a.sum += float64(x.SmUtil)
		a.n++
	}
	util := make(map[uint32]float64, len(per))
	for pid, a := range per {
		util[pid] = a.sum / a.n
	}
	return uuid, util, nil
}

// Close ends this Source's use of NVML.
func (s *NVML) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.initialized {
		return nil
	}
	s.initialized = false
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: shutting down: %w", ret)
	}
	return nil
}
