// Package nriplugin is the NRI plugin of nri-vgpu: at container creation it
// verifies the signed allocation (Contract 2) and returns the edits of
// Contract 3; containers without an allocation are stripped of GPU access,
// unless their pod is exempt (nri.exempt).
package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/bindings"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// Source is the hoststate.Info.Source of the containers this plugin prepares;
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
	hook string // oci.HostFiles.Hook

	bindings *bindings.Store // allocation ID -> pod, for good

	mu    sync.Mutex
	known map[string]bool // GPU UUIDs of the node, refreshed on a miss
	stub  stub.Stub       // of the current connection, for the runtime's NRI version
	// record is what runtime.json holds, written at Configure.
	record *hoststate.Runtime

	// resolveMu serializes resolveDriverFiles.
	resolveMu sync.Mutex

	// runtime is what Configure learned of the runtime; nil before.
	runtime atomic.Pointer[runtimeInfo]

	// connected is set once the runtime has synchronized the plugin on the
	// current connection, and cleared when that connection ends (Ready).
	connected atomic.Bool
}

// ErrPodAnnotation rejects a pod that carries the allocation annotation in
// its own (sandbox) annotations: only the kubelet sets it, on a container,
// from the device plugin's Allocate. containerd's pod_annotations pass-through
// would otherwise let a pod spec forge a GPU.
var ErrPodAnnotation = fmt.Errorf("%w: the pod's own annotations carry %s; only the kubelet may set it, on a container",
	limits.ErrRejected, limits.AnnotationKey)

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
	store, err := bindings.Open(opts.Config.Paths.StateDir, bindings.Options{
		Logger:  log,
		KeyPath: filepath.Join(opts.Config.Paths.StateDir, allockey.FileName),
	})
	if err != nil {
		return nil, fmt.Errorf("nri plugin: %w", err)
	}
	// The pin hook (oci.PinHook): paths.hook_path, else this binary.
	hook := opts.Config.Paths.HookPath
	if hook == "" {
		if hook, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("nri plugin: locate this executable for the pin hook: %w", err)
		}
	}
	return &Plugin{
		hook:     hook,
		cfg:      opts.Config,
		key:      opts.Key,
		host:     opts.Host,
		inv:      opts.Inventory,
		log:      log,
		bindings: store,
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
// container: it must never run without its limits. A container that passes
// also loses the device plugin's gate mount (limits.GateContainerPath), which
// would make the runtime refuse it had nri-vgpu not seen it.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj, updates, err := p.createContainer(ctx, pod, ctr)
	if err != nil {
		return nil, nil, err
	}
	for _, m := range ctr.GetMounts() {
		dest := m.GetDestination()
		_, _, marker, _ := limits.ParseClaimMarker(dest) // a malformed one failed createContainer
		if dest == limits.GateContainerPath || marker {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			adj.RemoveMount(dest)
		}
	}
	return adj, updates, nil
}

