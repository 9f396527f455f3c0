package oci

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Paths inside a vGPU container (Contract 3). The shim reads only these.
const (
	ContainerShimPath    = "/usr/local/nri-vgpu/libvgpu-shim.so"
	ContainerPreloadPath = "/etc/ld.so.preload"
	ContainerLimitsPath  = "/run/nri-vgpu/limits"
	ContainerRegionDir   = "/run/nri-vgpu/region"
	ContainerLedgerDir   = "/run/nri-vgpu/ledger"
)

// EnvVisibleDevices is the variable nvidia-container-runtime reads to decide
// which GPUs to inject; "void" means none.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// Mount options. The shim must stay executable (it is mapped into every
// process), so only the data files get noexec.
var (
	optsLibraryRO = []string{"rbind", "ro", "nosuid", "nodev"}
	optsDataRO    = []string{"rbind", "ro", "nosuid", "nodev", "noexec"}
	optsDataRW    = []string{"rbind", "rw", "nosuid", "nodev", "noexec"}
)

// Device access granted to the nodes of an allocation, and the access a
// hidden container is denied. Deny rules leave out "m" (mknod): runtimes
// refuse a rule that punches a hole into a wildcard rule holding the same
// permission, and many default specs allow "c *:* m". Without "r" and "w"
// a node cannot be opened, which is what matters.
const (
	accessAllow = "rwm"
	accessDeny  = "rw"
)

// HostFiles are the host paths, besides the shim (paths.shim_path), that
// the edits of a vGPU container bind-mount: whoever provisions them on the
// host (internal/hoststate) says where they are, so that this package only
// computes edits and never touches the host's files.
type HostFiles struct {
	Preload string // the preload file, mounted at ContainerPreloadPath
	Limits  string // the container's limits file, at ContainerLimitsPath
	Region  string // the container's usage region directory, at ContainerRegionDir
	// Ledger is the record's ledger directory (its ledger shards), at
	// ContainerLedgerDir; empty for a record of the previous release,
	// which has none and whose limits file names none.
	Ledger string
	// Hook is the host path of a binary of nri-vgpu that runs the
	// createContainer hook ("hook pin", see PinHook): the caller's own
	// executable, or paths.hook_path (nri-vgpu-hook beside the shim, for
	// the Helm chart). It is a host path like the others because the
	// runtime runs it before the container's root is switched.
	Hook string
}

// check refuses host paths that are not absolute: a relative bind-mount
// source would be resolved by the runtime against a directory of its own.
func (f HostFiles) check() error {
	for _, p := range []struct{ what, path string }{
		{"preload file", f.Preload}, {"limits file", f.Limits}, {"usage region directory", f.Region},
		{"pin hook binary", f.Hook},
	} {
		if !filepath.IsAbs(p.path) {
			return fmt.Errorf("compute edits: host path of the %s %q is not absolute", p.what, p.path)
		}
	}
	if f.Ledger != "" && !filepath.IsAbs(f.Ledger) {
		return fmt.Errorf("compute edits: host path of the ledger directory %q is not absolute", f.Ledger)
	}
	return nil
}

