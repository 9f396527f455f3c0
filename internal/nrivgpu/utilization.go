package nrivgpu

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// initPIDNamespace is what a process of the host's initial pid namespace
// has at /proc/<pid>/ns/pid: the kernel gives that namespace a fixed inode
// number (PROC_PID_INIT_INO, include/linux/proc_ns.h).
const initPIDNamespace = "pid:[4026531836]"

// utilizationSource returns the source of the containers' SM utilisation
// for the metrics, or nil, leaving the utilisation series out: on
// simulated GPUs whose driver root has no NVML, and where hostProc is not
// the host's /proc. NVML names processes by their host pid, and a /proc of
// another pid namespace (a pod without the host's) would not find them:
// every container would read as idle, which the metrics must not claim.
//
// Simulated GPUs are measured where a libnvidia-ml.so.1 lies beneath the
// driver root (gpu.NVMLLibraryPresent; not the loader's): the fake driver
// roots of the tests, whose NVML shows the simulated GPUs' UUIDs. A node
// with neither GPUs nor a driver has none, and gets no utilisation series
// rather than an NVML error at every scrape.
func utilizationSource(cfg *config.Config, hostProc string, logger *slog.Logger) *utilization.NVML {
	switch cfg.GPU.Backend {
	case config.BackendNVML, "":
	case config.BackendSimulated:
		if !gpu.NVMLLibraryPresent(cfg.Driver) {
			return nil
		}
	default:
		return nil
	}
	if ns, ok := hostPIDNamespace(hostProc); !ok {
		logger.Warn("metrics: no SM utilisation series: NVML reports GPU processes by host pid, and this /proc is not the host's; "+
			"run in the host's pid namespace, or mount the host's /proc and pass --host-proc",
			"host_proc", hostProc, "found", ns)
		return nil
	}
	return utilization.New(cfg.Driver, hostProc)
}

// hostPIDNamespace reports whether procRoot is a /proc of the host's pid
// namespace: whether its pid 1 (init) or pid 2 (kthreadd, the kernel's,
// whose namespace links can be read where init's cannot) is in the initial
// pid namespace. In a /proc of another namespace both are its processes,
// or missing. It also returns what it found, for the log.
func hostPIDNamespace(procRoot string) (string, bool) {
	var found []string
	for _, pid := range []string{"1", "2"} {
		ns, err := os.Readlink(filepath.Join(procRoot, pid, "ns", "pid"))
		if err == nil && ns == initPIDNamespace {
			return ns, true
		}
		if err != nil {
			found = append(found, err.Error())
		} else {
			found = append(found, "pid "+pid+": "+ns)
		}
	}
	return strings.Join(found, "; "), false
}
