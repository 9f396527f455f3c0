//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// escapes are the tenant's ways to run a program without the preload: a new
// user and mount namespace in which a bind mount hides /etc/ld.so.preload
// (an escape that needs no privilege), a mount namespace alone, another root
// (chroot, with containerd's default CAP_SYS_CHROOT, over a copy of the
// image), a mount of its own, and a bind mount straight over the preload.
// Each line of the script's output is "<name> rc=<exit status> <output>".
const escapes = `
try() { name=$1; shift; out=$("$@" 2>&1); echo "$name rc=$? $(echo $out | tr '\n' ' ')"; }
target=/etc/ld.so.preload; [ -e $target ] || target=/etc/hostname
mkdir -p /tmp/r/bin /tmp/mnt 2>/dev/null && cp /bin/busybox /tmp/r/bin/ 2>/dev/null && ln -sf busybox /tmp/r/bin/sh 2>/dev/null
try unshare-Urm-bind unshare -Urm sh -c "mount --bind /dev/null $target && echo hidden: \$(cat $target)"
try unshare-Urm unshare -Urm true
try unshare-m unshare -m true
try chroot chroot /tmp/r /bin/sh -c true
try mount-tmpfs mount -t tmpfs none /tmp/mnt
try bind-preload mount --bind /dev/null $target
try seccomp grep Seccomp: /proc/self/status
`

// escapeResults runs escapes in the container and returns each attempt's
// output line by name.
func (v *vgpu) escapeResults(t *testing.T, ctx context.Context, id string) map[string]string {
	t.Helper()
	out := v.sh(t, ctx, id, escapes)
	res := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, _ := strings.Cut(line, " ")
		res[name] = rest
	}
	return res
}

// refused reports whether an attempt failed with EPERM (busybox mount words
// it "permission denied").
func refused(line string) bool {
	return !strings.HasPrefix(line, "rc=0 ") &&
		(strings.Contains(line, "Operation not permitted") || strings.Contains(line, "permission denied"))
}

// TestTenantCannotEscapeThePreload plays the tenant of a default pod
// (Unconfined, root with containerd's default capabilities, and as uid
// 1000 with none): in a GPU container every escape is refused with EPERM;
// in a container of the same kind without a GPU the same attempts work (or
// fail only for lack of a capability), which shows the refusal is the
// confinement's. A RuntimeDefault pod keeps its profile, narrowed: chroot,
// which containerd's default profile allows, is refused in its GPU
// container. Where the runtime cannot apply the confinement (containerd
// 1.7), status and metrics say so and "required" refuses GPU containers.
func TestTenantCannotEscapeThePreload(t *testing.T) {
	forEachContainerd(t, testTenantCannotEscapeThePreload)
}

