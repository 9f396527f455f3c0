// Package nriplugin is the NRI plugin of nri-vgpu: at container creation it
// verifies the signed allocation (Contract 2) and returns the edits of
// Contract 3; containers without an allocation are stripped of GPU access.
package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// Source is the ContainerInfo.Source of the containers this plugin prepares;
// Synchronize sweeps only directories of that source, so that the runtime
// wrapper's (Docker) containers sharing run_dir are left alone.
const Source = "nri"

// Inventory lists the node's GPUs; gpu.Backend satisfies it.
type Inventory interface {
	Devices() ([]gpu.Device, error)
}

// Options configure a Plugin.
type Options struct {
	Config    *config.Config
	Key       limits.Key
	Host      oci.Host
	Inventory Inventory
	Logger    *slog.Logger // nil: slog.Default()
}

// Plugin handles the NRI events. Its methods are called by the NRI stub; it
// is safe for concurrent use.
type Plugin struct {
	cfg  *config.Config
	key  limits.Key
	host oci.Host
	inv  Inventory
	log  *slog.Logger

	mu       sync.Mutex
	bindings *limits.Bindings
	known    map[string]bool // GPU UUIDs of the node, refreshed on a miss
}

// New returns a plugin. It does not connect to the runtime; see Run.
func New(opts Options) (*Plugin, error) {
	if opts.Config == nil || opts.Host == nil || opts.Inventory == nil {
		return nil, errors.New("nri plugin: Config, Host and Inventory are required")
	}
	if opts.Key == (limits.Key{}) {
		// An all-zero key would accept annotations anyone can sign.
		return nil, errors.New("nri plugin: the allocation key is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Plugin{
		cfg:      opts.Config,
		key:      opts.Key,
		host:     opts.Host,
		inv:      opts.Inventory,
		log:      log,
		bindings: limits.NewBindings(),
		known:    map[string]bool{},
	}, nil
}

// knownGPU reports whether the node has the GPU. The inventory is read
// again on a miss, so a GPU that appeared since the last look is found.
func (p *Plugin) knownGPU(uuid string) bool {
	p.mu.Lock()
	ok := p.known[uuid]
	p.mu.Unlock()
	if ok {
		return true
	}
	devs, err := p.inv.Devices()
	if err != nil {
		p.log.Error("cannot list the node's GPUs; rejecting allocations until it works", "err", err)
		return false
	}
	known := make(map[string]bool, len(devs))
	for _, d := range devs {
		known[d.UUID] = true
	}
	p.mu.Lock()
	p.known = known
	p.mu.Unlock()
	return known[uuid]
}

func podUID(pod *api.PodSandbox, ctr *api.Container) string {
	if uid := pod.GetUid(); uid != "" {
		return uid
	}
	if id := pod.GetId(); id != "" {
		return id
	}
	return ctr.GetPodSandboxId()
}

func podName(pod *api.PodSandbox) string {
	if pod.GetName() == "" {
		return ""
	}
	return pod.GetNamespace() + "/" + pod.GetName()
}

// CreateContainer gives a container with an allocation its vGPUs and takes
// GPU access away from one without. A rejected allocation fails the
// container: it must never run without its limits.
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	value, ok := ctr.GetAnnotations()[limits.AnnotationKey]
	if !ok {
		adj, err := p.hide(pod, ctr)
		return adj, nil, err
	}
	log := p.log.With("container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod))

	a, err := limits.Verify(p.key, value)
	if err == nil {
		err = limits.CheckGPUs(a, p.knownGPU)
	}
	uid := podUID(pod, ctr)
	if err == nil {
		p.mu.Lock()
		err = p.bindings.Bind(a.ID, uid)
		p.mu.Unlock()
	}
	if err != nil {
		log.Warn("allocation rejected", "err", err)
		if errors.Is(err, limits.ErrRejected) {
			return nil, nil, fmt.Errorf("nri-vgpu: %w", err) // "nri-vgpu: allocation rejected: <reason>"
		}
		return nil, nil, fmt.Errorf("nri-vgpu: allocation rejected: %w", err)
	}

	edits, err := oci.Compute(a, p.cfg, p.host, ctr.GetId())
	if err != nil {
		log.Error("cannot give the container its vGPUs", "err", err)
		return nil, nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	for _, w := range edits.Warnings {
		log.Warn(w)
	}
	info := &oci.ContainerInfo{
		ID:           ctr.GetId(),
		Name:         ctr.GetName(),
		Pod:          podName(pod),
		PodUID:       uid,
		AllocationID: a.ID,
		GPUs:         a.GPUs,
		Source:       Source,
		Created:      time.Now().UTC(),
	}
	if err := oci.Prepare(p.cfg, info, limits.LimitsFromAllocation(a, "", "")); err != nil {
		log.Error("cannot prepare the container's host files", "err", err)
		_ = oci.RemoveContainerDir(p.cfg, ctr.GetId())
		return nil, nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	adj := &api.ContainerAdjustment{}
	edits.ApplyToAdjustment(adj, ctr.GetMounts())
	log.Info("vGPU container", "allocation", a.ID, "gpus", gpuSummary(a), "took", time.Since(start))
	return adj, nil, nil
}

func gpuSummary(a *limits.Allocation) []string {
	out := make([]string, len(a.GPUs))
	for i, g := range a.GPUs {
		out[i] = fmt.Sprintf("%s slices=%d memory=%s cores=%d%%", g.UUID, g.Slices, limits.FormatBytes(g.Memory), g.Cores)
	}
	return out
}

// hide strips GPU access from a container that asked for none. Containers
// allowed every device (privileged) are left alone: they see every host
// device whatever is done here, node agents (monitoring, the device plugin
// itself) run so, and a deny rule would make the runtime refuse them.
func (p *Plugin) hide(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	if !p.cfg.NRI.HideUnrequested {
		return nil, nil
	}
	var rules []specs.LinuxDeviceCgroup
	if res := ctr.GetLinux().GetResources(); res != nil {
		rules = res.ToOCI().Devices
	}
	if oci.AllowsAllDevices(rules) {
		p.log.Debug("container allowed every device (privileged): GPUs not hidden", "container", ctr.GetId(), "pod", podName(pod))
		return nil, nil
	}
	edits, err := oci.Hide(p.cfg, p.host)
	if err != nil {
		p.log.Error("cannot hide GPUs", "container", ctr.GetId(), "err", err)
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	adj := &api.ContainerAdjustment{}
	edits.ApplyToAdjustment(adj, ctr.GetMounts())
	return adj, nil
}

// RemoveContainer deletes the container's host directory.
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	if oci.ValidContainerID(ctr.GetId()) != nil {
		return nil // never prepared
	}
	if err := oci.RemoveContainerDir(p.cfg, ctr.GetId()); err != nil {
		p.log.Error("cannot remove container directory", "container", ctr.GetId(), "err", err)
		return fmt.Errorf("nri-vgpu: %w", err)
	}
	return nil
}

// RemovePodSandbox forgets the allocation IDs bound to the pod.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bindings.ReleasePod(podUID(pod, nil))
	return nil
}

// Synchronize rebuilds the replay bindings from the containers that exist
// (their annotations carry their allocations) and deletes the host
// directories of containers that no longer exist. It runs on every
// (re)connection, before any other event.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := make(map[string]*api.PodSandbox, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	bindings := limits.NewBindings()
	vgpu := 0
	exists := make(map[string]bool, len(containers))
	for _, ctr := range containers {
		exists[ctr.GetId()] = true
		value, ok := ctr.GetAnnotations()[limits.AnnotationKey]
		if !ok {
			continue
		}
		pod := byID[ctr.GetPodSandboxId()]
		a, err := limits.Verify(p.key, value)
		if err != nil {
			// It was created before; nothing to refuse now, but say so.
			p.log.Warn("existing container has an invalid allocation", "container", ctr.GetId(), "err", err)
			continue
		}
		uid := podUID(pod, ctr)
		if err := bindings.Bind(a.ID, uid); err != nil {
			p.log.Error("existing containers of different pods share an allocation", "container", ctr.GetId(), "err", err)
			continue
		}
		vgpu++
	}
	p.mu.Lock()
	p.bindings = bindings
	p.mu.Unlock()

	removed, err := oci.SweepContainerDirs(p.cfg, func(id string) bool {
		if exists[id] {
			return true
		}
		info, err := oci.ReadContainerInfo(oci.ContainerDir(p.cfg, id))
		// Another writer's directory (the runtime wrapper) is not ours to sweep.
		return err == nil && info.Source != "" && info.Source != Source
	})
	if err != nil {
		p.log.Error("sweeping container directories", "err", err)
	}
	p.log.Info("synchronized", "containers", len(containers), "vgpu_containers", vgpu, "swept", removed)
	return nil, nil
}

// Shutdown logs that the runtime is going away.
func (p *Plugin) Shutdown(context.Context) {
	p.log.Info("runtime shutting down")
}
