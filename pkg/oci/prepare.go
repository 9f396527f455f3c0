package oci

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// Host layout under run_dir:
//
//	<run_dir>/ld.so.preload                  the preload file, one line: ContainerShimPath
//	<run_dir>/containers/<id>/limits         the container's limits file (Contract 4)
//	<run_dir>/containers/<id>/region/        the container's usage region (Contract 5)
//	<run_dir>/containers/<id>/container.json ContainerInfo, for operators
const (
	PreloadFileName   = "ld.so.preload"
	ContainersDirName = "containers"
	LimitsFileName    = "limits"
	RegionDirName     = "region"
	InfoFileName      = "container.json"
)

// PreloadPath is the host file mounted at /etc/ld.so.preload.
func PreloadPath(cfg *config.Config) string {
	return filepath.Join(cfg.Paths.RunDir, PreloadFileName)
}

// ContainersDir is the directory holding one directory per vGPU container.
func ContainersDir(cfg *config.Config) string {
	return filepath.Join(cfg.Paths.RunDir, ContainersDirName)
}

// ContainerDir is the host directory of one container. The ID must satisfy
// ValidContainerID.
func ContainerDir(cfg *config.Config, containerID string) string {
	return filepath.Join(ContainersDir(cfg), containerID)
}

// ValidContainerID checks that id can name a directory: runtimes use hex
// IDs, but the ID comes from outside, so nothing that could leave the
// containers directory is accepted.
func ValidContainerID(id string) error {
	if id == "" || len(id) > 255 || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return fmt.Errorf("invalid container ID %q", id)
	}
	return nil
}

// ContainerInfo is what container.json records about a vGPU container, so
// that `nri-vgpu status` can name it and show its slices.
type ContainerInfo struct {
	ID           string                `json:"id"`
	Name         string                `json:"name,omitempty"`
	Pod          string                `json:"pod,omitempty"` // namespace/name
	PodUID       string                `json:"podUID,omitempty"`
	AllocationID string                `json:"allocationID"`
	GPUs         []limits.AllocatedGPU `json:"gpus"`
	// Source names the component that prepared the directory ("nri" for the
	// NRI plugin), so that each sweeps only its own.
	Source  string    `json:"source"`
	Created time.Time `json:"created"`
}

// Prepare creates on the host what the edits of a vGPU container point at:
// the preload file (if missing or different), the container's directory with
// its limits file (written atomically) and its usage region directory (mode
// 0777, so that any user in the container can create the region), and
// container.json. The shim library must exist: a container must never start
// without its limits, and a missing bind-mount source would fail it later
// with a less clear message.
func Prepare(cfg *config.Config, info *ContainerInfo, lf *limits.LimitsFile) error {
	if err := ValidContainerID(info.ID); err != nil {
		return err
	}
	if st, err := os.Stat(cfg.Paths.ShimPath); err != nil {
		return fmt.Errorf("shim library (paths.shim_path): %w", err)
	} else if !st.Mode().IsRegular() {
		return fmt.Errorf("shim library (paths.shim_path) %s is not a regular file", cfg.Paths.ShimPath)
	}
	run, err := openRunDir(cfg)
	if err != nil {
		return err
	}
	defer run.Close()
	if err := ensurePreloadFile(run); err != nil {
		return err
	}
	containers, err := ensureContainersDir(run)
	if err != nil {
		return err
	}
	defer containers.Close()
	// Nothing below run_dir is reached through a symbolic link: a link at
	// <id> or <id>/region (planted by whoever could write there) fails the
	// create instead of having its target written or made world-writable.
	dir, err := containers.EnsureDir(info.ID, 0o755)
	if err != nil {
		return fmt.Errorf("container directory: %w", err)
	}
	defer dir.Close()
	data, err := lf.Marshal()
	if err != nil {
		return fmt.Errorf("limits file %s: %w", dir.Join(LimitsFileName), err)
	}
	if err := atomicfile.WriteIn(dir, LimitsFileName, data, 0o644); err != nil {
		return fmt.Errorf("limits file: %w", err)
	}
	// Exactly 0777 whatever the umask, set on the directory opened without
	// following a link (no sticky bit: processes of different users share
	// the one region file).
	region, err := dir.EnsureDir(RegionDirName, 0o777)
	if err != nil {
		return fmt.Errorf("usage region directory: %w", err)
	}
	region.Close()
	data, err = json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	if err := atomicfile.WriteIn(dir, InfoFileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	return nil
}

// openRunDir creates run_dir if needed and opens it. run_dir itself comes
// from the configuration and is resolved like any path; everything below it
// is reached through the returned directory without following links.
func openRunDir(cfg *config.Config) (*safepath.Dir, error) {
	if err := os.MkdirAll(cfg.Paths.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("run directory (paths.run_dir): %w", err)
	}
	d, err := safepath.OpenDir(cfg.Paths.RunDir)
	if err != nil {
		return nil, fmt.Errorf("run directory (paths.run_dir): %w", err)
	}
	return d, nil
}

// ContainersDirMode is the mode of <run_dir>/containers. Each region
// directory below it is 0777, so that any user in the container can create
// the region; without a closed parent, any host user who knows a container
// ID (shim command lines show them) could plant or replace another
// container's usage region. Only root (the runtime, the NRI plugin, status
// and metrics) needs the host paths: the container reaches its files
// through bind mounts, which runc (1.1 and later) and crun open on the
// host before entering a user namespace.
const ContainersDirMode = 0o700

// ensureContainersDir creates <run_dir>/containers with ContainersDirMode,
// and closes one left with a wider mode by an earlier version.
func ensureContainersDir(run *safepath.Dir) (*safepath.Dir, error) {
	d, err := run.EnsureDir(ContainersDirName, ContainersDirMode)
	if err != nil {
		return nil, fmt.Errorf("containers directory: %w", err)
	}
	return d, nil
}

// ensurePreloadFile writes <run_dir>/ld.so.preload unless it already holds
// exactly the shim's container path. The file is shared by every container
// and replaced atomically, so a container being created never sees it empty.
func ensurePreloadFile(run *safepath.Dir) error {
	want := []byte(ContainerShimPath + "\n")
	// Anything else there (another content, a link, something that is not
	// a regular file) is replaced; a link is never followed.
	if got, err := run.ReadFile(PreloadFileName, int64(len(want))); err == nil && bytes.Equal(got, want) {
		return nil
	}
	if err := atomicfile.WriteIn(run, PreloadFileName, want, 0o644); err != nil {
		return fmt.Errorf("preload file: %w", err)
	}
	return nil
}

// maxInfoSize bounds what is read of a container.json; the file Prepare
// writes is a few hundred bytes.
const maxInfoSize = 1 << 20

// ReadContainerInfo reads container.json of a container directory. The
// directory's parent is resolved like any path; the directory itself and
// the file are not read through a symbolic link.
func ReadContainerInfo(dir string) (*ContainerInfo, error) {
	parent, err := safepath.OpenDir(filepath.Dir(dir))
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	defer parent.Close()
	data, err := parent.ReadFile(filepath.Join(filepath.Base(dir), InfoFileName), maxInfoSize)
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	var info ContainerInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("container info %s: %w", filepath.Join(dir, InfoFileName), err)
	}
	return &info, nil
}

