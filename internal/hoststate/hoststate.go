// Package hoststate owns what nri-vgpu keeps on the host for its vGPU
// containers under run_dir: the preload file all of them share and one
// directory per container, <run_dir>/containers/<id>, holding the
// container's limits file, its ledger shards, its usage region directory
// and container.json.
//
// A Store (New) is the one handle on these records. Their lifecycle is
// provision → read → release: the NRI plugin, the runtime wrapper and the
// DRA driver Provision a directory (and get back the host files its edits
// mount, see oci.Compute) and Release it when its container or claim goes;
// status, metrics, the runtime wrapper's admission sync and the DRA
// driver's capacity check read every directory through one Scan; Sweep
// removes the directories of containers that went away unseen.
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
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

// Host layout under run_dir:
//
//	<run_dir>/ld.so.preload                  the preload file, one line: oci.ContainerShimPath
//	<run_dir>/containers/<id>/limits         the container's limits file (Contract 4)
//	<run_dir>/containers/<id>/ledger/0..63   the container's ledger shards (Contract 5)
//	<run_dir>/containers/<id>/region/        the container's usage region (Contract 5)
//	<run_dir>/containers/<id>/container.json Info, for operators
const (
	PreloadFileName   = "ld.so.preload"
	ContainersDirName = "containers"
	LimitsFileName    = "limits"
	RegionDirName     = "region"
	LedgerDirName     = "ledger"
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

// Modes of the ledger directory and its shards: the shim only takes locks
// on them, which a read-only descriptor allows, so nobody but root may
// write there (a tenant that could replace a shard would split the ledger).
const (
	LedgerDirMode   = 0o755
	LedgerShardMode = 0o444
)

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
	// ErrNotClaim is wrapped by the errors about a claim's directory that
	// holds something else than that claim, prepared by the DRA driver.
	ErrNotClaim = errors.New("not the claim's record")
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

// Info is what container.json records about a directory: a container's
// (KindContainer) or a claim's (KindClaim), so that `nri-vgpu status` and
// the metrics can name it and show its slices.
type Info struct {
	ID string `json:"id"`
	// Name, Pod ("namespace/name") and PodUID are a container's; a
	// claim's record leaves them empty and names itself in Claim.
	Name         string           `json:"name,omitempty"`
	Pod          string           `json:"pod,omitempty"`
	PodUID       string           `json:"podUID,omitempty"`
	AllocationID string           `json:"allocationID"`
	GPUs         []allocation.GPU `json:"gpus"`
	// Source names the component that provisioned the directory, so that
	// each sweeps only its own.
	Source  Source    `json:"source"`
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
	// PodNames are the names of those pods, for status and the metrics.
	PodNames []string `json:"podNames,omitempty"`
}

// Kind is what a record is the directory of.
type Kind string

const (
	// KindContainer is the directory of one container, provisioned by the
	// NRI plugin or the runtime wrapper.
	KindContainer Kind = "container"
	// KindClaim is the directory of a ResourceClaim, provisioned by the
	// DRA driver and shared by the containers of the claim's pods.
	KindClaim Kind = "claim"
)

// Kind returns what the record is the directory of: a claim's record is
// the one with a Claim.
func (i *Info) Kind() Kind {
	if i.Claim != nil {
		return KindClaim
	}
	return KindContainer
}

// Names returns the name and the pod that status shows for the record: a
// container's Name and Pod, or for a claim "claim <name>" and
// "<namespace>/<pod>,<pod>...".
func (i *Info) Names() (name, pod string) {
	if c := i.Claim; c != nil {
		return "claim " + c.Name, c.Namespace + "/" + strings.Join(c.PodNames, ",")
	}
	return i.Name, i.Pod
}

// infoJSON is Info as container.json holds it.
type infoJSON Info

// MarshalJSON writes a claim's record with its Names in the name and pod
// fields too: the previous release reads a claim's name and pods there.
func (i Info) MarshalJSON() ([]byte, error) {
	j := infoJSON(i)
	if i.Claim != nil {
		j.Name, j.Pod = i.Names()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads container.json. A claim's record written by the
// previous release has no podNames: they are taken from its pod field
// ("<namespace>/<pod>,<pod>..."). A claim's name and pod fields are not
// kept: they are its Names.
func (i *Info) UnmarshalJSON(data []byte) error {
	var j infoJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	if c := j.Claim; c != nil {
		if c.PodNames == nil {
			_, names, _ := strings.Cut(j.Pod, "/")
			for name := range strings.SplitSeq(names, ",") {
				if name != "" {
					c.PodNames = append(c.PodNames, name)
				}
			}
		}
		j.Name, j.Pod = "", ""
	}
	*i = Info(j)
	return nil
}

// Source is the component that provisioned a directory, as container.json
// records it.
type Source string

const (
	// SourceNRI is the NRI plugin (containerd): Synchronize sweeps only
	// directories of this source, so that the runtime wrapper's containers
	// sharing run_dir are left alone.
	SourceNRI Source = "nri"
	// SourceRuntime is the OCI runtime wrapper (Docker); the NRI plugin
	// leaves its directories alone.
	SourceRuntime Source = "nri-vgpu-runtime"
	// SourceDRA is the DRA driver, which provisions the directories of
	// claims; the NRI plugin honours claim markers only for such
	// directories.
	SourceDRA Source = "dra"
)

// ClaimIDPrefix starts the directory name of a claim. Container IDs are
// hex, so a claim's directory never takes a container's name.
const ClaimIDPrefix = "claim-"

// ClaimID is the directory name (the Info.ID) of the claim with this UID.
func ClaimID(uid string) string { return ClaimIDPrefix + uid }

// Store is the records under <run_dir>/containers, one directory each:
// what the NRI plugin, the runtime wrapper and the DRA driver provision
// there and what status, the metrics, the runtime wrapper's admission
// sync and the DRA driver's capacity check read (Scan). It holds no open
// file: each call opens run_dir again, without following a link below it,
// so that one Store serves a daemon for its whole life while run_dir is
// created, or emptied at a reboot (a tmpfs), meanwhile.
type Store struct {
	cfg *config.Config
}

// New returns the store of the records under cfg's run_dir.
func New(cfg *config.Config) *Store { return &Store{cfg: cfg} }

// Provision creates on the host what the edits of a vGPU container point at
// and returns those files for oci.Compute: the preload file (if missing or
// different), the container's directory with its ledger directory
// (limits.LedgerShards empty shards), its limits file (written
// atomically), its usage region directory (mode 0777, so that any user in
// the container can make the region anew) on a tmpfs of its own, with the
// empty usage region of the limits file (region.Empty; only on a tmpfs
// mounted now: a record provisioned again keeps what its processes
// reported) and, last, container.json. The shim
// library must exist: a container must never start without its limits, and
// a missing bind-mount source would fail it later with a less clear
// message. When Provision fails, it removes what it made of the container's
// directory: a half-made directory is nobody's to account for.
func (s *Store) Provision(info *Info, lf *limits.LimitsFile) (oci.HostFiles, error) {
	cfg := s.cfg
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
	return hostFiles(cfg, info.ID, true), nil
}

// hostFiles names the host files of record id that its edits mount; a
// record without a ledger directory (made by the previous release) mounts
// none.
func hostFiles(cfg *config.Config, id string, ledger bool) oci.HostFiles {
	dir := ContainerDir(cfg, id)
	f := oci.HostFiles{
		Preload: PreloadPath(cfg),
		Limits:  filepath.Join(dir, LimitsFileName),
		Region:  filepath.Join(dir, RegionDirName),
	}
	if ledger {
		f.Ledger = filepath.Join(dir, LedgerDirName)
	}
	return f
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
	// Before the limits file: a limits file that names ledger shards
	// implies that they exist.
	if err := provisionLedger(dir); err != nil {
		return err
	}
	sharded := *lf
	sharded.LedgerShards = limits.LedgerShards
	data, err := sharded.Marshal()
	if err != nil {
		return fmt.Errorf("limits file %s: %w", dir.Join(LimitsFileName), err)
	}
	if err := atomicfile.WriteIn(dir, LimitsFileName, data, 0o644); err != nil {
		return fmt.Errorf("limits file: %w", err)
	}
	if err := provisionRegion(dir, &sharded); err != nil {
		return err
	}
	// Written last: see ProvisionGrace.
	return writeInfo(dir, info)
}

// provisionLedger creates the ledger directory below the container's
// directory dir and its shards 0 .. limits.LedgerShards-1, each an empty
// regular file of root's, LedgerShardMode whatever the umask. A shard that
// exists is kept as it is (processes of a container provisioned again may
// hold locks on it: a new file would give later processes a ledger of
// their own); anything but a regular file there fails.
func provisionLedger(dir *safepath.Dir) error {
	ledger, err := dir.EnsureDir(LedgerDirName, LedgerDirMode)
	if err != nil {
		return fmt.Errorf("ledger directory: %w", err)
	}
	defer ledger.Close()
	for k := range limits.LedgerShards {
		if err := ensureShard(ledger, strconv.Itoa(k)); err != nil {
			return fmt.Errorf("ledger shard: %w", err)
		}
	}
	return nil
}

// ensureShard creates the empty shard name in the ledger directory unless
// it exists, and gives it LedgerShardMode. It never blocks on a FIFO and
// never follows a link.
func ensureShard(ledger *safepath.Dir, name string) error {
	f, err := ledger.Open(name, unix.O_RDONLY|unix.O_CREAT|unix.O_NONBLOCK, LedgerShardMode)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%v)", ledger.Join(name), fi.Mode().Type())
	}
	if fi.Mode()&fs.ModePerm != LedgerShardMode {
		if err := f.Chmod(LedgerShardMode); err != nil {
			return err
		}
	}
	return nil
}

// provisionRegion creates the usage region directory below the container's
// directory dir: exactly 0777 whatever the umask, set on the directory
// opened without following a link (no sticky bit: processes of different
// users share the one region file), with a tmpfs of its own. On a tmpfs it
// mounts now, it writes the empty usage region of the limits file lf
// (writeEmptyRegion); a tmpfs that was there already (the record
// provisioned again) and what is on it are left as they are: its
// container's processes report there, and the shim makes the file itself
// when it is missing.
func provisionRegion(dir *safepath.Dir, lf *limits.LimitsFile) error {
	rd, err := dir.EnsureDir(RegionDirName, 0o777)
	if err != nil {
		return fmt.Errorf("usage region directory: %w", err)
	}
	defer rd.Close()
	mounted, err := mountRegionFS(dir, rd)
	if err != nil {
		return fmt.Errorf("usage region directory: %w", err)
	}
	if !mounted {
		return nil
	}
	if err := writeEmptyRegion(dir, lf); err != nil {
		// Unmounted, so that the failed record's directory can be removed.
		if uerr := unmountRegionFS(dir); uerr != nil {
			return fmt.Errorf("%w (and unmounting its file system: %w)", err, uerr)
		}
		return err
	}
	return nil
}

// writeEmptyRegion writes the empty usage region of the limits file lf
// (region.Empty) on the tmpfs just mounted on the region directory of the
// container's directory dir, before its container exists. The container's
// first process then finds a sound region and takes its slot in it, where
// without one it makes the file and rebuilds it from every ledger shard.
// The file is mode 0666 whatever the umask (any user of the container
// opens it for writing, as the shim's own), and appears at its name only
// whole and only where nothing is (a hard link from a temporary file);
// nothing is reached through a link.
func writeEmptyRegion(dir *safepath.Dir, lf *limits.LimitsFile) error {
	// The descriptor opened before the mount names the directory under the
	// tmpfs: the tmpfs is reached anew, and checked to be the one there.
	rd, err := dir.OpenDir(RegionDirName)
	if err != nil {
		return fmt.Errorf("usage region: %w", err)
	}
	defer rd.Close()
	path := rd.Join(region.FileName)
	on, err := isMountPoint(dir, rd)
	if err != nil {
		return fmt.Errorf("usage region %s: %w", path, err)
	}
	if !on {
		return fmt.Errorf("usage region %s: its directory is not the tmpfs just mounted", path)
	}
	data, err := region.Empty(lf)
	if err != nil {
		return fmt.Errorf("usage region %s: %w", path, err)
	}
	if err := atomicfile.CreateIn(rd, region.FileName, data, 0o666); err != nil {
		return fmt.Errorf("usage region %s: %w", path, err)
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
func (s *Store) UpdateInfo(info *Info) error {
	if err := ValidID(info.ID); err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	c, err := openContainers(s.cfg)
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	defer c.Close()
	dir, err := c.d.OpenDir(info.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("container info: %w", &notFoundError{err})
	}
	if err != nil {
		return fmt.Errorf("container info: %w", err)
	}
	defer dir.Close()
	return writeInfo(dir, info)
}

// writeInfo replaces container.json in the record directory dir.
func writeInfo(dir *safepath.Dir, info *Info) error {
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
// file, the region and the ledger directories, none reached through a
// link; a missing directory gives an error wrapping ErrNotFound. A record
// without a ledger directory (made by the previous release) has no ledger
// shards: its Ledger is empty, and its limits file names none.
func (s *Store) Files(id string) (oci.HostFiles, error) {
	if err := ValidID(id); err != nil {
		return oci.HostFiles{}, err
	}
	c, err := openContainers(s.cfg)
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
	ledger, err := c.d.OpenDir(filepath.Join(id, LedgerDirName))
	if errors.Is(err, fs.ErrNotExist) {
		return hostFiles(s.cfg, id, false), nil
	}
	if err != nil {
		return oci.HostFiles{}, fmt.Errorf("ledger directory: %w", err)
	}
	ledger.Close()
	return hostFiles(s.cfg, id, true), nil
}

// Release deletes the host directory of a container; a missing directory
// is not an error. A symbolic link at the container's place is removed
// itself, and so is any link below it: no target is touched.
func (s *Store) Release(id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	c, err := openContainers(s.cfg)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	defer c.Close()
	return c.release(id)
}

// Info reads container.json of container id. Neither the containers
// directory, the container's directory nor the file is read through a
// symbolic link. A container without a directory (or none at all under
// run_dir) gives an error wrapping ErrNotFound.
func (s *Store) Info(id string) (*Info, error) {
	if err := ValidID(id); err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	c, err := openContainers(s.cfg)
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	defer c.Close()
	return c.info(id)
}

// Claim reads the record of the claim with this UID and checks that it is
// that claim's, as the DRA driver provisions it: directory ClaimID(uid),
// source SourceDRA, kind KindClaim, the same UID. A claim never prepared
// (or unprepared) gives an error wrapping ErrNotFound, a directory without
// a readable container.json (half made, half removed) one wrapping
// fs.ErrNotExist alone, and a record that is not the claim's one wrapping
// ErrNotClaim.
func (s *Store) Claim(uid string) (*Info, error) {
	id := ClaimID(uid)
	info, err := s.Info(id)
	if err != nil {
		return nil, err
	}
	if err := checkClaim(id, info, ContainerDir(s.cfg, id)); err != nil {
		return nil, err
	}
	return info, nil
}

// Scan calls fn with each directory below <run_dir>/containers, in name
// order, all read through the one containers directory it opens: none when
// no container was ever provisioned. Symbolic links there are not
// records. It stops at the first error fn returns and returns it as is;
// other errors are about listing the directory.
func (s *Store) Scan(fn func(*Record) error) error {
	c, err := openContainers(s.cfg)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list container directories: %w", err)
	}
	defer c.Close()
	ids, err := c.ids()
	if err != nil {
		return fmt.Errorf("list container directories: %w", err)
	}
	for _, id := range ids {
		if err := fn(&Record{ID: id, c: c}); err != nil {
			return err
		}
	}
	return nil
}

// Sweep deletes the directories for which keep returns false, and returns
// the IDs it removed. A directory still being provisioned (no readable
// container.json, modified less than ProvisionGrace ago) is never deleted,
// whatever keep says.
func (s *Store) Sweep(keep func(*Record) bool) ([]string, error) {
	now := time.Now()
	var removed []string
	var errs []error
	err := s.Scan(func(r *Record) error {
		if keep(r) || r.beingProvisioned(now) {
			return nil
		}
		if err := r.c.release(r.ID); err != nil {
			errs = append(errs, err)
			return nil
		}
		removed = append(removed, r.ID)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return removed, errors.Join(errs...)
}

// Record is one directory that Scan met: its ID and, read on demand
// through the directory Scan opened, its files. It is valid only while
// Scan's fn runs.
type Record struct {
	ID string

	c        *containers
	info     *Info
	infoErr  error
	infoRead bool
}

// Info reads the record's container.json (once: later calls return what
// the first read). An error wrapping fs.ErrNotExist is a directory being
// provisioned or released; one wrapping ErrNotFound too, one released
// since Scan listed it.
func (r *Record) Info() (*Info, error) {
	if !r.infoRead {
		r.info, r.infoErr = r.c.info(r.ID)
		r.infoRead = true
	}
	return r.info, r.infoErr
}

// Limits reads and parses the record's limits file.
func (r *Record) Limits() (*limits.LimitsFile, error) { return r.c.limits(r.ID) }

// Usage reads the record's usage region without its lock (see
// region.ReadUsage). Provision writes an empty one; a missing region (a
// record of the previous release whose container has not used a GPU yet,
// or one its container deleted) returns an error wrapping fs.ErrNotExist;
// a link or anything but a regular file in its place (the container can
// plant either) one wrapping region.ErrInvalid.
func (r *Record) Usage() (*region.Usage, error) { return r.c.usage(r.ID) }

// Claim reads the record's container.json and checks that it is the
// record of the claim whose UID its ID names, as Store.Claim does.
func (r *Record) Claim() (*Info, error) {
	info, err := r.Info()
	if err != nil {
		return nil, err
	}
	if err := checkClaim(r.ID, info, r.Path()); err != nil {
		return nil, err
	}
	return info, nil
}

// checkClaim checks that info, read from the directory id at path, is the
// record of the claim whose UID id names, provisioned by the DRA driver.
func checkClaim(id string, info *Info, path string) error {
	uid, ok := strings.CutPrefix(id, ClaimIDPrefix)
	if !ok || info.Kind() != KindClaim || info.Source != SourceDRA || info.Claim.UID != uid || info.ID != id {
		return &notClaimError{path: path, uid: uid, source: info.Source}
	}
	return nil
}

// notClaimError is a claim's directory that holds something else.
type notClaimError struct {
	path, uid string
	source    Source
}

func (e *notClaimError) Error() string {
	return fmt.Sprintf("claim directory %s does not hold claim %s prepared by the DRA driver (source %q)", e.path, e.uid, e.source)
}

func (e *notClaimError) Unwrap() error { return ErrNotClaim }

// Path returns the host path of name in the record's directory, for
// messages.
func (r *Record) Path(name ...string) string {
	return r.c.d.Join(filepath.Join(append([]string{r.ID}, name...)...))
}

// beingProvisioned reports whether the record's directory may be one that
// Provision is still writing: it has no readable container.json and was
// modified (an entry created in it) less than ProvisionGrace before now. A
// directory that cannot be examined counts as being provisioned; the next
// sweep looks again.
func (r *Record) beingProvisioned(now time.Time) bool {
	if _, err := r.Info(); err == nil {
		return false
	}
	st, err := os.Lstat(r.Path())
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return now.Sub(st.ModTime()) < ProvisionGrace
}

// containers is <run_dir>/containers opened for reading the record
// directories without following a link below run_dir (each region
// directory is writable from its container).
type containers struct {
	d *safepath.Dir
}

// openContainers opens <run_dir>/containers, refusing a link there. A
// missing directory (no container was ever provisioned) returns an error
// wrapping ErrNotFound and fs.ErrNotExist.
func openContainers(cfg *config.Config) (*containers, error) {
	run, err := safepath.OpenDir(cfg.Paths.RunDir)
	if err == nil {
		defer run.Close()
		var d *safepath.Dir
		if d, err = run.OpenDir(ContainersDirName); err == nil {
			return &containers{d: d}, nil
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &notFoundError{err}
	}
	return nil, err
}

func (c *containers) Close() error { return c.d.Close() }

// path returns the host path of name in the directory of record id.
func (c *containers) path(id, name string) string { return c.d.Join(filepath.Join(id, name)) }

// ids returns the names of the record directories. Symbolic links there
// are not record directories.
func (c *containers) ids() ([]string, error) {
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

// info reads container.json of record id.
func (c *containers) info(id string) (*Info, error) {
	data, err := c.readFile(id, InfoFileName, maxInfoSize)
	if err != nil {
		return nil, fmt.Errorf("container info: %w", err)
	}
	var info Info
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("container info %s: %w", c.path(id, InfoFileName), err)
	}
	return &info, nil
}

// limits reads and parses the limits file of record id.
func (c *containers) limits(id string) (*limits.LimitsFile, error) {
	data, err := c.readFile(id, LimitsFileName, limits.MaxLimitsSize)
	if err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	lf, err := limits.ParseLimits(data)
	if err != nil {
		return nil, fmt.Errorf("limits file %s: %w", c.path(id, LimitsFileName), err)
	}
	return lf, nil
}

// usage reads the usage region of record id (see Record.Usage).
func (c *containers) usage(id string) (*region.Usage, error) {
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

// release unmounts the region filesystem of record id and removes its
// directory.
func (c *containers) release(id string) error {
	if err := unmountRecordFS(c.d, id); err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	if err := c.d.RemoveAll(id); err != nil {
		return fmt.Errorf("remove container directory: %w", err)
	}
	return nil
}

// readFile reads the regular file name in the directory of record id, at
// most limit bytes.
func (c *containers) readFile(id, name string, limit int64) ([]byte, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	data, err := c.d.ReadFile(filepath.Join(id, name), limit)
	if err != nil {
		return nil, c.notFound(id, err)
	}
	return data, nil
}

// notFound marks err, an error reaching a file of record id, as
// ErrNotFound when the record has no directory at all.
func (c *containers) notFound(id string, err error) error {
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
