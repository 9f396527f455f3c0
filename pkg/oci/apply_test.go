package oci

import (
	"encoding/json"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

func i64(v int64) *int64 { return &v }

// baseSpec is a container spec as containerd's CRI plugin and Docker write
// them: everything denied, a few devices allowed, mknod of any char/block
// device allowed (Docker), an image env asking for every GPU.
func baseSpec() *specs.Spec {
	mode := os.FileMode(0o666)
	return &specs.Spec{
		Process: &specs.Process{Env: []string{"PATH=/usr/local/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_VERSION=12.4"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/c/hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/ld.so.preload", Type: "bind", Source: "/elsewhere/preload", Options: []string{"rbind", "rw"}},
			// Mounts of the user's that name our destinations in other
			// spellings, lie beneath ours, or mount their parents.
			{Destination: "/etc/ld.so.preload/", Type: "bind", Source: "/elsewhere/preload2", Options: []string{"rbind", "rw"}},
			{Destination: "/etc//ld.so.preload", Type: "bind", Source: "/elsewhere/preload3", Options: []string{"rbind", "rw"}},
			{Destination: "/run/nri-vgpu/./limits", Type: "bind", Source: "/elsewhere/limits", Options: []string{"rbind", "rw"}},
			{Destination: "/run/nri-vgpu/region/usage", Type: "bind", Source: "/elsewhere/usage", Options: []string{"rbind", "rw"}},
			{Destination: "/run/nri-vgpu/ledger/0", Type: "bind", Source: "/elsewhere/shard", Options: []string{"rbind", "rw"}},
			{Destination: "run/nri-vgpu/region", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/etc", Type: "bind", Source: "/elsewhere/etc", Options: []string{"rbind", "rw"}},
			{Destination: "/run/nri-vgpu/", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/run/nri-vgpu-other", Type: "tmpfs", Source: "tmpfs"},
		},
		Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{
				{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229, FileMode: &mode},
				{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0, FileMode: &mode},
			},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"},
				{Allow: true, Type: "c", Access: "m"},
				{Allow: true, Type: "b", Access: "m"},
				{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},
				{Allow: true, Type: "c", Major: i64(10), Minor: i64(229), Access: "rwm"},
				{Allow: true, Type: "c", Major: i64(195), Minor: i64(0), Access: "rw"},
			}},
			// A RuntimeDefault-like policy. NRI's runtime side does not
			// pass defaultErrnoRet of an adjusted policy on (runc then
			// uses EPERM), so it is left out here.
			Seccomp: &specs.LinuxSeccomp{
				DefaultAction: specs.ActErrno,
				Architectures: []specs.Arch{specs.ArchX86_64},
				Syscalls: []specs.LinuxSyscall{
					{Names: []string{"read", "chroot"}, Action: specs.ActAllow},
					{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x7E020000, Op: specs.OpMaskedEqual}}},
				},
			},
		},
	}
}

// probes are the devices whose cgroup access the comparison checks.
func probes(s ...*specs.Spec) []ocitest.Probe {
	ps := []ocitest.Probe{
		{Type: "c", Major: 195, Minor: 0}, {Type: "c", Major: 195, Minor: 1}, {Type: "c", Major: 195, Minor: 7},
		{Type: "c", Major: 195, Minor: 254}, {Type: "c", Major: 195, Minor: 255},
		{Type: "c", Major: ocitest.UVMMajor, Minor: 0}, {Type: "c", Major: ocitest.UVMMajor, Minor: 1},
		{Type: "c", Major: 510, Minor: 1}, {Type: "c", Major: 226, Minor: 1}, {Type: "c", Major: 1, Minor: 3},
		{Type: "c", Major: 10, Minor: 229}, {Type: "b", Major: 8, Minor: 0},
	}
	for _, sp := range s {
		for _, d := range sp.Linux.Devices {
			ps = append(ps, ocitest.Probe{Type: cgroupType(d.Type), Major: d.Major, Minor: d.Minor})
		}
	}
	return ps
}

