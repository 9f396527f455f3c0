// Package kubeletsim is a kubelet for end-to-end tests and `make demo`: the
// part of it that a device plugin and a CRI runtime see, and no more. The
// device plugin side is the project's one fake kubelet,
// internal/kubelettest (Registration socket, checks, dial-back, the
// ListAndWatch stream); on top of it this package keeps the device list and
// health that ListAndWatch streams, allocates devices to a
// pod's containers the way kubelet's device manager does
// (GetPreferredAllocation, then Allocate, one container at a time), and runs
// the pod through CRI with the Allocate response placed where kubelet places
// it (annotations in ContainerConfig.Annotations, next to kubelet's own).
package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
)

// SocketName is the Registration socket's file name in the socket directory,
// as kubelet names it.
const SocketName = kubelettest.SocketName

// Kubelet is the simulated kubelet. Create it with New; it is safe for
// concurrent use.
type Kubelet struct {
	dir    string
	logDir string
	log    *slog.Logger

	mu        sync.Mutex
	fake      *kubelettest.Kubelet // serves Registration; nil when closed
	resources map[string]*resource
	// changed is closed and replaced whenever a resource's registration,
	// devices or health change, to wake up WaitFor.
	changed chan struct{}
	closed  bool
}

// resource is one extended resource and the plugin endpoint that serves it.
type resource struct {
	name     string
	endpoint string // socket file name in dir
	// reg is the plugin's current registration with the fake kubelet.
	reg     *kubelettest.Registration
	client  pluginapi.DevicePluginClient
	options *pluginapi.DevicePluginOptions
	// connected is false once ListAndWatch ended: kubelet then treats every
	// device of the resource as unhealthy until the plugin registers again.
	connected bool
	devices   map[string]*pluginapi.Device // by ID, as last streamed
	order     []string                     // device IDs in streamed order
	// allocated maps a device ID to the pod UID holding it.
	allocated map[string]string
	// streams counts ListAndWatch updates received, for WaitFor.
	streams int
	// registrations counts successful Register calls for the resource.
	registrations int
}

// Options configure a Kubelet.
type Options struct {
	// SocketDir holds the Registration socket (kubelet.sock) and the
	// plugins' own sockets: kubelet's /var/lib/kubelet/device-plugins.
	// Required.
	SocketDir string
	// PodLogDir is the root of the pods' log directories (kubelet's
	// /var/log/pods); the runtime writes container logs there. Default:
	// SocketDir/../pod-logs.
	PodLogDir string
	// Logger; nil discards logs.
	Logger *slog.Logger
}

// New starts serving the Registration socket at SocketDir/kubelet.sock.
func New(opts Options) (*Kubelet, error) {
	if opts.SocketDir == "" {
		return nil, errors.New("kubeletsim: Options.SocketDir is required")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logDir := opts.PodLogDir
	if logDir == "" {
		logDir = filepath.Join(filepath.Dir(filepath.Clean(opts.SocketDir)), "pod-logs")
	}
	for _, d := range []string{opts.SocketDir, logDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("kubeletsim: %w", err)
		}
	}
	k := &Kubelet{
		dir:       opts.SocketDir,
		logDir:    logDir,
		log:       logger.With("component", "kubeletsim"),
		resources: map[string]*resource{},
		changed:   make(chan struct{}),
	}
	if err := k.serve(); err != nil {
		return nil, err
	}
	return k, nil
}

// SocketDir is the directory of the Registration socket and plugin sockets.
func (k *Kubelet) SocketDir() string { return k.dir }

// SocketPath is the Registration socket.
func (k *Kubelet) SocketPath() string { return filepath.Join(k.dir, SocketName) }

func (k *Kubelet) serve() error {
	fake, err := kubelettest.StartWith(k.dir, k.registered)
	if err != nil {
		return fmt.Errorf("kubeletsim: %w", err)
	}
	k.mu.Lock()
	k.fake = fake
	k.mu.Unlock()
	return nil
}

// Restart does what a kubelet restart does to device plugins: the
// Registration socket goes away and comes back, and every plugin connection
// is dropped, so plugins must notice and register again. Allocations are
// kept (kubelet checkpoints them).
func (k *Kubelet) Restart() error {
	k.mu.Lock()
	fake := k.fake
	k.disconnectAllLocked()
	k.mu.Unlock()
	fake.Stop()
	return k.serve()
}

// Close stops serving and drops every plugin connection.
func (k *Kubelet) Close() error {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil
	}
	k.closed = true
	fake := k.fake
	k.disconnectAllLocked()
	k.mu.Unlock()
	fake.Stop()
	return nil
}

func (r *resource) disconnect() {
	if r.reg != nil {
		r.reg.Close()
	}
	r.connected = false
}

// disconnectAllLocked drops every plugin connection, as a kubelet that
// stops does, and wakes every WaitFor. k.mu must be held.
func (k *Kubelet) disconnectAllLocked() {
	for _, r := range k.resources {
		r.disconnect()
	}
	k.notifyLocked()
}

