package nriplugin

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// Hand-written: linux/sched.h and asm-generic/errno-base.h.
const (
	tCloneNewNS   = 0x00020000
	tCloneNewUser = 0x10000000
	tEPERM        = 1
	tENOSYS       = 38
)

// deniedBy reports whether the policy has an unconditional rule refusing
// name with errno.
func deniedBy(p *api.LinuxSeccomp, name string, errno uint32) bool {
	return slices.ContainsFunc(p.GetSyscalls(), func(r *api.LinuxSyscall) bool {
		return r.GetAction() == "SCMP_ACT_ERRNO" && r.GetErrnoRet().GetValue() == errno &&
			len(r.GetArgs()) == 0 && slices.Contains(r.GetNames(), name)
	})
}

// deniedWithFlag reports whether the policy refuses name (EPERM) when arg 0
// has flag set.
func deniedWithFlag(p *api.LinuxSeccomp, name string, flag uint64) bool {
	return slices.ContainsFunc(p.GetSyscalls(), func(r *api.LinuxSyscall) bool {
		return r.GetAction() == "SCMP_ACT_ERRNO" && r.GetErrnoRet().GetValue() == tEPERM &&
			slices.Contains(r.GetNames(), name) && len(r.GetArgs()) == 1 &&
			r.GetArgs()[0].GetIndex() == 0 && r.GetArgs()[0].GetOp() == "SCMP_CMP_MASKED_EQ" &&
			r.GetArgs()[0].GetValue() == flag && r.GetArgs()[0].GetValueTwo() == flag
	})
}

// A tenant's GPU container in a default pod (seccomp Unconfined) gets a
// policy that lets everything through but the ways around the preload; a
// container of the same pod without a GPU gets none.
func TestGPUContainerIsConfined(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	adj, err := h.create(p, container("c1", p, ann))
	if err != nil {
		t.Fatal(err)
	}
	sc := adj.GetLinux().GetSeccompPolicy()
	if sc == nil {
		t.Fatal("the GPU container's adjustment sets no seccomp policy")
	}
	if sc.GetDefaultAction() != "SCMP_ACT_ALLOW" {
		t.Errorf("default action %s, want SCMP_ACT_ALLOW (the pod was unconfined)", sc.GetDefaultAction())
	}
	for _, name := range []string{"mount", "umount2", "chroot", "pivot_root", "setns", "open_tree", "move_mount", "fsopen", "mount_setattr"} {
		if !deniedBy(sc, name, tEPERM) {
			t.Errorf("%s is not refused with EPERM", name)
		}
	}
	if !deniedBy(sc, "clone3", tENOSYS) {
		t.Errorf("clone3 does not fail with ENOSYS")
	}
	for _, name := range []string{"clone", "unshare"} {
		if !deniedWithFlag(sc, name, tCloneNewUser) || !deniedWithFlag(sc, name, tCloneNewNS) {
			t.Errorf("%s is not refused with CLONE_NEWUSER and with CLONE_NEWNS", name)
		}
	}
	// What containerd would run.
	if got := specFor(t, adj).Linux.Seccomp; got == nil || got.DefaultAction != "SCMP_ACT_ALLOW" {
		t.Errorf("the runtime's spec has seccomp %+v", got)
	}

	plain, err := h.create(p, container("c2", p, ""))
	if err != nil {
		t.Fatal(err)
	}
	if plain.GetLinux().GetSeccompPolicy() != nil {
		t.Errorf("a container without a GPU got a seccomp policy: %v", plain.GetLinux().GetSeccompPolicy())
	}
}

// A pod with RuntimeDefault keeps its profile, narrowed: its default action
// and rules stay, chroot leaves the allow rule.
func TestConfinementKeepsThePodsProfile(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	c := container("c1", p, ann)
	c.Linux.SeccompProfile = &api.SecurityProfile{ProfileType: api.SecurityProfile_RUNTIME_DEFAULT}
	c.Linux.SeccompPolicy = &api.LinuxSeccomp{
		DefaultAction: "SCMP_ACT_ERRNO",
		DefaultErrno:  &api.OptionalUInt32{Value: 1},
		Architectures: []string{"SCMP_ARCH_X86_64"},
		Syscalls: []*api.LinuxSyscall{
			{Names: []string{"read", "chroot"}, Action: "SCMP_ACT_ALLOW"},
			{Names: []string{"clone"}, Action: "SCMP_ACT_ALLOW", Args: []*api.LinuxSeccompArg{{Index: 0, Value: 0x7E020000, Op: "SCMP_CMP_MASKED_EQ"}}},
		},
	}
	adj, err := h.create(p, c)
	if err != nil {
		t.Fatal(err)
	}
	sc := adj.GetLinux().GetSeccompPolicy()
	if sc.GetDefaultAction() != "SCMP_ACT_ERRNO" || sc.GetDefaultErrno().GetValue() != 1 {
		t.Errorf("default %s errno %v, want the pod's SCMP_ACT_ERRNO, 1", sc.GetDefaultAction(), sc.GetDefaultErrno())
	}
	if got := sc.GetSyscalls(); len(got) != 2 || !slices.Equal(got[0].GetNames(), []string{"read"}) || !slices.Equal(got[1].GetNames(), []string{"clone"}) {
		t.Errorf("rules %v, want the pod's two with chroot gone", got)
	}
}

