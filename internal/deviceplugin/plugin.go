// Package deviceplugin is the kubelet device plugin of nri-vgpu (API
// v1beta1). It advertises every GPU as split_count slices (Contract 1),
// prefers slices by the configured policy, and answers Allocate with one
// signed allocation annotation per container and nothing else (Contract 2).
package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// Options configure a Plugin.
type Options struct {
	Config  *config.Config
	Backend gpu.Backend
	Logger  *slog.Logger // slog.Default() when nil

	// SysfsRoot is where the NUMA node of each GPU is read from
	// (bus/pci/devices/<bus id>/numa_node). Empty means /sys for the nvml
	// backend and no NUMA topology for the simulated one, whose bus IDs are
	// made up.
	SysfsRoot string

	// Now is the clock for allocation timestamps; time.Now when nil.
	Now func() time.Time
}

// Plugin serves one extended resource (device_plugin.resource_name) to
// kubelet. Create it with New and serve it with Run.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg    config.DevicePlugin
	dra    config.DRA // GPUs it serves are the DRA driver's: never advertised here
	policy string
	// coresPolicy is signed into every allocation: "burst", or "" for
	// hard (allocation.Allocation.CoresPolicy).
	coresPolicy string
	backend     gpu.Backend
	key         allocation.Key
	log         *slog.Logger
	now         func() time.Time
	sysfs       string
	dir         string // socket_dir, absolute
	socketName  string

	// registered is set while the kubelet of the current kubelet.sock has
	// accepted the registration and the plugin serves its socket (Ready).
	registered atomic.Bool

	metrics *collector

	mu      sync.Mutex
	inv     *inventory
	events  map[string]gpu.HealthEvent // the last health event per GPU UUID
	changed chan struct{}              // closed and replaced when inv's device list changes

	// The feature file (device_plugin.feature_file): kept while featuresOn,
	// featuresWritten is its content on disk, featuresErr the last write
	// error logged.
	featuresOn      bool
	featuresWritten []byte
	featuresErr     string
}

var _ pluginapi.DevicePluginServer = (*Plugin)(nil)

// SocketName is the name of the plugin's socket in socket_dir for a
// resource: "nri-vgpu-nvidia.com_gpu.sock" for nvidia.com/gpu. Each resource
// gets its own, so instances serving different resources do not collide.
func SocketName(resourceName string) string {
	return "nri-vgpu-" + strings.ReplaceAll(resourceName, "/", "_") + ".sock"
}

// New loads (or creates) the allocation key in state_dir, reads the GPU
// inventory from the backend and returns a plugin ready to Run.
func New(opts Options) (*Plugin, error) {
	if opts.Config == nil || opts.Backend == nil {
		return nil, errors.New("device plugin: Config and Backend are required")
	}
	cfg := opts.Config
	dir, err := filepath.Abs(cfg.DevicePlugin.SocketDir)
	if err != nil {
		return nil, fmt.Errorf("device plugin: socket_dir %q: %w", cfg.DevicePlugin.SocketDir, err)
	}
	p := &Plugin{
		cfg:        cfg.DevicePlugin,
		dra:        cfg.DRA,
		policy:     cmp.Or(cfg.DevicePlugin.AllocationPolicy, config.PolicyBinpack),
		backend:    opts.Backend,
		log:        cmp.Or(opts.Logger, slog.Default()),
		now:        opts.Now,
		sysfs:      opts.SysfsRoot,
		dir:        dir,
		socketName: SocketName(cfg.DevicePlugin.ResourceName),
		events:     make(map[string]gpu.HealthEvent),
		changed:    make(chan struct{}),
	}
	p.metrics = newCollector(p)
	if p.now == nil {
		p.now = time.Now
	}
	if p.sysfs == "" && opts.Backend.Name() == config.BackendNVML {
		p.sysfs = "/sys"
	}
	if err := limits.CheckSplit(p.cfg.SplitCount, p.cfg.MemoryScaling, p.cfg.CoresScaling); err != nil {
		return nil, fmt.Errorf("device plugin: %w", err)
	}
	for _, m := range p.cfg.Models {
		if err := limits.CheckSplit(m.SplitCount, p.cfg.MemoryScaling, p.cfg.CoresScaling); err != nil {
			return nil, fmt.Errorf("device plugin: model %q: %w", m.Name, err)
		}
	}
	if p.policy != config.PolicyBinpack && p.policy != config.PolicySpread {
		return nil, fmt.Errorf("device plugin: unknown allocation_policy %q (want %q or %q)",
			p.policy, config.PolicyBinpack, config.PolicySpread)
	}
	switch cfg.Limits.CoresPolicy {
	case limits.CoresPolicyBurst:
		p.coresPolicy = limits.CoresPolicyBurst
	case limits.CoresPolicyHard, "":
	default:
		return nil, fmt.Errorf("device plugin: unknown limits.cores_policy %q (want %q or %q)",
			cfg.Limits.CoresPolicy, limits.CoresPolicyHard, limits.CoresPolicyBurst)
	}
	key, err := allockey.LoadOrCreate(cfg.Paths.StateDir)
	if err != nil {
		return nil, fmt.Errorf("device plugin: allocation key in %s: %w", cfg.Paths.StateDir, err)
	}
	p.key = key
	if err := p.Refresh(); err != nil {
		return nil, err
	}
	return p, nil
}

