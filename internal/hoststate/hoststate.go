// Package hoststate owns what nri-vgpu keeps on the host for its vGPU
// containers under run_dir: the preload file all of them share and one
// directory per container, <run_dir>/containers/<id>, holding the
// container's limits file, its usage region directory and container.json.
//
// Its lifecycle is provision → read → release: the NRI plugin and the
// runtime wrapper Provision a container's directory (and get back the host
// files its edits mount, see oci.Compute) and Release it when the container
// goes; status, metrics and the runtime wrapper's admission record read the
// directories through Open, List and ReadInfo; Sweep removes the
// directories of containers that went away unseen.
//
// Each region directory is writable from its container, so nothing below
// run_dir is reached through a symbolic link (internal/safepath), files are
// replaced atomically (internal/atomicfile), and readers never block on
// what a container wrote. Errors wrap ErrInvalidID, ErrNotFound and
// ErrSymlink for callers to tell apart with errors.Is.
package hoststate

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
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Host layout under run_dir:
//
//	<run_dir>/ld.so.preload                  the preload file, one line: oci.ContainerShimPath
//	<run_dir>/containers/<id>/limits         the container's limits file (Contract 4)
//	<run_dir>/containers/<id>/region/        the container's usage region (Contract 5)
//	<run_dir>/containers/<id>/container.json Info, for operators
const (
	PreloadFileName   = "ld.so.preload"
	ContainersDirName = "containers"
	LimitsFileName    = "limits"
	RegionDirName     = "region"
	InfoFileName      = "container.json"
)

// ContainersDirMode is the mode of <run_dir>/containers. Each region
// directory below it is 0777, so that any user in the container can create
// the region; without a closed parent, any host user who knows a container
// ID (shim command lines show them) could plant or replace another
// container's usage region. Only root (the runtime, the NRI plugin, status
// and metrics) needs the host paths: the container reaches its files
// through bind mounts, which runc (1.1 and later) and crun open on the
// host before entering a user namespace.
const ContainersDirMode = 0o700

// ProvisionGrace is how long a container directory without a readable
// container.json is taken to be still being provisioned: Provision writes
// container.json last, and a sweep must not delete the directory of a
// container being created at that moment. Older such directories are
// debris of a create that died half-way.
const ProvisionGrace = time.Minute

// maxInfoSize bounds what is read of a container.json; the file Provision
// writes is a few hundred bytes.
const maxInfoSize = 1 << 20

var (
	// ErrInvalidID is wrapped by the errors about a container ID that
	// cannot name a directory.
	ErrInvalidID = errors.New("invalid container ID")
	// ErrNotFound is wrapped, together with fs.ErrNotExist, by the errors
	// of the readers about a container that has no directory: never
	// provisioned, or released. A file missing from a directory that
	// exists (being provisioned or released right now) wraps only
	// fs.ErrNotExist.
	ErrNotFound = errors.New("no directory for this container")
	// ErrSymlink is wrapped by the errors about a symbolic link met below
	// run_dir: links there are never followed.
	ErrSymlink = safepath.ErrSymlink
)

// notFoundError marks an error about a container without a directory; its
// message is that of the error it wraps.
type notFoundError struct{ err error }

func (e *notFoundError) Error() string   { return e.err.Error() }
func (e *notFoundError) Unwrap() []error { return []error{ErrNotFound, e.err} }

// PreloadPath is the host file mounted at /etc/ld.so.preload.
func PreloadPath(cfg *config.Config) string {
	return filepath.Join(cfg.Paths.RunDir, PreloadFileName)
}

// ContainersDir is the directory holding one directory per vGPU container.
func ContainersDir(cfg *config.Config) string {
	return filepath.Join(cfg.Paths.RunDir, ContainersDirName)
}

// ContainerDir is the host directory of one container. The ID must satisfy
// ValidID.
func ContainerDir(cfg *config.Config, id string) string {
	return filepath.Join(ContainersDir(cfg), id)
}

// ValidID checks that id can name a directory: runtimes use hex IDs, but
// the ID comes from outside, so nothing that could leave the containers
// directory is accepted. The error wraps ErrInvalidID.
func ValidID(id string) error {
	if id == "" || len(id) > 255 || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return fmt.Errorf("%w %q", ErrInvalidID, id)
	}
	return nil
}

