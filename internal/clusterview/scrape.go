package clusterview

import (
	"bytes"
	"fmt"
	"math"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The series read from a node's endpoint (docs/metrics.md).
const (
	mGPUMemoryTotal      = "nri_vgpu_gpu_memory_total_bytes"
	mGPUMemoryAllocated  = "nri_vgpu_gpu_memory_allocated_bytes"
	mGPUMemoryUsed       = "nri_vgpu_gpu_memory_used_bytes"
	mGPUSMAllocated      = "nri_vgpu_gpu_sm_allocated_ratio"
	mGPUSMUtilization    = "nri_vgpu_gpu_sm_utilization_ratio"
	mCtrMemoryLimit      = "nri_vgpu_container_memory_limit_bytes"
	mCtrMemoryUsed       = "nri_vgpu_container_memory_used_bytes"
	mCtrMemoryPeak       = "nri_vgpu_container_memory_peak_bytes"
	mCtrSMLimit          = "nri_vgpu_container_sm_limit_ratio"
	mCtrSMUtilization    = "nri_vgpu_container_sm_utilization_ratio"
	mCtrSMShareUtil      = "nri_vgpu_container_sm_share_utilization_ratio"
	mCtrSMThrottled      = "nri_vgpu_container_sm_throttled_seconds_total"
	mCtrKernelLaunches   = "nri_vgpu_container_kernel_launches_total"
	mCtrRegionSuspect    = "nri_vgpu_container_region_suspect"
	mCtrProcesses        = "nri_vgpu_container_processes"
	mClaimPodInfo        = "nri_vgpu_claim_pod_info"
	mOldGPUCoresAlloc    = "nri_vgpu_gpu_cores_allocated_percent"   // before sm_allocated_ratio
	mOldCtrCoresLimitPct = "nri_vgpu_container_cores_limit_percent" // before sm_limit_ratio
)

// claimRecordPrefix starts the container_id of a DRA claim's record
// (hoststate.ClaimIDPrefix).
const claimRecordPrefix = "claim-"

// nodeMetrics is what one node's endpoint says.
type nodeMetrics struct {
	gpus    map[string]*gpuSeries // by UUID
	records map[recordKey]*recordSeries
	// processes by container_id (the series has no UUID).
	processes map[string]uint64
	// claimPods: "namespace/claim" -> pods, from nri_vgpu_claim_pod_info.
	claimPods map[string][]string
}

type gpuSeries struct {
	index, name                string
	total, allocated, used     *uint64
	smAllocated, smUtilization *float64
}

type recordKey struct{ containerID, uuid string }

// recordSeries is one container's (or claim record's) series on one GPU.
type recordSeries struct {
	namespace, pod, container, claim string
	usage                            Usage
}

// parseMetrics reads the Prometheus text format of a node's endpoint.
func parseMetrics(text []byte) (*nodeMetrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("not the Prometheus text format: %w", err)
	}
	m := &nodeMetrics{
		gpus:      map[string]*gpuSeries{},
		records:   map[recordKey]*recordSeries{},
		processes: map[string]uint64{},
		claimPods: map[string][]string{},
	}
	// Every series is read into what it says, whichever family it is in.
	for name, f := range families {
		for _, s := range f.GetMetric() {
			v, ok := value(f, s)
			if !ok {
				continue
			}
			l := labelsOf(s)
			switch name {
			case mGPUMemoryTotal:
				m.gpu(l).total = bytesOf(v)
			case mGPUMemoryAllocated:
				m.gpu(l).allocated = bytesOf(v)
			case mGPUMemoryUsed:
				m.gpu(l).used = bytesOf(v)
			case mGPUSMAllocated:
				m.gpu(l).smAllocated = &v
			case mOldGPUCoresAlloc:
				if g := m.gpu(l); g.smAllocated == nil {
					r := v / 100
					g.smAllocated = &r
				}
			case mGPUSMUtilization:
				m.gpu(l).smUtilization = &v
			case mCtrMemoryLimit:
				m.record(l).usage.MemoryLimitBytes = bytesOf(v)
			case mCtrMemoryUsed:
				m.record(l).usage.MemoryUsedBytes = bytesOf(v)
			case mCtrMemoryPeak:
				m.record(l).usage.MemoryPeakBytes = bytesOf(v)
			case mCtrSMLimit:
				m.record(l).usage.SMLimitRatio = &v
			case mOldCtrCoresLimitPct:
				if r := m.record(l); r.usage.SMLimitRatio == nil {
					ratio := v / 100
					r.usage.SMLimitRatio = &ratio
				}
			case mCtrSMUtilization:
				m.record(l).usage.SMUtilizationRatio = &v
			case mCtrSMShareUtil:
				m.record(l).usage.SMShareUtilizationRatio = &v
			case mCtrSMThrottled:
				m.record(l).usage.SMThrottledSeconds = &v
			case mCtrKernelLaunches:
				m.record(l).usage.KernelLaunches = bytesOf(v)
			case mCtrRegionSuspect:
				b := v != 0
				m.record(l).usage.Suspect = &b
			case mCtrProcesses:
				if n := bytesOf(v); n != nil {
					m.processes[l["container_id"]] = *n
				}
			case mClaimPodInfo:
				if v == 1 {
					k := l["namespace"] + "/" + l["claim"]
					m.claimPods[k] = append(m.claimPods[k], l["pod"])
				}
			}
		}
	}
	return m, nil
}

