package oci

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Edits is the edit set of one container: what Compute or Hide decided,
// independent of how it reaches the container. Apply it with
// ApplyToAdjustment (NRI) or ApplyToSpec (an OCI bundle's config.json).
//
// The appliers follow the order in which the NRI runtime side applies an
// adjustment to a spec (environment, hooks, device nodes, device-cgroup rules,
// mounts), so that both produce the same container.
type Edits struct {
	// Env holds KEY=VALUE entries, at most one per key. A key the container
	// already has is replaced in place; new keys are appended in order.
	Env []string
	// Devices are the device nodes to create in the container. A node the
	// container already has at the same path is replaced.
	Devices []specs.LinuxDevice
	// DeviceRules are device-cgroup rules appended after the container's own
	// rules. For every device in Devices there is an allow rule here.
	DeviceRules []specs.LinuxDeviceCgroup
	// RemoveDevices are container paths of device nodes to drop from the
	// container. NRI runtimes do not pass such removals on, which is why Hide
	// also denies the devices in DeviceRules.
	RemoveDevices []string
	// Mounts are added to the container. A mount of the container's own at
	// the same destination (after cleaning: "/etc//ld.so.preload/" is
	// /etc/ld.so.preload) or beneath one of these is dropped, so that none
	// can lie over the read-only preload, shim or limits. Mounts of parent
	// directories (/etc, /run) stay: runtimes mount by depth, so these
	// always go on top of them.
	Mounts []specs.Mount
	// Hooks are appended to the container's hooks of the same stage.
	Hooks specs.Hooks
	// Seccomp, when set, replaces the container's seccomp policy: the
	// confinement of a GPU container (see Confine and ConfineSeccomp).
	Seccomp *specs.LinuxSeccomp
	// Warnings name edits that could not be expressed (for the caller to
	// log); they do not make the container unsafe.
	Warnings []string
	// DriverFiles is how Compute gave the container the driver's files.
	DriverFiles DriverFiles
}

// ConfineSeccomp sets the edits' seccomp policy to the confinement of a
// container whose own policy is own (nil: unconfined).
func (e *Edits) ConfineSeccomp(own *specs.LinuxSeccomp) { e.Seccomp = Confine(own) }

// setEnv sets key=value, replacing an earlier value of key in place.
func (e *Edits) setEnv(key, value string) {
	kv := key + "=" + value
	for i, cur := range e.Env {
		if k, _, _ := strings.Cut(cur, "="); k == key {
			e.Env[i] = kv
			return
		}
	}
	e.Env = append(e.Env, kv)
}

// addDevice adds a device node and, for block and character devices, its
// allow rule with the given access ("" = no rule).
func (e *Edits) addDevice(d specs.LinuxDevice, access string) {
	e.Devices = slices.DeleteFunc(e.Devices, func(cur specs.LinuxDevice) bool { return cur.Path == d.Path })
	e.Devices = append(e.Devices, d)
	if access == "" || (d.Type != "c" && d.Type != "b" && d.Type != "u") {
		return
	}
	major, minor := d.Major, d.Minor
	e.DeviceRules = append(e.DeviceRules, specs.LinuxDeviceCgroup{
		Allow: true, Type: cgroupType(d.Type), Major: &major, Minor: &minor, Access: access,
	})
}

// addMount adds m, replacing an earlier mount with the same destination.
func (e *Edits) addMount(m specs.Mount) {
	m.Destination = filepath.Clean(m.Destination)
	e.Mounts = slices.DeleteFunc(e.Mounts, func(cur specs.Mount) bool { return cur.Destination == m.Destination })
	e.Mounts = append(e.Mounts, m)
}

// covers reports whether a container mount at dest would lie at or beneath
// one of the edits' mounts, and so cover part of it. Destinations are
// compared cleaned and absolute, as the runtime resolves them (runc takes a
// relative destination as relative to the container's root).
func (e *Edits) covers(dest string) bool {
	d := path.Join("/", dest)
	for _, m := range e.Mounts {
		if d == m.Destination || strings.HasPrefix(d, m.Destination+"/") {
			return true
		}
	}
	return false
}

// replaces reports whether one of the edits' mounts has exactly the
// destination dest: the runtime replaces such a mount itself when it adds
// ours.
func (e *Edits) replaces(dest string) bool {
	return slices.ContainsFunc(e.Mounts, func(m specs.Mount) bool { return m.Destination == dest })
}

// cgroupType maps a device node type to its device-cgroup type: "u"
// (unbuffered character device) is "c" to the cgroup.
func cgroupType(t string) string {
	if t == "u" {
		return "c"
	}
	return t
}

