package deviceplugin

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// gpuState is one GPU as the plugin advertises it.
type gpuState struct {
	gpu.Device
	Split   int    // slices this GPU is split into (per-model override applied)
	Reason  string // why it is unhealthy, from the last health event
	NUMA    int    // NUMA node, -1 when unknown
	Healthy bool   // after health events
}

// inventory is an immutable snapshot of the node's GPUs; a new one replaces
// it on every change, so readers need no lock once they hold it.
type inventory struct {
	gpus          []gpuState // by GPU index
	byUUID        map[string]int
	devices       []*pluginapi.Device // the ListAndWatch list
	healthySlices int
	healthyGPUs   int
}

// buildInventory applies the split counts and the NUMA nodes. Health is the
// backend's (Devices reflects every event it has sent); the last event only
// supplies the reason. p.mu must be held.
func (p *Plugin) buildInventory(devs []gpu.Device) *inventory {
	devs = slices.Clone(devs)
	slices.SortStableFunc(devs, func(a, b gpu.Device) int { return cmp.Compare(a.Index, b.Index) })
	inv := &inventory{byUUID: make(map[string]int, len(devs))}
	for _, d := range devs {
		if p.dra.Serves(d.UUID) {
			continue // the DRA driver's (Contract 8)
		}
		if _, dup := inv.byUUID[d.UUID]; dup {
			p.log.Error("the GPU backend lists a UUID twice; advertising it once", "uuid", d.UUID, "index", d.Index)
			continue
		}
		g := gpuState{Device: d, Split: p.cfg.SplitCountFor(d.Name), NUMA: -1, Healthy: d.Healthy}
		if !d.Healthy {
			g.Reason = "reported unhealthy by the " + p.backend.Name() + " backend"
			if ev, ok := p.events[d.UUID]; ok && !ev.Healthy {
				g.Reason = ev.Reason
			}
		}
		if p.sysfs != "" {
			if n, ok := numaNode(p.sysfs, d.PCIBusID); ok {
				g.NUMA = n
			}
		}
		inv.byUUID[d.UUID] = len(inv.gpus)
		inv.gpus = append(inv.gpus, g)
		// Present at 0 from the GPU's first appearance.
		p.metrics.healthChanges.WithLabelValues(g.UUID, strconv.Itoa(g.Index), g.Name)

		health := pluginapi.Unhealthy
		if g.Healthy {
			health = pluginapi.Healthy
			inv.healthyGPUs++
			inv.healthySlices += g.Split
		}
		var topo *pluginapi.TopologyInfo
		if g.NUMA >= 0 {
			topo = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMA)}}}
		}
		for i := range g.Split {
			inv.devices = append(inv.devices, &pluginapi.Device{
				ID: limits.DeviceID(g.UUID, i), Health: health, Topology: topo,
			})
		}
	}
	return inv
}

// lookup resolves a device ID to the position of its GPU in inv.gpus and
// the slice number, with an error naming what is wrong with it.
func (inv *inventory) lookup(id string) (int, int, error) {
	uuid, slice, err := limits.ParseDeviceID(id)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", errMalformedDevice, err)
	}
	i, ok := inv.byUUID[uuid]
	if !ok {
		return 0, 0, fmt.Errorf("%w: device %q names GPU %s, which this node does not have (%s)", errUnknownGPU, id, uuid, inv.describe())
	}
	if g := inv.gpus[i]; slice < 0 || slice >= g.Split {
		return 0, 0, fmt.Errorf("%w: device %q names slice %d of GPU %s, which has slices 0..%d", errUnknownSlice, id, slice, uuid, g.Split-1)
	}
	return i, slice, nil
}

// describe summarises the node for error messages, e.g.
// "2 of 3 GPUs healthy: GPU 0 (NVIDIA A100, 10 slices), GPU 1 (…, unhealthy)".
func (inv *inventory) describe() string {
	if len(inv.gpus) == 0 {
		return "no GPUs"
	}
	s := fmt.Sprintf("%d of %d GPUs healthy:", inv.healthyGPUs, len(inv.gpus))
	for i, g := range inv.gpus {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" GPU %d (%s, %d slice", g.Index, cmp.Or(g.Name, g.UUID), g.Split)
		if g.Split != 1 {
			s += "s"
		}
		if !g.Healthy {
			s += ", unhealthy"
		}
		s += ")"
	}
	return s
}

func sameDevices(a, b []*pluginapi.Device) bool {
	return slices.EqualFunc(a, b, func(x, y *pluginapi.Device) bool {
		return x.ID == y.ID && x.Health == y.Health && numaOf(x) == numaOf(y)
	})
}

func numaOf(d *pluginapi.Device) int64 {
	if d.Topology == nil || len(d.Topology.Nodes) == 0 {
		return -1
	}
	return d.Topology.Nodes[0].ID
}
