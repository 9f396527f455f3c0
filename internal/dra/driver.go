package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/internal/refusal"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// CDIKind is the CDI vendor and class of the devices the driver returns.
const CDIKind = "nri-vgpu.io/claim"

// Inventory lists the node's GPUs; gpu.Backend satisfies it.
type Inventory interface {
	Devices() ([]gpu.Device, error)
}

// Options configure a Driver.
type Options struct {
	Config    *config.Config
	Inventory Inventory
	// NodeName is the node's name, which is also the name of the pool the
	// driver publishes.
	NodeName string
	Logger   *slog.Logger // nil: slog.Default()
}

// Driver implements kubeletplugin.DRAPlugin. Its methods are safe for
// concurrent use; preparations are serialized.
type Driver struct {
	cfg  *config.Config
	inv  Inventory
	pool string
	log  *slog.Logger
	cdi  *cdiapi.Cache

	state *hoststate.Store // the claims' records under run_dir

	mu sync.Mutex // serializes Prepare and Unprepare: the capacity check reads what others wrote

	// helper is the kubelet plugin helper while Run runs: it knows whether
	// the kubelet has registered the driver.
	helper  atomic.Pointer[kubeletplugin.Helper]
	metrics *collector

	// statusClient writes the quota of each prepared claim into its status
	// (status.go); set by Run before the kubelet can call.
	statusClient kubernetes.Interface
	healthMu     sync.Mutex
	unhealthy    map[string]Unhealthy // by UUID: the GPUs published with a taint
	// leaveOutUnhealthy is set where the API server would drop a device's
	// taints (see taintsDropped): an unhealthy GPU is not published there.
	leaveOutUnhealthy atomic.Bool
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New returns a driver. It does not talk to the kubelet or the API server;
// see Run.
func New(opts Options) (*Driver, error) {
	if opts.Config == nil || opts.Inventory == nil {
		return nil, errors.New("dra driver: Config and Inventory are required")
	}
	if opts.NodeName == "" {
		return nil, errors.New("dra driver: the node name is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// Only this driver's directory, read when a spec is written or
	// removed: the container runtime, not the driver, reads the specs.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(opts.Config.DRA.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("dra driver: CDI directory %s: %w", opts.Config.DRA.CDIDir, err)
	}
	d := &Driver{cfg: opts.Config, state: hoststate.New(opts.Config), inv: opts.Inventory, pool: opts.NodeName, log: log, cdi: cache,
		unhealthy: map[string]Unhealthy{}}
	d.metrics = newCollector(d)
	return d, nil
}

// gpus lists the GPUs the driver serves now.
func (d *Driver) gpus() ([]served, error) {
	devs, err := d.inv.Devices()
	if err != nil {
		return nil, fmt.Errorf("list the node's GPUs: %w", err)
	}
	return servedGPUs(d.cfg, devs)
}

// Resources is what the driver publishes: one pool named after the node,
// holding one slice with a device per served GPU.
func (d *Driver) Resources() (resourceslice.DriverResources, error) {
	devs, err := d.inv.Devices()
	if err != nil {
		return resourceslice.DriverResources{}, fmt.Errorf("dra driver: list the node's GPUs: %w", err)
	}
	if d.leaveOutUnhealthy.Load() {
		devs = slices.DeleteFunc(slices.Clone(devs), func(g gpu.Device) bool { return !g.Healthy })
	}
	published, err := Devices(d.cfg, devs, d.noteHealth(devs))
	if err != nil {
		return resourceslice.DriverResources{}, fmt.Errorf("dra driver: %w", err)
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			d.pool: {Slices: []resourceslice.Slice{{Devices: published}}},
		},
	}, nil
}

// noteHealth records when each GPU of devs was first seen unhealthy, so that
// its taint keeps its TimeAdded from one publication to the next, forgets
// the GPUs that are healthy again, and returns a copy of the record.
func (d *Driver) noteHealth(devs []gpu.Device) map[string]Unhealthy {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	for _, g := range devs {
		if g.Healthy {
			delete(d.unhealthy, g.UUID)
		} else if _, ok := d.unhealthy[g.UUID]; !ok {
			d.unhealthy[g.UUID] = Unhealthy{Since: time.Now()}
		}
	}
	return maps.Clone(d.unhealthy)
}

// healthEvent records the reason of an unhealthy event; the GPU's taint
// keeps the time it was first seen unhealthy.
func (d *Driver) healthEvent(ev gpu.HealthEvent) {
	if ev.Healthy {
		return
	}
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	u, ok := d.unhealthy[ev.UUID]
	if !ok {
		u.Since = time.Now()
	}
	u.Reason = ev.Reason
	d.unhealthy[ev.UUID] = u
}

// PrepareResourceClaims prepares each claim (see prepare); a claim that
// cannot be prepared gets its error, the others are prepared all the same.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gpus, err := d.gpus()
	if err != nil {
		// Every claim of the call fails with it.
		d.metrics.refusals.WithLabelValues(ReasonInventory).Add(float64(len(claims)))
		return nil, fmt.Errorf("dra driver: %w", err)
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		ctx := logging.NewContext(ctx, d.log.With("claim", claim.Namespace+"/"+claim.Name, "uid", claim.UID))
		devices, err := d.prepare(ctx, claim, gpus)
		if err != nil {
			d.metrics.refusals.WithLabelValues(refusalReason(err)).Inc()
			logging.FromContext(ctx).Warn("cannot prepare claim", "err", err)
			out[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("nri-vgpu: %w", err)}
			continue
		}
		d.metrics.prepares.Inc()
		d.writeStatus(ctx, claim, gpus)
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// prepare makes the claim's host state and CDI spec (Contract 8) and
// returns its devices. Preparing a claim again (the kubelet restarted, or
// another pod shares the claim) only brings its pods up to date: its limits
// file and region are mounted in running containers.
func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim, gpus []served) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	id := hoststate.ClaimID(uid)
	if !draclaim.ValidUID(uid) {
		return nil, rejected(ReasonInvalidUID, "claim UID %q is not a UUID", uid)
	}
	shares, err := claimShares(claim, d.cfg.DRA.DriverName, d.pool, gpus)
	if err != nil {
		return nil, err
	}
	info := &hoststate.Info{
		ID:           id,
		AllocationID: uid,
		Source:       hoststate.SourceDRA,
		Created:      time.Now().UTC(),
		Claim: &hoststate.ClaimInfo{
			Namespace: claim.Namespace, Name: claim.Name, UID: uid,
			PodUIDs: podUIDs(claim), PodNames: podNames(claim),
		},
	}
	for _, s := range shares {
		info.GPUs = append(info.GPUs, s.GPU)
	}

	prev, err := d.state.Claim(uid)
	switch {
	case errors.Is(err, hoststate.ErrNotClaim):
		return nil, refuse(ReasonStateConflict, fmt.Errorf("claim %s/%s: %s holds something else than this claim", claim.Namespace, claim.Name, hoststate.ContainerDir(d.cfg, id)))
	case err == nil:
		if !slices.Equal(prev.GPUs, info.GPUs) {
			return nil, rejected(ReasonAllocationChanged, "claim %s/%s was prepared with %v and is now allocated %v", claim.Namespace, claim.Name, prev.GPUs, info.GPUs)
		}
		info.Created = prev.Created
		if err := d.state.UpdateInfo(info); err != nil {
			return nil, refuse(ReasonHostState, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
		}
	case errors.Is(err, fs.ErrNotExist):
		if err := d.checkCapacity(info, gpus); err != nil {
			return nil, err
		}
		lf := &limits.LimitsFile{CoresPolicy: d.cfg.Limits.CoresPolicy, LogLevel: d.cfg.Limits.LogLevel}
		for _, s := range shares {
			lf.GPUs = append(lf.GPUs, limits.GPULimit{UUID: s.UUID, Memory: s.Memory, Cores: s.Cores})
		}
		if _, err := d.state.Provision(info, lf); err != nil {
			return nil, refuse(ReasonHostState, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
		}
	default:
		return nil, refuse(ReasonHostState, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
	}

	if err := d.writeSpec(uid, shares); err != nil {
		return nil, refuse(ReasonHostState, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err))
	}
	var devices []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DRA.DriverName {
			continue
		}
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{CDIKind + "=" + cdiDeviceName(uid, r.Device)},
			ShareID:      r.ShareID,
		})
	}
	logging.FromContext(ctx).Info("claim prepared", "gpus", summary(info.GPUs), "pods", info.Claim.PodUIDs)
	return devices, nil
}

