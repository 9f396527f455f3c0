// Package metrics exposes the node's vGPU state to Prometheus: per GPU the
// memory and SM share handed out and in use, per container its limits, the
// memory its processes hold and the kernels they launched. A custom
// Collector reads the host files under run_dir (limits files,
// container.json, usage regions) and the GPU inventory on every scrape;
// nothing polls in the background, so an idle endpoint costs nothing and a
// scrape never shows stale data.
//
// Each usage region is written by its container, so a scrape follows no
// symbolic link below run_dir, never waits on a region's lock, and exports
// counters that cannot be true as nri_vgpu_container_region_suspect
// instead of as usage. Limits always come from the limits files.
package metrics

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/utilization"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Inventory lists the node's GPUs; gpu.Backend and
// nriplugin.BackendInventory satisfy it.
type Inventory interface {
	Devices() ([]gpu.Device, error)
}

// What a scrape error is about: the value of the "source" label of
// nri_vgpu_scrape_errors_total.
const (
	SourceInventory     = "inventory"      // the GPU backend could not list the GPUs
	SourceRunDir        = "run_dir"        // <run_dir>/containers could not be listed
	SourceLimits        = "limits"         // a limits file could not be read or parsed
	SourceContainerInfo = "container_info" // a container.json could not be read or parsed
	SourceRegion        = "region"         // a usage region could not be read or is invalid
	SourceNVML          = "nvml"           // the processes' SM utilisation could not be read
)

var errorSources = []string{SourceInventory, SourceRunDir, SourceLimits, SourceContainerInfo, SourceRegion, SourceNVML}

