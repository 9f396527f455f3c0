// Package ocitest holds test helpers shared by the packages that apply edits:
// a spec generator for NRI's runtime-side adjustment code, a device-cgroup
// evaluator with the runtime's semantics, and fake NVIDIA device nodes.
package ocitest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/runtime-tools/generate"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ApplyAdjustment applies an NRI container adjustment to spec with NRI's own
// runtime-side code (pkg/runtime-tools/generate), as containerd does.
func ApplyAdjustment(spec *specs.Spec, adj *api.ContainerAdjustment) error {
	return generate.SpecGenerator(&Generator{spec: spec}).Adjust(adj)
}

// Generator implements generate.UnderlyingGenerator directly on a spec, with
// the semantics of runtime-tools' generator (which does not build against
// runtime-spec v1.3): adding a device, env variable or annotation replaces an
// existing one of the same key.
type Generator struct{ spec *specs.Spec }

var _ generate.UnderlyingGenerator = (*Generator)(nil)

func (g *Generator) process() *specs.Process {
	if g.spec.Process == nil {
		g.spec.Process = &specs.Process{}
	}
	return g.spec.Process
}

func (g *Generator) linux() *specs.Linux {
	if g.spec.Linux == nil {
		g.spec.Linux = &specs.Linux{}
	}
	return g.spec.Linux
}

func (g *Generator) resources() *specs.LinuxResources {
	if g.linux().Resources == nil {
		g.spec.Linux.Resources = &specs.LinuxResources{}
	}
	return g.spec.Linux.Resources
}

func (g *Generator) hooks() *specs.Hooks {
	if g.spec.Hooks == nil {
		g.spec.Hooks = &specs.Hooks{}
	}
	return g.spec.Hooks
}

func (g *Generator) cpu() *specs.LinuxCPU {
	if g.resources().CPU == nil {
		g.spec.Linux.Resources.CPU = &specs.LinuxCPU{}
	}
	return g.spec.Linux.Resources.CPU
}

func (g *Generator) memory() *specs.LinuxMemory {
	if g.resources().Memory == nil {
		g.spec.Linux.Resources.Memory = &specs.LinuxMemory{}
	}
	return g.spec.Linux.Resources.Memory
}

func (g *Generator) AddAnnotation(key, value string) {
	if g.spec.Annotations == nil {
		g.spec.Annotations = map[string]string{}
	}
	g.spec.Annotations[key] = value
}

func (g *Generator) RemoveAnnotation(key string) { delete(g.spec.Annotations, key) }

func (g *Generator) AddDevice(d specs.LinuxDevice) {
	l := g.linux()
	for i := range l.Devices {
		if l.Devices[i].Path == d.Path {
			l.Devices[i] = d
			return
		}
	}
	l.Devices = append(l.Devices, d)
}

func (g *Generator) RemoveDevice(path string) {
	if g.spec.Linux == nil {
		return
	}
	g.spec.Linux.Devices = slices.DeleteFunc(g.spec.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == path })
}

func (g *Generator) AddLinuxResourcesDevice(allow bool, devType string, major, minor *int64, access string) {
	r := g.resources()
	r.Devices = append(r.Devices, specs.LinuxDeviceCgroup{Allow: allow, Type: devType, Major: major, Minor: minor, Access: access})
}

func (g *Generator) AddOrReplaceLinuxNamespace(ns, path string) error {
	l := g.linux()
	t := specs.LinuxNamespaceType(ns)
	for i := range l.Namespaces {
		if l.Namespaces[i].Type == t {
			l.Namespaces[i].Path = path
			return nil
		}
	}
	l.Namespaces = append(l.Namespaces, specs.LinuxNamespace{Type: t, Path: path})
	return nil
}

func (g *Generator) RemoveLinuxNamespace(ns string) error {
	l := g.linux()
	l.Namespaces = slices.DeleteFunc(l.Namespaces, func(n specs.LinuxNamespace) bool { return string(n.Type) == ns })
	return nil
}