// Compute returns the edits that give a container its GPUs: device nodes
// and their cgroup rules, driver files per driver.injection, the shim, and
// the preload file, limits file, usage region and ledger directory at files
// (Contract 3).
// The GPUs are a signed allocation's, a Docker request's or a claim's; only
// their UUIDs and minors matter here, the quotas being in the limits file.
// It reads host facts but writes nothing.
func Compute(gpus []allocation.GPU, cfg *config.Config, host Host, files HostFiles) (*Edits, error) {
	if len(gpus) == 0 {
		return nil, errors.New("compute edits: no GPUs")
	}
	if err := files.check(); err != nil {
		return nil, err
	}
	e := &Edits{}

	// Device nodes: the control and UVM nodes, then one per GPU.
	type node struct {
		path     string
		required bool
	}
	nodes := []node{{"/dev/nvidiactl", true}, {"/dev/nvidia-uvm", false}, {"/dev/nvidia-uvm-tools", false}}
	for _, g := range gpus {
		if g.Minor < 0 {
			return nil, fmt.Errorf("compute edits: GPU %s: invalid minor %d", g.UUID, g.Minor)
		}
		nodes = append(nodes, node{"/dev/nvidia" + strconv.Itoa(g.Minor), true})
	}
	for _, n := range nodes {
		d, err := host.DriverDeviceNode(n.path)
		if err != nil {
			if !n.required && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("compute edits: device node %s: %w", n.path, err)
		}
		e.addDevice(d, accessAllow)
	}

	// Driver files.
	df, warnings, err := ResolveDriverFiles(cfg, host, files.Hook)
	if err != nil {
		return nil, err
	}
	e.Warnings = append(e.Warnings, warnings...)
	e.DriverFiles = df
	switch df.Mode {
	case config.InjectionCDI, config.InjectionGenerate:
		if err := addCDIEdits(e, df.specs, gpus, host); err != nil {
			return nil, err
		}
		// Keep nvidia-container-runtime, if it is the runtime, from adding
		// GPUs the container does not hold (images set "all").
		e.setEnv(EnvVisibleDevices, "void")
	case config.InjectionNVIDIARuntime:
		uuids := make([]string, len(gpus))
		for i, g := range gpus {
			uuids[i] = g.UUID
		}
		e.setEnv(EnvVisibleDevices, strings.Join(uuids, ","))
	case config.InjectionNone:
		e.setEnv(EnvVisibleDevices, "void")
	}

	// The shim, the preload file that loads it, the limits, the region,
	// the ledger shards.
	e.addMount(bindMount(cfg.Paths.ShimPath, ContainerShimPath, optsLibraryRO))
	e.addMount(bindMount(files.Preload, ContainerPreloadPath, optsDataRO))
	e.addMount(bindMount(files.Limits, ContainerLimitsPath, optsDataRO))
	e.addMount(bindMount(files.Region, ContainerRegionDir, optsDataRW))
	if files.Ledger != "" {
		e.addMount(bindMount(files.Ledger, ContainerLedgerDir, optsDataRO))
	}
	// The hook that makes those paths stay where the loader and the
	// shim look (PinHook); appended after any CDI createContainer hook, so
	// it sees the container's mounts as they will be.
	e.Hooks.CreateContainer = append(e.Hooks.CreateContainer, PinHook(files.Hook))
	return e, nil
}

// PinnedPaths are the container paths the limiter depends on: the pin hook
// checks that each is exactly nri-vgpu's mount and makes every directory
// on the way to them a mount point. Each must be mounted, but for those in
// OptionalPinnedPaths.
var PinnedPaths = []string{ContainerPreloadPath, ContainerShimPath, ContainerLimitsPath, ContainerRegionDir, ContainerLedgerDir}

// OptionalPinnedPaths are the PinnedPaths a vGPU container may lack: the
// ledger directory, which a record of the previous release does not have
// (its limits file names no ledger shards, so the shim never looks there).
// Where the spec mounts one, it is pinned like the others.
var OptionalPinnedPaths = []string{ContainerLedgerDir}

// PinHookArgs are the arguments after the binary's name with which a binary
// of nri-vgpu runs the pin hook.
var PinHookArgs = []string{"hook", "pin"}

// PinHookTimeout bounds the pin hook (seconds): it opens a few paths and
// makes a few mounts.
const PinHookTimeout = 10

// PinHook is the createContainer hook that pins PinnedPaths (Contract 3):
// bin is the host path of the nri-vgpu binary that runs it.
func PinHook(bin string) specs.Hook {
	timeout := PinHookTimeout
	return specs.Hook{Path: bin, Args: append([]string{bin}, PinHookArgs...), Timeout: &timeout}
}