// Label names are dcgm-exporter's (UUID; gpu for the index; namespace, pod,
// container), so that queries and dashboards join the two exporters' series
// on them. The model stays "name": dcgm-exporter's modelName is camelCase,
// which `promtool check metrics` refuses for a label. No series carries the
// node: Prometheus adds it when it scrapes (docs/metrics.md), as it knows
// which node it scraped and a label of ours could only repeat that.
var (
	gpuLabels = []string{"UUID", "gpu", "name"}
	// claim is "" for a container's record; a DRA claim's record has the
	// claim's namespace and name, and pod and container "" (its pods are
	// in nri_vgpu_claim_pod_info).
	containerLabels = []string{"container_id", "namespace", "pod", "container", "claim"}
	perGPULabels    = append(append([]string(nil), containerLabels...), "UUID")

	gpuMemoryTotal = prometheus.NewDesc("nri_vgpu_gpu_memory_total_bytes",
		"Total memory of the GPU, from the GPU inventory.", gpuLabels, nil)
	gpuMemoryAllocated = prometheus.NewDesc("nri_vgpu_gpu_memory_allocated_bytes",
		"Sum of the memory limits of the vGPU containers on the GPU (a container without a memory limit adds 0).", gpuLabels, nil)
	gpuMemoryUsed = prometheus.NewDesc("nri_vgpu_gpu_memory_used_bytes",
		"Sum of the memory the vGPU containers' processes hold on the GPU, from their usage regions.", gpuLabels, nil)
	gpuSMAllocated = prometheus.NewDesc("nri_vgpu_gpu_sm_allocated_ratio",
		"Sum of the SM-time shares of the vGPU containers on the GPU, as a ratio of the GPU (1 = all of it; above 1 when cores_scaling overcommits).", gpuLabels, nil)
	gpuSMUtilization = prometheus.NewDesc("nri_vgpu_gpu_sm_utilization_ratio",
		"Share of the GPU's SM time the vGPU containers' processes used (sum of nri_vgpu_container_sm_utilization_ratio), measured by NVML on the host.", gpuLabels, nil)

	ctrMemoryLimit = prometheus.NewDesc("nri_vgpu_container_memory_limit_bytes",
		"Memory limit of the container on the GPU; 0 means no memory limit.", perGPULabels, nil)
	ctrMemoryUsed = prometheus.NewDesc("nri_vgpu_container_memory_used_bytes",
		"Memory the container's processes hold on the GPU, from its usage region.", perGPULabels, nil)
	ctrMemoryPeak = prometheus.NewDesc("nri_vgpu_container_memory_peak_bytes",
		"Most memory the container's processes held on the GPU at once since its usage region was made, from the region (version 2 and later).", perGPULabels, nil)
	ctrSMLimit = prometheus.NewDesc("nri_vgpu_container_sm_limit_ratio",
		"SM-time share of the container on the GPU, as a ratio of the GPU (1 = not throttled).", perGPULabels, nil)
	ctrSMUtilization = prometheus.NewDesc("nri_vgpu_container_sm_utilization_ratio",
		"Share of the GPU's SM time the container's processes used, measured by NVML on the host (0-1 of the whole GPU).", perGPULabels, nil)
	ctrSMShareUtilization = prometheus.NewDesc("nri_vgpu_container_sm_share_utilization_ratio",
		"SM utilisation of the container as a ratio of its SM-time share (1 = its whole share; above 1 only with the burst cores policy).", perGPULabels, nil)
	ctrSMThrottled = prometheus.NewDesc("nri_vgpu_container_sm_throttled_seconds_total",
		"Seconds the container's processes had kernel launches waiting on the SM limiter on the GPU, summed over processes, since its usage region was made, from the region (version 2 and later).", perGPULabels, nil)
	ctrLaunches = prometheus.NewDesc("nri_vgpu_container_kernel_launches_total",
		"Kernel launches of the container's processes on the GPU since this daemon first saw them.", perGPULabels, nil)
	ctrRegionSuspect = prometheus.NewDesc("nri_vgpu_container_region_suspect",
		"1 when the container's usage region holds impossible counters for the GPU (its memory used, peak, throttled time and kernel launches are then left out), else 0.", perGPULabels, nil)
	ctrProcesses = prometheus.NewDesc("nri_vgpu_container_processes",
		"Processes of the container registered in its usage region (processes that initialised CUDA or NVML and are alive).", containerLabels, nil)

	claimPodInfo = prometheus.NewDesc("nri_vgpu_claim_pod_info",
		"Always 1: one series per pod a DRA claim's record serves (the pods the claim was reserved for when last prepared).",
		[]string{"namespace", "claim", "pod"}, nil)

	confinementAvailable = prometheus.NewDesc("nri_vgpu_confinement_available",
		"1 when the container runtime applies the confinement of GPU containers (NRI seccomp adjustment, containerd 2.2 and later), 0 when it cannot or nri-vgpu cannot tell; absent until the NRI plugin first connected. policy is nri.confinement: what happens to a GPU container that cannot be confined.",
		[]string{"runtime", "runtime_version", "nri_version", "policy"}, nil)

	gpuServedElsewhere = prometheus.NewDesc("nri_vgpu_gpu_served_elsewhere_info",
		"Always 1: one series per GPU of the node that nri-vgpu leaves to another plugin and never advertises; reason is \"MIG mode\".",
		append(append([]string(nil), gpuLabels...), "reason"), nil)

	buildInfo = prometheus.NewDesc("nri_vgpu_build_info",
		"Always 1; the version label is that of the running build.", []string{"version"}, nil)
)

// Collector is a prometheus.Collector over the files under run_dir and the
// GPU inventory. Scrapes are serialised: each one reads every container's
// files once, and the state kept between scrapes (which files are known to
// be broken, the launch counts of processes that exited) needs no finer
// locking.
type Collector struct {
	cfg  *config.Config
	inv  Inventory
	util utilization.Source
	log  *slog.Logger

	state        *hoststate.Store
	scrapeErrors *prometheus.CounterVec
	buildInfo    prometheus.Metric

	mu sync.Mutex
	// broken holds the files (and "inventory", "run_dir") that failed at the
	// last scrape, so that each is logged once while it stays broken.
	broken map[string]bool
	// launches holds, per container ID, what keeps
	// nri_vgpu_container_kernel_launches_total from going down when a
	// process exits and the shim frees its slot.
	launches map[string]*launchHistory
}

