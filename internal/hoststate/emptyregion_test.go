package hoststate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const uuid1 = "GPU-0f3e2d1c-5b6a-4978-8a9b-0c1d2e3f4a5b"

// twoGPUs is a limits file of two GPUs, the second without a memory limit.
func twoGPUs() *limits.LimitsFile {
	return &limits.LimitsFile{GPUs: []limits.GPULimit{
		{UUID: uuid1, Memory: 3 << 30, Cores: 30},
		{UUID: uuid0, Memory: 0, Cores: 100},
	}}
}

// Provision writes the region the container's first process would
// otherwise make: on the record's tmpfs, 0666 whatever the umask (any user
// of the container opens it for writing), a sound version 2 region with
// the limits file's GPUs in its order and nothing in use, and no
// temporary file left beside it.
func TestProvisionWritesEmptyRegion(t *testing.T) {
	cfg := newConfig(t)
	old := setUmask(0o077)
	defer setUmask(old)
	files, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(files.Region, region.FileName)
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o666 {
		t.Errorf("%s: %v, want a regular file 0666", path, st.Mode())
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		t.Errorf("%s: file system %#x (%v), want the record's tmpfs", path, sfs.Type, err)
	}
	if entries, err := os.ReadDir(files.Region); err != nil || len(entries) != 1 {
		t.Errorf("region directory holds %v (%v), want only %s", entries, err, region.FileName)
	}
	u, err := region.ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []region.DeviceUsage{{UUID: uuid1, Limit: 3 << 30, Cores: 30}, {UUID: uuid0, Limit: 0, Cores: 100}}
	if u.Version != 2 || !reflect.DeepEqual(u.Devices, want) || len(u.Processes) != 0 {
		t.Errorf("region = %+v, want version 2 with devices %+v and no process", u, want)
	}
	// What status and metrics read through the record.
	c, err := openContainers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if u, err := c.usage(ctrID); err != nil || len(u.Devices) != 2 || u.Devices[0].Used != 0 || u.Devices[1].Used != 0 {
		t.Errorf("Usage = %+v, %v; want two GPUs with nothing in use", u, err)
	}
}

// Provisioned again (a restart, a claim prepared for another pod), a record
// keeps its region as its processes left it: what they report is not
// wiped.
func TestProvisionAgainKeepsTheRegion(t *testing.T) {
	cfg := newConfig(t)
	files, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(files.Region, region.FileName)
	devs := []region.DeviceUsage{{UUID: uuid1, Limit: 3 << 30, Used: 1 << 30, Cores: 30, Peak: 2 << 30, ThrottledNs: 5}, {UUID: uuid0, Cores: 100}}
	regiontest.WriteV2(t, path, devs, []region.ProcessUsage{{PID: 9, HostPID: 1009, StartTime: 4, Used: []uint64{1 << 30, 0}, Launches: []uint64{2, 0}}})
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs()); err != nil {
		t.Fatal(err)
	}
	u, err := region.ReadUsage(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(u.Devices, devs) || len(u.Processes) != 1 || u.Processes[0].HostPID != 1009 {
		t.Errorf("region after a second Provision = %+v, want what its process reported: %+v and host pid 1009", u, devs)
	}
}

// What a tenant planted at the region's name (after deleting the host's) is
// neither followed nor opened when the record is provisioned again: a link
// stays a link and its target is untouched, a FIFO does not block.
func TestProvisionAgainLeavesWhatIsPlanted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, lt linkTarget, path string)
		is    fs.FileMode
	}{
		{"a link", func(t *testing.T, lt linkTarget, path string) { plant(t, lt.file, path) }, fs.ModeSymlink},
		{"a FIFO", func(t *testing.T, _ linkTarget, path string) {
			if err := unix.Mkfifo(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}, fs.ModeNamedPipe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			lt := newLinkTarget(t)
			files, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs())
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(files.Region, region.FileName)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, lt, path)
			done := make(chan error, 1)
			go func() { _, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs()); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Provision again: %v", err)
				}
			case <-time.After(30 * time.Second): // a failure detector, not a timing
				t.Fatal("Provision blocked on what was planted")
			}
			if st, err := os.Lstat(path); err != nil {
				t.Error(err)
			} else if st.Mode().Type() != tc.is {
				t.Errorf("%s after Provision: %v, want it left as planted (%v)", path, st.Mode(), tc.is)
			}
			lt.untouched(t)
		})
	}
}

// The region not written on the tmpfs just mounted fails Provision, naming
// the file, and leaves neither the record's directory nor its mount behind.
func TestProvisionFailsWithoutTheRegion(t *testing.T) {
	cfg := newConfig(t)
	defer func(opts string) { regionFSOpts = opts }(regionFSOpts)
	regionFSOpts = "size=65536,nr_inodes=16,mode=0777" // smaller than a region
	dir := ContainerDir(cfg, ctrID)
	regionDir := filepath.Join(dir, RegionDirName)
	_, err := New(cfg).Provision(&Info{ID: ctrID}, twoGPUs())
	if err == nil || !strings.Contains(err.Error(), "usage region "+filepath.Join(regionDir, region.FileName)+": ") ||
		!errors.Is(err, unix.ENOSPC) {
		t.Errorf("Provision = %v, want an error naming %s and saying no space is left", err, filepath.Join(regionDir, region.FileName))
	}
	if n := mountsAt(t, regionDir); n != 0 {
		t.Errorf("%d mounts left on %s", n, regionDir)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("container directory after a failed Provision: %v, want it gone", err)
	}
}
