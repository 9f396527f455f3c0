package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// RunOptions are what Run needs besides the driver.
type RunOptions struct {
	Client  kubernetes.Interface
	Backend gpu.Backend // its health events republish the slice, tainting or untainting the GPU
	// PluginDir and RegistryDir override the kubelet's directories
	// (kubeletplugin.KubeletPluginsDir/<driver name> and
	// kubeletplugin.KubeletRegistryDir); empty: the defaults.
	PluginDir   string
	RegistryDir string
	// NodeUID is the UID of the Node, which owns the slice (so that it goes
	// away with the node); empty: the slice controller looks it up.
	NodeUID types.UID
	// Republish is how often the slice is rebuilt from the inventory even
	// without a health event (the NVML backend reports some changes only
	// as a new device list); 0: every minute.
	Republish time.Duration
}

// Run registers the driver with the kubelet, publishes its ResourceSlice and
// keeps it up to date until ctx is done.
func (d *Driver) Run(ctx context.Context, opts RunOptions) error {
	pluginOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(d.cfg.DRA.DriverName),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(d.pool),
		// The helper serializes the gRPC calls; d.mu also covers
		// in-process callers.
		kubeletplugin.Serialize(true),
		kubeletplugin.HealthService(false),
	}
	if opts.NodeUID != "" {
		pluginOpts = append(pluginOpts, kubeletplugin.NodeUID(opts.NodeUID))
	}
	pluginDir := opts.PluginDir
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, d.cfg.DRA.DriverName)
	}
	// The kubelet does not make a driver's directory; the helper only
	// listens in it.
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("dra driver: plugin directory: %w", err)
	}
	pluginOpts = append(pluginOpts, kubeletplugin.PluginDataDirectoryPath(pluginDir))
	if opts.RegistryDir != "" {
		pluginOpts = append(pluginOpts, kubeletplugin.RegistrarDirectoryPath(opts.RegistryDir))
	}
	d.statusClient = opts.Client
	if dropped, version := taintsDropped(opts.Client); dropped {
		d.log.Warn("the API server drops device taints; an unhealthy GPU is left out of the ResourceSlice instead of tainted", "version", version)
		d.leaveOutUnhealthy.Store(true)
	}
	// Before the kubelet can prepare a claim: a pod joining it later is
	// accepted only through this socket.
	stopPods, err := d.ServePods(ctx, opts.Client)
	if err != nil {
		return err
	}
	defer stopPods()
	helper, err := kubeletplugin.Start(ctx, d, pluginOpts...)
	if err != nil {
		return fmt.Errorf("dra driver: start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	d.helper.Store(helper)
	defer d.helper.Store(nil)

	last := -1
	publish := func() {
		res, err := d.Resources()
		if err != nil {
			d.log.Error("cannot build the ResourceSlice; the published one stays", "err", err)
			return
		}
		if err := helper.PublishResources(ctx, res); err != nil {
			d.log.Error("cannot publish the ResourceSlice", "err", err)
			return
		}
		d.metrics.publications.Inc()
		n := 0
		for _, p := range res.Pools {
			for _, s := range p.Slices {
				n += len(s.Devices)
			}
		}
		if n != last {
			// PublishResources only hands the slice to the plugin helper's
			// controller, which writes it to the API server in the
			// background; its failures come through HandleError.
			d.log.Info("ResourceSlice updated; written to the API server in the background", "pool", d.pool, "gpus", n)
			last = n
		}
	}
	// Watched before the first publish, so that a GPU failing while the
	// first slice is built is published again.
	events := make(chan gpu.HealthEvent, 16)
	health := d.servedHealth()
	if opts.Backend != nil {
		go func() {
			if err := opts.Backend.WatchHealth(ctx, events); err != nil {
				d.log.Warn("GPU health is not watched; a GPU turning unhealthy is tainted at the next periodic publication only", "err", err)
			}
		}()
	}
	publish()

	every := opts.Republish
	if every <= 0 {
		every = time.Minute
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			d.log.Warn("GPU health changed; publishing the slice again", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
			d.countHealthChange(ev, health)
			d.healthEvent(ev)
			publish()
		case <-tick.C:
			publish()
		}
	}
}

// servedHealth is the health of each GPU served through DRA now, which
// health events are compared with; empty when the GPUs cannot be listed.
func (d *Driver) servedHealth() map[string]bool {
	out := map[string]bool{}
	devs, err := d.inv.Devices()
	if err != nil {
		return out
	}
	for _, g := range devs {
		if d.cfg.DRA.Serves(g.UUID) {
			out[g.UUID] = g.Healthy
		}
	}
	return out
}

// countHealthChange counts ev as a transition of a GPU served through DRA
// when its health differs from the GPU's last known one (a GPU not known
// yet was healthy): a repeated event is none. last is updated.
func (d *Driver) countHealthChange(ev gpu.HealthEvent, last map[string]bool) {
	if !d.cfg.DRA.Serves(ev.UUID) {
		return
	}
	was, known := last[ev.UUID]
	last[ev.UUID] = ev.Healthy
	if known && was == ev.Healthy || !known && ev.Healthy {
		return
	}
	devs, err := d.inv.Devices()
	if err != nil {
		d.log.Error("cannot list the GPUs to label a health change; not counted", "uuid", ev.UUID, "err", err)
		return
	}
	for _, g := range devs {
		if g.UUID == ev.UUID {
			d.metrics.healthChanges.WithLabelValues(g.UUID, strconv.Itoa(g.Index), g.Name).Inc()
			return
		}
	}
}

// taintsDropped reports whether the API server is older than 1.36, whose
// DRADeviceTaints is off by default: it drops a device's taints on write,
// so a tainted GPU would look healthy to the scheduler. A version that
// cannot be read or parsed counts as newer. It returns the version read.
func taintsDropped(client kubernetes.Interface) (bool, string) {
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		return false, ""
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil {
		return false, info.GitVersion
	}
	return v.LessThan(utilversion.MajorMinor(1, 36)), info.GitVersion
}