// checkCapacity refuses a claim that would take a GPU past its capacity
// together with the claims already prepared on the node: the scheduler
// should never allow it, and the driver is the last line of defence. It
// fails closed: a claim directory it cannot account for refuses every
// claim until it is released or removed, since what it holds is unknown.
func (d *Driver) checkCapacity(info *hoststate.Info, gpus []served) error {
	type used struct {
		memory uint64
		cores  int
	}
	inUse := map[string]used{}
	err := d.state.Scan(func(r *hoststate.Record) error {
		if !strings.HasPrefix(r.ID, hoststate.ClaimIDPrefix) || r.ID == info.ID {
			return nil
		}
		oi, err := d.preparedClaim(r)
		if err != nil {
			return refuse(ReasonUnaccountedClaim, fmt.Errorf("capacity check: %w", err))
		}
		if oi == nil {
			return nil
		}
		for _, g := range oi.GPUs {
			u := inUse[g.UUID]
			inUse[g.UUID] = used{u.memory + g.Memory, u.cores + g.Cores}
		}
		return nil
	})
	if _, ok := errors.AsType[*refusal.Error](err); ok {
		return err
	}
	if err != nil {
		return refuse(ReasonHostState, fmt.Errorf("capacity check: %w", err))
	}
	for _, g := range info.GPUs {
		i := slices.IndexFunc(gpus, func(s served) bool { return s.UUID == g.UUID })
		if i < 0 {
			return rejected(ReasonUnknownDevice, "GPU %s is not served through DRA on this node", g.UUID)
		}
		total := gpus[i]
		u := inUse[g.UUID]
		if u.memory+g.Memory > total.Memory || u.cores+g.Cores > total.Cores {
			return rejected(ReasonOverCapacity, "GPU %s has %s and %d%% left, the claim needs %s and %d%%",
				g.UUID, quantity.FormatBytes(total.Memory-min(u.memory, total.Memory)), max(total.Cores-u.cores, 0),
				quantity.FormatBytes(g.Memory), g.Cores)
		}
	}
	return nil
}