// RemoveContainerDir deletes the host directory of a container; a missing
// directory is not an error. A symbolic link at the container's place is
// removed itself, and so is any link below it: no target is touched.
func RemoveContainerDir(cfg *config.Config, containerID string) error {
	if err := ValidContainerID(containerID); err != nil {
		return err
	}
	containers, err := openContainersDir(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	defer containers.Close()
	if err := containers.RemoveAll(containerID); err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	return nil
}

// OpenContainersDir opens <run_dir>/containers, refusing a link there, for
// reading the container directories without following a link below
// run_dir (each region directory is writable from its container). A
// missing directory returns an error wrapping fs.ErrNotExist.
func OpenContainersDir(cfg *config.Config) (*safepath.Dir, error) {
	return openContainersDir(cfg)
}

// ReadLimitsIn reads and parses the limits file of container id below
// containers (see OpenContainersDir), without following a link.
func ReadLimitsIn(containers *safepath.Dir, id string) (*limits.LimitsFile, error) {
	rel := filepath.Join(id, LimitsFileName)
	data, err := containers.ReadFile(rel, limits.MaxLimitsSize)
	if err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	lf, err := limits.ParseLimits(data)
	if err != nil {
		return nil, fmt.Errorf("limits file %s: %w", containers.Join(rel), err)
	}
	return lf, nil
}

// openContainersDir opens <run_dir>/containers, refusing a link there.
func openContainersDir(cfg *config.Config) (*safepath.Dir, error) {
	run, err := safepath.OpenDir(cfg.Paths.RunDir)
	if err != nil {
		return nil, err
	}
	defer run.Close()
	return run.OpenDir(ContainersDirName)
}

// ListContainerDirs returns the IDs of the container directories under
// run_dir. Symbolic links there are not container directories.
func ListContainerDirs(cfg *config.Config) ([]string, error) {
	containers, err := openContainersDir(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list container directories: %w", err)
	}
	defer containers.Close()
	entries, err := containers.ReadDir()
	if err != nil {
		return nil, fmt.Errorf("list container directories: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && ValidContainerID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// PrepareGrace is how long a container directory without a readable
// container.json is taken to be still being prepared: Prepare writes
// container.json last, and a sweep must not delete the directory of a
// container being created at that moment. Older such directories are
// debris of a create that died half-way.
const PrepareGrace = time.Minute

// SweepContainerDirs deletes the directories of containers for which keep
// returns false, and returns the IDs it removed. A directory still being
// prepared (no readable container.json, modified less than PrepareGrace
// ago) is never deleted, whatever keep says.
func SweepContainerDirs(cfg *config.Config, keep func(id string) bool) ([]string, error) {
	ids, err := ListContainerDirs(cfg)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var removed []string
	var errs []error
	for _, id := range ids {
		if keep(id) || beingPrepared(ContainerDir(cfg, id), now) {
			continue
		}
		if err := RemoveContainerDir(cfg, id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// beingPrepared reports whether dir may be a container directory that
// Prepare is still writing: it has no readable container.json and was
// modified (an entry created in it) less than PrepareGrace before now. A
// directory that cannot be examined counts as being prepared; the next
// sweep looks again.
func beingPrepared(dir string, now time.Time) bool {
	if _, err := ReadContainerInfo(dir); err == nil {
		return false
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return now.Sub(st.ModTime()) < PrepareGrace
}
