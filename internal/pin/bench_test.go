package pin

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkPin measures the hook's own work on a container's start (the
// checks and the six bind mounts; not the start of the hook's process),
// over a root mounted as the runtime mounts it. Root only.
func BenchmarkPin(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for a mount namespace")
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the namespace ends with the thread
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- err
			return
		}
		for b.Loop() {
			b.StopTimer()
			root := rootfs(b)
			// The root is a mount of its own, as runc makes it, so that
			// one detach takes everything below it away.
			if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				done <- err
				return
			}
			sources, err := mountLikeRunc(root, b.TempDir())
			if err != nil {
				done <- err
				return
			}
			b.StartTimer()
			if err := Pin(root, sources, true); err != nil {
				done <- fmt.Errorf("Pin: %w", err)
				return
			}
			b.StopTimer()
			if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
				done <- err
				return
			}
			b.StartTimer()
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