// notifyLocked wakes every WaitFor. k.mu must be held.
func (k *Kubelet) notifyLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// registered takes in a registration the fake kubelet accepted (it checked
// the request and has the plugin's options), before the plugin hears back.
func (k *Kubelet) registered(reg *kubelettest.Registration) {
	req, opts := reg.Request, reg.Options
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		reg.Close()
		return
	}
	r := k.resources[req.ResourceName]
	if r == nil {
		r = &resource{name: req.ResourceName, allocated: map[string]string{}}
		k.resources[req.ResourceName] = r
	} else {
		// A plugin registering again (it restarted) replaces the old
		// endpoint; allocations survive, the device list is re-streamed.
		r.disconnect()
	}
	r.endpoint, r.reg, r.client, r.options = req.Endpoint, reg, reg.Client, opts
	r.connected = true
	r.registrations++
	r.devices, r.order = map[string]*pluginapi.Device{}, nil
	k.notifyLocked()
	k.mu.Unlock()
	k.log.Info("device plugin registered", "resource", req.ResourceName, "endpoint", req.Endpoint,
		"preferredAllocation", opts.GetGetPreferredAllocationAvailable(), "preStartRequired", opts.GetPreStartRequired())

	go k.watch(r, reg)
}

// watch follows one registration's ListAndWatch stream until it ends.
func (k *Kubelet) watch(r *resource, reg *kubelettest.Registration) {
	for {
		devices, err := reg.NextList(context.Background())
		k.mu.Lock()
		if r.reg != reg {
			// A newer registration replaced this stream.
			k.mu.Unlock()
			return
		}
		if err != nil {
			r.connected = false
			k.notifyLocked()
			k.mu.Unlock()
			k.log.Info("ListAndWatch ended; devices are unhealthy until the plugin registers again",
				"resource", r.name, "err", err)
			return
		}
		r.devices, r.order = map[string]*pluginapi.Device{}, nil
		for _, d := range devices {
			r.devices[d.ID] = d
			r.order = append(r.order, d.ID)
		}
		r.streams++
		healthy := r.healthyLocked()
		k.notifyLocked()
		k.mu.Unlock()
		k.log.Debug("ListAndWatch update", "resource", r.name, "devices", len(devices), "healthy", len(healthy))
	}
}

// healthyLocked returns the IDs of the healthy devices of a connected plugin.
func (r *resource) healthyLocked() []string {
	if !r.connected {
		return nil
	}
	var ids []string
	for _, id := range r.order {
		if r.devices[id].Health == pluginapi.Healthy {
			ids = append(ids, id)
		}
	}
	return ids
}

// Device is one device as the plugin last reported it.
type Device struct {
	ID      string
	Healthy bool
	// PodUID holds the device, "" when free.
	PodUID string
}

// Devices returns the devices of resource in the order the plugin streamed
// them. A device of a disconnected plugin is reported unhealthy.
func (k *Kubelet) Devices(resourceName string) []Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.snapshotLocked(resourceName).Devices
}

// Snapshot is what WaitFor conditions look at.
type Snapshot struct {
	// Registered: a plugin registered for the resource and its ListAndWatch
	// stream is open.
	Registered bool
	// Registrations counts the plugin's successful Register calls; it grows
	// when a plugin registers again (after a restart of either side).
	Registrations int
	// Endpoint is the plugin's socket file name in the socket directory, as
	// the last registration gave it.
	Endpoint string
	// PreferredAllocation: the plugin offers GetPreferredAllocation.
	PreferredAllocation bool
	// Updates counts the ListAndWatch responses received since the process
	// started (across registrations).
	Updates int
	// Devices as in Kubelet.Devices.
	Devices []Device
}

// Healthy counts the healthy devices.
func (s Snapshot) Healthy() int {
	n := 0
	for _, d := range s.Devices {
		if d.Healthy {
			n++
		}
	}
	return n
}

// WaitFor blocks until cond holds for resource, or ctx ends (the error then
// says what the last state was).
func (k *Kubelet) WaitFor(ctx context.Context, resourceName string, cond func(Snapshot) bool) error {
	for {
		k.mu.Lock()
		snap := k.snapshotLocked(resourceName)
		ch := k.changed
		k.mu.Unlock()
		if cond(snap) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeletsim: waiting for %s (registered=%v, %d devices, %d healthy): %w",
				resourceName, snap.Registered, len(snap.Devices), snap.Healthy(), ctx.Err())
		case <-ch:
		}
	}
}

// WaitForDevices waits until a plugin for resource is registered and reports
// at least n healthy devices.
func (k *Kubelet) WaitForDevices(ctx context.Context, resourceName string, n int) error {
	return k.WaitFor(ctx, resourceName, func(s Snapshot) bool { return s.Registered && s.Healthy() >= n })
}

// Snapshot returns the state of resourceName (the zero Snapshot when no
// plugin ever registered for it).
func (k *Kubelet) Snapshot(resourceName string) Snapshot {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.snapshotLocked(resourceName)
}

// Resources returns the names of the resources that plugins registered
// for, sorted, including those whose plugin has since disconnected.
func (k *Kubelet) Resources() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return sortedKeys(k.resources)
}

// Changed returns a channel that is closed at the next change of any
// resource: a registration, a ListAndWatch update or its end, an allocation
// or a release. Take it before reading the state, so that no change between
// the read and the wait is missed.
func (k *Kubelet) Changed() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.changed
}

func (k *Kubelet) snapshotLocked(resourceName string) Snapshot {
	r := k.resources[resourceName]
	if r == nil {
		return Snapshot{}
	}
	s := Snapshot{Registered: r.connected, Updates: r.streams, Registrations: r.registrations,
		Endpoint: r.endpoint, PreferredAllocation: r.options.GetGetPreferredAllocationAvailable()}
	for _, id := range r.order {
		s.Devices = append(s.Devices, Device{
			ID:      id,
			Healthy: r.connected && r.devices[id].Health == pluginapi.Healthy,
			PodUID:  r.allocated[id],
		})
	}
	return s
}