// The edits applied through an NRI adjustment (with NRI's own runtime-side
// code, as containerd applies it) and applied to the spec directly must give
// the same container: same env, hooks, device nodes, mounts, and the same
// effective device access. Runtimes evaluate the device rules, so the rule
// lists are compared by what they allow, not entry by entry (the NRI path
// also carries the runtime's implicit "rw" rule for every added device).
func TestAppliersAgree(t *testing.T) {
	type tc struct {
		name  string
		edits func(e env) (*Edits, error)
	}
	tests := []tc{
		{"cdi, two GPUs", func(e env) (*Edits, error) { return Compute(gpus(gpu0, gpu1), e.cfg, e.host, testFiles) }},
		{"nvidia-runtime", func(e env) (*Edits, error) {
			e.cfg.Driver.Injection = config.InjectionNVIDIARuntime
			return Compute(gpus(gpu1), e.cfg, e.host, testFiles)
		}},
		{"hide", func(e env) (*Edits, error) { return Hide(e.host, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, config.InjectionAuto, true, ocitest.StandardNodes)
			if err := os.WriteFile(e.host.ProcDevices, []byte("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			edits, err := tt.edits(e)
			if err != nil {
				t.Fatal(err)
			}
			if tt.name != "hide" {
				edits.ConfineSeccomp(baseSpec().Linux.Seccomp)
			}

			viaNRI := baseSpec()
			adj := &api.ContainerAdjustment{}
			edits.ApplyToAdjustment(adj, api.FromOCIMounts(viaNRI.Mounts))
			if err := ocitest.ApplyAdjustment(viaNRI, adj); err != nil {
				t.Fatalf("NRI applying the adjustment: %v", err)
			}
			direct := baseSpec()
			if err := edits.ApplyToSpec(direct); err != nil {
				t.Fatal(err)
			}

			if !reflect.DeepEqual(viaNRI.Process.Env, direct.Process.Env) {
				t.Errorf("env:\n NRI:  %v\n spec: %v", viaNRI.Process.Env, direct.Process.Env)
			}
			if !reflect.DeepEqual(viaNRI.Hooks, direct.Hooks) {
				t.Errorf("hooks:\n NRI:  %+v\n spec: %+v", viaNRI.Hooks, direct.Hooks)
			}
			if tt.name != "hide" {
				// Both carry the pin hook, last (equal but empty would pass above).
				for which, sp := range map[string]*specs.Spec{"NRI": viaNRI, "spec": direct} {
					if sp.Hooks == nil || len(sp.Hooks.CreateContainer) == 0 {
						t.Errorf("%s: no createContainer hook, want the pin hook", which)
						continue
					}
					checkPinHook(t, sp.Hooks.CreateContainer[len(sp.Hooks.CreateContainer)-1])
				}
			}
			if !reflect.DeepEqual(viaNRI.Mounts, direct.Mounts) {
				t.Errorf("mounts:\n NRI:  %+v\n spec: %+v", viaNRI.Mounts, direct.Mounts)
			}
			checkMountsOnTop(t, edits, direct.Mounts)
			// As runc reads them: JSON, where an empty list is no list.
			if nri, spec := mustJSON(t, viaNRI.Linux.Seccomp), mustJSON(t, direct.Linux.Seccomp); nri != spec {
				t.Errorf("seccomp:\n NRI:  %+v\n spec: %+v", viaNRI.Linux.Seccomp, direct.Linux.Seccomp)
			}
			if !reflect.DeepEqual(viaNRI.Linux.Devices, direct.Linux.Devices) {
				t.Errorf("devices:\n NRI:  %+v\n spec: %+v", viaNRI.Linux.Devices, direct.Linux.Devices)
			}
			ps := probes(viaNRI, direct)
			accNRI, err := ocitest.DeviceAccess(viaNRI.Linux.Resources.Devices, ps)
			if err != nil {
				t.Fatalf("runtime would refuse the NRI device rules: %v", err)
			}
			accSpec, err := ocitest.DeviceAccess(direct.Linux.Resources.Devices, ps)
			if err != nil {
				t.Fatalf("runtime would refuse the spec's device rules: %v", err)
			}
			if !reflect.DeepEqual(accNRI, accSpec) {
				t.Errorf("device access differs:\n NRI:  %v\n spec: %v", accNRI, accSpec)
			}

			// And the container is what the edits mean.
			if tt.name == "hide" {
				for _, p := range ps {
					nvidia := p.Major == 195 || p.Major == ocitest.UVMMajor || p.Major == 510
					if nvidia && strings.ContainsAny(accSpec[p], "rw") {
						t.Errorf("hidden container can open %v: %q", p, accSpec[p])
					}
				}
				if v, _ := envValue(direct.Process.Env, EnvVisibleDevices); v != "void" {
					t.Errorf("hidden container has %s=%s", EnvVisibleDevices, v)
				}
				if got := accSpec[ocitest.Probe{Type: "c", Major: 1, Minor: 3}]; got != "rwm" {
					t.Errorf("/dev/null access = %q, want rwm", got)
				}
				if !reflect.DeepEqual(direct.Linux.Seccomp, baseSpec().Linux.Seccomp) {
					t.Errorf("hidden container's seccomp policy changed: %+v", direct.Linux.Seccomp)
				}
			} else {
				for _, d := range edits.Devices {
					p := ocitest.Probe{Type: "c", Major: d.Major, Minor: d.Minor}
					if accSpec[p] != "rwm" {
						t.Errorf("vGPU container access to %s = %q, want rwm", d.Path, accSpec[p])
					}
				}
				if m, ok := findMount(direct.Mounts, ContainerPreloadPath); !ok || m.Source != testFiles.Preload {
					t.Errorf("preload mount = %+v, want ours replacing the image's", m)
				}
				if sc := direct.Linux.Seccomp; sc == nil || slices.ContainsFunc(sc.Syscalls, func(r specs.LinuxSyscall) bool {
					return r.Action == specs.ActAllow && slices.Contains(r.Names, "chroot")
				}) {
					t.Errorf("vGPU container's seccomp policy still allows chroot: %+v", sc)
				}
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkMountsOnTop checks that nothing of the container's own lies over a
// mount of the edits: no other mount at or beneath its destination (in any
// spelling), and every mount of a parent directory comes before it, since
// runtimes mount in spec order.
func checkMountsOnTop(t *testing.T, edits *Edits, mounts []specs.Mount) {
	t.Helper()
	under := func(dest, dir string) bool { return dest == dir || strings.HasPrefix(dest, dir+"/") }
	for _, ours := range edits.Mounts {
		at := slices.IndexFunc(mounts, func(m specs.Mount) bool { return reflect.DeepEqual(m, ours) })
		if at < 0 {
			t.Errorf("mount %s missing", ours.Destination)
			continue
		}
		for i, m := range mounts {
			dest := path.Join("/", m.Destination)
			switch {
			case i == at || slices.ContainsFunc(edits.Mounts, func(o specs.Mount) bool { return reflect.DeepEqual(m, o) }):
			case under(dest, ours.Destination):
				t.Errorf("container mount %q (%s) covers ours at %s", m.Destination, m.Source, ours.Destination)
			case under(ours.Destination, dest) && i > at:
				t.Errorf("container mount %q of a parent directory comes after ours at %s, hiding it", m.Destination, ours.Destination)
			}
		}
	}
	for _, keep := range []string{"/etc", "/run/nri-vgpu/", "/run/nri-vgpu-other", "/etc/hosts"} {
		if len(edits.Mounts) > 0 && !slices.ContainsFunc(mounts, func(m specs.Mount) bool { return m.Destination == keep }) {
			t.Errorf("container mount %s was dropped; only mounts over ours should be", keep)
		}
	}
}