// createContainer reads verify → provision → apply: the allocation is
// checked (signature, GPUs, replay), the container's host files are
// provisioned, and the edits that mount them are computed and returned.
func (p *Plugin) createContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	if _, forged := pod.GetAnnotations()[limits.AnnotationKey]; forged {
		p.log.Warn("allocation rejected", "container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod), "err", ErrPodAnnotation)
		return nil, nil, fmt.Errorf("nri-vgpu: %w", ErrPodAnnotation)
	}
	value, ok := ctr.GetAnnotations()[limits.AnnotationKey]
	// A claim (Contract 8) comes first: its container must get its limits
	// whatever exemption its pod has.
	if claim, devices, err := claimMarkers(ctr); err != nil || claim != "" {
		log := p.log.With("container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod))
		ctx = logging.NewContext(ctx, log)
		if err == nil && ok {
			err = fmt.Errorf("%w: the container holds GPUs of claim %s and of the device plugin; a container may use one or the other", limits.ErrClaimRejected, claim)
		}
		if err != nil {
			log.Warn("claim rejected", "err", err)
			return nil, nil, fmt.Errorf("nri-vgpu: %w", err)
		}
		adj, err := p.claimContainer(ctx, pod, ctr, claim, devices)
		return adj, nil, err
	}
	if !ok {
		if e, exempt := p.cfg.NRI.ExemptionFor(pod.GetNamespace(), pod.GetRuntimeHandler()); exempt {
			// The node's own GPU agents: nothing is hidden, denied or
			// preloaded. Logged, since it is a trust decision.
			p.log.Info("container exempt from hiding (nri.exempt): left as its runtime made it",
				"container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod),
				"runtime_handler", pod.GetRuntimeHandler(), "exemption", exemptionString(e))
			return nil, nil, nil
		}
		adj, err := p.hide(pod, ctr)
		return adj, nil, err
	}
	log := p.log.With("container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod))
	ctx = logging.NewContext(ctx, log)

	uid := podUID(pod, ctr)
	a, err := p.verify(value, uid)
	if err != nil {
		log.Warn("allocation rejected", "err", err)
		if errors.Is(err, limits.ErrRejected) {
			return nil, nil, fmt.Errorf("nri-vgpu: %w", err) // "nri-vgpu: allocation rejected: <reason>"
		}
		return nil, nil, fmt.Errorf("nri-vgpu: allocation rejected: %w", err)
	}

	info := &hoststate.Info{
		ID:           ctr.GetId(),
		Name:         ctr.GetName(),
		Pod:          podName(pod),
		PodUID:       uid,
		AllocationID: a.ID,
		GPUs:         a.GPUs,
		Source:       Source,
		Created:      time.Now().UTC(),
	}
	files, err := hoststate.Provision(p.cfg, info, limits.LimitsFromAllocation(a, p.cfg.Limits.LogLevel))
	if err != nil {
		log.Error("cannot provision the container's host files", "err", err)
		return nil, nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}

	adj, err := p.apply(ctx, a, files, pod, ctr)
	if err != nil {
		log.Error("cannot give the container its vGPUs", "err", err)
		if rmErr := hoststate.Release(p.cfg, ctr.GetId()); rmErr != nil {
			log.Warn("cannot remove the container's host files", "err", rmErr)
		}
		return nil, nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	log.Info("vGPU container", "allocation", a.ID, "gpus", gpuSummary(a), "took", time.Since(start))
	return adj, nil, nil
}

// verify checks an allocation annotation's signature and GPUs, and binds
// its ID to the pod for good (Contract 2).
func (p *Plugin) verify(value, podUID string) (*limits.Allocation, error) {
	a, err := limits.Verify(p.key, value)
	if err != nil {
		return nil, err
	}
	if err := limits.CheckGPUs(a, p.knownGPU); err != nil {
		return nil, err
	}
	for _, g := range a.GPUs {
		if p.cfg.DRA.Serves(g.UUID) {
			// The device plugin does not hand it out: an allocation of
			// one is older than the config, or not the device plugin's.
			return nil, fmt.Errorf("%w: GPU %s is served through DRA on this node (dra.enabled), not by the device plugin", limits.ErrRejected, g.UUID)
		}
	}
	if err := p.bindings.Bind(a.ID, podUID, a.Issued); err != nil {
		return nil, err
	}
	return a, nil
}

// apply computes the edits of a verified allocation whose host files were
// provisioned at files, confinement included, as an adjustment of ctr.
func (p *Plugin) apply(ctx context.Context, a *limits.Allocation, files oci.HostFiles, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	files.Hook = p.hook
	edits, err := oci.Compute(a, p.cfg, p.host, files)
	if err != nil {
		return nil, err
	}
	if err := p.confine(ctx, pod, ctr, edits); err != nil {
		return nil, err
	}
	for _, w := range edits.Warnings {
		logging.FromContext(ctx).Warn(w)
	}
	p.recordDriverFiles(edits.DriverFiles)
	adj := &api.ContainerAdjustment{}
	edits.ApplyToAdjustment(adj, ctr.GetMounts())
	return adj, nil
}

func gpuSummary(a *limits.Allocation) []string {
	out := make([]string, len(a.GPUs))
	for i, g := range a.GPUs {
		out[i] = fmt.Sprintf("%s slices=%d memory=%s cores=%d%%", g.UUID, g.Slices, limits.FormatBytes(g.Memory), g.Cores)
	}
	return out
}

// exemptionString names an nri.exempt entry in logs.
func exemptionString(e config.Exemption) string {
	var parts []string
	if e.Namespace != "" {
		parts = append(parts, "namespace="+e.Namespace)
	}
	if e.RuntimeHandler != "" {
		parts = append(parts, "runtime_handler="+e.RuntimeHandler)
	}
	return strings.Join(parts, " ")
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
	edits, err := oci.Hide(p.host)
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
	if hoststate.ValidID(ctr.GetId()) != nil {
		return nil // never provisioned
	}
	if err := hoststate.Release(p.cfg, ctr.GetId()); err != nil {
		p.log.Error("cannot remove container directory", "container", ctr.GetId(), "err", err)
		return fmt.Errorf("nri-vgpu: %w", err)
	}
	return nil
}

// RemovePodSandbox marks the pod's allocation IDs as spent: they stay bound
// to it, so no other pod can present them.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if err := p.bindings.ReleasePod(podUID(pod, nil)); err != nil {
		// The IDs stay bound in memory and on disk as live: still refused
		// to every other pod.
		p.log.Error("cannot record the removal of a pod's allocations", "pod", podName(pod), "err", err)
	}
	return nil
}

// Synchronize brings the replay bindings up to date with the containers that
// exist (their annotations carry their allocations; pods removed while the
// plugin was away are released) and deletes the host directories of
// containers that no longer exist. It runs on every (re)connection, before
// any other event.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := make(map[string]*api.PodSandbox, len(pods))
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	var existing []bindings.Binding
	podUIDs := make([]string, 0, len(pods))
	for _, pod := range pods {
		podUIDs = append(podUIDs, podUID(pod, nil))
	}
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
		existing = append(existing, bindings.Binding{ID: a.ID, Pod: podUID(pod, ctr), Issued: a.Issued})
		vgpu++
	}
	conflicts, err := p.bindings.Sync(existing, podUIDs)
	for _, c := range conflicts {
		p.log.Error("existing containers of different pods share an allocation", "err", c)
	}
	if err != nil {
		p.log.Error("cannot record the allocation bindings", "err", err)
	}

	removed, err := hoststate.Sweep(p.cfg, func(id string) bool {
		if exists[id] {
			return true
		}
		info, err := hoststate.ReadInfo(p.cfg, id)
		// Another writer's directory (the runtime wrapper) is not ours to sweep.
		return err == nil && info.Source != "" && info.Source != Source
	})
	if err != nil {
		p.log.Error("sweeping container directories", "err", err)
	}
	p.log.Info("synchronized", "containers", len(containers), "vgpu_containers", vgpu, "swept", removed)
	p.connected.Store(true)
	return nil, nil
}

// Shutdown logs that the runtime is going away.
func (p *Plugin) Shutdown(context.Context) {
	p.log.Info("runtime shutting down")
}
