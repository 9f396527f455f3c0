// Package hoststatetest gives tests a run_dir whose region filesystems
// (hoststate mounts a tmpfs on each container's region directory) are
// unmounted when the test ends, so that the temporary directory can be
// removed even when a test leaves containers behind.
package hoststatetest

import (
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
)

// RunDir returns a new temporary directory to use as paths.run_dir.
func RunDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	// Registered after TempDir's own cleanup, so it runs before it.
	t.Cleanup(func() {
		if err := mountinfo.UnmountUnder(dir); err != nil {
			t.Errorf("unmounting region filesystems under %s: %v", dir, err)
		}
	})
	return dir
}
