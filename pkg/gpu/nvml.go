package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// IgnoredXIDs are the XID critical errors that do not make a GPU unhealthy:
// they are caused by an application (a faulting kernel, a bad memory access,
// a hung context) and do not need a GPU reset. The list is the one NVIDIA's
// Kubernetes device plugin uses.
//
//	13  graphics engine exception
//	31  GPU memory page fault
//	43  GPU stopped processing (the faulting channel was reset)
//	45  preemptive cleanup, due to previous errors
//	68  video processor (NVDEC) exception
//	109 context switch timeout
var IgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// defaultSysfs is where the GPUs' PCIe root complexes are looked up.
const defaultSysfs = "/sys"

// defaultEventTimeout bounds each EventSetWait: the longest WatchHealth takes
// to notice that its context is done or that the backend was closed.
const defaultEventTimeout = 5 * time.Second

// noDriverHint is appended to driver errors: the fix is either installing the
// driver or not using NVML at all.
const noDriverHint = `(is the NVIDIA driver installed? for a machine without GPUs set gpu.backend = "simulated")`

// NVML is the backend for real GPUs. It loads libnvidia-ml.so.1 on first use
// (go-nvml dlopens it at Init), so binaries start on machines without the
// driver. GPUs in MIG mode are served elsewhere: Devices leaves them out,
// ServedElsewhere lists them (MIG partitions are another plugin's).
//
// The inventory is read once, at the first successful call: NVML's device
// set does not change while it is initialized. Health changes are recorded
// by WatchHealth; a GPU that became unhealthy stays so, because every error
// that is not ignored (see IgnoredXIDs) needs a GPU reset, which restarts the
// driver and therefore this process's view of it.
type NVML struct {
	// lib is the library; nil until search has loaded one.
	lib    nvml.Interface
	search *librarySearch
	// eventTimeout is the EventSetWait timeout; tests shorten it.
	eventTimeout time.Duration
	// sysfs is where sysfs is mounted (defaultSysfs); tests move it.
	sysfs string

	mu          sync.Mutex
	initialized bool // lib.Init succeeded; Close must call lib.Shutdown
	closed      bool
	devices     []nvmlDevice // nil until enumerated
	elsewhere   []Device     // the GPUs in MIG mode, read with devices
	done        chan struct{}
	watchers    sync.WaitGroup
}

type nvmlDevice struct {
	Device
	handle nvml.Device
}

var (
	_ Backend         = (*NVML)(nil)
	_ ElsewhereLister = (*NVML)(nil)
)

// NewNVML returns an NVML backend on lib, a mock in tests. Nothing is
// loaded until the first call.
func NewNVML(lib nvml.Interface) *NVML {
	return &NVML{lib: lib, eventTimeout: defaultEventTimeout, sysfs: defaultSysfs, done: make(chan struct{})}
}

// newNVMLForDriver returns an NVML backend on the libnvidia-ml.so.1 of the
// driver d describes, found at the first call (see librarySearch).
func newNVMLForDriver(d config.Driver) *NVML {
	return &NVML{search: newLibrarySearch(d), eventTimeout: defaultEventTimeout, sysfs: defaultSysfs, done: make(chan struct{})}
}

// Name returns "nvml".
func (n *NVML) Name() string { return "nvml" }

// Devices lists the GPUs that are not in MIG mode, by NVML index, with their
// current health. If the driver cannot be found, the error wraps ErrNoDriver.
func (n *NVML) Devices() ([]Device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.readyLocked(); err != nil {
		return nil, err
	}
	out := make([]Device, len(n.devices))
	for i, d := range n.devices {
		out[i] = d.Device
	}
	return out, nil
}

// ServedElsewhere lists the GPUs in MIG mode, by NVML index. If the driver
// cannot be found, the error wraps ErrNoDriver.
func (n *NVML) ServedElsewhere() ([]Device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.readyLocked(); err != nil {
		return nil, err
	}
	return slices.Clone(n.elsewhere), nil
}