// ApplyToAdjustment records the edits in an NRI container adjustment for a
// container that has the given mounts (api.Container.Mounts): those that
// would cover one of the edits' mounts are removed.
func (e *Edits) ApplyToAdjustment(adj *api.ContainerAdjustment, mounts []*api.Mount) {
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		adj.AddEnv(k, v)
	}
	if hooks := api.FromOCIHooks(&e.Hooks); hooks.Hooks() != nil {
		adj.AddHooks(hooks)
	}
	for _, p := range e.RemoveDevices {
		adj.RemoveDevice(p)
	}
	for _, d := range api.FromOCILinuxDevices(e.Devices) {
		// The runtime adds an allow rule ("rw") for every device it is
		// given; DeviceRules below carry the intended access.
		adj.AddDevice(d)
	}
	if len(e.DeviceRules) > 0 {
		if adj.Linux == nil {
			adj.Linux = &api.LinuxContainerAdjustment{}
		}
		if adj.Linux.Resources == nil {
			adj.Linux.Resources = &api.LinuxResources{}
		}
		for _, r := range e.DeviceRules {
			adj.Linux.Resources.Devices = append(adj.Linux.Resources.Devices, &api.LinuxDeviceCgroup{
				Allow:  r.Allow,
				Type:   r.Type,
				Major:  api.Int64(r.Major),
				Minor:  api.Int64(r.Minor),
				Access: r.Access,
			})
		}
	}
	// One removal per mount: the runtime removes the first mount with the
	// destination named. Mounts at exactly our destinations are replaced
	// by the runtime when it adds ours, and a removal of the same
	// destination as an addition would be dropped by NRI anyway.
	for _, m := range mounts {
		if e.covers(m.GetDestination()) && !e.replaces(m.GetDestination()) {
			adj.RemoveMount(m.GetDestination())
		}
	}
	for _, m := range api.FromOCIMounts(e.Mounts) {
		adj.AddMount(m)
	}
	if e.Seccomp != nil {
		adj.SetLinuxSeccompPolicy(api.FromOCILinuxSeccomp(e.Seccomp))
	}
}

// ApplyToSpec edits an OCI runtime spec in place, the way an NRI runtime
// applies the adjustment made by ApplyToAdjustment.
func (e *Edits) ApplyToSpec(spec *specs.Spec) error {
	if spec == nil {
		return fmt.Errorf("apply edits: nil OCI spec")
	}
	if len(e.Env) > 0 {
		if spec.Process == nil {
			spec.Process = &specs.Process{}
		}
		spec.Process.Env = mergeEnv(spec.Process.Env, e.Env)
	}
	if !hooksEmpty(&e.Hooks) {
		if spec.Hooks == nil {
			spec.Hooks = &specs.Hooks{}
		}
		h := spec.Hooks
		//lint:ignore SA1019 prestart hooks are deprecated in the OCI spec but still run, and CDI specs may use them
		h.Prestart = append(h.Prestart, e.Hooks.Prestart...)
		h.CreateRuntime = append(h.CreateRuntime, e.Hooks.CreateRuntime...)
		h.CreateContainer = append(h.CreateContainer, e.Hooks.CreateContainer...)
		h.StartContainer = append(h.StartContainer, e.Hooks.StartContainer...)
		h.Poststart = append(h.Poststart, e.Hooks.Poststart...)
		h.Poststop = append(h.Poststop, e.Hooks.Poststop...)
	}
	if len(e.RemoveDevices) > 0 || len(e.Devices) > 0 || len(e.DeviceRules) > 0 {
		if spec.Linux == nil {
			spec.Linux = &specs.Linux{}
		}
	}
	for _, p := range e.RemoveDevices {
		spec.Linux.Devices = removeDevice(spec.Linux.Devices, p)
	}
	for _, d := range e.Devices {
		spec.Linux.Devices = append(removeDevice(spec.Linux.Devices, d.Path), d)
	}
	if len(e.DeviceRules) > 0 {
		if spec.Linux.Resources == nil {
			spec.Linux.Resources = &specs.LinuxResources{}
		}
		spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, e.DeviceRules...)
	}
	if len(e.Mounts) > 0 {
		spec.Mounts = slices.DeleteFunc(spec.Mounts, func(cur specs.Mount) bool { return e.covers(cur.Destination) })
		for _, m := range e.Mounts {
			m.Options = slices.Clone(m.Options)
			spec.Mounts = append(spec.Mounts, m)
		}
		SortMounts(spec.Mounts)
	}
	if e.Seccomp != nil {
		if spec.Linux == nil {
			spec.Linux = &specs.Linux{}
		}
		spec.Linux.Seccomp = e.Seccomp
	}
	return nil
}

// mergeEnv replaces the keys of add that env already has in place and
// appends the others in order.
func mergeEnv(env, add []string) []string {
	out := slices.Clone(env)
	for _, kv := range add {
		key, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, cur := range out {
			if k, _, _ := strings.Cut(cur, "="); k == key {
				out[i] = kv
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

func removeDevice(devs []specs.LinuxDevice, path string) []specs.LinuxDevice {
	return slices.DeleteFunc(devs, func(d specs.LinuxDevice) bool { return d.Path == path })
}

func hooksEmpty(h *specs.Hooks) bool {
	//lint:ignore SA1019 prestart hooks are deprecated in the OCI spec but still run, and CDI specs may use them
	return len(h.Prestart) == 0 && len(h.CreateRuntime) == 0 && len(h.CreateContainer) == 0 &&
		len(h.StartContainer) == 0 && len(h.Poststart) == 0 && len(h.Poststop) == 0
}

// SortMounts orders mounts so that a mount never comes before the mount of a
// parent directory: by the depth of the destination, then by destination.
// NRI runtimes and Docker sort the same way after adding mounts.
func SortMounts(mounts []specs.Mount) {
	depth := func(m specs.Mount) int {
		return strings.Count(filepath.Clean(m.Destination), string(os.PathSeparator))
	}
	sort.SliceStable(mounts, func(i, j int) bool {
		di, dj := depth(mounts[i]), depth(mounts[j])
		if di != dj {
			return di < dj
		}
		return mounts[i].Destination < mounts[j].Destination
	})
}