// Options are what a Collector reads besides run_dir.
type Options struct {
	// Inventory lists the node's GPUs. nil: GPUs appear only through the
	// containers that use them, without index, name or total memory.
	Inventory Inventory
	// Utilization gives the SM utilisation of the GPU processes, mapped to
	// their containers. nil: no utilisation series.
	Utilization utilization.Source
	// Logger nil means slog.Default().
	Logger *slog.Logger
}

// NewCollectorWith returns a collector over cfg's run_dir and what opts
// gives.
func NewCollectorWith(cfg *config.Config, opts Options) *Collector {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	c := &Collector{
		cfg:  cfg,
		inv:  opts.Inventory,
		util: opts.Utilization,
		log:  logger,
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_scrape_errors_total",
			Help: "Files (limits, container.json, usage regions) or sources (GPU inventory, run_dir, NVML's utilisation) that could not be read during scrapes, by source; each scrape counts each failure once.",
		}, []string{"source"}),
		state:     hoststate.New(cfg),
		buildInfo: prometheus.MustNewConstMetric(buildInfo, prometheus.GaugeValue, 1, version.Version),
		broken:    map[string]bool{},
		launches:  map[string]*launchHistory{},
	}
	// Every source appears from the first scrape on, at 0, so that rate()
	// and alerts on it work before the first error.
	for _, s := range errorSources {
		c.scrapeErrors.WithLabelValues(s)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		gpuMemoryTotal, gpuMemoryAllocated, gpuMemoryUsed, gpuSMAllocated, gpuSMUtilization,
		ctrMemoryLimit, ctrMemoryUsed, ctrMemoryPeak, ctrSMLimit, ctrSMUtilization, ctrSMShareUtilization,
		ctrSMThrottled, ctrLaunches, ctrRegionSuspect, ctrProcesses,
		claimPodInfo, buildInfo, confinementAvailable, gpuServedElsewhere,
	} {
		ch <- d
	}
	c.scrapeErrors.Describe(ch)
}

// gpuTotals accumulates one GPU's series.
type gpuTotals struct {
	labels                    []string // uuid, index, name
	total                     uint64
	inInventory               bool
	allocated, used, coresSum uint64
	smUtilization             float64
}

