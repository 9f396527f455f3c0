// Package hoststatetest gives tests a run_dir whose region filesystems
// (hoststate mounts a tmpfs on each container's region directory) are
// unmounted when the test ends, so that the temporary directory can be
// removed even when a test leaves containers behind.
package hoststatetest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// RunDir returns a new temporary directory to use as paths.run_dir.
func RunDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	// Registered after TempDir's own cleanup, so it runs before it.
	t.Cleanup(func() {
		if err := UnmountUnder(dir); err != nil {
			t.Errorf("unmounting region filesystems under %s: %v", dir, err)
		}
	})
	return dir
}

// UnmountUnder detaches every mount point below dir.
func UnmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	prefix := filepath.Clean(dir) + "/"
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		// Mount points are octal-escaped in mountinfo; ours have no
		// spaces, so the field is the path.
		if p := fields[4]; strings.HasPrefix(p, prefix) {
			points = append(points, p)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return &os.PathError{Op: "umount", Path: points[i], Err: err}
		}
	}
	return nil
}
