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
	"slices"
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
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// Inventory lists the node's GPUs; gpu.Backend satisfies it.
type Inventory interface {
	Devices() ([]gpu.Device, error)
}

// Options configure a Plugin.
type Options struct {
	Config    *config.Config
	Key       allocation.Key
	Host      oci.Host
	Inventory Inventory
	Logger    *slog.Logger // nil: slog.Default()
}

// Plugin handles the NRI events. Its methods are called by the NRI stub; it
// is safe for concurrent use.
type Plugin struct {
	cfg  *config.Config
	key  allocation.Key
	host oci.Host
	inv  Inventory
	log  *slog.Logger
	hook string // oci.HostFiles.Hook

	state    *hoststate.Store // the records under run_dir
	bindings *bindings.Store  // allocation ID -> pod, for good

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
	allocation.ErrRejected, allocation.AnnotationKey)

// New returns a plugin. It does not connect to the runtime; see Run.
func New(opts Options) (*Plugin, error) {
	if opts.Config == nil || opts.Host == nil || opts.Inventory == nil {
		return nil, errors.New("nri plugin: Config, Host and Inventory are required")
	}
	if opts.Key == (allocation.Key{}) {
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
		state:    hoststate.New(opts.Config),
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

// CreateContainer reads what the container asks for, once, and hands it to
// the handler of that kind: the GPUs of a claim (createWithClaim), the GPUs
// of a signed allocation (createWithAllocation), or none (hide). A rejected
// request fails the container: it must never run without its limits. A
// container that passes also loses the device plugin's gate mount
// (allocation.GateContainerPath) and its claim markers, which would make the
// runtime refuse it had nri-vgpu not seen it.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	log := p.log.With("container", ctr.GetId(), "name", ctr.GetName(), "pod", podName(pod))
	ctx = logging.NewContext(ctx, log)
	req, err := readRequest(pod, ctr)
	if err != nil {
		log.Warn(rejectedWhat(err), "err", err)
		return nil, nil, fmt.Errorf("nri-vgpu: %w", err)
	}
	var adj *api.ContainerAdjustment
	switch req.kind {
	case requestClaim:
		adj, err = p.createWithClaim(ctx, pod, ctr, req.claim, req.devices)
	case requestAllocation:
		adj, err = p.createWithAllocation(ctx, pod, ctr, req.allocation)
	default:
		adj, err = p.hide(ctx, pod, ctr)
	}
	if err != nil {
		return nil, nil, err
	}
	if _, exempt := p.cfg.NRI.ExemptionFor(pod.GetNamespace(), pod.GetRuntimeHandler()); !exempt {
		// A CDI request the tenant wrote on its pod would give it any
		// device a CDI runtime knows, past the limits and the hiding.
		for _, key := range podCDIRequests(pod, ctr) {
			if adj == nil {
				adj = &api.ContainerAdjustment{}
			}
			log.Warn("CDI request copied from the pod's annotations removed", "annotation", key)
			adj.RemoveAnnotation(key)
		}
	}
	for _, dest := range req.gates {
		if adj == nil {
			adj = &api.ContainerAdjustment{}
		}
		adj.RemoveMount(dest)
	}
	return adj, nil, nil
}

// requestKind is what a container asks nri-vgpu for.
type requestKind int

const (
	requestNone       requestKind = iota // no GPU: hidden, unless exempt
	requestClaim                         // the GPUs of a claim (Contract 8)
	requestAllocation                    // the GPUs of a signed allocation (Contract 2)
)

// request is what a container asks for, read from its pod's annotations,
// its own annotations and its mounts.
type request struct {
	kind       requestKind
	claim      string   // requestClaim: the claim's UID
	devices    []string // requestClaim: the claim's devices it is given
	allocation string   // requestAllocation: the annotation's value
	// gates are the mounts that make the runtime refuse a container
	// nri-vgpu did not handle: the gate and the claim markers.
	gates []string
}

// readRequest reads what ctr asks for. Refused, with an error wrapping
// allocation.ErrRejected or draclaim.ErrRejected: the allocation annotation
// on the pod itself (ErrPodAnnotation), a malformed claim marker, markers of
// two claims, and a claim with an allocation. A claim's container must get
// its limits whatever exemption its pod has, so the claim is read first.
func readRequest(pod *api.PodSandbox, ctr *api.Container) (request, error) {
	var req request
	if _, forged := pod.GetAnnotations()[allocation.AnnotationKey]; forged {
		return req, ErrPodAnnotation
	}
	for _, m := range ctr.GetMounts() {
		dest := m.GetDestination()
		if dest == allocation.GateContainerPath {
			req.gates = append(req.gates, dest)
			continue
		}
		uid, dev, marker, err := draclaim.ParseMarker(dest)
		if err != nil {
			return req, err
		}
		if !marker {
			continue
		}
		if req.claim != "" && uid != req.claim {
			// The shim reads one limits file.
			return req, fmt.Errorf("%w: the container holds GPUs of two claims (%s and %s); a container may use one nri-vgpu claim", draclaim.ErrRejected, req.claim, uid)
		}
		req.kind, req.claim = requestClaim, uid
		if !slices.Contains(req.devices, dev) {
			req.devices = append(req.devices, dev)
		}
		req.gates = append(req.gates, dest)
	}
	value, ok := ctr.GetAnnotations()[allocation.AnnotationKey]
	switch {
	case ok && req.kind == requestClaim:
		return req, fmt.Errorf("%w: the container holds GPUs of claim %s and of the device plugin; a container may use one or the other", draclaim.ErrRejected, req.claim)
	case ok:
		req.kind, req.allocation = requestAllocation, value
	}
	return req, nil
}

// rejectedWhat names in the log what a request's error rejected.
func rejectedWhat(err error) string {
	if errors.Is(err, allocation.ErrRejected) {
		return "allocation rejected"
	}
	return "claim rejected"
}

// createWithAllocation gives a container the GPUs of its signed allocation:
// the allocation is verified (signature, GPUs, replay), the container's host
// files are provisioned, and the edits that mount them are computed.
func (p *Plugin) createWithAllocation(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, value string) (*api.ContainerAdjustment, error) {
	log := logging.FromContext(ctx)
	start := time.Now()
	uid := podUID(pod, ctr)
	a, err := p.verify(value, uid)
	if err != nil {
		log.Warn("allocation rejected", "err", err)
		if errors.Is(err, allocation.ErrRejected) {
			return nil, fmt.Errorf("nri-vgpu: %w", err) // "nri-vgpu: allocation rejected: <reason>"
		}
		return nil, fmt.Errorf("nri-vgpu: allocation rejected: %w", err)
	}
	info := &hoststate.Info{
		ID:           ctr.GetId(),
		Name:         ctr.GetName(),
		Pod:          podName(pod),
		PodUID:       uid,
		AllocationID: a.ID,
		GPUs:         a.GPUs,
		Source:       hoststate.SourceNRI,
		Created:      time.Now().UTC(),
	}
	files, err := p.state.Provision(info, a.Limits(p.cfg.Limits.LogLevel))
	if err != nil {
		log.Error("cannot provision the container's host files", "err", err)
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	adj, err := p.apply(ctx, a.GPUs, files, pod, ctr)
	if err != nil {
		log.Error("cannot give the container its vGPUs", "err", err)
		if rmErr := p.state.Release(ctr.GetId()); rmErr != nil {
			log.Warn("cannot remove the container's host files", "err", rmErr)
		}
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	log.Info("vGPU container", "allocation", a.ID, "gpus", gpuSummary(a.GPUs), "took", time.Since(start))
	return adj, nil
}

// verify checks an allocation annotation's signature and GPUs, and binds
// its ID to the pod for good (Contract 2).
func (p *Plugin) verify(value, podUID string) (*allocation.Allocation, error) {
	a, err := allocation.Verify(p.key, value)
	if err != nil {
		return nil, err
	}
	if err := allocation.CheckGPUs(a, p.knownGPU); err != nil {
		return nil, err
	}
	for _, g := range a.GPUs {
		if p.cfg.DRA.Serves(g.UUID) {
			// The device plugin does not hand it out: an allocation of
			// one is older than the config, or not the device plugin's.
			return nil, fmt.Errorf("%w: GPU %s is served through DRA on this node (dra.enabled), not by the device plugin", allocation.ErrRejected, g.UUID)
		}
	}
	if err := p.bindings.Bind(a.ID, podUID, a.Issued); err != nil {
		return nil, err
	}
	return a, nil
}

// apply computes the edits of verified GPUs whose host files were
// provisioned at files, confinement included, as an adjustment of ctr.
func (p *Plugin) apply(ctx context.Context, gpus []allocation.GPU, files oci.HostFiles, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	files.Hook = p.hook
	edits, err := oci.Compute(gpus, p.cfg, p.host, files)
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

func gpuSummary(gpus []allocation.GPU) []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = fmt.Sprintf("%s slices=%d memory=%s cores=%d%%", g.UUID, g.Slices, quantity.FormatBytes(g.Memory), g.Cores)
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

// hide strips GPU access from a container that asked for none. The node's
// own GPU agents (nri.exempt) are left as their runtime made them: nothing
// is hidden, denied or preloaded. So are containers allowed every device
// (privileged): they see every host device whatever is done here, node
// agents (monitoring, the device plugin itself) run so, and a deny rule
// would make the runtime refuse them.
func (p *Plugin) hide(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	log := logging.FromContext(ctx)
	if e, exempt := p.cfg.NRI.ExemptionFor(pod.GetNamespace(), pod.GetRuntimeHandler()); exempt {
		// Logged, since it is a trust decision.
		log.Info("container exempt from hiding (nri.exempt): left as its runtime made it",
			"runtime_handler", pod.GetRuntimeHandler(), "exemption", exemptionString(e))
		return nil, nil
	}
	if !p.cfg.NRI.HideUnrequested {
		return nil, nil
	}
	var rules []specs.LinuxDeviceCgroup
	if res := ctr.GetLinux().GetResources(); res != nil {
		rules = res.ToOCI().Devices
	}
	if oci.AllowsAllDevices(rules) {
		log.Debug("container allowed every device (privileged): GPUs not hidden")
		return nil, nil
	}
	granted := grantedDevices(ctr)
	edits, err := oci.Hide(p.host, granted)
	if err != nil {
		log.Error("cannot hide GPUs", "err", err)
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	if len(granted) > 0 || len(ctr.GetCDIDevices()) > 0 {
		paths := make([]string, len(granted))
		for i, d := range granted {
			paths[i] = d.Path
		}
		cdi := make([]string, 0, len(ctr.GetCDIDevices()))
		for _, d := range ctr.GetCDIDevices() {
			cdi = append(cdi, d.GetName())
		}
		log.Info("device nodes another plugin gave the container are kept; other GPUs hidden",
			"devices", paths, "cdi_devices", cdi)
	}
	adj := &api.ContainerAdjustment{}
	edits.ApplyToAdjustment(adj, ctr.GetMounts())
	return adj, nil
}

// grantedDevices are the device nodes already in the container's spec when
// nri-vgpu sees it: what kubelet asked the runtime for (a device plugin's
// DeviceSpecs, a DRA driver's or a device plugin's CDI devices, which the
// runtime resolves before NRI). A pod spec has no way to add a device node,
// so these are another plugin's grant, never the tenant's own request.
func grantedDevices(ctr *api.Container) []specs.LinuxDevice {
	var out []specs.LinuxDevice
	for _, d := range ctr.GetLinux().GetDevices() {
		out = append(out, d.ToOCI())
	}
	return out
}

// CDIAnnotationPrefix starts the annotations that request CDI devices
// (cdi.k8s.io/<name>: "vendor.com/class=device,...").
const CDIAnnotationPrefix = "cdi.k8s.io/"

// podCDIRequests are the container's CDI annotations that its pod carries
// too, with the same value: the runtime copied them from the pod (a
// pod_annotations pattern of containerd's runtime), where the tenant wrote
// them. kubelet never copies a pod's annotations to its containers, and
// containerd resolves CDI annotations only from what kubelet sent; a CDI
// runtime (nvidia-container-runtime in CDI mode) would act on these.
func podCDIRequests(pod *api.PodSandbox, ctr *api.Container) []string {
	var keys []string
	podAnn := pod.GetAnnotations()
	for k, v := range ctr.GetAnnotations() {
		if !strings.HasPrefix(k, CDIAnnotationPrefix) {
			continue
		}
		if pv, ok := podAnn[k]; ok && pv == v {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// RemoveContainer deletes the container's host directory.
func (p *Plugin) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	if hoststate.ValidID(ctr.GetId()) != nil {
		return nil // never provisioned
	}
	if err := p.state.Release(ctr.GetId()); err != nil {
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
		value, ok := ctr.GetAnnotations()[allocation.AnnotationKey]
		if !ok {
			continue
		}
		pod := byID[ctr.GetPodSandboxId()]
		a, err := allocation.Verify(p.key, value)
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

	removed, err := p.state.Sweep(func(r *hoststate.Record) bool {
		if exists[r.ID] {
			return true
		}
		info, err := r.Info()
		// Another writer's directory (the runtime wrapper) is not ours to sweep.
		return err == nil && info.Source != "" && info.Source != hoststate.SourceNRI
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