// On containerd 1.7 (NRI v0.8, which drops the adjustment), "required"
// refuses the GPU container with an error that says why and leaves no host
// files; "best-effort" lets it run unconfined and sends no policy; an exempt
// namespace runs unconfined either way.
func TestConfinementRequiredRefuses(t *testing.T) {
	for _, tt := range []struct {
		policy, namespace string
		refused           bool
	}{
		{config.ConfinementRequired, "ml", true},
		{config.ConfinementBestEffort, "ml", false},
		{config.ConfinementRequired, "ci-builds", false},
	} {
		t.Run(tt.policy+"/"+tt.namespace, func(t *testing.T) {
			cfg := newConfig(t)
			cfg.NRI.Confinement = tt.policy
			cfg.NRI.ConfinementExempt = []config.ConfinementExemption{{Namespace: "ci-builds"}}
			h := newHarness(t, cfg)
			asContainerd17(t, h.plugin)
			ann, _ := sign(t, h.key, gpu0)
			p := pod("sb1", "uid-1")
			p.Namespace = tt.namespace
			c := container("c1", p, ann)
			c.Linux.SeccompProfile = nil // as containerd 1.7 passes it
			adj, err := h.create(p, c)
			if !tt.refused {
				if err != nil {
					t.Fatal(err)
				}
				if adj.GetLinux().GetSeccompPolicy() != nil {
					t.Errorf("a policy was sent without the container's own: it would replace a profile nri-vgpu was not shown")
				}
				return
			}
			if err == nil {
				t.Fatal("the GPU container was created unconfined")
			}
			for _, want := range []string{`nri.confinement = "required"`, "containerd 1.7.35+unknown (NRI v0.8.0) does not apply NRI seccomp adjustments"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if _, err := hoststate.New(cfg).Info("c1"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the refused container's host directory is left: %v", err)
			}
		})
	}
}

// asContainerd17 makes the plugin take the runtime for containerd 1.7.35,
// which reports no NRI version.
func asContainerd17(t *testing.T, pl *Plugin) {
	t.Helper()
	pl.mu.Lock()
	pl.stub = nil
	pl.mu.Unlock()
	if _, err := pl.Configure(context.Background(), "", "containerd", "1.7.35+unknown"); err != nil {
		t.Fatal(err)
	}
}

// What the runtime says of itself at Configure decides: containerd 1.7
// (NRI v0.8) cannot confine, and runtime.json says so for status and
// metrics; containerd 2.4 can. A container of an old runtime is refused
// under "required" even if it came with a profile.
func TestConfigureDecidesByRuntime(t *testing.T) {
	cfg := newConfig(t)
	cfg.NRI.Confinement = config.ConfinementRequired
	h := newHarness(t, cfg)
	pl := h.plugin
	pl.mu.Lock()
	pl.stub = nil // as if the runtime reported no NRI version
	pl.mu.Unlock()

	asContainerd17(t, pl)
	rt, err := hoststate.ReadRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Confinement || rt.NRIVersion != "v0.8.0" || !strings.Contains(rt.Reason, "containerd 1.7.35+unknown (NRI v0.8.0) does not apply NRI seccomp adjustments") || rt.ConfinementPolicy != "required" {
		t.Errorf("runtime.json for containerd 1.7.35 = %+v", rt)
	}
	ann, _ := sign(t, h.key, gpu0)
	pd := pod("sb1", "uid-1")
	if _, _, err := pl.CreateContainer(context.Background(), pd, container("c1", pd, ann)); err == nil || !strings.Contains(err.Error(), "1.7.35") {
		t.Errorf("GPU container on containerd 1.7.35 under required: err = %v, want a refusal naming the runtime", err)
	}

	if _, err := pl.Configure(context.Background(), "", "containerd", "v2.4.2"); err != nil {
		t.Fatal(err)
	}
	if rt, err := hoststate.ReadRuntime(cfg); err != nil || !rt.Confinement || rt.Reason != "" || rt.NRIVersion != "v0.11.0" {
		t.Errorf("runtime.json for containerd 2.4.2 = %+v, %v", rt, err)
	}
	adj, _, err := pl.CreateContainer(context.Background(), pd, container("c2", pd, ann))
	if err != nil || adj.GetLinux().GetSeccompPolicy() == nil {
		t.Errorf("GPU container on containerd 2.4.2: err %v, policy %v", err, adj.GetLinux().GetSeccompPolicy())
	}
	// containerd 2.4 passes no profile for a pod that set none, and no
	// policy where the spec has none: unconfined, and confined.
	c := container("c2b", pd, ann)
	c.Linux.SeccompProfile = nil
	adj, _, err = pl.CreateContainer(context.Background(), pd, c)
	if err != nil || adj.GetLinux().GetSeccompPolicy().GetDefaultAction() != "SCMP_ACT_ALLOW" {
		t.Errorf("GPU container without a profile on containerd 2.4.2: err %v, policy %v", err, adj.GetLinux().GetSeccompPolicy())
	}

	// A version nri-vgpu cannot place: each container decides by what the
	// runtime passes.
	if _, err := pl.Configure(context.Background(), "", "example-runtime", "v0.1.0"); err != nil {
		t.Fatal(err)
	}
	if rt, err := hoststate.ReadRuntime(cfg); err != nil || rt.Confinement || !strings.Contains(rt.Reason, "reports no NRI version") {
		t.Errorf("runtime.json for an unknown runtime = %+v, %v", rt, err)
	}
	adj, _, err = pl.CreateContainer(context.Background(), pd, container("c3", pd, ann))
	if err != nil || adj.GetLinux().GetSeccompPolicy() == nil {
		t.Errorf("GPU container with a profile on an unknown runtime: err %v, policy %v", err, adj.GetLinux().GetSeccompPolicy())
	}
	c = container("c4", pd, ann)
	c.Linux.SeccompProfile = nil
	if _, _, err := pl.CreateContainer(context.Background(), pd, c); err == nil || !strings.Contains(err.Error(), "no seccomp profile") {
		t.Errorf("GPU container without a profile on an unknown runtime under required: err = %v", err)
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tt := range []struct {
		v    string
		want bool
	}{
		{"v0.10.0", true}, {"v0.12.3", true}, {"v1.0.0", true}, {"v0.9.9", false}, {"v0.8.0", false},
		{"v0.10.0-rc.1", true}, {"0.12.3", false}, {"", false}, {"v0", false}, {"vx.y.z", false},
	} {
		if got := versionAtLeast(tt.v, "v0.10.0"); got != tt.want {
			t.Errorf("versionAtLeast(%q, v0.10.0) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

// runtime.json also says how GPU containers get the driver's files, as
// resolved when the runtime connected, and follows a change seen when a
// container is created (here the host's CDI spec is removed: auto falls
// back to the nvidia runtime, the fake root holding no driver libraries).
func TestRuntimeFileRecordsDriverFiles(t *testing.T) {
	cfg := newConfig(t)
	h := newHarness(t, cfg)
	spec := filepath.Join(cfg.Driver.CDIDirs[0], "nvidia.yaml")
	// Resolved beside the connection (generating may take a while).
	var rt *hoststate.Runtime
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if rt, err = hoststate.ReadRuntime(cfg); err == nil && rt.DriverFiles != "" || time.Now().After(deadline) {
			break
		}
	}
	if want := "CDI spec " + spec; rt == nil || rt.DriverFiles != want {
		t.Fatalf("runtime.json %+v, want driverFiles %q", rt, want)
	}
	if err := os.Remove(spec); err != nil {
		t.Fatal(err)
	}
	ann, _ := sign(t, h.key, gpu0)
	pd := pod("sb1", "uid-1")
	if _, _, err := h.plugin.CreateContainer(context.Background(), pd, container("c1", pd, ann)); err != nil {
		t.Fatal(err)
	}
	rt, err := hoststate.ReadRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := "nvidia-runtime (no CDI spec, no driver libraries under /)"; rt.DriverFiles != want || rt.Name == "" {
		t.Errorf("runtime.json after the spec went: %+v, want driverFiles %q and the runtime kept", rt, want)
	}
}