// preparedClaim reads the directory of another prepared claim for the
// capacity check. Only a directory that is gone (released since it was
// listed) holds nothing; one that is unreadable, half-made or not a claim's
// is an error naming it. Prepare and Unprepare are serialized, so no claim
// directory is being written while this reads.
func (d *Driver) preparedClaim(r *hoststate.Record) (*hoststate.Info, error) {
	dir := r.Path()
	info, err := r.Claim()
	switch {
	case errors.Is(err, hoststate.ErrNotFound):
		return nil, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("claim directory %s has no %s (half made or half removed): what it holds is unknown; "+
			"unprepare its claim or remove the directory: %w", dir, hoststate.InfoFileName, err)
	case errors.Is(err, hoststate.ErrNotClaim):
		return nil, fmt.Errorf("%w: what it holds is unknown", err)
	case err != nil:
		return nil, fmt.Errorf("claim directory %s cannot be read: %w", dir, err)
	}
	return info, nil
}

// cdiDeviceName is the CDI device of one device of a claim.
func cdiDeviceName(claimUID, device string) string { return claimUID + "-" + device }

// specName is the file name of a claim's CDI spec.
func specName(claimUID string) string { return "nri-vgpu.io-claim_" + claimUID + ".json" }

// writeSpec writes the claim's CDI spec: per device, one read-only mount of
// /dev/null at the device's marker and nothing else.
func (d *Driver) writeSpec(claimUID string, shares []share) error {
	spec := &cdispec.Spec{Version: cdispec.CurrentVersion, Kind: CDIKind}
	for _, s := range shares {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: cdiDeviceName(claimUID, s.Device),
			ContainerEdits: cdispec.ContainerEdits{
				Mounts: []*cdispec.Mount{{
					HostPath:      "/dev/null",
					ContainerPath: draclaim.MarkerPath(claimUID, s.Device),
					Options:       []string{"ro", "nosuid", "nodev", "noexec", "bind"},
				}},
			},
		})
	}
	// The oldest version with everything used here, so that older CDI
	// readers in container runtimes accept the file.
	if v, err := cdispec.MinimumRequiredVersion(spec); err == nil {
		spec.Version = v
	}
	if err := d.cdi.WriteSpec(spec, specName(claimUID)); err != nil {
		return fmt.Errorf("CDI spec in %s: %w", d.cfg.DRA.CDIDir, err)
	}
	return nil
}

// UnprepareResourceClaims removes each claim's CDI spec and host state;
// claims that were never prepared (or already unprepared) are no error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(string(c.UID))
		if out[c.UID] != nil {
			d.log.Error("cannot unprepare claim", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", out[c.UID])
		} else {
			d.metrics.unprepares.Inc()
			d.log.Info("claim unprepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
		}
	}
	return out, nil
}

func (d *Driver) unprepare(uid string) error {
	id := hoststate.ClaimID(uid)
	if !draclaim.ValidUID(uid) {
		return nil // never prepared: prepare refuses such a UID
	}
	if err := d.cdi.RemoveSpec(specName(uid)); err != nil {
		return fmt.Errorf("nri-vgpu: remove CDI spec: %w", err)
	}
	if _, err := d.state.Claim(uid); errors.Is(err, hoststate.ErrNotClaim) {
		return fmt.Errorf("nri-vgpu: %s is not a claim's directory; left alone", hoststate.ContainerDir(d.cfg, id))
	}
	if err := d.state.Release(id); err != nil {
		return fmt.Errorf("nri-vgpu: %w", err)
	}
	return nil
}

// HandleError logs errors met in the background (publishing the
// ResourceSlice); the helper retries recoverable ones.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.Warn(msg, "err", err)
		return
	}
	d.log.Error(msg, "err", err)
}

// WatchHealthStatus: health reaches the scheduler through the
// ResourceSlice (an unhealthy GPU is tainted there), not through the kubelet.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func podNames(claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, c := range claim.Status.ReservedFor {
		if c.APIGroup == "" && c.Resource == "pods" {
			out = append(out, c.Name)
		}
	}
	return out
}

func summary(gpus []allocation.GPU) []string {
	out := make([]string, len(gpus))
	for i, g := range gpus {
		out[i] = fmt.Sprintf("%s memory=%s cores=%d%%", g.UUID, quantity.FormatBytes(g.Memory), g.Cores)
	}
	return out
}