func (m *nodeMetrics) gpu(l map[string]string) *gpuSeries {
	g := m.gpus[l["UUID"]]
	if g == nil {
		g = &gpuSeries{}
		m.gpus[l["UUID"]] = g
	}
	// The labels are the same on every GPU series; a series without them
	// (a GPU missing from the node's inventory) must not blank them.
	if l["gpu"] != "" {
		g.index = l["gpu"]
	}
	if l["name"] != "" {
		g.name = l["name"]
	}
	return g
}

func (m *nodeMetrics) record(l map[string]string) *recordSeries {
	k := recordKey{l["container_id"], l["UUID"]}
	r := m.records[k]
	if r == nil {
		r = &recordSeries{namespace: l["namespace"], pod: l["pod"], container: l["container"], claim: l["claim"]}
		m.records[k] = r
	}
	return r
}

// isClaim tells a DRA claim's record from a container's: its claim label
// (the metric contract), or its container_id.
func (r *recordSeries) isClaim(containerID string) bool {
	return r.claim != "" || strings.HasPrefix(containerID, claimRecordPrefix)
}

// claimName is the claim's name: its claim label, else what releases before
// that label wrote in container ("claim <name>").
func (r *recordSeries) claimName() string {
	if r.claim != "" {
		return r.claim
	}
	return strings.TrimPrefix(r.container, "claim ")
}

func labelsOf(s *dto.Metric) map[string]string {
	out := make(map[string]string, len(s.GetLabel()))
	for _, l := range s.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// value is the sample of a gauge, counter or untyped series; false for other
// types and for NaN.
func value(f *dto.MetricFamily, s *dto.Metric) (float64, bool) {
	var v float64
	switch f.GetType() {
	case dto.MetricType_GAUGE:
		v = s.GetGauge().GetValue()
	case dto.MetricType_COUNTER:
		v = s.GetCounter().GetValue()
	case dto.MetricType_UNTYPED:
		v = s.GetUntyped().GetValue()
	default:
		return 0, false
	}
	return v, !math.IsNaN(v)
}

// bytesOf is v as a count; nil when it is negative, infinite or beyond
// 2^64 (no count the node writes is).
func bytesOf(v float64) *uint64 {
	if v < 0 || math.IsInf(v, 0) || v >= 1<<64 {
		return nil
	}
	n := uint64(v)
	return &n
}
