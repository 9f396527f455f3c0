package hoststate

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
)

// The region directory is the only host storage a container can write
// (Contract 5): it is a tmpfs of its own, so a tenant that fills it fills
// only RegionFSSize, never run_dir, and cannot make another container's
// creation fail. The usage region is 280,896 bytes (shim/include/region.h);
// the rest leaves room for the shim to rebuild a damaged one beside it.
const (
	RegionFSSize   = 1 << 20
	regionFSInodes = 16
)

var regionFSOpts = fmt.Sprintf("size=%d,nr_inodes=%d,mode=0777", RegionFSSize, regionFSInodes)

// mountRegionFS mounts a size-limited tmpfs on the open region directory,
// unless one is already there (the same container provisioned again), and
// reports whether it mounted one now.
func mountRegionFS(parent, region *safepath.Dir) (bool, error) {
	mounted, err := isMountPoint(parent, region)
	if err != nil || mounted {
		return false, err
	}
	if err := unix.Mount("nri-vgpu-region", region.ProcPath(), "tmpfs",
		unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, regionFSOpts); err != nil {
		return false, fmt.Errorf("mounting a %d-byte tmpfs on %s (nri-vgpu needs CAP_SYS_ADMIN in the host's mount namespace): %w",
			RegionFSSize, region.Join(""), err)
	}
	return true, nil
}

// unmountRecordFS detaches the tmpfs of container id's region directory, if
// there is one; a missing directory is not an error.
func unmountRecordFS(containers *safepath.Dir, id string) error {
	dir, err := containers.OpenDir(id)
	if err != nil {
		return ignoreMissing(err)
	}
	defer dir.Close()
	return unmountRegionFS(dir)
}

// unmountRegionFS detaches the tmpfs of the region directory in the
// container's directory dir, if there is one; a missing region directory
// is not an error.
func unmountRegionFS(dir *safepath.Dir) error {
	region, err := dir.OpenDir(RegionDirName)
	if err != nil {
		return ignoreMissing(err)
	}
	defer region.Close()
	mounted, err := isMountPoint(dir, region)
	if err != nil || !mounted {
		return err
	}
	// MNT_DETACH: the container may still have it mounted (its bind mount
	// keeps the tmpfs alive until the container's mount namespace goes).
	if err := unix.Unmount(region.ProcPath(), unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the region filesystem %s: %w", region.Join(""), err)
	}
	return nil
}

// isMountPoint reports whether region (a directory in parent) is the root
// of another file system than parent's.
func isMountPoint(parent, region *safepath.Dir) (bool, error) {
	ps, err := parent.Stat()
	if err != nil {
		return false, err
	}
	rs, err := region.Stat()
	if err != nil {
		return false, err
	}
	return ps.Dev != rs.Dev, nil
}

// ignoreMissing drops the errors that mean nothing of ours can be mounted
// there: nothing at all, or a link planted where we only ever mount on a
// directory (RemoveAll removes the link itself).
func ignoreMissing(err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, safepath.ErrSymlink) {
		return nil
	}
	return err
}
