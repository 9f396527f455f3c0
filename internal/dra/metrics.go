package dra

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nri-vgpu/nri-vgpu/internal/refusal"
)

// The reasons of nri_vgpu_dra_prepare_refusals_total: a fixed set
// (docs/metrics.md), so that the label never carries a claim's own text.
const (
	// ReasonInvalidUID: the claim's UID is not a UUID.
	ReasonInvalidUID = "invalid_uid"
	// ReasonNotAllocated: the claim has no allocation.
	ReasonNotAllocated = "not_allocated"
	// ReasonForeignPool: a device of this driver in another node's pool.
	ReasonForeignPool = "foreign_pool"
	// ReasonAdminAccess: a request with admin access, which would bypass
	// the quotas.
	ReasonAdminAccess = "admin_access"
	// ReasonUnknownDevice: a device this node does not serve through DRA
	// (never was, or is unhealthy now).
	ReasonUnknownDevice = "unknown_device"
	// ReasonInvalidCapacity: a consumed capacity that is not positive.
	ReasonInvalidCapacity = "invalid_capacity"
	// ReasonNoDevice: the claim holds no device of this driver.
	ReasonNoDevice = "no_device"
	// ReasonTooManyGPUs: more GPUs than a limits file holds.
	ReasonTooManyGPUs = "too_many_gpus"
	// ReasonAllocationChanged: the claim was prepared with other GPUs or
	// shares than it is allocated now.
	ReasonAllocationChanged = "allocation_changed"
	// ReasonOverCapacity: the claim would take a GPU past its capacity
	// together with the claims prepared on the node.
	ReasonOverCapacity = "over_capacity"
	// ReasonStateConflict: the claim's host state directory holds
	// something else.
	ReasonStateConflict = "state_conflict"
	// ReasonUnaccountedClaim: the capacity check met a claim directory it
	// cannot account for, and fails closed.
	ReasonUnaccountedClaim = "unaccounted_claim"
	// ReasonHostState: reading or writing host state or the CDI spec failed.
	ReasonHostState = "host_state"
	// ReasonInventory: the node's GPUs could not be listed.
	ReasonInventory = "inventory"
	// ReasonInternal: an error none of the others names (not expected).
	ReasonInternal = "internal"
)

// RefusalReasons is every reason, in the order the documentation lists them.
var RefusalReasons = []string{
	ReasonInvalidUID, ReasonNotAllocated, ReasonForeignPool, ReasonAdminAccess, ReasonUnknownDevice,
	ReasonInvalidCapacity, ReasonNoDevice, ReasonTooManyGPUs, ReasonAllocationChanged, ReasonOverCapacity,
	ReasonStateConflict, ReasonUnaccountedClaim, ReasonHostState, ReasonInventory, ReasonInternal,
}

// refuse returns err refused for reason, which the refusal counter counts.
func refuse(reason string, err error) error { return refusal.New(reason, err) }

func refusalReason(err error) string { return refusal.Reason(err, ReasonInternal) }

var gpuLabels = []string{"UUID", "gpu", "name"}

var (
	descRegistered = prometheus.NewDesc("nri_vgpu_dra_registered",
		"1 while the kubelet has registered the DRA driver, else 0.", nil, nil)
	descGPUHealthy = prometheus.NewDesc("nri_vgpu_dra_gpu_healthy",
		"1 while the GPU served through DRA is healthy, 0 while unhealthy (published in the ResourceSlice with the taint nri-vgpu.io/unhealthy).",
		gpuLabels, nil)
)

// collector is the driver's prometheus.Collector: the registration and
// the GPUs' health are read at each scrape from the kubelet plugin helper
// and the inventory, counters count events where they happen.
type collector struct {
	d *Driver

	prepares      prometheus.Counter
	unprepares    prometheus.Counter
	refusals      *prometheus.CounterVec
	healthChanges *prometheus.CounterVec
	publications  prometheus.Counter
}

func newCollector(d *Driver) *collector {
	c := &collector{
		d: d,
		prepares: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nri_vgpu_dra_prepares_total",
			Help: "Claims the DRA driver prepared (a claim prepared again, for another pod or after a kubelet restart, counts again).",
		}),
		unprepares: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nri_vgpu_dra_unprepares_total",
			Help: "Claims the DRA driver unprepared (a claim it never prepared counts too: nothing is left of it).",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_dra_prepare_refusals_total",
			Help: "Claims the DRA driver refused to prepare, by reason (a fixed set, see docs/metrics.md).",
		}, []string{"reason"}),
		healthChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_dra_health_changes_total",
			Help: "Health transitions of the GPU served through DRA (healthy to unhealthy or back) the DRA driver received from the GPU backend.",
		}, gpuLabels),
		publications: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nri_vgpu_dra_resourceslice_publications_total",
			Help: "ResourceSlice contents the DRA driver handed to its slice controller, which writes them to the API server when they differ from what it holds.",
		}),
	}
	// Present at 0 from the start, so that rate() and alerts see them.
	for _, r := range RefusalReasons {
		c.refusals.WithLabelValues(r)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRegistered
	ch <- descGPUHealthy
	c.prepares.Describe(ch)
	c.unprepares.Describe(ch)
	c.refusals.Describe(ch)
	c.healthChanges.Describe(ch)
	c.publications.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	registered := 0.0
	if c.d.Ready() == nil {
		registered = 1
	}
	ch <- prometheus.MustNewConstMetric(descRegistered, prometheus.GaugeValue, registered)
	// A failing inventory leaves the GPUs out of this scrape; the driver
	// logs the failure where it matters, at publication and preparation.
	if devs, err := c.d.inv.Devices(); err == nil {
		for _, g := range devs {
			if !c.d.cfg.DRA.Serves(g.UUID) {
				continue
			}
			v := 0.0
			if g.Healthy {
				v = 1
			}
			labels := []string{g.UUID, strconv.Itoa(g.Index), g.Name}
			ch <- prometheus.MustNewConstMetric(descGPUHealthy, prometheus.GaugeValue, v, labels...)
			c.healthChanges.WithLabelValues(labels...) // at 0 until its first transition
		}
	}
	c.prepares.Collect(ch)
	c.unprepares.Collect(ch)
	c.refusals.Collect(ch)
	c.healthChanges.Collect(ch)
	c.publications.Collect(ch)
}

// Collector is the driver's metrics (docs/metrics.md), to register with a
// prometheus.Registry.
func (d *Driver) Collector() prometheus.Collector { return d.metrics }

// Ready reports nil while the kubelet has registered the driver, else why
// not. It answers the readiness probe.
func (d *Driver) Ready() error {
	h := d.helper.Load()
	if h == nil {
		return errors.New("the kubelet plugin is not started")
	}
	st := h.RegistrationStatus()
	switch {
	case st == nil:
		return errors.New("the kubelet has not registered the driver yet")
	case !st.PluginRegistered:
		return fmt.Errorf("the kubelet refused the registration: %s", st.Error)
	}
	return nil
}
