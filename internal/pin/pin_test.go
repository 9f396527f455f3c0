package pin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// rootfs is a container root holding the pinned paths as plain files and
// directories, as the runtime leaves them before it mounts.
func rootfs(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"etc", "usr/local/nri-vgpu", "run/nri-vgpu/region", "run/nri-vgpu/ledger", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"etc/ld.so.preload", "usr/local/nri-vgpu/libvgpu-shim.so", "run/nri-vgpu/limits"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// replace puts what at the container path p of root, in place of what is
// there: "link:TARGET", "file" or "dir".
func replace(t *testing.T, root, p, what string) {
	t.Helper()
	host := filepath.Join(root, p)
	if err := os.RemoveAll(host); err != nil {
		t.Fatal(err)
	}
	var err error
	switch {
	case strings.HasPrefix(what, "link:"):
		err = os.Symlink(strings.TrimPrefix(what, "link:"), host)
	case what == "file":
		err = os.WriteFile(host, nil, 0o644)
	case what == "dir":
		err = os.Mkdir(host, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func openRoot(t *testing.T, root string) *os.File {
	t.Helper()
	f, err := os.OpenFile(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestWalkRefusesTheImagesLinks plants, in turn, each way an image can make
// the runtime mount one of the pinned paths somewhere else (a symbolic link
// on the way, dangling or not) or make it no directory, and wants Walk of
// that pinned path refused with a message naming the planted path.
func TestWalkRefusesTheImagesLinks(t *testing.T) {
	tests := []struct {
		plant, what string // container path, and what the image has there
		walk        string // the pinned path walked
		want        string
	}{
		{"/etc", "link:/tmp", oci.ContainerPreloadPath, "/etc in the image is a symbolic link; refusing"},
		{"/etc", "link:tmp", oci.ContainerPreloadPath, "/etc in the image is a symbolic link; refusing"},
		{"/etc/ld.so.preload", "link:/tmp/preload", oci.ContainerPreloadPath, "/etc/ld.so.preload in the image is a symbolic link; refusing"},
		{"/etc/ld.so.preload", "link:/nonexistent", oci.ContainerPreloadPath, "/etc/ld.so.preload in the image is a symbolic link; refusing"},
		{"/run/nri-vgpu", "link:/tmp", oci.ContainerLimitsPath, "/run/nri-vgpu in the image is a symbolic link; refusing"},
		{"/run/nri-vgpu", "link:/tmp", oci.ContainerRegionDir, "/run/nri-vgpu in the image is a symbolic link; refusing"},
		{"/run/nri-vgpu/region", "link:.", oci.ContainerRegionDir, "/run/nri-vgpu/region in the image is a symbolic link; refusing"},
		{"/run/nri-vgpu", "link:/tmp", oci.ContainerLedgerDir, "/run/nri-vgpu in the image is a symbolic link; refusing"},
		{"/run/nri-vgpu/ledger", "link:/tmp", oci.ContainerLedgerDir, "/run/nri-vgpu/ledger in the image is a symbolic link; refusing"},
		{"/run", "link:/tmp", oci.ContainerLimitsPath, "/run in the image is a symbolic link; refusing"},
		{"/usr/local/nri-vgpu", "link:/tmp", oci.ContainerShimPath, "/usr/local/nri-vgpu in the image is a symbolic link; refusing"},
		{"/usr/local", "link:../tmp", oci.ContainerShimPath, "/usr/local in the image is a symbolic link; refusing"},
		{"/usr", "link:/tmp", oci.ContainerShimPath, "/usr in the image is a symbolic link; refusing"},
		{"/usr/local/nri-vgpu", "file", oci.ContainerShimPath, "/usr/local/nri-vgpu in the image is not a directory; refusing"},
		{"/run/nri-vgpu", "file", oci.ContainerLimitsPath, "/run/nri-vgpu in the image is not a directory; refusing"},
	}
	for _, tt := range tests {
		t.Run(tt.plant+"="+tt.what+"/"+filepath.Base(tt.walk), func(t *testing.T) {
			root := rootfs(t)
			replace(t, root, tt.plant, tt.what)
			fd, err := Walk(openRoot(t, root), tt.walk)
			if err == nil {
				unix.Close(fd)
				t.Fatalf("Walk(%s) succeeded with %s planted at %s", tt.walk, tt.what, tt.plant)
			}
			if err.Error() != tt.want {
				t.Errorf("Walk(%s) error = %q, want %q", tt.walk, err, tt.want)
			}
		})
	}
}

// TestWalkOpensThePathItself: on a clean root, Walk opens the very file at
// the literal path (same inode as seen from the host).
func TestWalkOpensThePathItself(t *testing.T) {
	root := rootfs(t)
	for _, p := range oci.PinnedPaths {
		fd, err := Walk(openRoot(t, root), p)
		if err != nil {
			t.Fatalf("Walk(%s): %v", p, err)
		}
		var got, want unix.Stat_t
		if err := unix.Fstat(fd, &got); err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		if err := unix.Stat(filepath.Join(root, p), &want); err != nil {
			t.Fatal(err)
		}
		if got.Dev != want.Dev || got.Ino != want.Ino {
			t.Errorf("Walk(%s) opened inode %d:%d, want %d:%d", p, got.Dev, got.Ino, want.Dev, want.Ino)
		}
	}
}

func TestAncestors(t *testing.T) {
	got := Ancestors(oci.PinnedPaths)
	want := []string{"/etc", "/run", "/usr", "/run/nri-vgpu", "/usr/local", "/usr/local/nri-vgpu"}
	if !slices.Equal(got, want) {
		t.Errorf("Ancestors = %q, want %q", got, want)
	}
}

// TestSourcesNeedsEveryMount: a spec without one of the pinned mounts is
// refused (the hook would have nothing to check there), but for the ledger
// directory, which a record of the previous release lacks; the last mount
// at a destination is the one taken, destinations compared cleaned.
func TestSourcesNeedsEveryMount(t *testing.T) {
	mounts := []specs.Mount{
		{Destination: "/etc/ld.so.preload", Source: "/old"},
		{Destination: "/etc//ld.so.preload/", Source: "/host/preload"},
		{Destination: oci.ContainerShimPath, Source: "/host/shim"},
		{Destination: oci.ContainerLimitsPath, Source: "/host/limits"},
	}
	if _, err := Sources(mounts); err == nil || !strings.Contains(err.Error(), "no mount at "+oci.ContainerRegionDir) {
		t.Errorf("Sources without the region: error = %v, want one naming %s", err, oci.ContainerRegionDir)
	}
	mounts = append(mounts, specs.Mount{Destination: oci.ContainerRegionDir, Source: "/host/region"})
	got, err := Sources(mounts)
	if err != nil {
		t.Fatal(err)
	}
	if got[oci.ContainerPreloadPath] != "/host/preload" {
		t.Errorf("source of %s = %q, want the last mount's /host/preload", oci.ContainerPreloadPath, got[oci.ContainerPreloadPath])
	}
	if src, ok := got[oci.ContainerLedgerDir]; ok {
		t.Errorf("Sources without a ledger mount names %s as its source, want no entry (nothing to pin)", src)
	}
	if len(got) != 4 {
		t.Errorf("Sources without a ledger mount = %v, want the four others", got)
	}
	mounts = append(mounts, specs.Mount{Destination: oci.ContainerLedgerDir + "/", Source: "/host/ledger"})
	if got, err = Sources(mounts); err != nil {
		t.Fatal(err)
	}
	if got[oci.ContainerLedgerDir] != "/host/ledger" || len(got) != 5 {
		t.Errorf("Sources with a ledger mount = %v, want /host/ledger at %s too", got, oci.ContainerLedgerDir)
	}
}

// TestPinRefusesAFileThatIsNotTheMount: the pinned path is a file of the
// image's (not the host source the spec mounts there): refused before any
// mount is made.
func TestPinRefusesAFileThatIsNotTheMount(t *testing.T) {
	root := rootfs(t)
	host := t.TempDir()
	sources := map[string]string{}
	for _, p := range oci.PinnedPaths {
		sources[p] = filepath.Join(root, p) // the very files: pass
	}
	sources[oci.ContainerLimitsPath] = filepath.Join(host, "limits")
	if err := os.WriteFile(sources[oci.ContainerLimitsPath], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := check(openRoot(t, root), []string{oci.ContainerLimitsPath}, sources)
	want := "nri-vgpu's mount is not at /run/nri-vgpu/limits in the container (the image has something else there); refusing"
	if err == nil || err.Error() != want {
		t.Errorf("check error = %v, want %q", err, want)
	}
	// The ledger directory the spec mounts is another than the image's.
	sources[oci.ContainerLedgerDir] = host
	err = check(openRoot(t, root), []string{oci.ContainerLedgerDir}, sources)
	want = "nri-vgpu's mount is not at /run/nri-vgpu/ledger in the container (the image has something else there); refusing"
	if err == nil || err.Error() != want {
		t.Errorf("check error = %v, want %q", err, want)
	}
	// The very file, but reached without its mount (no runtime mounted
	// it): not the mount point the spec asked for.
	err = check(openRoot(t, root), []string{oci.ContainerPreloadPath}, sources)
	want = "/etc/ld.so.preload in the container is nri-vgpu's file but not its mount point; refusing"
	if err == nil || err.Error() != want {
		t.Errorf("check error = %v, want %q", err, want)
	}
}

// TestMainRefusesWithTheMessage runs the hook as the runtime does, with a
// bundle whose root has /etc/ld.so.preload as a link: status 1 and the
// message naming the path on stderr, before any mount is tried.
func TestMainRefusesWithTheMessage(t *testing.T) {
	bundle := t.TempDir()
	root := rootfs(t)
	replace(t, root, oci.ContainerPreloadPath, "link:/tmp/x")
	spec := specs.Spec{Root: &specs.Root{Path: root}}
	for _, p := range oci.PinnedPaths {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: p, Type: "bind", Source: "/"})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	state, _ := json.Marshal(specs.State{ID: "c1", Bundle: bundle})
	var stderr bytes.Buffer
	if code := Main("nri-vgpu", []string{"hook", "pin"}, bytes.NewReader(state), &stderr); code != 1 {
		t.Errorf("status = %d, want 1", code)
	}
	if want := "nri-vgpu: /etc/ld.so.preload in the image is a symbolic link; refusing\n"; stderr.String() != want {
		t.Errorf("stderr = %q, want %q", stderr.String(), want)
	}
	stderr.Reset()
	if code := Main("nri-vgpu", []string{"hook", "pinn"}, bytes.NewReader(state), &stderr); code != 2 {
		t.Errorf("status for \"hook pinn\" = %d, want 2 (usage)", code)
	}
}

// inMountNamespace runs f on a thread of its own in a private mount
// namespace, so that the mounts it makes vanish with the thread.
func inMountNamespace(t *testing.T, f func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and its
		// namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// mountLikeRunc bind-mounts a host file or directory for each pinned path
// of root, as the runtime does from the spec, and returns the sources.
func mountLikeRunc(root, host string) (map[string]string, error) {
	sources := map[string]string{}
	for _, p := range oci.PinnedPaths {
		src := filepath.Join(host, filepath.Base(p))
		var err error
		if p == oci.ContainerRegionDir || p == oci.ContainerLedgerDir {
			err = os.Mkdir(src, 0o755)
		} else {
			err = os.WriteFile(src, []byte("host\n"), 0o644)
		}
		if err != nil {
			return nil, err
		}
		if err := unix.Mount(src, filepath.Join(root, p), "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("bind %s: %w", p, err)
		}
		sources[p] = src
	}
	// The preload and the ledger are read-only, as the edits mount them.
	for _, p := range []string{oci.ContainerPreloadPath, oci.ContainerLedgerDir} {
		if err := unix.Mount("", filepath.Join(root, p), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return nil, err
		}
	}
	return sources, nil
}

// TestPinMakesTheParentsMountPoints plays the tenant after the hook: every
// rename or removal of a directory on the way to a pinned path, or of the
// preload, fails with EBUSY, and the files are still the host's. Without
// the hook the same renames succeed (checked first, on a second root).
func TestPinMakesTheParentsMountPoints(t *testing.T) {
	attacks := []struct{ from, to string }{
		{"usr/local/nri-vgpu", "usr/local/x"},
		{"run/nri-vgpu", "run/x"},
		{"etc", "etc.x"},
		{"usr", "usr.x"},
		{"usr/local", "usr/local.x"},
		{"run", "run.x"},
	}
	inMountNamespace(t, func() error {
		host := t.TempDir()
		// The control: the runtime's mounts alone leave the parents movable.
		control := rootfs(t)
		if _, err := mountLikeRunc(control, t.TempDir()); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(control, "run/nri-vgpu"), filepath.Join(control, "run/x")); err != nil {
			return fmt.Errorf("control: renaming run/nri-vgpu without the hook: %w (the test would prove nothing)", err)
		}

		root := rootfs(t)
		sources, err := mountLikeRunc(root, host)
		if err != nil {
			return err
		}
		if err := Pin(root, sources, false); err != nil {
			return fmt.Errorf("Pin: %w", err)
		}
		for _, a := range attacks {
			err := os.Rename(filepath.Join(root, a.from), filepath.Join(root, a.to))
			if !errors.Is(err, unix.EBUSY) {
				t.Errorf("rename /%s to /%s after the hook: %v, want EBUSY", a.from, a.to, err)
			}
		}
		if err := os.Remove(filepath.Join(root, oci.ContainerPreloadPath)); !errors.Is(err, unix.EBUSY) {
			t.Errorf("remove /etc/ld.so.preload after the hook: %v, want EBUSY", err)
		}
		if err := os.Remove(filepath.Join(root, "run/nri-vgpu/region")); !errors.Is(err, unix.EBUSY) {
			t.Errorf("rmdir /run/nri-vgpu/region after the hook: %v, want EBUSY", err)
		}
		if err := os.Remove(filepath.Join(root, oci.ContainerLedgerDir)); !errors.Is(err, unix.EBUSY) {
			t.Errorf("rmdir %s after the hook: %v, want EBUSY", oci.ContainerLedgerDir, err)
		}
		if err := os.Rename(filepath.Join(root, oci.ContainerLedgerDir), filepath.Join(root, "run/nri-vgpu/x")); !errors.Is(err, unix.EBUSY) {
			t.Errorf("rename %s after the hook: %v, want EBUSY", oci.ContainerLedgerDir, err)
		}
		if err := os.WriteFile(filepath.Join(root, oci.ContainerLedgerDir, "64"), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("creating a file in %s after the hook: %v, want EROFS", oci.ContainerLedgerDir, err)
		}
		data, err := os.ReadFile(filepath.Join(root, oci.ContainerPreloadPath))
		if err != nil || string(data) != "host\n" {
			t.Errorf("/etc/ld.so.preload after the hook = %q, %v; want the host file", data, err)
		}
		// The binds keep what lies below them: the preload is still
		// read-only; /etc itself is writable (the root is not read-only).
		if err := os.WriteFile(filepath.Join(root, oci.ContainerPreloadPath), nil, 0o644); !errors.Is(err, unix.EROFS) {
			t.Errorf("writing /etc/ld.so.preload after the hook: %v, want EROFS", err)
		}
		if err := os.WriteFile(filepath.Join(root, "etc/hostname"), nil, 0o644); err != nil {
			t.Errorf("writing /etc/hostname with a writable root: %v", err)
		}
		return nil
	})
}

// TestPinKeepsAReadOnlyRootReadOnly: with root.readonly the runtime later
// remounts only "/" read-only, so the hook's binds must be read-only
// themselves: no new file in /etc, /usr/local or /run/nri-vgpu.
func TestPinKeepsAReadOnlyRootReadOnly(t *testing.T) {
	inMountNamespace(t, func() error {
		root := rootfs(t)
		sources, err := mountLikeRunc(root, t.TempDir())
		if err != nil {
			return err
		}
		if err := Pin(root, sources, true); err != nil {
			return fmt.Errorf("Pin: %w", err)
		}
		for _, dir := range Ancestors(oci.PinnedPaths) {
			err := os.WriteFile(filepath.Join(root, dir, "new"), nil, 0o644)
			if !errors.Is(err, unix.EROFS) {
				t.Errorf("creating a file in %s of a read-only root after the hook: %v, want EROFS", dir, err)
			}
		}
		// The region below stays writable, as the edits mount it.
		if err := os.WriteFile(filepath.Join(root, oci.ContainerRegionDir, "usage"), nil, 0o644); err != nil {
			t.Errorf("writing the region after the hook: %v", err)
		}
		return nil
	})
}