// SocketPath is the plugin's own socket.
func (p *Plugin) SocketPath() string { return filepath.Join(p.dir, p.socketName) }

// Refresh reads the GPU list from the backend again (after a configuration
// reload of the simulated backend, say) and sends the new device list on
// every ListAndWatch stream if it changed.
func (p *Plugin) Refresh() error {
	// The GPUs are read under p.mu (here and in applyHealth), so that of a
	// reload and a health event racing, the one that reads the backend
	// last also installs its list last: an older list never replaces a
	// newer one.
	p.mu.Lock()
	defer p.mu.Unlock()
	devs, err := p.backend.Devices()
	if err != nil {
		return fmt.Errorf("device plugin: list GPUs from the %s backend: %w", p.backend.Name(), err)
	}
	if len(devs) == 0 {
		p.log.Warn("the GPU backend lists no GPUs; advertising no devices", "backend", p.backend.Name())
	}
	p.setInventory(p.buildInventory(devs))
	return nil
}

// applyHealth records a health event's reason and re-reads the inventory,
// which carries the new health.
func (p *Plugin) applyHealth(ev gpu.HealthEvent) {
	level := slog.LevelInfo
	if !ev.Healthy {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
	p.mu.Lock()
	defer p.mu.Unlock()
	devs, err := p.backend.Devices() // under p.mu: see Refresh
	// A transition is an event whose health differs from the GPU's last
	// event (or, before any, from its health when listed): a repeated
	// event (the backend reporting a failing GPU again) is none.
	if i, ok := p.inv.byUUID[ev.UUID]; ok {
		g := p.inv.gpus[i]
		was := g.Healthy
		if last, ok := p.events[ev.UUID]; ok {
			was = last.Healthy
		}
		if was != ev.Healthy {
			p.metrics.healthChanges.WithLabelValues(g.UUID, strconv.Itoa(g.Index), g.Name).Inc()
		}
	}
	p.events[ev.UUID] = ev
	if err != nil {
		// Keep the GPU list we have and apply the event to it.
		p.log.Error("listing GPUs after a health event failed; applying the event to the previous list", "err", err)
		devs = make([]gpu.Device, len(p.inv.gpus))
		for i, g := range p.inv.gpus {
			devs[i] = g.Device
			if g.UUID == ev.UUID {
				devs[i].Healthy = ev.Healthy
			}
		}
	}
	p.setInventory(p.buildInventory(devs))
}

// setInventory installs inv and wakes ListAndWatch streams if the device
// list changed. p.mu must be held.
func (p *Plugin) setInventory(inv *inventory) {
	old := p.inv
	p.inv = inv
	p.writeFeatures(inv)
	if old != nil && sameDevices(old.devices, inv.devices) {
		return
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Plugin) snapshot() (*inventory, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inv, p.changed
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; kubelet does not
// call it, since the options say it is not required.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: it sends every slice
// of every GPU now and again whenever a GPU's health (or the GPU list)
// changes, until kubelet goes away or the server stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		inv, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: inv.devices}); err != nil {
			return fmt.Errorf("send device list: %w", err)
		}
		p.log.Debug("sent device list", "devices", len(inv.devices), "healthy_slices", inv.healthySlices)
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer with the
// configured policy; see Choose for what binpack and spread mean.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	inv, _ := p.snapshot()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, creq := range req.ContainerRequests {
		ids, err := p.prefer(inv, creq)
		if err != nil {
			p.metrics.refusals.WithLabelValues(p.cfg.ResourceName, refusalReason(err)).Inc()
			p.log.Warn("preferred allocation failed", "err", err)
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *Plugin) prefer(inv *inventory, req *pluginapi.ContainerPreferredAllocationRequest) ([]string, error) {
	size := int(req.AllocationSize)
	if size > inv.healthySlices {
		return nil, refuse(ReasonExhausted, status.Error(codes.ResourceExhausted, p.overAsked(inv, size)))
	}

	// Must-include slices are kept whatever their state: kubelet has given
	// them to this pod already.
	var must []string
	mustSet := make(map[string]bool, len(req.MustIncludeDeviceIDs))
	cands := make([]Candidate, len(inv.gpus))
	for i, g := range inv.gpus {
		cands[i].Index = g.Index
	}
	for _, id := range req.MustIncludeDeviceIDs {
		if mustSet[id] {
			continue
		}
		mustSet[id] = true
		must = append(must, id)
		if i, _, err := inv.lookup(id); err == nil {
			cands[i].Held++
		}
	}
	if len(must) >= size {
		return must, nil
	}

	type slot struct {
		slice int
		id    string
	}
	free := make([][]slot, len(inv.gpus))
	seen := make(map[string]bool, len(req.AvailableDeviceIDs))
	for _, id := range req.AvailableDeviceIDs {
		if mustSet[id] || seen[id] {
			continue
		}
		seen[id] = true
		i, slice, err := inv.lookup(id)
		if err != nil {
			p.log.Debug("ignoring an offered device that is not ours", "id", id, "err", err)
			continue
		}
		if !inv.gpus[i].Healthy {
			continue
		}
		free[i] = append(free[i], slot{slice, id})
	}
	for i := range free {
		slices.SortFunc(free[i], func(a, b slot) int { return cmp.Compare(a.slice, b.slice) })
		for _, s := range free[i] {
			cands[i].Free = append(cands[i].Free, s.id)
		}
	}

	chosen, err := Choose(p.policy, cands, size-len(must))
	if err != nil {
		return nil, refuse(ReasonExhausted, status.Errorf(codes.ResourceExhausted, "%s: preferred allocation of %d slices (%d must-include): %v",
			p.cfg.ResourceName, size, len(must), err))
	}
	return append(must, chosen...), nil
}

// overAsked is the error for a container that asks for more slices than
// the node has healthy.
func (p *Plugin) overAsked(inv *inventory, asked int) string {
	return fmt.Sprintf("%s: the container asks for %d slices, but this node has only %d healthy (%s)",
		p.cfg.ResourceName, asked, inv.healthySlices, inv.describe())
}

// Allocate implements pluginapi.DevicePluginServer. For each container it
// returns exactly one annotation, the signed allocation (Contract 2): the
// GPUs its slices lie on and the quota those slices are worth there.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp, err := p.allocate(req)
	if err != nil {
		p.metrics.refusals.WithLabelValues(p.cfg.ResourceName, refusalReason(err)).Inc()
		return nil, err
	}
	p.metrics.allocations.WithLabelValues(p.cfg.ResourceName).Inc()
	return resp, nil
}

func (p *Plugin) allocate(req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	inv, _ := p.snapshot()
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		a, err := p.allocation(inv, creq.DevicesIds)
		if err != nil {
			p.log.Warn("allocation refused", "devices", creq.DevicesIds, "err", err)
			return nil, err
		}
		value, err := allocation.Sign(p.key, a)
		if err != nil {
			return nil, refuse(ReasonInternal, status.Errorf(codes.Internal, "%s: sign allocation: %v", p.cfg.ResourceName, err))
		}
		gpus := make([]string, len(a.GPUs))
		for i, g := range a.GPUs {
			gpus[i] = fmt.Sprintf("%s: %d slices, %s, %d%% SM", g.UUID, g.Slices, quantity.FormatBytes(g.Memory), g.Cores)
		}
		p.log.Info("allocated", "id", a.ID, "gpus", gpus, "cores_policy", cmp.Or(a.CoresPolicy, limits.CoresPolicyHard))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Annotations: map[string]string{allocation.AnnotationKey: value},
			// The gate: the runtime refuses this mount unless nri-vgpu
			// removed it, so the container never starts without its limits.
			Mounts: []*pluginapi.Mount{{ContainerPath: allocation.GateContainerPath, HostPath: allocation.GateHostPath, ReadOnly: true}},
		})
	}
	return resp, nil
}