// Hide returns the edits that take GPU access away from a container that has
// no allocation: NVIDIA_VISIBLE_DEVICES=void (so nvidia-container-runtime
// injects nothing), the host's NVIDIA device nodes removed, and device-cgroup
// rules denying every NVIDIA major and node. The deny rules are what holds on
// NRI, which does not pass the removal of a device on to the runtime.
//
// granted are the device nodes already in the container's spec: another
// plugin's grant (a device plugin's DeviceSpecs, the device nodes of a CDI
// device the runtime resolved), since a pod spec cannot add a device node.
// Each stays: it is neither removed nor denied, by its container path and by
// its major:minor (a MIG device's /dev/nvidia-caps node, the parent GPU's
// node). The wildcard denies do not take back their allow rules, which the
// runtime put before these.
func Hide(host Host, granted []specs.LinuxDevice) (*Edits, error) {
	e := &Edits{}
	e.setEnv(EnvVisibleDevices, "void")
	majors, err := host.NVIDIAMajors()
	if err != nil {
		return nil, fmt.Errorf("hide GPUs: %w", err)
	}
	nodes, err := host.NVIDIADeviceNodes()
	if err != nil {
		return nil, fmt.Errorf("hide GPUs: %w", err)
	}
	type number struct{ major, minor int64 }
	keptNumbers := map[number]bool{}
	keptPaths := map[string]bool{}
	for _, g := range granted {
		if g.Type == "c" {
			keptNumbers[number{g.Major, g.Minor}] = true
		}
		keptPaths[path.Clean(g.Path)] = true
	}
	for _, m := range majors {
		major := m
		e.DeviceRules = append(e.DeviceRules, specs.LinuxDeviceCgroup{Allow: false, Type: "c", Major: &major, Access: accessDeny})
	}
	// Wildcard denies do not take back an allow rule for one node (the
	// cgroup keeps exceptions per exact major:minor), so deny each node too.
	for _, d := range nodes {
		major, minor := d.Major, d.Minor
		if !keptNumbers[number{major, minor}] {
			e.DeviceRules = append(e.DeviceRules, specs.LinuxDeviceCgroup{Allow: false, Type: "c", Major: &major, Minor: &minor, Access: accessDeny})
		}
		if !keptNumbers[number{major, minor}] && !keptPaths[d.Path] {
			e.RemoveDevices = append(e.RemoveDevices, d.Path)
		}
	}
	return e, nil
}

// AllowsAllDevices reports whether device-cgroup rules let the container open
// every character device: privileged containers (the last rule for all
// devices allows) and containers with an allow rule for "c *:*" with read
// or write access. Hide must not be applied to those: they asked for every
// device, and runtimes refuse a deny rule that punches a hole into a
// wildcard allow rule.
func AllowsAllDevices(rules []specs.LinuxDeviceCgroup) bool {
	all, char := false, false
	for _, r := range rules {
		if r.Major != nil || r.Minor != nil {
			continue
		}
		switch r.Type {
		case "", "a":
			all, char = r.Allow, false
		case "c":
			if strings.ContainsAny(r.Access, "rw") {
				char = r.Allow
			}
		}
	}
	return all || char
}

func bindMount(src, dst string, opts []string) specs.Mount {
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: slices.Clone(opts)}
}

// DriverFiles is how the driver's files reach GPU containers: driver.injection
// resolved on this node.
type DriverFiles struct {
	// Mode is config.InjectionCDI, InjectionGenerate, InjectionNVIDIARuntime
	// or InjectionNone, never auto.
	Mode string
	// Source says where the files come from, and for auto's fallback to
	// the nvidia runtime why: "CDI spec /etc/cdi/nvidia.yaml",
	// "generated from driver root / (...)", "nvidia-runtime (no CDI spec,
	// no driver libraries under /)".
	Source string

	specs []cdiSource // the CDI specs of the cdi and generate modes
}

// cdiSource is a CDI spec of GPUs: a host spec file or the generated one.
type cdiSource struct {
	name string // the spec file, or what generated it, for errors
	spec *cdispec.Spec
}

