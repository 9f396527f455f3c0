package oci

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Flag values written out by hand (linux/sched.h), not taken from the code
// under test.
const (
	tNewNS     = 0x00020000
	tNewUser   = 0x10000000
	tNewNet    = 0x40000000
	tBothFlags = 0x10020000
	// containerd's and Docker's RuntimeDefault let clone through only
	// without any namespace flag: NEWNS|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWCGROUP.
	tAllNSFlags = 0x7E020000
)

var tArches = []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}

func errno(v uint) *uint { return &v }

// The denials every confinement ends with where the policy's default lets
// calls through.
var tDenyAll = []string{
	"mount", "umount", "umount2",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	"chroot", "pivot_root", "setns",
}

func tFlagRules(names ...string) []specs.LinuxSyscall {
	return []specs.LinuxSyscall{
		{Names: names, Action: specs.ActErrno, ErrnoRet: errno(1), Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewUser, ValueTwo: tNewUser, Op: specs.OpMaskedEqual}}},
		{Names: names, Action: specs.ActErrno, ErrnoRet: errno(1), Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewNS, ValueTwo: tNewNS, Op: specs.OpMaskedEqual}}},
	}
}

func checkPolicy(t *testing.T, got, want *specs.LinuxSeccomp) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("policy:\n got: %s\nwant: %s", g, w)
	}
}

// A default pod (Unconfined): everything allowed but the ways around the
// preload, on every architecture the CPU runs.
func TestConfineUnconfined(t *testing.T) {
	got := confine(nil, tArches)
	want := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"},
		Syscalls: append([]specs.LinuxSyscall{
			{Names: tDenyAll, Action: specs.ActErrno, ErrnoRet: errno(1)},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
		}, tFlagRules("clone", "unshare")...),
	}
	checkPolicy(t, got, want)
}

// A RuntimeDefault-like profile (containerd's, with the CAP_SYS_ADMIN group
// of rules a pod with that capability gets): the default ERRNO and every
// rule stay; chroot, mount, umount2 and setns leave the allow rules and fall
// to the default; unshare keeps being allowed without the flags; the clone
// rule that already excludes every namespace flag stands as it is; clone3's
// ENOSYS rule of the profile stays and is not doubled.
func TestConfineRuntimeDefault(t *testing.T) {
	own := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: errno(1),
		Architectures:   tArches,
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write", "chroot", "personality"}, Action: specs.ActAllow},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tAllNSFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
			{Names: []string{"mount", "umount2", "unshare", "setns", "sethostname"}, Action: specs.ActAllow},
		},
	}
	before := deepCopy(t, own)
	got := confine(own, []specs.Arch{specs.ArchAARCH64}) // arches of an own policy are its own
	want := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: errno(1),
		Architectures:   []specs.Arch{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write", "personality"}, Action: specs.ActAllow},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tAllNSFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
			{Names: []string{"sethostname"}, Action: specs.ActAllow},
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tBothFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
		},
	}
	checkPolicy(t, got, want)
	if !reflect.DeepEqual(own, before) {
		t.Errorf("Confine changed the container's own policy")
	}
}

// A Localhost profile with default ERRNO and an explicit allow of chroot,
// clone, unshare and clone3: chroot goes to the default, clone and unshare
// stay allowed only without the flags, and clone3, which the profile let
// through, now fails with ENOSYS (not the default's EPERM, which libc would
// not fall back from).
func TestConfineLocalhost(t *testing.T) {
	own := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Flags:         []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"chroot", "openat", "clone", "unshare", "clone3", "exit_group"}, Action: specs.ActAllow},
		},
	}
	got := confine(own, tArches)
	want := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Flags:         []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_LOG"},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"openat", "exit_group"}, Action: specs.ActAllow},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tBothFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tBothFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
		},
	}
	checkPolicy(t, got, want)
}

