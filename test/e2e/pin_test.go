//go:build e2e

package e2e

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// moveAttacks are what root in a default pod tries to take the limiter
// away from the container's later processes: rename a directory on the way
// to a mount of nri-vgpu's (rename(2) refuses to move a mount point, not
// its parent), or remove the preload.
var moveAttacks = []string{
	"mv /usr/local/nri-vgpu /usr/local/x",
	"mv /run/nri-vgpu /run/x",
	"mv /etc /etc.x",
	"rm /etc/ld.so.preload",
	"rm -f /etc/ld.so.preload",
	"mv /usr /usr.x",
	"mv /usr/local /usr/local.x",
	"mv /run /run.x",
}

// TestTenantCannotMoveTheLimiterAway plays root in a GPU container: each of
// moveAttacks fails, and afterwards a fresh process still loads the shim
// and is refused an allocation past its slice. A second container with a
// read-only root gets no writable /etc from the hook's bind mounts.
func TestTenantCannotMoveTheLimiterAway(t *testing.T) {
	forEachContainerd(t, testTenantCannotMoveTheLimiterAway)
}

func testTenantCannotMoveTheLimiterAway(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 4*time.Minute)
	rp := v.mustRun(t, ctx, cudaPod(t, "tenant", 1))
	id := rp.ContainerID("main")
	uuid := v.allocationOf(t, rp, "main").GPUs[0].UUID

	for _, attack := range moveAttacks {
		res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", attack)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded in the container", attack)
		} else if !strings.Contains(res.Stderr, "busy") {
			t.Errorf("%q: %s, want EBUSY (Resource busy)", attack, strings.TrimSpace(res.Stderr))
		}
	}
	if got := strings.TrimSpace(v.sh(t, ctx, id, "cat /etc/ld.so.preload")); got != "/usr/local/nri-vgpu/libvgpu-shim.so" {
		t.Errorf("/etc/ld.so.preload after the attacks = %q", got)
	}
	v.cudaprog(t, ctx, id, fakeDriverEnv(uuid, "/tmp"), "direct",
		"init", "info:4GiB:4GiB", "alloc:3GiB", "alloc:2GiB:2", "freeall")

	// A read-only root stays read-only where the hook bind-mounted.
	pod := cudaPod(t, "readonly", 1)
	pod.Containers[0].ReadOnlyRootFilesystem = true
	ro := v.mustRun(t, ctx, pod)
	for _, dir := range []string{"/", "/etc", "/usr/local", "/usr/local/nri-vgpu", "/run", "/run/nri-vgpu"} {
		res, err := v.c.Exec(ctx, ro.ContainerID("main"), "/bin/sh", "-c", "touch "+filepath.Join(dir, "new"))
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
			t.Errorf("touch %s/new with a read-only root: exit %d, %q; want EROFS", dir, res.ExitCode, res.Stderr)
		}
	}
}

// ledgerAttacks are what root in a default pod tries on the ledger shards:
// a tenant that could add, remove, replace or change a shard, move the
// directory or mount something over it would give its later processes a
// ledger apart from the others', and so room past the quota.
var ledgerAttacks = []struct{ attack, want string }{
	{"touch /run/nri-vgpu/ledger/64", "Read-only file system"},
	{"mkfifo /run/nri-vgpu/ledger/65", "Read-only file system"},
	{"rm -f /run/nri-vgpu/ledger/0", "Read-only file system"},
	{"mv /run/nri-vgpu/ledger/0 /run/nri-vgpu/ledger/x", "Read-only file system"},
	{"echo x >> /run/nri-vgpu/ledger/1", "Read-only file system"},
	{"chmod 666 /run/nri-vgpu/ledger/2", "Read-only file system"},
	{"ln -s /tmp/x /run/nri-vgpu/ledger/66", "Read-only file system"},
	{"rmdir /run/nri-vgpu/ledger", "busy"},
	{"mv /run/nri-vgpu/ledger /run/nri-vgpu/x", "busy"},
	{"mv /run/nri-vgpu /run/x", "busy"},
	{"mount -t tmpfs none /run/nri-vgpu/ledger", "denied"},
	{"mount -o bind /tmp /run/nri-vgpu/ledger", "denied"},
	{"mount -o bind /tmp /run/nri-vgpu", "denied"},
}

// TestTenantCannotTouchTheLedger plays root in a GPU container (default
// capabilities, seccomp unconfined) against its ledger shards: each of
// ledgerAttacks fails, the directory still holds the host's 64 empty
// read-only shards that the limits file names, and a fresh process is still
// refused an allocation past its slice.
func TestTenantCannotTouchTheLedger(t *testing.T) {
	forEachContainerd(t, testTenantCannotTouchTheLedger)
}

