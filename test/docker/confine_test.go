//go:build e2e

package docker

import (
	"strings"
	"testing"
)

// escapes are the tenant's ways around the preload (see test/e2e's
// TestTenantCannotEscapeThePreload); each prints "<name> rc=<status> <output>".
const escapes = `
try() { name=$1; shift; out=$("$@" 2>&1); echo "$name rc=$? $(echo $out | tr '\n' ' ')"; }
target=/etc/ld.so.preload; [ -e $target ] || target=/etc/hostname
mkdir -p /tmp/r/bin /tmp/mnt && cp /bin/busybox /tmp/r/bin/ && ln -sf busybox /tmp/r/bin/sh
try unshare-Urm-bind unshare -Urm sh -c "mount --bind /dev/null $target && echo hidden"
try unshare-m unshare -m true
try chroot chroot /tmp/r /bin/sh -c true
try mount-tmpfs mount -t tmpfs none /tmp/mnt
try bind-preload mount --bind /dev/null $target
`

func escapeResults(out string) map[string]string {
	res := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, _ := strings.Cut(line, " ")
		res[name] = rest
	}
	return res
}

// TestTenantCannotEscapeThePreload: in a Docker GPU container, with Docker's
// default seccomp profile and with seccomp=unconfined, every escape is
// refused with EPERM; the same container under runc alone (unconfined)
// runs the escapes: a bind mount over /etc/ld.so.preload in a user and
// mount namespace of its own, and chroot.
func TestTenantCannotEscapeThePreload(t *testing.T) {
	ctx := setup(t)
	vars := []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"}
	for _, opts := range [][]string{nil, {"--security-opt", "seccomp=unconfined"}} {
		args := vgpuRun(vars, "sh", "-c", escapes)
		args = append(append([]string{args[0]}, opts...), args[1:]...)
		res := escapeResults(docker(t, ctx, args...))
		t.Logf("GPU container %v: %v", opts, res)
		for _, name := range []string{"unshare-Urm-bind", "unshare-m", "chroot", "mount-tmpfs", "bind-preload"} {
			if l := res[name]; strings.HasPrefix(l, "rc=0 ") ||
				!(strings.Contains(l, "Operation not permitted") || strings.Contains(l, "permission denied")) {
				t.Errorf("GPU container %v: %s: %q, want EPERM", opts, name, l)
			}
		}
	}
	plain := escapeResults(docker(t, ctx, "run", "--rm", "--network", "none", "--security-opt", "seccomp=unconfined", busyboxImage, "sh", "-c", escapes))
	t.Logf("runc alone, unconfined: %v", plain)
	for _, name := range []string{"unshare-Urm-bind", "chroot"} {
		if !strings.HasPrefix(plain[name], "rc=0 ") {
			t.Errorf("runc alone, unconfined: %s: %q, want it to work (the test would prove nothing)", name, plain[name])
		}
	}
}
