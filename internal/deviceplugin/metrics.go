package deviceplugin

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/refusal"
)

// The reasons of nri_vgpu_device_plugin_allocation_refusals_total: a
// fixed set (docs/metrics.md), so that the label never carries the
// request's own text.
const (
	// ReasonNoDevices: the request names no device.
	ReasonNoDevices = "no_devices"
	// ReasonExhausted: more slices asked for than the node has healthy, or
	// (GetPreferredAllocation) than are free and healthy among those
	// offered.
	ReasonExhausted = "exhausted"
	// ReasonDuplicateDevice: one device ID named twice.
	ReasonDuplicateDevice = "duplicate_device"
	// ReasonMalformedDevice: a device ID that is not <UUID>::<slice>.
	ReasonMalformedDevice = "malformed_device"
	// ReasonUnknownGPU: a device ID naming a GPU this plugin does not
	// advertise.
	ReasonUnknownGPU = "unknown_gpu"
	// ReasonUnknownSlice: a device ID naming a slice its GPU does not have.
	ReasonUnknownSlice = "unknown_slice"
	// ReasonUnhealthyGPU: a device on a GPU that is unhealthy now.
	ReasonUnhealthyGPU = "unhealthy_gpu"
	// ReasonInternal: the plugin failed (allocation ID, quota, signature).
	ReasonInternal = "internal"
)

// RefusalReasons is every reason, in the order the documentation lists them.
var RefusalReasons = []string{
	ReasonNoDevices, ReasonExhausted, ReasonDuplicateDevice, ReasonMalformedDevice,
	ReasonUnknownGPU, ReasonUnknownSlice, ReasonUnhealthyGPU, ReasonInternal,
}

// The errors lookup wraps, telling its refusal reasons apart.
var (
	errMalformedDevice = errors.New("malformed device ID")
	errUnknownGPU      = errors.New("unknown GPU")
	errUnknownSlice    = errors.New("unknown slice")
)

// refuse returns err refused for reason, which the refusal counter counts.
func refuse(reason string, err error) error { return refusal.New(reason, err) }

// lookupReason is the refusal reason of an error of inventory.lookup.
func lookupReason(err error) string {
	switch {
	case errors.Is(err, errMalformedDevice):
		return ReasonMalformedDevice
	case errors.Is(err, errUnknownSlice):
		return ReasonUnknownSlice
	default:
		return ReasonUnknownGPU
	}
}

// refusalReason is err's reason; an error that carries none is the
// plugin's own failure.
func refusalReason(err error) string { return refusal.Reason(err, ReasonInternal) }

var gpuLabels = []string{"UUID", "gpu", "name"}

var (
	descRegistered = prometheus.NewDesc("nri_vgpu_device_plugin_registered",
		"1 while the device plugin is registered with the kubelet that listens on kubelet.sock now and serves its socket, else 0.",
		[]string{"resource"}, nil)
	descDevices = prometheus.NewDesc("nri_vgpu_device_plugin_devices",
		"Slices the device plugin advertises to the kubelet, by health.",
		[]string{"resource", "health"}, nil)
	descGPUHealthy = prometheus.NewDesc("nri_vgpu_device_plugin_gpu_healthy",
		"1 while the GPU's slices are advertised healthy, 0 while unhealthy; GPUs served through DRA are left out.",
		gpuLabels, nil)
)

// collector is the plugin's prometheus.Collector. Gauges are read from the
// plugin's state at each scrape (the inventory and the registration flag,
// which the plugin keeps anyway); counters count events where they happen.
type collector struct {
	p *Plugin

	registrations *prometheus.CounterVec
	allocations   *prometheus.CounterVec
	refusals      *prometheus.CounterVec
	healthChanges *prometheus.CounterVec
}

func newCollector(p *Plugin) *collector {
	c := &collector{
		p: p,
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_device_plugin_registrations_total",
			Help: "Successful registrations with the kubelet, including those after a kubelet restart.",
		}, []string{"resource"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_device_plugin_allocations_total",
			Help: "Allocate calls the device plugin answered with an allocation.",
		}, []string{"resource"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_device_plugin_allocation_refusals_total",
			Help: "Allocate and GetPreferredAllocation calls the device plugin refused, by reason (a fixed set, see docs/metrics.md).",
		}, []string{"resource", "reason"}),
		healthChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nri_vgpu_device_plugin_health_changes_total",
			Help: "Health transitions of the GPU (healthy to unhealthy or back) the device plugin received from the GPU backend.",
		}, gpuLabels),
	}
	// Present at 0 from the start, so that rate() and alerts see them.
	res := p.cfg.ResourceName
	c.registrations.WithLabelValues(res)
	c.allocations.WithLabelValues(res)
	for _, r := range RefusalReasons {
		c.refusals.WithLabelValues(res, r)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRegistered
	ch <- descDevices
	ch <- descGPUHealthy
	c.registrations.Describe(ch)
	c.allocations.Describe(ch)
	c.refusals.Describe(ch)
	c.healthChanges.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	res := c.p.cfg.ResourceName
	registered := 0.0
	if c.p.registered.Load() {
		registered = 1
	}
	ch <- prometheus.MustNewConstMetric(descRegistered, prometheus.GaugeValue, registered, res)
	inv, _ := c.p.snapshot()
	var healthy, unhealthy int
	for _, d := range inv.devices {
		if d.Health == pluginapi.Healthy {
			healthy++
		} else {
			unhealthy++
		}
	}
	ch <- prometheus.MustNewConstMetric(descDevices, prometheus.GaugeValue, float64(healthy), res, "healthy")
	ch <- prometheus.MustNewConstMetric(descDevices, prometheus.GaugeValue, float64(unhealthy), res, "unhealthy")
	for _, g := range inv.gpus {
		v := 0.0
		if g.Healthy {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descGPUHealthy, prometheus.GaugeValue, v, g.UUID, strconv.Itoa(g.Index), g.Name)
	}
	c.registrations.Collect(ch)
	c.allocations.Collect(ch)
	c.refusals.Collect(ch)
	c.healthChanges.Collect(ch)
}

// Collector is the plugin's metrics (docs/metrics.md), to register with a
// prometheus.Registry.
func (p *Plugin) Collector() prometheus.Collector { return p.metrics }