func (g *Generator) AddPreStartHook(h specs.Hook) {
	//lint:ignore SA1019 the runtime still runs prestart hooks
	g.hooks().Prestart = append(g.hooks().Prestart, h)
}
func (g *Generator) AddPostStartHook(h specs.Hook) {
	g.hooks().Poststart = append(g.hooks().Poststart, h)
}
func (g *Generator) AddPostStopHook(h specs.Hook) { g.hooks().Poststop = append(g.hooks().Poststop, h) }

func (g *Generator) AddProcessEnv(name, value string) {
	p := g.process()
	for i, kv := range p.Env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			p.Env[i] = name + "=" + value
			return
		}
	}
	p.Env = append(p.Env, name+"="+value)
}

func (g *Generator) ClearProcessEnv() {
	if g.spec.Process != nil {
		g.spec.Process.Env = nil
	}
}

func (g *Generator) AddLinuxResourcesHugepageLimit(pageSize string, limit uint64) {
	r := g.resources()
	r.HugepageLimits = append(r.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: pageSize, Limit: limit})
}

func (g *Generator) AddLinuxResourcesUnified(key, val string) {
	r := g.resources()
	if r.Unified == nil {
		r.Unified = map[string]string{}
	}
	r.Unified[key] = val
}

func (g *Generator) AddMount(m specs.Mount) { g.spec.Mounts = append(g.spec.Mounts, m) }

// RemoveMount removes the first mount at dest, as runtime-tools' generator does.
func (g *Generator) RemoveMount(dest string) {
	if i := slices.IndexFunc(g.spec.Mounts, func(m specs.Mount) bool { return m.Destination == dest }); i >= 0 {
		g.spec.Mounts = slices.Delete(g.spec.Mounts, i, i+1)
	}
}

func (g *Generator) ClearMounts() { g.spec.Mounts = nil }

func (g *Generator) Mounts() []specs.Mount { return g.spec.Mounts }

func (g *Generator) AddLinuxSysctl(key, value string) {
	l := g.linux()
	if l.Sysctl == nil {
		l.Sysctl = map[string]string{}
	}
	l.Sysctl[key] = value
}

func (g *Generator) RemoveLinuxSysctl(key string) {
	if g.spec.Linux != nil {
		delete(g.spec.Linux.Sysctl, key)
	}
}

func (g *Generator) SetProcessArgs(args []string)      { g.process().Args = args }
func (g *Generator) SetLinuxCgroupsPath(path string)   { g.linux().CgroupsPath = path }
func (g *Generator) SetLinuxResourcesCPUCpus(c string) { g.cpu().Cpus = c }
func (g *Generator) SetLinuxResourcesCPUMems(m string) { g.cpu().Mems = m }
func (g *Generator) SetLinuxResourcesCPUPeriod(p uint64) {
	g.cpu().Period = &p
}
func (g *Generator) SetLinuxResourcesCPUQuota(q int64) { g.cpu().Quota = &q }
func (g *Generator) SetLinuxResourcesCPURealtimePeriod(p uint64) {
	g.cpu().RealtimePeriod = &p
}
func (g *Generator) SetLinuxResourcesCPURealtimeRuntime(t int64) {
	g.cpu().RealtimeRuntime = &t
}
func (g *Generator) SetLinuxResourcesCPUShares(s uint64)  { g.cpu().Shares = &s }
func (g *Generator) SetLinuxResourcesMemoryLimit(l int64) { g.memory().Limit = &l }
func (g *Generator) SetLinuxResourcesMemorySwap(s int64)  { g.memory().Swap = &s }

func (g *Generator) SetLinuxRootPropagation(rp string) error {
	switch rp {
	case "", "private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable":
		g.linux().RootfsPropagation = rp
		return nil
	}
	return fmt.Errorf("rootfs propagation %q is not valid", rp)
}

func (g *Generator) SetProcessOOMScoreAdj(adj int) { g.process().OOMScoreAdj = &adj }

func (g *Generator) Spec() *specs.Spec { return g.spec }