// readyLocked initializes NVML and enumerates the devices if that has not
// been done yet. A failure is not remembered: a later call tries again, so a
// driver that is installed after the process started is picked up.
func (n *NVML) readyLocked() error {
	if n.closed {
		return ErrClosed
	}
	if !n.initialized {
		if n.lib == nil {
			lib, err := n.search.init()
			// A library that loaded stays: its symbols are bound, so a
			// retry initializes it again rather than searching anew.
			n.lib = lib
			if err != nil {
				return err
			}
		} else if err := initError(n.lib.Init()); err != nil {
			return err
		}
		n.initialized = true
	}
	if n.devices == nil {
		devs, elsewhere, err := n.enumerate()
		if err != nil {
			return err
		}
		n.devices, n.elsewhere = devs, elsewhere
	}
	return nil
}

// initError turns the result of nvmlInit into an error; the driver-missing
// cases wrap ErrNoDriver and say what to do.
func initError(ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: libnvidia-ml.so.1 could not be loaded %s", ErrNoDriver, noDriverHint)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: libnvidia-ml.so.1 was loaded but the NVIDIA kernel driver is not running %s", ErrNoDriver, noDriverHint)
	default:
		return fmt.Errorf("initializing NVML: %w", ret)
	}
}

// enumerate reads every GPU: those nri-vgpu serves, and those in MIG mode,
// served elsewhere.
func (n *NVML) enumerate() ([]nvmlDevice, []Device, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("NVML: counting GPUs: %w", ret)
	}
	devs := make([]nvmlDevice, 0, count)
	elsewhere := []Device{}
	driver, cuda := n.driverVersions()
	lib := nvdev.New(n.lib)
	for i := range count {
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, nil, fmt.Errorf("NVML: GPU %d: getting its handle: %w", i, ret)
		}
		d, err := describe(i, h)
		if err != nil {
			return nil, nil, fmt.Errorf("NVML: GPU %d: %w", i, err)
		}
		if d.MIG {
			slog.Warn("GPU in MIG mode: served elsewhere (its MIG devices are another plugin's), not shared by nri-vgpu; disable MIG to share it",
				"index", i, "uuid", d.UUID)
			elsewhere = append(elsewhere, d.Device)
			continue
		}
		d.DriverVersion, d.CUDADriverVersion = driver, cuda
		identify(lib, h, &d.Device, n.sysfs)
		devs = append(devs, *d)
	}
	return devs, elsewhere, nil
}

// driverVersions returns the driver's version ("550.54.15") and the CUDA
// version it supports ("12.4"), each "" when NVML does not say: they only
// describe the GPUs, so their absence fails nothing.
func (n *NVML) driverVersions() (driver, cuda string) {
	if v, ret := n.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		driver = v
	} else {
		slog.Warn("NVML: getting the driver version failed; it is left unknown", "err", ret)
	}
	// NVML encodes CUDA major.minor as 1000 × major + 10 × minor.
	if v, ret := n.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		cuda = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	} else {
		slog.Warn("NVML: getting the CUDA driver version failed; it is left unknown", "err", ret, "version", v)
	}
	return driver, cuda
}

// identify fills in d what describes the GPU beyond the inventory
// (architecture, brand, compute capability, PCIe root complex), by the
// names NVIDIA's go-nvlib gives. What the driver does not report, or names
// unknown, stays "": a guessed value would match selectors the GPU does not
// meet.
func identify(lib nvdev.Interface, h nvml.Device, d *Device, sysfs string) {
	missing := func(what string, err error) {
		slog.Warn("cannot read the GPU's "+what+"; it is left unknown", "uuid", d.UUID, "err", err)
	}
	dev, err := lib.NewDevice(h)
	if err != nil {
		missing("architecture, brand and compute capability", err)
	} else {
		if arch, err := dev.GetArchitectureAsString(); err != nil {
			missing("architecture", err)
		} else if arch != "Unknown" {
			d.Architecture = arch
		}
		if brand, err := dev.GetBrandAsString(); err != nil {
			missing("brand", err)
		} else if brand != "Unknown" {
			d.Brand = brand
		}
		if cc, err := dev.GetCudaComputeCapabilityAsString(); err != nil {
			missing("CUDA compute capability", err)
		} else {
			d.CUDAComputeCapability = cc
		}
	}
	root, err := pcieRoot(sysfs, d.PCIBusID)
	if err != nil {
		missing("PCIe root", err)
	}
	d.PCIeRoot = root
}