func testTenantCannotEscapeThePreload(t *testing.T, containerd string) {
	if strings.HasPrefix(containerd, "v1.") {
		testNoConfinementOnOldRuntime(t, containerd)
		return
	}
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 4*time.Minute)
	uid1000 := int64(1000)

	gpu := v.mustRun(t, ctx, gpuPod("gpu", 1))
	plain := v.mustRun(t, ctx, gpuPod("plain", 0))
	gpuRes := v.escapeResults(t, ctx, gpu.ContainerID("main"))
	plainRes := v.escapeResults(t, ctx, plain.ContainerID("main"))
	t.Logf("GPU container:\n%v\ncontainer without a GPU:\n%v", gpuRes, plainRes)
	for _, name := range []string{"unshare-Urm-bind", "unshare-Urm", "unshare-m", "chroot", "mount-tmpfs", "bind-preload"} {
		if !refused(gpuRes[name]) {
			t.Errorf("root in the GPU container: %s: %q, want EPERM", name, gpuRes[name])
		}
	}
	if !strings.Contains(gpuRes["seccomp"], "Seccomp:\t2") && !strings.Contains(gpuRes["seccomp"], "Seccomp: 2") {
		t.Errorf("GPU container: %s, want a seccomp filter", gpuRes["seccomp"])
	}
	// Without a GPU: no confinement. The user namespace's bind mount works
	// there, and chroot with the default CAP_SYS_CHROOT; a mount needs a
	// user namespace (no CAP_SYS_ADMIN), which is what that escape takes.
	for _, name := range []string{"unshare-Urm-bind", "unshare-Urm", "chroot"} {
		if !strings.HasPrefix(plainRes[name], "rc=0 ") {
			t.Errorf("root in the container without a GPU: %s: %q, want it to work (the test would prove nothing)", name, plainRes[name])
		}
	}
	if !strings.Contains(plainRes["seccomp"], "0") {
		t.Errorf("container without a GPU: %s, want no seccomp filter", plainRes["seccomp"])
	}

	// uid 1000, no capabilities: a user namespace gives them all back.
	asUser := func(name string, n int) *kubeletsim.RunningPod {
		p := gpuPod(name, n)
		p.Containers[0].RunAsUser = &uid1000
		return v.mustRun(t, ctx, p)
	}
	gpuUser, plainUser := asUser("gpu-user", 1), asUser("plain-user", 0)
	for _, tc := range []struct {
		rp       *kubeletsim.RunningPod
		confined bool
	}{{gpuUser, true}, {plainUser, false}} {
		out := v.sh(t, ctx, tc.rp.ContainerID("main"), `id -u; unshare -Urm true 2>&1; echo "rc=$?"; unshare -Urm sh -c 'mount -t tmpfs none /tmp' 2>&1; echo "rc=$?"`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) == 0 || lines[0] != "1000" {
			t.Fatalf("not uid 1000: %q", out)
		}
		worked := strings.Count(out, "rc=0")
		if tc.confined && (worked != 0 || !strings.Contains(out, "Operation not permitted")) {
			t.Errorf("uid 1000 in the GPU container: %q, want every unshare refused with EPERM", out)
		}
		if !tc.confined && worked != 2 {
			t.Errorf("uid 1000 in the container without a GPU: %q, want unshare -Urm to work", out)
		}
	}

	// RuntimeDefault: containerd's profile allows chroot; the GPU
	// container's narrowed one does not, and the rest of it still runs
	// programs (fork, exec: the merged policy loads).
	rd := func(name string, n int) *kubeletsim.RunningPod {
		p := gpuPod(name, n)
		p.Containers[0].SeccompRuntimeDefault = true
		return v.mustRun(t, ctx, p)
	}
	gpuRD, plainRD := rd("gpu-rd", 1), rd("plain-rd", 0)
	gpuRDRes := v.escapeResults(t, ctx, gpuRD.ContainerID("main"))
	plainRDRes := v.escapeResults(t, ctx, plainRD.ContainerID("main"))
	t.Logf("RuntimeDefault GPU container:\n%v\nRuntimeDefault without a GPU:\n%v", gpuRDRes, plainRDRes)
	if !strings.HasPrefix(plainRDRes["chroot"], "rc=0 ") {
		t.Errorf("RuntimeDefault without a GPU: chroot %q, want it to work (the test would prove nothing)", plainRDRes["chroot"])
	}
	for _, name := range []string{"unshare-Urm-bind", "unshare-Urm", "chroot", "mount-tmpfs", "bind-preload"} {
		if !refused(gpuRDRes[name]) {
			t.Errorf("RuntimeDefault GPU container: %s: %q, want EPERM", name, gpuRDRes[name])
		}
	}

	// Status and metrics say the runtime confines.
	st := nriVGPUStatus(t, v)
	if !strings.Contains(st, "runtime containerd "+strings.TrimPrefix(containerd, "v")) || !strings.Contains(st, "GPU containers are confined") {
		t.Errorf("nri-vgpu status:\n%s\nwant it to say containerd %s confines GPU containers", st, containerd)
	}
}