// DeviceAccess evaluates device-cgroup rules the way runc does (its cgroup v1
// emulator, which it also uses to build the cgroup v2 filter): a rule for
// all devices resets the default, other rules add or remove exceptions for
// exactly their type:major:minor, and removing a permission that a wildcard
// exception also holds is an error. It returns, per probe, the access the
// container gets ("" = none), in the order r, w, m.
func DeviceAccess(rules []specs.LinuxDeviceCgroup, probes []Probe) (map[Probe]string, error) {
	type meta struct {
		typ          string
		major, minor int64
	}
	const wildcard = -1
	defaultAllow := false
	exc := map[meta]string{}
	for i, r := range rules {
		m := meta{typ: r.Type, major: wildcard, minor: wildcard}
		if r.Major != nil {
			m.major = *r.Major
		}
		if r.Minor != nil {
			m.minor = *r.Minor
		}
		if m.typ == "" || m.typ == "a" {
			defaultAllow, exc = r.Allow, map[meta]string{}
			continue
		}
		if r.Allow != defaultAllow { // adds an exception
			exc[m] = union(exc[m], r.Access)
			continue
		}
		for _, p := range []meta{{m.typ, wildcard, m.minor}, {m.typ, m.major, wildcard}, {m.typ, wildcard, wildcard}} {
			if p != m && intersect(exc[p], r.Access) != "" {
				return nil, fmt.Errorf("rule %d (%+v) punches a hole in wildcard exception %v %q", i, r, p, exc[p])
			}
		}
		exc[m] = minus(exc[m], r.Access)
	}
	out := map[Probe]string{}
	for _, p := range probes {
		matched := ""
		for _, m := range []meta{{p.Type, p.Major, p.Minor}, {p.Type, wildcard, p.Minor}, {p.Type, p.Major, wildcard}, {p.Type, wildcard, wildcard}} {
			matched = union(matched, exc[m])
		}
		if defaultAllow {
			out[p] = minus("rwm", matched)
		} else {
			out[p] = matched
		}
	}
	return out, nil
}

// Probe is a device whose access DeviceAccess reports.
type Probe struct {
	Type         string
	Major, Minor int64
}

func union(a, b string) string { return canon(a + b) }

func intersect(a, b string) string {
	var s string
	for _, c := range a {
		if strings.ContainsRune(b, c) {
			s += string(c)
		}
	}
	return canon(s)
}

func minus(a, b string) string {
	var s string
	for _, c := range a {
		if !strings.ContainsRune(b, c) {
			s += string(c)
		}
	}
	return canon(s)
}

func canon(s string) string {
	var out string
	for _, c := range "rwm" {
		if strings.ContainsRune(s, c) {
			out += string(c)
		}
	}
	return out
}

// Node is a fake device node for FakeDevRoot.
type Node struct {
	Path         string // relative to the root, e.g. "dev/nvidia0"
	Major, Minor uint32
}

// UVMMajor is the major FakeDevRoot gives nvidia-uvm; the real one is
// assigned when the driver loads.
const UVMMajor = 511

// StandardNodes are the nodes of a host with two GPUs (minors 0 and 1).
var StandardNodes = []Node{
	{"dev/nvidiactl", 195, 255},
	{"dev/nvidia-modeset", 195, 254},
	{"dev/nvidia0", 195, 0},
	{"dev/nvidia1", 195, 1},
	{"dev/nvidia-uvm", UVMMajor, 0},
	{"dev/nvidia-uvm-tools", UVMMajor, 1},
	{"dev/nvidia-caps/nvidia-cap1", 510, 1},
	{"dev/dri/card1", 226, 1},
	{"dev/dri/renderD128", 226, 128},
	{"dev/dri/card2", 226, 2},
	{"dev/dri/renderD129", 226, 129},
}

// FakeDevRoot creates character device nodes under a new temporary root and
// returns it. Creating device nodes needs CAP_MKNOD: the test is skipped
// without it.
func FakeDevRoot(t testing.TB, nodes []Node) string {
	t.Helper()
	root := t.TempDir()
	for _, n := range nodes {
		p := filepath.Join(root, n.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.Major, n.Minor)))
		if err != nil {
			if os.Geteuid() != 0 || err == unix.EPERM {
				t.Skipf("cannot create device nodes (need root/CAP_MKNOD): %v", err)
			}
			t.Fatalf("mknod %s: %v", p, err)
		}
		// mknod applied the umask.
		if err := os.Chmod(p, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	return root
}