// pcieRoot returns the PCIe root complex of the PCI device busID
// ("0000:07:00.0") as Kubernetes resolves it for its standard pcieRoot
// attribute: the first directory of the device's path under devices/,
// which its sysfs link bus/pci/devices/<busID> points to
// (../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0 gives
// "pci0000:00").
func pcieRoot(sysfs, busID string) (string, error) {
	link := filepath.Join("bus", "pci", "devices", busID)
	target, err := os.Readlink(filepath.Join(sysfs, link))
	if err != nil {
		return "", fmt.Errorf("resolving the PCIe root of %s: %w", busID, err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(link), target)
	} else if rel, err := filepath.Rel(sysfs, target); err == nil {
		target = rel
	}
	root, rest, _ := strings.Cut(strings.TrimPrefix(target, "devices/"), "/")
	if !strings.HasPrefix(target, "devices/pci") || filepath.Base(rest) != busID {
		return "", fmt.Errorf("resolving the PCIe root of %s: %s links to %s, want devices/pci…/%s", busID, link, target, busID)
	}
	return root, nil
}

// describe reads what the inventory needs about one GPU, and whether it is
// in MIG mode (the current mode: a pending change takes effect only after a
// GPU reset).
func describe(index int, h nvml.Device) (*nvmlDevice, error) {
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting its UUID: %w", ret)
	}
	current, _, ret := h.GetMigMode()
	var mig bool
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		// Not MIG-capable.
	case ret != nvml.SUCCESS:
		return nil, fmt.Errorf("%s: getting its MIG mode: %w", uuid, ret)
	default:
		mig = current == nvml.DEVICE_MIG_ENABLE
	}
	name, ret := h.GetName()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: getting its name: %w", uuid, ret)
	}
	mem, ret := h.GetMemoryInfo()
	switch {
	case ret == nvml.SUCCESS:
	case mig:
		// Only shown, never shared: the size is not worth failing the
		// whole inventory for.
		mem = nvml.Memory{}
	default:
		return nil, fmt.Errorf("%s: getting its memory size: %w", uuid, ret)
	}
	minor, ret := h.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: getting its minor number: %w", uuid, ret)
	}
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%s: getting its PCI info: %w", uuid, ret)
	}
	return &nvmlDevice{
		Device: Device{
			Index:    index,
			UUID:     uuid,
			Name:     name,
			Memory:   mem.Total,
			Minor:    minor,
			PCIBusID: pciBusID(pci),
			Healthy:  true,
			MIG:      mig,
		},
		handle: h,
	}, nil
}

// pciBusID formats NVML's PCI address. The BusId string is authoritative; the
// numeric fields are the fallback when it is empty.
func pciBusID(p nvml.PciInfo) string {
	raw := cString(p.BusId[:])
	if raw == "" {
		return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
	}
	id, err := NormalizePCIBusID(raw)
	if err != nil {
		// Only cosmetic: keep what the driver said rather than failing
		// the inventory.
		slog.Warn("NVML reported an unexpected PCI bus id", "bus_id", raw, "err", err)
		return raw
	}
	return id
}

func cString[T int8 | uint8](b []T) string {
	if i := slices.Index(b, 0); i >= 0 {
		b = b[:i]
	}
	out := make([]byte, len(b))
	for i, c := range b {
		out[i] = byte(c)
	}
	return string(out)
}

