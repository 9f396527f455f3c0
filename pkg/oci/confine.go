package oci

import (
	"runtime"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The confinement of a GPU container: the shim reaches every process through
// the read-only /etc/ld.so.preload, and the loader reads that path in the
// process's own view of the file system. Whatever gives a process another
// view runs a program without the shim: a new mount namespace in which a
// bind mount hides the file (unshare -Urm, possible without any capability
// where the kernel allows unprivileged user namespaces), another root
// (chroot, which CAP_SYS_CHROOT of containerd's default set allows, or
// pivot_root), joining another namespace (setns), or any mount. A GPU
// container runs under a seccomp policy that denies these with EPERM.

// Linux clone flags the confinement refuses (arg 0 of clone and unshare on
// every architecture nri-vgpu is built for).
const (
	cloneNewNS   = 0x00020000 // CLONE_NEWNS
	cloneNewUser = 0x10000000 // CLONE_NEWUSER
	// ConfinedCloneFlags are the namespace flags clone and unshare are
	// refused with.
	ConfinedCloneFlags = cloneNewNS | cloneNewUser
)

// Errors the denied calls return.
const (
	errnoEPERM  = 1
	errnoENOSYS = 38
)

// ConfinedSyscalls are the system calls a GPU container may not make at all.
var ConfinedSyscalls = []string{
	// Mounts, old and new API: a bind mount over the preload, or a mount
	// namespace's tree rearranged.
	"mount", "umount", "umount2",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	// Another root.
	"chroot", "pivot_root",
	// Another process's namespaces.
	"setns",
}

// confinedCloneSyscalls are refused when their flags ask for a new user or
// mount namespace; with other flags (threads, fork) they stay allowed.
var confinedCloneSyscalls = []string{"clone", "unshare"}

// clone3 passes its flags in a structure seccomp cannot read. It fails with
// ENOSYS, on which glibc (2.34+) and others fall back to clone, which is
// filtered by flags.
const syscallClone3 = "clone3"

// Seccomp actions by what they do to a call.
const (
	actAllow = specs.ActAllow
	actErrno = specs.ActErrno
)

// denies reports whether a seccomp action refuses a call outright. ALLOW and
// LOG let it through; TRACE and NOTIFY hand it to a tracer or agent that may
// let it through; unknown actions are taken as letting it through.
func denies(a specs.LinuxSeccompAction) bool {
	switch a {
	case specs.ActErrno, specs.ActKill, specs.ActKillProcess, specs.ActKillThread, specs.ActTrap:
		return true
	}
	return false
}

// Architectures returns the seccomp architectures of the confinement when a
// container has no policy of its own: the native one and the ones its CPU
// also runs (x86 and x32 on amd64, arm on arm64), so that a 32-bit program
// meets the same denials. A filter that lists only the native architecture
// kills every 32-bit process instead.
func Architectures() []specs.Arch { return architectures(runtime.GOARCH) }

func architectures(goarch string) []specs.Arch {
	switch goarch {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64, specs.ArchARM}
	case "ppc64le":
		return []specs.Arch{specs.ArchPPC64LE}
	case "s390x":
		return []specs.Arch{specs.ArchS390X, specs.ArchS390}
	case "riscv64":
		return []specs.Arch{specs.ArchRISCV64}
	}
	return nil // the runtime's native architecture
}

// Confine returns the seccomp policy of a GPU container whose own policy is
// own (nil: unconfined): own with the confinement's denials, never weaker.
//   - No own policy: default ALLOW with the denials.
//   - Own policy: every rule and the default action are kept, except that the
//     confined syscalls are taken out of every rule that would let them
//     through (ALLOW, LOG, TRACE, NOTIFY); rules that let clone or unshare
//     through get the condition that neither CLONE_NEWUSER nor CLONE_NEWNS
//     is set (a rule that cannot have it is dropped). Where the default
//     action denies, it now refuses these calls; where it lets calls
//     through, the denials are added as EPERM rules. clone3 always fails
//     with ENOSYS, unless the policy already refuses it with a rule of its
//     own or by its default: EPERM would not make libc fall back to clone.
//
// own is not changed.
func Confine(own *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	return confine(own, Architectures())
}