// Collect implements prometheus.Collector: it reads the inventory and every
// container directory now. A file that cannot be read costs its own series
// only; the scrape goes on.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &scrape{c: c, failed: map[string]bool{}}
	if c.util != nil {
		// Asked before run_dir is read: a container created in between has
		// no sample yet and shows 0, rather than one removed in between
		// showing its processes' last use.
		samples, err := c.util.Samples()
		if err != nil {
			s.fail(SourceNVML, "nvml", err)
		} else {
			s.ok("nvml")
			s.util = indexSamples(samples)
		}
	}

	gpus := map[string]*gpuTotals{}
	var order []string // GPU UUIDs, inventory order first
	if c.inv != nil {
		devs, err := c.inv.Devices()
		if err != nil {
			s.fail(SourceInventory, "inventory", err)
		} else {
			s.ok("inventory")
		}
		for _, d := range devs {
			if _, dup := gpus[d.UUID]; dup {
				continue
			}
			gpus[d.UUID] = &gpuTotals{labels: []string{d.UUID, strconv.Itoa(d.Index), d.Name}, total: d.Memory, inInventory: true}
			order = append(order, d.UUID)
		}
	}
	gpuOf := func(uuid string) *gpuTotals {
		g, ok := gpus[uuid]
		if !ok {
			g = &gpuTotals{labels: []string{uuid, "", ""}}
			gpus[uuid] = g
			order = append(order, uuid)
		}
		return g
	}

	// Every record's files are reached below one directory, without
	// following a link.
	live := map[string]bool{}
	err := c.state.Scan(func(r *hoststate.Record) error {
		live[r.ID] = true
		for _, m := range s.container(r, gpuOf) {
			ch <- m
		}
		return nil
	})
	if err != nil {
		s.fail(SourceRunDir, "run_dir", err)
	} else {
		s.ok("run_dir")
	}
	// Containers gone since the last scrape take their launch history along
	// (not when run_dir could not be listed: that says nothing about them).
	if err == nil {
		for id := range c.launches {
			if !live[id] {
				delete(c.launches, id)
			}
		}
	}

	for _, uuid := range order {
		g := gpus[uuid]
		if g.inInventory {
			ch <- prometheus.MustNewConstMetric(gpuMemoryTotal, prometheus.GaugeValue, float64(g.total), g.labels...)
		}
		ch <- prometheus.MustNewConstMetric(gpuMemoryAllocated, prometheus.GaugeValue, float64(g.allocated), g.labels...)
		ch <- prometheus.MustNewConstMetric(gpuMemoryUsed, prometheus.GaugeValue, float64(g.used), g.labels...)
		ch <- prometheus.MustNewConstMetric(gpuSMAllocated, prometheus.GaugeValue, percentToRatio(g.coresSum), g.labels...)
		if s.util != nil {
			ch <- prometheus.MustNewConstMetric(gpuSMUtilization, prometheus.GaugeValue, g.smUtilization, g.labels...)
		}
	}
	ch <- c.buildInfo
	if l, ok := c.inv.(gpu.ElsewhereLister); ok {
		// Not a scrape error of its own: the inventory's source counts
		// a backend that cannot be read, and these GPUs are only shown.
		if devs, err := l.ServedElsewhere(); err == nil {
			for _, d := range devs {
				ch <- prometheus.MustNewConstMetric(gpuServedElsewhere, prometheus.GaugeValue, 1, d.UUID, strconv.Itoa(d.Index), d.Name, "MIG mode")
			}
		}
	}
	if rt, err := hoststate.ReadRuntime(c.cfg); err == nil {
		v := 0.0
		if rt.Confinement {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(confinementAvailable, prometheus.GaugeValue, v, rt.Name, rt.Version, rt.NRIVersion, rt.ConfinementPolicy)
	} else if !errors.Is(err, fs.ErrNotExist) {
		s.fail(SourceRunDir, "runtime.json", err)
	}

	// A file that failed before and was neither read fine nor failed again
	// is gone (its container was removed): forget it silently.
	c.broken = s.failed
	c.scrapeErrors.Collect(ch)
}

// scrape is one Collect call.
type scrape struct {
	c      *Collector
	failed map[string]bool // keys that failed in this scrape
	// claimPodSeen holds the nri_vgpu_claim_pod_info label values
	// (namespace, claim, pod) exported so far in this scrape.
	claimPodSeen map[[3]string]bool
	// util is this scrape's SM utilisation; nil leaves the utilisation
	// series out (no source, or it failed).
	util *utilIndex
}

// utilIndex sums the utilisation samples per GPU UUID, by container ID and
// by pod UID.
type utilIndex struct {
	byContainer, byPod map[string]map[string]float64
}

func indexSamples(samples []utilization.Sample) *utilIndex {
	x := &utilIndex{byContainer: map[string]map[string]float64{}, byPod: map[string]map[string]float64{}}
	add := func(m map[string]map[string]float64, key, uuid string, v float64) {
		if key == "" {
			return
		}
		if m[key] == nil {
			m[key] = map[string]float64{}
		}
		m[key][uuid] += v
	}
	for _, smp := range samples {
		add(x.byContainer, smp.ContainerID, smp.UUID, smp.SM)
		add(x.byPod, smp.PodUID, smp.UUID, smp.SM)
	}
	return x
}