// WatchHealth registers for XID critical errors and double-bit ECC errors on
// every GPU (where the GPU supports them) and reports each one that is not in
// IgnoredXIDs: the GPU becomes unhealthy and an event is sent. An event that
// names no GPU marks every GPU unhealthy. It returns nil when ctx is done or
// the backend is closed, within one EventSetWait timeout (5 s).
func (n *NVML) WatchHealth(ctx context.Context, events chan<- HealthEvent) error {
	n.mu.Lock()
	if err := n.readyLocked(); err != nil {
		n.mu.Unlock()
		return err
	}
	// Close waits for watchers before it shuts NVML down, so no NVML call
	// below races with nvmlShutdown.
	n.watchers.Add(1)
	defer n.watchers.Done()
	devs := slices.Clone(n.devices)
	n.mu.Unlock()

	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: creating an event set: %w", ret)
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			slog.Warn("NVML: freeing the event set failed", "err", ret)
		}
	}()

	w := &nvmlWatch{n: n, ctx: ctx, events: events, devs: devs}
	for _, d := range devs {
		types, reason := register(d, set)
		if reason != "" {
			if !w.report([]string{d.UUID}, reason) {
				return nil
			}
			continue
		}
		logRegistered(d.UUID, types)
	}

	waitFailing := false // reports a run of failed waits once
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.done:
			return nil
		default:
		}
		ev, ret := set.Wait(uint32(n.eventTimeout.Milliseconds()))
		switch ret {
		case nvml.ERROR_TIMEOUT:
			waitFailing = false
		case nvml.SUCCESS:
			waitFailing = false
			if !w.handle(ev) {
				return nil
			}
		default:
			// As NVIDIA's device plugin does: if health cannot be
			// observed, no GPU can be trusted.
			if !waitFailing {
				waitFailing = true
				slog.Error("NVML: waiting for events failed; marking every GPU unhealthy", "err", ret)
				if !w.report(w.allUUIDs(), fmt.Sprintf("NVML event wait failed: %v", ret)) {
					return nil
				}
			}
			// Wait before trying again, so a persistent error does not
			// spin.
			select {
			case <-ctx.Done():
				return nil
			case <-n.done:
				return nil
			case <-time.After(n.eventTimeout):
			}
		}
	}
}

// healthEventTypes are the event types WatchHealth registers for, each
// where the GPU supports it, by the names its log and the inventory use.
var healthEventTypes = []struct {
	mask uint64
	name string
}{
	{nvml.EventTypeXidCriticalError, "xid_critical_error"},
	{nvml.EventTypeDoubleBitEccError, "double_bit_ecc_error"},
}

// HealthEventTypes is what the driver said when health events were
// registered for one GPU: the types it accepted and those it does not
// support (names of healthEventTypes).
type HealthEventTypes struct {
	Accepted    []string `json:"accepted"`
	Unsupported []string `json:"unsupported"`
}

// register subscribes set to d's health events, one type at a time, so the
// driver's answer for each is known: a type the GPU does not list among its
// supported ones, or that the driver refuses with NOT_SUPPORTED, is
// unsupported. It returns the reason to mark d unhealthy ("" if none) when
// the driver fails otherwise.
func register(d nvmlDevice, set nvml.EventSet) (HealthEventTypes, string) {
	types := HealthEventTypes{Accepted: []string{}, Unsupported: []string{}}
	supported, ret := d.handle.GetSupportedEventTypes()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		supported = 0
	default:
		slog.Error("NVML: getting the supported event types failed; marking the GPU unhealthy", "gpu", d.UUID, "err", ret)
		return types, fmt.Sprintf("health events unavailable: %v", ret)
	}
	for _, t := range healthEventTypes {
		if supported&t.mask == 0 {
			types.Unsupported = append(types.Unsupported, t.name)
			continue
		}
		switch ret := d.handle.RegisterEvents(t.mask, set); ret {
		case nvml.SUCCESS:
			types.Accepted = append(types.Accepted, t.name)
		case nvml.ERROR_NOT_SUPPORTED:
			types.Unsupported = append(types.Unsupported, t.name)
		default:
			slog.Error("NVML: registering for health events failed; marking the GPU unhealthy", "gpu", d.UUID, "type", t.name, "err", ret)
			return types, fmt.Sprintf("health events unavailable: registering %s: %v", t.name, ret)
		}
	}
	return types, ""
}

// logRegistered says once per GPU which health events the driver accepted,
// as bracketed comma-separated names that the text log leaves unquoted:
// accepted=[xid_critical_error,double_bit_ecc_error] unsupported=[].
func logRegistered(uuid string, types HealthEventTypes) {
	slog.Info("health watch registered", "gpu", uuid,
		"accepted", "["+strings.Join(types.Accepted, ",")+"]",
		"unsupported", "["+strings.Join(types.Unsupported, ",")+"]")
	if len(types.Accepted) == 0 {
		slog.Warn("GPU reports no health events; it is not monitored", "gpu", uuid)
	}
}

