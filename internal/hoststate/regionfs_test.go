package hoststate

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// A tenant filling its region directory fills a 1 MiB file system of its
// own, not run_dir: other containers are still provisioned.
func TestRegionDirectoryIsBounded(t *testing.T) {
	cfg := newConfig(t)
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	files, err := New(cfg).Provision(&Info{ID: "tenant"}, lf)
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(files.Region, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC || fs.Blocks*uint64(fs.Bsize) != 1<<20 {
		t.Fatalf("region directory: file system type %#x, %d bytes; want a 1 MiB tmpfs", fs.Type, fs.Blocks*uint64(fs.Bsize))
	}
	st, err := os.Stat(files.Region)
	if err != nil || st.Mode().Perm() != 0o777 {
		t.Fatalf("region directory mode %v (%v), want 0777 for every user of the container", st.Mode().Perm(), err)
	}

	// The attack: write until it fails.
	f, err := os.Create(filepath.Join(files.Region, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0xff}, 64<<10)
	written := 0
	for written < 64<<20 {
		n, err := f.Write(chunk)
		written += n
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling the region directory: %v", err)
			}
			break
		}
	}
	f.Close()
	if written > 1<<20 {
		t.Fatalf("the tenant wrote %d bytes into its region directory, want at most 1 MiB", written)
	}
	// Many small files: the inode limit.
	for i := range 64 {
		f, err := os.Create(filepath.Join(files.Region, "f"+string(rune('a'+i%26))+string(rune('a'+i/26))))
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("creating files in the region directory: %v", err)
			}
			break
		}
		f.Close()
		if i == 63 {
			t.Fatal("64 files created in the region directory, want an inode limit below that")
		}
	}

	if _, err := New(cfg).Provision(&Info{ID: "neighbour"}, lf); err != nil {
		t.Fatalf("provisioning another container after a tenant filled its region: %v", err)
	}
	// Provisioning the same container again mounts nothing twice.
	if _, err := New(cfg).Provision(&Info{ID: "tenant"}, lf); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, files.Region); n != 1 {
		t.Fatalf("%d mounts on the region directory after provisioning twice, want 1", n)
	}

	if err := New(cfg).Release("tenant"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := mountsAt(t, files.Region); n != 0 {
		t.Fatalf("%d mounts left on the released region directory", n)
	}
	if _, err := os.Lstat(filepath.Dir(files.Region)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("container directory after Release: %v", err)
	}
}

func mountsAt(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range bytes.Split(data, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) > 4 && string(fields[4]) == path {
			n++
		}
	}
	return n
}