// ResolveDriverFiles resolves driver.injection on this node: "auto" takes
// the host's CDI spec of kind nvidia.com/gpu, else the spec generated from
// the driver root when it holds the driver's libraries, else leaves the
// files to nvidia-container-runtime. hook is the host path of the binary
// that runs the hooks of a generated spec (HostFiles.Hook). Warnings, for
// the caller to log, say what auto passed over and why.
func ResolveDriverFiles(cfg *config.Config, host Host, hook string) (DriverFiles, []string, error) {
	mode := cfg.Driver.Injection
	switch mode {
	case config.InjectionNVIDIARuntime:
		return DriverFiles{Mode: mode, Source: "nvidia-runtime (driver.injection = \"nvidia-runtime\")"}, nil, nil
	case config.InjectionNone:
		return DriverFiles{Mode: mode, Source: "none (driver.injection = \"none\")"}, nil, nil
	case config.InjectionGenerate:
		g, err := host.GeneratedCDISpec(hook)
		if err != nil {
			return DriverFiles{}, nil, fmt.Errorf("compute edits: driver.injection = \"generate\": %w", err)
		}
		return generated(g), nil, nil
	case config.InjectionCDI, config.InjectionAuto, "":
	default:
		return DriverFiles{}, nil, fmt.Errorf("compute edits: unknown driver.injection %q", mode)
	}
	var warnings []string
	gpuSpecs, err := host.CDISpecs()
	if len(gpuSpecs) > 0 {
		if err != nil {
			warnings = append(warnings, err.Error())
		}
		df := DriverFiles{Mode: config.InjectionCDI}
		var names []string
		for _, s := range gpuSpecs {
			df.specs = append(df.specs, cdiSource{name: "CDI spec " + s.GetPath(), spec: s.Spec})
			names = append(names, s.GetPath())
		}
		df.Source = "CDI spec " + strings.Join(names, ", ")
		return df, warnings, nil
	}
	if mode == config.InjectionCDI {
		msg := fmt.Sprintf("compute edits: driver.injection = \"cdi\" but no %s CDI spec in %s", CDIKind, strings.Join(cfg.Driver.CDIDirs, ", "))
		if err != nil {
			return DriverFiles{}, nil, fmt.Errorf("%s: %w", msg, err)
		}
		return DriverFiles{}, nil, errors.New(msg + " (generate one with `nvidia-ctk cdi generate`, or set driver.injection = \"generate\")")
	}
	if err != nil {
		warnings = append(warnings, fmt.Sprintf("no usable %s CDI spec: %v", CDIKind, err))
	}
	g, genErr := host.GeneratedCDISpec(hook)
	if genErr == nil {
		return generated(g), warnings, nil
	}
	why := "no driver libraries under " + cmp.Or(cfg.Driver.DriverRoot, "/")
	if !errors.Is(genErr, ErrNoDriverLibraries) {
		// The driver is there but the spec could not be made: say so
		// with every container rather than hide it in the fallback.
		why = "generating from the driver root failed: " + genErr.Error()
		warnings = append(warnings, "no CDI spec, and "+why+"; falling back to nvidia-runtime injection")
	}
	return DriverFiles{Mode: config.InjectionNVIDIARuntime, Source: "nvidia-runtime (no CDI spec, " + why + ")"}, warnings, nil
}

func generated(g *GeneratedSpec) DriverFiles {
	return DriverFiles{Mode: config.InjectionGenerate, Source: g.Describe(),
		specs: []cdiSource{{name: "CDI spec " + g.Describe(), spec: g.Spec}}}
}

// addCDIEdits translates the CDI container edits of the allocated GPUs, and
// the spec-level edits of the specs they come from, into e. It does what the
// CDI library's ContainerEdits.Apply does to a spec, but with device nodes
// looked up through host (dev_root) and without touching a spec, so that the
// same edits can go to an NRI adjustment.
func addCDIEdits(e *Edits, gpuSpecs []cdiSource, gpus []allocation.GPU, host Host) error {
	// Spec-level edits come before the first device of that spec, as the
	// CDI library orders them.
	var (
		all  []*cdispec.ContainerEdits
		used []*cdispec.Spec
	)
	for _, g := range gpus {
		spec, dev, err := findCDIDevice(gpuSpecs, g)
		if err != nil {
			return err
		}
		if !slices.Contains(used, spec.spec) {
			used = append(used, spec.spec)
			all = append(all, &spec.spec.ContainerEdits)
		}
		all = append(all, &dev.ContainerEdits)
	}
	for _, ce := range all {
		if err := translateCDI(e, ce, host); err != nil {
			return err
		}
	}
	return nil
}

// findCDIDevice finds the CDI device of GPU g: the device named by its UUID
// (device-name-strategy uuid), else the one whole-GPU device whose nodes
// include /dev/nvidia<minor> (device-name-strategy index, where the name is
// the NVML index, which the allocation does not carry).
func findCDIDevice(gpuSpecs []cdiSource, g allocation.GPU) (cdiSource, *cdispec.Device, error) {
	for _, s := range gpuSpecs {
		for i := range s.spec.Devices {
			if s.spec.Devices[i].Name == g.UUID {
				return s, &s.spec.Devices[i], nil
			}
		}
	}
	node := "/dev/nvidia" + strconv.Itoa(g.Minor)
	for _, s := range gpuSpecs {
		var found *cdispec.Device
		for i := range s.spec.Devices {
			d := &s.spec.Devices[i]
			if d.Name == "all" || strings.Contains(d.Name, ":") { // "all", MIG devices ("0:1")
				continue
			}
			if !slices.ContainsFunc(d.ContainerEdits.DeviceNodes, func(n *cdispec.DeviceNode) bool { return n.Path == node }) {
				continue
			}
			if found != nil {
				return cdiSource{}, nil, fmt.Errorf("compute edits: %s: devices %q and %q both hold %s; name the GPU by UUID", s.name, found.Name, d.Name, node)
			}
			found = d
		}
		if found != nil {
			return s, found, nil
		}
	}
	var names []string
	for _, s := range gpuSpecs {
		names = append(names, s.name)
	}
	return cdiSource{}, nil, fmt.Errorf("compute edits: no %s CDI device for GPU %s (named by UUID or holding %s) in %s", CDIKind, g.UUID, node, strings.Join(names, ", "))
}