// Info is what container.json records about a vGPU container, so that
// `nri-vgpu status` can name it and show its slices.
type Info struct {
	ID           string                `json:"id"`
	Name         string                `json:"name,omitempty"`
	Pod          string                `json:"pod,omitempty"` // namespace/name
	PodUID       string                `json:"podUID,omitempty"`
	AllocationID string                `json:"allocationID"`
	GPUs         []limits.AllocatedGPU `json:"gpus"`
	// Source names the component that provisioned the directory ("nri"
	// for the NRI plugin), so that each sweeps only its own.
	Source  string    `json:"source"`
	Created time.Time `json:"created"`
	// Claim is set on the directory of a ResourceClaim (Contract 8),
	// whose ID is ClaimID(Claim.UID): the containers of the claim's pods
	// share its limits file and usage region.
	Claim *ClaimInfo `json:"claim,omitempty"`
}

// ClaimInfo is what the DRA driver read from the API server about a claim
// it prepared.
type ClaimInfo struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// PodUIDs are the pods in the claim's status.reservedFor when it was
	// last prepared: only their containers may use it.
	PodUIDs []string `json:"podUIDs"`
}

// ClaimSource is the Info.Source of a claim's directory: the DRA driver
// provisions it, and the NRI plugin honours claim markers only for such
// directories.
const ClaimSource = "dra"

// ClaimIDPrefix starts the directory name of a claim. Container IDs are
// hex, so a claim's directory never takes a container's name.
const ClaimIDPrefix = "claim-"

// ClaimID is the directory name (the Info.ID) of the claim with this UID.
func ClaimID(uid string) string { return ClaimIDPrefix + uid }

// Provision creates on the host what the edits of a vGPU container point at
// and returns those files for oci.Compute: the preload file (if missing or
// different), the container's directory with its limits file (written
// atomically), its usage region directory (mode 0777, so that any user in
// the container can create the region) and, last, container.json. The shim
// library must exist: a container must never start without its limits, and
// a missing bind-mount source would fail it later with a less clear
// message. When Provision fails, it removes what it made of the container's
// directory: a half-made directory is nobody's to account for.
func Provision(cfg *config.Config, info *Info, lf *limits.LimitsFile) (oci.HostFiles, error) {
	if err := ValidID(info.ID); err != nil {
		return oci.HostFiles{}, err
	}
	if st, err := os.Stat(cfg.Paths.ShimPath); err != nil {
		return oci.HostFiles{}, fmt.Errorf("shim library (paths.shim_path): %w", err)
	} else if !st.Mode().IsRegular() {
		return oci.HostFiles{}, fmt.Errorf("shim library (paths.shim_path) %s is not a regular file", cfg.Paths.ShimPath)
	}
	run, err := openRunDir(cfg)
	if err != nil {
		return oci.HostFiles{}, err
	}
	defer run.Close()
	if err := ensurePreloadFile(run); err != nil {
		return oci.HostFiles{}, err
	}
	containers, err := ensureContainersDir(run)
	if err != nil {
		return oci.HostFiles{}, err
	}
	defer containers.Close()
	if err := provisionContainer(containers, info, lf); err != nil {
		// RemoveAll removes a planted link itself, never its target.
		if rmErr := containers.RemoveAll(info.ID); rmErr != nil {
			return oci.HostFiles{}, fmt.Errorf("%w (and removing what was made: %w)", err, rmErr)
		}
		return oci.HostFiles{}, err
	}
	dir := ContainerDir(cfg, info.ID)
	return oci.HostFiles{
		Preload: PreloadPath(cfg),
		Limits:  filepath.Join(dir, LimitsFileName),
		Region:  filepath.Join(dir, RegionDirName),
	}, nil
}