// A profile whose default lets calls through (LOG) with rules of every
// shape the merge has to decide on.
func TestConfineDefaultLetsThrough(t *testing.T) {
	own := &specs.LinuxSeccomp{
		DefaultAction: specs.ActLog,
		Syscalls: []specs.LinuxSyscall{
			// Lets clone through only with CLONE_NEWUSER: goes.
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewUser, ValueTwo: tNewUser, Op: specs.OpMaskedEqual}}},
			// Exactly CLONE_NEWNET: has the flags clear, stays.
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewNet, Op: specs.OpEqualTo}}},
			// Without CLONE_NEWNET: the mask takes our flags too.
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewNet, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			// A comparison that cannot hold the flags: goes.
			{Names: []string{"clone"}, Action: specs.ActTrace, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 5, Op: specs.OpGreaterThan}}},
			// A condition on another argument: kept, and clone gets ours.
			{Names: []string{"clone", "read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 1, Value: 7, Op: specs.OpEqualTo}}},
			// A conditional deny of mount: our unconditional one replaces it.
			{Names: []string{"mount", "ioctl"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 2, Value: 0, Op: specs.OpEqualTo}}},
			// The profile kills chroot: that stays, and no EPERM rule.
			{Names: []string{"chroot"}, Action: specs.ActKillProcess},
			// An agent decides on setns: not any more.
			{Names: []string{"setns"}, Action: specs.ActNotify},
			// The profile's own ENOSYS for clone3 stays, not doubled.
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
		},
	}
	got := confine(own, tArches)
	deny := []string{
		"mount", "umount", "umount2",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
		"pivot_root", "setns",
	}
	want := &specs.LinuxSeccomp{
		DefaultAction: specs.ActLog,
		Syscalls: append([]specs.LinuxSyscall{
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tNewNet, Op: specs.OpEqualTo}}},
			{Names: []string{"unshare"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x50020000, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"read"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 1, Value: 7, Op: specs.OpEqualTo}}},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
				{Index: 1, Value: 7, Op: specs.OpEqualTo},
				{Index: 0, Value: tBothFlags, ValueTwo: 0, Op: specs.OpMaskedEqual},
			}},
			{Names: []string{"ioctl"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 2, Value: 0, Op: specs.OpEqualTo}}},
			{Names: []string{"chroot"}, Action: specs.ActKillProcess},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
			{Names: deny, Action: specs.ActErrno, ErrnoRet: errno(1)},
		}, tFlagRules("clone", "unshare")...),
	}
	checkPolicy(t, got, want)
}

// The native architecture list of an unconfined container.
func TestConfineArchitectures(t *testing.T) {
	for goarch, want := range map[string][]specs.Arch{
		"amd64": {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"},
		"arm64": {"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"},
		"mips":  nil,
	} {
		if got := architectures(goarch); !reflect.DeepEqual(got, want) {
			t.Errorf("architectures(%s) = %v, want %v", goarch, got, want)
		}
	}
}

func deepCopy(t *testing.T, s *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out specs.LinuxSeccomp
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// BenchmarkConfine measures the policy computation alone: an unconfined
// container, and a profile the size of containerd's RuntimeDefault (about
// 350 names in a few rules).
func BenchmarkConfine(b *testing.B) {
	names := make([]string, 350)
	for i := range names {
		names[i] = "sys" + strconv.Itoa(i)
	}
	names[100] = "chroot"
	rd := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno, DefaultErrnoRet: errno(1), Architectures: tArches,
		Syscalls: []specs.LinuxSyscall{
			{Names: names, Action: specs.ActAllow},
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: tAllNSFlags, Op: specs.OpMaskedEqual}}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: errno(38)},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 8, Op: specs.OpEqualTo}}},
		},
	}
	b.Run("unconfined", func(b *testing.B) {
		for b.Loop() {
			Confine(nil)
		}
	})
	b.Run("runtime-default", func(b *testing.B) {
		for b.Loop() {
			Confine(rd)
		}
	})
}