func (p *Plugin) allocation(inv *inventory, ids []string) (*allocation.Allocation, error) {
	if len(ids) == 0 {
		return nil, refuse(ReasonNoDevices, status.Errorf(codes.InvalidArgument, "%s: allocate request names no devices", p.cfg.ResourceName))
	}
	if len(ids) > inv.healthySlices {
		return nil, refuse(ReasonExhausted, status.Error(codes.ResourceExhausted, p.overAsked(inv, len(ids))))
	}
	perGPU := make(map[int]int)
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return nil, refuse(ReasonDuplicateDevice, status.Errorf(codes.InvalidArgument, "%s: device %q is requested twice", p.cfg.ResourceName, id))
		}
		seen[id] = true
		i, _, err := inv.lookup(id)
		if err != nil {
			return nil, refuse(lookupReason(err), status.Errorf(codes.InvalidArgument, "%s: %v", p.cfg.ResourceName, err))
		}
		if g := inv.gpus[i]; !g.Healthy {
			return nil, refuse(ReasonUnhealthyGPU, status.Errorf(codes.FailedPrecondition, "%s: device %q is on GPU %d (%s, %s), which is unhealthy: %s",
				p.cfg.ResourceName, id, g.Index, g.UUID, g.Name, cmp.Or(g.Reason, "no reason given")))
		}
		perGPU[i]++
	}

	id, err := allocation.NewID()
	if err != nil {
		return nil, refuse(ReasonInternal, status.Errorf(codes.Internal, "%s: allocation id: %v", p.cfg.ResourceName, err))
	}
	a := &allocation.Allocation{V: allocation.Version, ID: id, Issued: p.now().Unix(), CoresPolicy: p.coresPolicy}
	for i, n := range perGPU {
		g := inv.gpus[i]
		// n <= g.Split: the IDs are distinct and each names a slice below
		// g.Split (lookup checks), so no GPU can be over-committed here.
		q, err := limits.CheckedQuota(g.Memory, g.Split, n, p.cfg.MemoryScaling, p.cfg.CoresScaling)
		if err != nil {
			return nil, refuse(ReasonInternal, status.Errorf(codes.Internal, "%s: quota on GPU %s: %v", p.cfg.ResourceName, g.UUID, err))
		}
		a.GPUs = append(a.GPUs, allocation.GPU{
			UUID: g.UUID, Minor: g.Minor, Slices: n, Memory: q.Memory, Cores: q.Cores,
		})
	}
	slices.SortFunc(a.GPUs, func(x, y allocation.GPU) int { return cmp.Compare(x.UUID, y.UUID) })
	return a, nil
}

// newServer is the gRPC server for one run of the plugin's socket.
func (p *Plugin) newServer() *grpc.Server {
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	return srv
}