// HealthEventTypes registers the health events of every GPU in a scratch
// event set, as WatchHealth does, and returns the driver's answers by UUID:
// what an operator or a check compares with what the GPU should report.
func (n *NVML) HealthEventTypes() (map[string]HealthEventTypes, error) {
	n.mu.Lock()
	if err := n.readyLocked(); err != nil {
		n.mu.Unlock()
		return nil, err
	}
	n.watchers.Add(1) // Close must not shut NVML down under these calls
	defer n.watchers.Done()
	devs := slices.Clone(n.devices)
	n.mu.Unlock()

	set, ret := n.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: creating an event set: %w", ret)
	}
	defer set.Free()
	out := make(map[string]HealthEventTypes, len(devs))
	for _, d := range devs {
		types, reason := register(d, set)
		if reason != "" {
			return nil, fmt.Errorf("NVML: GPU %s: %s", d.UUID, reason)
		}
		out[d.UUID] = types
	}
	return out, nil
}

// nvmlWatch is the state of one WatchHealth call.
type nvmlWatch struct {
	n      *NVML
	ctx    context.Context
	events chan<- HealthEvent
	devs   []nvmlDevice
}

// handle processes one NVML event; it returns false when the watch must stop.
func (w *nvmlWatch) handle(ev nvml.EventData) bool {
	var reason string
	switch {
	case ev.EventType&nvml.EventTypeXidCriticalError != 0:
		if slices.Contains(IgnoredXIDs, ev.EventData) {
			slog.Info("ignoring application XID", "xid", ev.EventData)
			return true
		}
		reason = fmt.Sprintf("XID %d", ev.EventData)
	case ev.EventType&nvml.EventTypeDoubleBitEccError != 0:
		reason = "double-bit ECC error"
	default:
		slog.Debug("ignoring NVML event", "type", ev.EventType, "data", ev.EventData)
		return true
	}

	if ev.Device == nil {
		slog.Error("GPU error reported for no particular GPU; marking every GPU unhealthy", "reason", reason)
		return w.report(w.allUUIDs(), reason)
	}
	uuid, ret := ev.Device.GetUUID()
	if ret != nvml.SUCCESS {
		// The real library reports a device-less event with a null
		// handle, on which GetUUID fails; so does a GPU that fell off
		// the bus. Either way no GPU can be singled out.
		slog.Error("GPU error on a GPU that cannot be identified; marking every GPU unhealthy",
			"reason", reason, "err", ret)
		return w.report(w.allUUIDs(), reason)
	}
	if !slices.ContainsFunc(w.devs, func(d nvmlDevice) bool { return d.UUID == uuid }) {
		slog.Warn("GPU error on a GPU outside the inventory", "uuid", uuid, "reason", reason)
		return true
	}
	slog.Error("GPU error; marking the GPU unhealthy", "uuid", uuid, "reason", reason)
	return w.report([]string{uuid}, reason)
}

func (w *nvmlWatch) allUUIDs() []string {
	out := make([]string, len(w.devs))
	for i, d := range w.devs {
		out[i] = d.UUID
	}
	return out
}

// report marks the GPUs unhealthy and sends one event for each. Every
// observed error is sent, also for a GPU that is already unhealthy, so each
// watcher hears every reason. It returns false when the watch must stop.
func (w *nvmlWatch) report(uuids []string, reason string) bool {
	w.n.mu.Lock()
	for i := range w.n.devices {
		if slices.Contains(uuids, w.n.devices[i].UUID) {
			w.n.devices[i].Healthy = false
		}
	}
	w.n.mu.Unlock()
	for _, u := range uuids {
		select {
		case w.events <- HealthEvent{UUID: u, Healthy: false, Reason: reason}:
		case <-w.ctx.Done():
			return false
		case <-w.n.done:
			return false
		}
	}
	return true
}

// Close stops every WatchHealth call, waits for them to return (at most one
// EventSetWait timeout) and shuts NVML down. Later calls fail with ErrClosed.
func (n *NVML) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	close(n.done)
	n.mu.Unlock()

	n.watchers.Wait()

	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.initialized {
		return nil
	}
	n.initialized = false
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: shutting down: %w", ret)
	}
	return nil
}