// translateCDI adds one set of CDI container edits to e.
func translateCDI(e *Edits, ce *cdispec.ContainerEdits, host Host) error {
	for _, kv := range ce.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("compute edits: CDI env entry %q is not KEY=VALUE", kv)
		}
		e.setEnv(k, v)
	}
	for _, n := range ce.DeviceNodes {
		d, access, err := cdiDeviceNode(n, host)
		if err != nil {
			return err
		}
		e.addDevice(d, access)
	}
	for _, m := range ce.Mounts {
		e.addMount(specs.Mount{Destination: m.ContainerPath, Type: m.Type, Source: m.HostPath, Options: slices.Clone(m.Options)})
	}
	for _, h := range ce.Hooks {
		hook := specs.Hook{Path: h.Path, Args: slices.Clone(h.Args), Env: slices.Clone(h.Env), Timeout: h.Timeout}
		switch h.HookName {
		case cdi.PrestartHook:
			//lint:ignore SA1019 prestart hooks are deprecated in the OCI spec but still run, and CDI specs may use them
			e.Hooks.Prestart = append(e.Hooks.Prestart, hook)
		case cdi.CreateRuntimeHook:
			e.Hooks.CreateRuntime = append(e.Hooks.CreateRuntime, hook)
		case cdi.CreateContainerHook:
			e.Hooks.CreateContainer = append(e.Hooks.CreateContainer, hook)
		case cdi.StartContainerHook:
			e.Hooks.StartContainer = append(e.Hooks.StartContainer, hook)
		case cdi.PoststartHook:
			e.Hooks.Poststart = append(e.Hooks.Poststart, hook)
		case cdi.PoststopHook:
			e.Hooks.Poststop = append(e.Hooks.Poststop, hook)
		default:
			return fmt.Errorf("compute edits: CDI hook %s: unknown hook name %q", h.Path, h.HookName)
		}
	}
	if len(ce.AdditionalGIDs) > 0 {
		e.Warnings = append(e.Warnings, fmt.Sprintf("CDI additionalGids %v not applied: NRI adjustments cannot add groups", ce.AdditionalGIDs))
	}
	if ce.IntelRdt != nil || len(ce.NetDevices) > 0 {
		e.Warnings = append(e.Warnings, "CDI intelRdt/netDevices edits not applied: not GPU edits")
	}
	return nil
}

// cdiDeviceNode resolves a CDI device node the way the CDI library does:
// type, major and minor from the host node unless the spec gives them.
func cdiDeviceNode(n *cdispec.DeviceNode, host Host) (specs.LinuxDevice, string, error) {
	hostPath := n.HostPath
	if hostPath == "" {
		hostPath = n.Path
	}
	d := specs.LinuxDevice{Path: n.Path, Type: n.Type, Major: n.Major, Minor: n.Minor, FileMode: n.FileMode, UID: n.UID, GID: n.GID}
	minimal := n.Type != "" && (n.Major != 0 || n.Type == "p")
	hd, err := host.DeviceNode(hostPath)
	switch {
	case err != nil && !minimal:
		return d, "", fmt.Errorf("compute edits: CDI device node %s (host %s): %w", n.Path, hostPath, err)
	case err == nil:
		if d.FileMode == nil {
			d.FileMode = hd.FileMode
		}
		if !minimal {
			if d.Type != "" && cgroupType(d.Type) != hd.Type {
				return d, "", fmt.Errorf("compute edits: CDI device node %s: type %q but host node %s is %q", n.Path, d.Type, hostPath, hd.Type)
			}
			if d.Type == "" {
				d.Type = hd.Type
			}
			if d.Type != "p" && d.Major == 0 {
				d.Major, d.Minor = hd.Major, hd.Minor
			}
		}
	}
	access := n.Permissions
	switch access {
	case "":
		access = accessAllow
	case cdi.NoPermissions:
		access = ""
	}
	return d, access, nil
}