// of returns the SM utilisation of a record on the GPU uuid: that of the
// container's processes, or for a claim (claim non-nil) that of its pods'
// processes on the GPU.
func (x *utilIndex) of(id string, claim *hoststate.ClaimInfo, uuid string) float64 {
	if claim == nil {
		return x.byContainer[id][uuid]
	}
	var sum float64
	for i, pod := range claim.PodUIDs {
		if !slices.Contains(claim.PodUIDs[:i], pod) { // a pod named twice counts once
			sum += x.byPod[pod][uuid]
		}
	}
	return sum
}

// fail counts a scrape error and logs it unless key already failed at the
// previous scrape.
func (s *scrape) fail(source, key string, err error) {
	s.c.scrapeErrors.WithLabelValues(source).Inc()
	if !s.c.broken[key] {
		s.c.log.Warn("metrics: cannot read; its series are left out until it can be read", "source", source, "err", err)
	}
	s.failed[key] = true
}

// ok notes that key was read fine, logging the recovery of a file that had
// failed.
func (s *scrape) ok(key string) {
	if s.c.broken[key] {
		s.c.log.Info("metrics: readable again", "what", key)
	}
}

// suspect logs, unless it did so at the previous scrape, that a region's
// counters for a GPU are impossible.
func (s *scrape) suspect(key string, err error) {
	if !s.c.broken[key] {
		s.c.log.Warn("metrics: usage region counters are impossible; the container's usage on this GPU is left out", "region", key, "err", err)
	}
	s.failed[key] = true
}

// believable logs that a region's counters for a GPU that were impossible
// at the last scrape can be believed again.
func (s *scrape) believable(key string) {
	if s.c.broken[key] {
		s.c.log.Info("metrics: usage region counters are believable again", "region", key)
	}
}