// provisionContainer fills the directory of one container below containers.
func provisionContainer(containers *safepath.Dir, info *Info, lf *limits.LimitsFile) error {
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
	if err := provisionRegion(dir); err != nil {
		return err
	}
	data, err = json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	// Written last: see ProvisionGrace.
	if err := atomicfile.WriteIn(dir, InfoFileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	return nil
}

// provisionRegion creates the usage region directory below the container's
// directory dir: exactly 0777 whatever the umask, set on the directory
// opened without following a link (no sticky bit: processes of different
// users share the one region file).
func provisionRegion(dir *safepath.Dir) error {
	region, err := dir.EnsureDir(RegionDirName, 0o777)
	if err != nil {
		return fmt.Errorf("usage region directory: %w", err)
	}
	defer region.Close()
	if err := mountRegionFS(dir, region); err != nil {
		return fmt.Errorf("usage region directory: %w", err)
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
	want := []byte(oci.ContainerShimPath + "\n")
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

// UpdateInfo replaces container.json of a directory that Provision made,
// leaving its limits file and usage region as they are: both are bind
// mounted into running containers, and a new limits file would give the
// containers created after it a ledger of their own (Contract 5). A
// directory that does not exist is an error wrapping ErrNotFound.
func UpdateInfo(cfg *config.Config, info *Info) error {
	if err := ValidID(info.ID); err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	containers, err := openContainersDir(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("container info: %w", &notFoundError{err})
	}
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	defer containers.Close()
	dir, err := containers.OpenDir(info.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("container info: %w", &notFoundError{err})
	}
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	defer dir.Close()
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	if err := atomicfile.WriteIn(dir, InfoFileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	return nil
}

// Files returns the host files of a directory that Provision made, for
// oci.Compute: a container that uses another's files (the containers of a
// claim use the claim's) mounts these. The limits file must be a regular
// file and the region a directory, neither reached through a link; a
// missing directory gives an error wrapping ErrNotFound.
func Files(cfg *config.Config, id string) (oci.HostFiles, error) {
	if err := ValidID(id); err != nil {
		return oci.HostFiles{}, err
	}
	c, err := Open(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return oci.HostFiles{}, &notFoundError{err}
	}
	if err != nil {
		return oci.HostFiles{}, err
	}
	defer c.Close()
	f, err := c.d.OpenRegular(filepath.Join(id, LimitsFileName))
	if err != nil {
		return oci.HostFiles{}, fmt.Errorf("limits file: %w", c.notFound(id, err))
	}
	f.Close()
	region, err := c.d.OpenDir(filepath.Join(id, RegionDirName))
	if err != nil {
		return oci.HostFiles{}, fmt.Errorf("usage region directory: %w", c.notFound(id, err))
	}
	region.Close()
	dir := ContainerDir(cfg, id)
	return oci.HostFiles{
		Preload: PreloadPath(cfg),
		Limits:  filepath.Join(dir, LimitsFileName),
		Region:  filepath.Join(dir, RegionDirName),
	}, nil
}

// Release deletes the host directory of a container; a missing directory
// is not an error. A symbolic link at the container's place is removed
// itself, and so is any link below it: no target is touched.
func Release(cfg *config.Config, id string) error {
	if err := ValidID(id); err != nil {
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
	if err := unmountRegionFS(containers, id); err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	if err := containers.RemoveAll(id); err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	return nil
}

// Containers is <run_dir>/containers opened for reading the container
// directories without following a link below run_dir (each region
// directory is writable from its container). Close it when done.
type Containers struct {
	d *safepath.Dir
}

// Open opens <run_dir>/containers, refusing a link there. A missing
// directory (no container was ever provisioned) returns an error wrapping
// fs.ErrNotExist.
func Open(cfg *config.Config) (*Containers, error) {
	d, err := openContainersDir(cfg)
	if err != nil {
		return nil, err
	}
	return &Containers{d: d}, nil
}

// Close closes the directory.
func (c *Containers) Close() error { return c.d.Close() }

// Path returns the host path of name in the directory of container id, for
// messages.
func (c *Containers) Path(id string, name ...string) string {
	return c.d.Join(filepath.Join(append([]string{id}, name...)...))
}

// IDs returns the IDs of the container directories. Symbolic links there
// are not container directories.
func (c *Containers) IDs() ([]string, error) {
	entries, err := c.d.ReadDir()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && ValidID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Info reads container.json of container id.
func (c *Containers) Info(id string) (*Info, error) {
	data, err := c.readFile(id, InfoFileName, maxInfoSize)
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	var info Info
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("container info %s: %w", c.Path(id, InfoFileName), err)
	}
	return &info, nil
}

// Limits reads and parses the limits file of container id.
func (c *Containers) Limits(id string) (*limits.LimitsFile, error) {
	data, err := c.readFile(id, LimitsFileName, limits.MaxLimitsSize)
	if err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	lf, err := limits.ParseLimits(data)
	if err != nil {
		return nil, fmt.Errorf("limits file %s: %w", c.Path(id, LimitsFileName), err)
	}
	return lf, nil
}

// Usage reads the usage region of container id without its lock (see
// region.ReadUsage). A region that no process has created yet returns an
// error wrapping fs.ErrNotExist; a link or anything but a regular file in
// its place (the container can plant either) one wrapping region.ErrInvalid.
func (c *Containers) Usage(id string) (*region.Usage, error) {
	if err := ValidID(id); err != nil {
		return nil, fmt.Errorf("reading usage region: %w", err)
	}
	f, err := c.d.OpenRegular(filepath.Join(id, RegionDirName, region.FileName))
	if errors.Is(err, safepath.ErrSymlink) || errors.Is(err, safepath.ErrNotRegular) {
		return nil, fmt.Errorf("reading usage region: %w: %w", region.ErrInvalid, err)
	}
	if err != nil {
		return nil, fmt.Errorf("reading usage region: %w", c.notFound(id, err))
	}
	defer f.Close()
	return region.ReadUsageFrom(f)
}

// readFile reads the regular file name in the directory of container id,
// at most limit bytes.
func (c *Containers) readFile(id, name string, limit int64) ([]byte, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	data, err := c.d.ReadFile(filepath.Join(id, name), limit)
	if err != nil {
		return nil, c.notFound(id, err)
	}
	return data, nil
}

// notFound marks err, an error reaching a file of container id, as
// ErrNotFound when the container has no directory at all.
func (c *Containers) notFound(id string, err error) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	d, dirErr := c.d.OpenDir(id)
	if dirErr == nil {
		d.Close()
		return err
	}
	if errors.Is(dirErr, fs.ErrNotExist) {
		return &notFoundError{err}
	}
	return err
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

// List returns the IDs of the container directories under run_dir; none
// when no container was ever provisioned. Symbolic links there are not
// container directories.
func List(cfg *config.Config) ([]string, error) {
	c, err := Open(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list container directories: %w", err)
	}
	defer c.Close()
	ids, err := c.IDs()
	if err != nil {
		return nil, fmt.Errorf("list container directories: %w", err)
	}
	return ids, nil
}

// ReadInfo reads container.json of container id. Neither the containers
// directory, the container's directory nor the file is read through a
// symbolic link. A container without a directory (or none at all under
// run_dir) gives an error wrapping ErrNotFound.
func ReadInfo(cfg *config.Config, id string) (*Info, error) {
	if err := ValidID(id); err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	c, err := Open(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("container info: %w", &notFoundError{err})
	}
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	defer c.Close()
	return c.Info(id)
}

// Sweep deletes the directories of containers for which keep returns false,
// and returns the IDs it removed. A directory still being provisioned (no
// readable container.json, modified less than ProvisionGrace ago) is never
// deleted, whatever keep says.
func Sweep(cfg *config.Config, keep func(id string) bool) ([]string, error) {
	ids, err := List(cfg)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var removed []string
	var errs []error
	for _, id := range ids {
		if keep(id) || beingProvisioned(cfg, id, now) {
			continue
		}
		if err := Release(cfg, id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// beingProvisioned reports whether the directory of container id may be
// one that Provision is still writing: it has no readable container.json
// and was modified (an entry created in it) less than ProvisionGrace before
// now. A directory that cannot be examined counts as being provisioned;
// the next sweep looks again.
func beingProvisioned(cfg *config.Config, id string, now time.Time) bool {
	if _, err := ReadInfo(cfg, id); err == nil {
		return false
	}
	st, err := os.Lstat(ContainerDir(cfg, id))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return now.Sub(st.ModTime()) < ProvisionGrace
}