// testNoConfinementOnOldRuntime: containerd 1.7 passes no seccomp profile
// and drops NRI's seccomp adjustment. With "best-effort" (the default) a
// GPU container runs unconfined, which status and metrics say; with
// "required" it is refused with the reason.
func testNoConfinementOnOldRuntime(t *testing.T, containerd string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	v := startVGPU(t, containerd, vgpuOptions{extraConfig: fmt.Sprintf("\n[metrics]\nlisten = %q\n", addr)})
	ctx := testContext(t, 3*time.Minute)
	gpu := v.mustRun(t, ctx, gpuPod("gpu", 1))
	res := v.escapeResults(t, ctx, gpu.ContainerID("main"))
	if !strings.HasPrefix(res["unshare-Urm"], "rc=0 ") {
		t.Logf("unshare -Urm in a GPU container on %s: %q (the runtime applied no confinement, yet it failed)", containerd, res["unshare-Urm"])
	}
	st := nriVGPUStatus(t, v)
	if !strings.Contains(st, "confinement unavailable") || !strings.Contains(st, strings.TrimPrefix(containerd, "v")) || !strings.Contains(st, "WITHOUT the confinement") {
		t.Errorf("nri-vgpu status on %s:\n%s\nwant it to say GPU containers run without the confinement", containerd, st)
	}
	var metrics string
	if err := waitFor(ctx, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return strings.Contains(metrics, "nri_vgpu_confinement_available{")
	}); err != nil {
		t.Errorf("no nri_vgpu_confinement_available in the metrics: %v\n%s", err, metrics)
	}
	want := `nri_vgpu_confinement_available{nri_version="v0.8.0",policy="best-effort",runtime="containerd",runtime_version="` + strings.TrimPrefix(containerd, "v")
	if !strings.Contains(metrics, want) || !strings.Contains(grepLines(metrics, want), "} 0") {
		t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "confinement"))
	}

	req := startVGPU(t, containerd, vgpuOptions{extraConfig: "confinement = \"required\"\n"})
	_, err = req.run(t, ctx, gpuPod("refused", 1))
	if err == nil || !strings.Contains(err.Error(), `nri.confinement = "required"`) || !strings.Contains(err.Error(), "does not apply NRI seccomp adjustments") {
		t.Errorf("GPU pod on %s with confinement = \"required\": error = %v, want a refusal that says why", containerd, err)
	}
	// A pod without a GPU is not affected.
	req.mustRun(t, ctx, gpuPod("plain", 0))
}

func nriVGPUStatus(t *testing.T, v *vgpu) string {
	t.Helper()
	out, err := exec.Command(binaries.nriPlugin, "--config", v.configPath, "status").CombinedOutput()
	if err != nil {
		t.Fatalf("nri-vgpu status: %v\n%s", err, out)
	}
	return string(out)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestValidatorRefusingSeccompAdjustments: containerd's NRI validator
// set to refuse seccomp adjustments of unconfined containers
// (reject_unconfined_seccomp_adjustment) fails a default pod's GPU
// container with an error naming nri-vgpu and the seccomp adjustment; a
// container without a GPU, which gets none, still starts.
func TestValidatorRefusingSeccompAdjustments(t *testing.T) {
	forEachContainerd(t, func(t *testing.T, containerd string) {
		if strings.HasPrefix(containerd, "v1.") {
			t.Skipf("containerd %s has no NRI validator", containerd)
		}
		v := startVGPU(t, containerd, vgpuOptions{containerd: harness.Options{Validator: &harness.Validator{RejectUnconfinedSeccomp: true}}})
		ctx := testContext(t, 2*time.Minute)
		_, err := v.run(t, ctx, gpuPod("gpu", 1))
		t.Logf("GPU pod under the validator: %v", err)
		if err == nil || !strings.Contains(err.Error(), "nri-vgpu") || !strings.Contains(err.Error(), "unconfined seccomp policy adjustment") {
			t.Errorf("GPU pod under a validator refusing seccomp adjustments: error = %v, want the validator's refusal naming nri-vgpu", err)
		}
		v.mustRun(t, ctx, gpuPod("plain", 0))
	})
}