// container reads one record's directory (a container's or a claim's) and
// returns its series; it adds the record's share to the GPU totals.
func (s *scrape) container(r *hoststate.Record, gpuOf func(uuid string) *gpuTotals) []prometheus.Metric {
	id := r.ID
	limitsPath := r.Path(hoststate.LimitsFileName)
	lf, err := r.Limits()
	if errors.Is(err, fs.ErrNotExist) {
		// Being created (Provision writes the limits file first) or being
		// removed: not a vGPU container yet, or any more.
		return nil
	}
	if err != nil {
		s.fail(SourceLimits, limitsPath, err)
		return nil
	}
	s.ok(limitsPath)

	labels := []string{id, "", "", "", ""} // container_id, namespace, pod, container, claim
	var out []prometheus.Metric
	var claim *hoststate.ClaimInfo
	// A claim's record is told by its container.json; without one, its
	// processes cannot be found (they are its pods'), and its utilisation
	// is left out rather than read as 0.
	utilKnown := !strings.HasPrefix(id, hoststate.ClaimIDPrefix)
	infoPath := r.Path(hoststate.InfoFileName)
	if info, err := r.Info(); err == nil {
		utilKnown = true
		s.ok(infoPath)
		claim = info.Claim
		if info.Kind() == hoststate.KindClaim {
			labels[1], labels[4] = info.Claim.Namespace, info.Claim.Name
			out = s.claimPods(out, info)
		} else {
			labels[1], labels[2] = splitPod(info.Pod)
			labels[3] = info.Name
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		s.fail(SourceContainerInfo, infoPath, err)
	}

	// The host writes an empty region when it provisions a record; a
	// record of the previous release has none until a process of its
	// container uses a GPU, so a missing region means that it holds
	// nothing, held nothing, launched nothing and was never held back. An
	// unreadable region leaves the container's usage series out of this
	// scrape rather than report 0.
	regionPath := r.Path(hoststate.RegionDirName, region.FileName)
	usage, err := r.Usage()
	haveUsage, noRegion := true, false
	switch {
	case errors.Is(err, fs.ErrNotExist):
		usage, noRegion = &region.Usage{Version: region.Version}, true
	case err != nil:
		s.fail(SourceRegion, regionPath, err)
		haveUsage = false
	default:
		s.ok(regionPath)
	}

	var launched map[string]uint64
	var devs map[string]region.DeviceUsage
	if haveUsage {
		devs = make(map[string]region.DeviceUsage, len(usage.Devices))
		for _, d := range usage.Devices {
			devs[d.UUID] = d
		}
		launched = s.c.launchTotals(id, usage)
		out = append(out, prometheus.MustNewConstMetric(ctrProcesses, prometheus.GaugeValue, float64(len(usage.Processes)), labels...))
	}
	for _, l := range lf.GPUs {
		gl := append(labels[:len(labels):len(labels)], l.UUID)
		g := gpuOf(l.UUID)
		g.allocated += l.Memory
		g.coresSum += uint64(l.Cores)
		out = append(out,
			prometheus.MustNewConstMetric(ctrMemoryLimit, prometheus.GaugeValue, float64(l.Memory), gl...),
			prometheus.MustNewConstMetric(ctrSMLimit, prometheus.GaugeValue, percentToRatio(uint64(l.Cores)), gl...))
		if s.util != nil && utilKnown {
			// Measured on the host: exported whatever the region says.
			u := s.util.of(id, claim, l.UUID)
			g.smUtilization += u
			out = append(out,
				prometheus.MustNewConstMetric(ctrSMUtilization, prometheus.GaugeValue, u, gl...),
				// Cores is 1..100 in a limits file that parsed.
				prometheus.MustNewConstMetric(ctrSMShareUtilization, prometheus.GaugeValue, u/percentToRatio(uint64(l.Cores)), gl...))
		}
		if !haveUsage {
			continue
		}
		// The region is the container's to write: counters that cannot be
		// true are reported as such, never exported as usage. The limit
		// they are checked against is the limits file's.
		suspectKey := regionPath + " " + l.UUID
		var suspect error
		if !noRegion {
			suspect = usage.Check(l.UUID, l.Memory)
		}
		if suspect == nil && launched[l.UUID] > region.MaxPlausibleLaunches {
			suspect = fmt.Errorf("GPU %s: %w: %d kernel launches counted so far", l.UUID, region.ErrSuspect, launched[l.UUID])
		}
		if suspect != nil {
			s.suspect(suspectKey, suspect)
			out = append(out, prometheus.MustNewConstMetric(ctrRegionSuspect, prometheus.GaugeValue, 1, gl...))
			continue
		}
		s.believable(suspectKey)
		d := devs[l.UUID]
		g.used += d.Used
		out = append(out,
			prometheus.MustNewConstMetric(ctrRegionSuspect, prometheus.GaugeValue, 0, gl...),
			prometheus.MustNewConstMetric(ctrMemoryUsed, prometheus.GaugeValue, float64(d.Used), gl...),
			prometheus.MustNewConstMetric(ctrLaunches, prometheus.CounterValue, float64(launched[l.UUID]), gl...))
		// A version 1 region (a container started with an earlier
		// release's shim) has no peak or throttled time: left out, not 0.
		// The throttled time starts again at 0 when the shim makes the
		// region anew; Prometheus takes that for a counter reset, as it is.
		if usage.HasPeakAndThrottle() {
			out = append(out,
				prometheus.MustNewConstMetric(ctrMemoryPeak, prometheus.GaugeValue, float64(d.Peak), gl...),
				prometheus.MustNewConstMetric(ctrSMThrottled, prometheus.CounterValue, float64(d.ThrottledNs)/1e9, gl...))
		}
	}
	return out
}

// claimPods appends to out one nri_vgpu_claim_pod_info per pod of the
// claim record info. A pod named twice, or by two records of one claim
// name (a claim deleted and created again while the old record is still
// prepared), is exported once: the registry refuses a series collected
// twice.
func (s *scrape) claimPods(out []prometheus.Metric, info *hoststate.Info) []prometheus.Metric {
	for _, pod := range info.Claim.PodNames {
		if pod == "" {
			continue
		}
		k := [3]string{info.Claim.Namespace, info.Claim.Name, pod}
		if s.claimPodSeen[k] {
			continue
		}
		if s.claimPodSeen == nil {
			s.claimPodSeen = map[[3]string]bool{}
		}
		s.claimPodSeen[k] = true
		out = append(out, prometheus.MustNewConstMetric(claimPodInfo, prometheus.GaugeValue, 1, k[:]...))
	}
	return out
}

// percentToRatio turns a share in percent (limits files count in percent)
// into the ratio the metrics are in.
func percentToRatio(p uint64) float64 { return float64(p) / 100 }

// splitPod splits container.json's "namespace/name" pod field.
func splitPod(pod string) (namespace, name string) {
	if ns, n, ok := strings.Cut(pod, "/"); ok {
		return ns, n
	}
	return "", pod
}

// launchHistory is what a container's processes launched, as seen so far.
type launchHistory struct {
	// procs holds the last counts seen of each live process, per GPU UUID.
	procs map[procKey]map[string]uint64
	// exited sums, per GPU UUID, the last counts seen of processes that
	// have since left the region.
	exited map[string]uint64
}

// procKey names a process across PID reuse, and across the pid namespaces
// that share one region (the containers of a pod sharing a claim), where one
// pid and start tick can be two processes: the host pid tells them apart.
type procKey struct {
	pid     int32
	hostPID int32
	start   uint64
}

// learnedHostPID reports whether k, gone from now, is a process that has
// since learned its host pid (the shim finds it at the first context, and
// may write it to the region later): the same process under a new key.
func learnedHostPID(k procKey, was, now map[procKey]map[string]uint64) bool {
	if k.hostPID != 0 {
		return false
	}
	for n := range now {
		if n.pid == k.pid && n.start == k.start && n.hostPID != 0 {
			if _, seen := was[n]; !seen {
				return true
			}
		}
	}
	return false
}

// launchTotals returns the container's kernel launches per GPU UUID: the
// counters of its live processes plus the last counts seen of those that
// exited. The region only holds live processes (the shim frees a slot when
// its process exits), so a plain sum would fall at every exit and
// Prometheus would take each fall for a counter reset. Launches of a
// process that starts and exits between two scrapes are not seen.
func (c *Collector) launchTotals(id string, u *region.Usage) map[string]uint64 {
	h := c.launches[id]
	if h == nil {
		h = &launchHistory{procs: map[procKey]map[string]uint64{}, exited: map[string]uint64{}}
		c.launches[id] = h
	}
	now := make(map[procKey]map[string]uint64, len(u.Processes))
	for _, p := range u.Processes {
		counts := make(map[string]uint64, len(u.Devices))
		for i, d := range u.Devices {
			// A count no process can reach is forged: it is never exported
			// (region.Usage.Check flags it) and must not stay in the history.
			if i < len(p.Launches) && p.Launches[i] <= region.MaxPlausibleLaunches {
				counts[d.UUID] += p.Launches[i]
			}
		}
		now[procKey{p.PID, p.HostPID, p.StartTime}] = counts
	}
	for k, counts := range h.procs {
		if _, alive := now[k]; !alive && !learnedHostPID(k, h.procs, now) {
			for uuid, n := range counts {
				h.exited[uuid] += n
			}
		}
	}
	h.procs = now
	total := make(map[string]uint64, len(h.exited))
	for uuid, n := range h.exited {
		total[uuid] = n
	}
	for _, counts := range now {
		for uuid, n := range counts {
			total[uuid] += n
		}
	}
	return total
}