func testTenantCannotTouchTheLedger(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 4*time.Minute)
	rp := v.mustRun(t, ctx, cudaPod(t, "tenant", 1))
	id := rp.ContainerID("main")
	uuid := v.allocationOf(t, rp, "main").GPUs[0].UUID

	for _, a := range ledgerAttacks {
		res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", a.attack)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded in the container", a.attack)
		} else if !strings.Contains(res.Stderr, a.want) {
			t.Errorf("%q: %s, want an error saying %q", a.attack, strings.TrimSpace(res.Stderr), a.want)
		}
	}
	host := filepath.Join(v.hostContainerDir(id), "ledger")
	out := v.sh(t, ctx, id, "grep -x ledger.shards=64 /run/nri-vgpu/limits; ls /run/nri-vgpu/ledger | wc -l; "+
		"stat -c '%a %u %s' /run/nri-vgpu/ledger/0 /run/nri-vgpu/ledger/63 | sort -u; "+
		"grep ' /run/nri-vgpu/ledger ' /proc/self/mountinfo | cut -d' ' -f6")
	if want := "ledger.shards=64\n64\n444 0 0\nro,nosuid,nodev,noexec"; !strings.HasPrefix(strings.TrimSpace(out), want) {
		t.Errorf("the ledger in the container after the attacks:\n%s\nwant it to start with:\n%s", out, want)
	}
	if entries, err := os.ReadDir(host); err != nil || len(entries) != 64 {
		t.Errorf("host ledger directory %s after the attacks: %d entries (%v), want the 64 shards", host, len(entries), err)
	}
	v.cudaprog(t, ctx, id, fakeDriverEnv(uuid, "/tmp"), "direct",
		"init", "info:4GiB:4GiB", "alloc:3GiB", "alloc:2GiB:2", "freeall")
}

// TestImageLinksRefuseTheContainer: an image whose /etc/ld.so.preload,
// /run/nri-vgpu, /usr/local/nri-vgpu or /etc is a symbolic link (the runtime
// follows it and mounts at the target, which the tenant could then unlink)
// gets no GPU container: the create fails with a message naming the path.
// The same image without a GPU runs.
func TestImageLinksRefuseTheContainer(t *testing.T) {
	forEachContainerd(t, testImageLinksRefuseTheContainer)
}

func testImageLinksRefuseTheContainer(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 4*time.Minute)
	applets, err := image.BusyboxApplets(harness.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range []struct{ link, target string }{
		{"/etc/ld.so.preload", "/tmp/preload"},
		{"/run/nri-vgpu", "/tmp/nv"},
		{"/usr/local/nri-vgpu", "/tmp"},
		{"/etc", "/tmp"},
	} {
		ref := "nri-vgpu.test/link" + string(rune('a'+i)) + ":e2e"
		links := maps.Clone(applets)
		links[tt.link] = tt.target
		dirs := []string{"/tmp", "/dev", "/proc", "/sys", "/run", "/usr/local"}
		if tt.link != "/etc" {
			dirs = append(dirs, "/etc")
		}
		tarball := filepath.Join(images.dir, "link"+string(rune('a'+i))+".tar")
		if err := image.Write(tarball, image.Spec{
			Ref:      ref,
			Files:    []image.File{{Src: harness.BusyboxPath, Dst: "/bin/busybox", Mode: 0o755}},
			Symlinks: links, Dirs: dirs, Env: []string{"PATH=/bin"}, Cmd: harness.SleepCommand,
		}); err != nil {
			t.Fatal(err)
		}
		if err := v.c.Import(ctx, tarball); err != nil {
			t.Fatal(err)
		}
		pod := gpuPod("link", 1)
		pod.Containers[0].Image = ref
		_, err := v.run(t, ctx, pod)
		want := "nri-vgpu: " + tt.link + " in the image is a symbolic link; refusing"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("GPU pod of an image with %s -> %s: error = %v, want one containing %q", tt.link, tt.target, err, want)
		} else {
			t.Logf("%s -> %s: the create error CRI returns: %v", tt.link, tt.target, err)
		}
		plain := &kubeletsim.Pod{Name: "plain", UID: kubeletsim.NewUID(), TerminationGracePeriod: 5 * time.Second,
			Containers: []kubeletsim.Container{{Name: "main", Image: ref}}}
		v.mustRun(t, ctx, plain)
	}
}