func confine(own *specs.LinuxSeccomp, arches []specs.Arch) *specs.LinuxSeccomp {
	if own == nil {
		own = &specs.LinuxSeccomp{DefaultAction: actAllow, Architectures: arches}
	}
	out := &specs.LinuxSeccomp{
		DefaultAction:    own.DefaultAction,
		DefaultErrnoRet:  cloneUint(own.DefaultErrnoRet),
		Architectures:    slices.Clone(own.Architectures),
		Flags:            slices.Clone(own.Flags),
		ListenerPath:     own.ListenerPath,
		ListenerMetadata: own.ListenerMetadata,
	}
	defaultDenies := denies(own.DefaultAction)
	confined := func(name string) bool { return slices.Contains(ConfinedSyscalls, name) }
	flagged := func(name string) bool { return slices.Contains(confinedCloneSyscalls, name) }

	// Which confined calls the policy already refuses whatever their
	// arguments, and whether it let clone3 through anywhere.
	refused := map[string]bool{}
	clone3Allowed := !defaultDenies
	for _, r := range own.Syscalls {
		for _, n := range r.Names {
			switch {
			case denies(r.Action) && len(r.Args) == 0:
				refused[n] = true
			case !denies(r.Action) && n == syscallClone3:
				clone3Allowed = true
			}
		}
	}
	// The confined calls that get a deny rule of ours, unconditional: rules
	// of the policy's that deny them under conditions are dropped for them
	// (ours covers every case, and libseccomp refuses some mixes of
	// conditional and unconditional rules with different actions).
	ours := map[string]bool{}
	for _, n := range ConfinedSyscalls {
		ours[n] = !defaultDenies && !refused[n]
	}
	ours[syscallClone3] = clone3Allowed && !refused[syscallClone3]

	for _, r := range own.Syscalls {
		if denies(r.Action) {
			keep := slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return ours[n] })
			if len(keep) > 0 {
				out.Syscalls = append(out.Syscalls, cloneRule(r, keep))
			}
			continue
		}
		keep := slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool {
			return confined(n) || flagged(n) || n == syscallClone3
		})
		if len(keep) > 0 {
			out.Syscalls = append(out.Syscalls, cloneRule(r, keep))
		}
		for _, n := range r.Names {
			if !flagged(n) {
				continue
			}
			if args, ok := withoutConfinedFlags(r.Args); ok {
				c := cloneRule(r, []string{n})
				c.Args = args
				out.Syscalls = append(out.Syscalls, c)
			}
		}
	}

	var deny []string
	for _, n := range ConfinedSyscalls {
		if ours[n] {
			deny = append(deny, n)
		}
	}
	if len(deny) > 0 {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: deny, Action: actErrno, ErrnoRet: uintp(errnoEPERM)})
	}
	if ours[syscallClone3] {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: []string{syscallClone3}, Action: actErrno, ErrnoRet: uintp(errnoENOSYS)})
	}
	// clone and unshare with a confined flag: one rule per flag, since a
	// rule's conditions must all hold. Not needed where the default action
	// refuses them (the rules that let them through now exclude the flags).
	var flaggedDeny []string
	for _, n := range confinedCloneSyscalls {
		if !defaultDenies && !refused[n] {
			flaggedDeny = append(flaggedDeny, n)
		}
	}
	if len(flaggedDeny) > 0 {
		for _, flag := range []uint64{cloneNewUser, cloneNewNS} {
			out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
				Names:    flaggedDeny,
				Action:   actErrno,
				ErrnoRet: uintp(errnoEPERM),
				Args:     []specs.LinuxSeccompArg{{Index: 0, Value: flag, ValueTwo: flag, Op: specs.OpMaskedEqual}},
			})
		}
	}
	return out
}

// withoutConfinedFlags returns the conditions of a rule that lets clone or
// unshare through, narrowed to calls without a confined flag, and false
// when the rule cannot be narrowed (it then goes). libseccomp takes one
// comparison per argument, so the flags are folded into the rule's own
// comparison of argument 0: a masked equality gets the flags added to its
// mask (expecting them clear), an equality that already has them clear
// stands, and any other comparison of argument 0 cannot hold the flags and
// drops the rule.
func withoutConfinedFlags(args []specs.LinuxSeccompArg) ([]specs.LinuxSeccompArg, bool) {
	out := slices.Clone(args)
	narrowed := false
	for i, a := range out {
		if a.Index != 0 {
			continue
		}
		switch a.Op {
		case specs.OpMaskedEqual:
			// Value is the mask, ValueTwo the value expected under it.
			if a.ValueTwo&ConfinedCloneFlags != 0 {
				return nil, false // lets only calls with a confined flag through
			}
			out[i].Value |= ConfinedCloneFlags
			narrowed = true
		case specs.OpEqualTo:
			if a.Value&ConfinedCloneFlags != 0 {
				return nil, false
			}
			narrowed = true
		default:
			return nil, false
		}
	}
	if !narrowed {
		out = append(out, specs.LinuxSeccompArg{Index: 0, Value: ConfinedCloneFlags, ValueTwo: 0, Op: specs.OpMaskedEqual})
	}
	return out, true
}

func cloneRule(r specs.LinuxSyscall, names []string) specs.LinuxSyscall {
	return specs.LinuxSyscall{Names: names, Action: r.Action, ErrnoRet: cloneUint(r.ErrnoRet), Args: slices.Clone(r.Args)}
}

func cloneUint(p *uint) *uint {
	if p == nil {
		return nil
	}
	return uintp(*p)
}

func uintp(v uint) *uint { return &v }
