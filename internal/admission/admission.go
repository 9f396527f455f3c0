// Package admission is the Docker runtime wrapper's admission record: the
// node's account of the GPU memory and SM time that the wrapper has promised
// to live containers. Docker has no device plugin to hand out slices, so the
// wrapper admits each request against this account instead, and refuses one
// that would promise a GPU more than memory_scaling × its memory or
// cores_scaling × 100 percent of its SM time.
//
// The account is a JSON file under state_dir, read and rewritten under an
// exclusive flock on a separate lock file (the data file is replaced by
// rename, which a lock on the data file itself would not survive). The file
// is a cache over the host directories of live containers
// (<run_dir>/containers/<id>/, see internal/hoststate), which State.Sync
// reconciles it with on every change, so a lost or damaged file costs only
// a rebuild.
package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// File names under state_dir. They keep the name the record had before the
// package was called admission, so that an upgraded wrapper finds the
// record, and the lock, that the previous release kept.
const (
	FileName = "runtime-ledger.json"
	LockName = "runtime-ledger.lock"
)

// Version is the format version of the record file.
const Version = 1

// DefaultLockTimeout bounds the wait for the lock. Holders only read a few
// small files while they hold it, so a long wait means a hung holder, and a
// container create should fail with a message rather than hang.
const DefaultLockTimeout = 30 * time.Second

// Reservation is what a container holds of one GPU.
type Reservation struct {
	UUID string `json:"uuid"`
	// Memory is the container's GPU memory limit in bytes.
	Memory uint64 `json:"memory"`
	// Cores is the share of SM time reserved, in percent; 0 when the
	// container is not throttled (see FromAllocated).
	Cores int `json:"cores"`
}

// FromAllocated is the reservation of a container whose limits on one GPU
// are g. Memory is reserved in full: memory cannot be taken back from a
// container that holds it, so promising more than exists would make
// allocations fail in other containers. SM time is elastic: a container
// throttled to a share reserves that share, while a container with 100 % (no
// throttling) competes for whatever is idle and reserves none, so that
// containers asking only for memory can share a GPU.
func FromAllocated(g allocation.GPU) Reservation {
	r := Reservation{UUID: g.UUID, Memory: g.Memory}
	if g.Cores < 100 {
		r.Cores = g.Cores
	}
	return r
}

// Entry is one container's reservations.
type Entry struct {
	ID string `json:"id"`
	// Source names who prepared the container (the runtime wrapper, the NRI
	// plugin); see hoststate.Info.Source.
	Source  hoststate.Source `json:"source,omitempty"`
	Created time.Time        `json:"created"`
	// RuntimeRoot is the state directory of the runtime that runs the
	// container (runc's --root), when known. A runtime keeps a directory
	// named by the container ID under it while the container exists.
	RuntimeRoot string `json:"runtimeRoot,omitempty"`
	// Seen is set once that directory has been observed: only then does its
	// absence mean that the container is gone.
	Seen bool          `json:"seen,omitempty"`
	GPUs []Reservation `json:"gpus"`
}

// Capacity is what may be promised on one GPU.
type Capacity struct {
	Index  int    // NVML index, for messages
	UUID   string //
	Memory uint64 // bytes: memory_scaling × total memory
	Total  uint64 // the GPU's real memory, for messages
	Cores  int    // percent: cores_scaling × 100
}

// CapacityOf is the capacity of a GPU with totalMemory bytes under the given
// scalings (which must pass limits.CheckSplit): memory_scaling × total
// bytes, as the device plugin counts a whole GPU, and cores_scaling × 100
// percent, both rounded down.
func CapacityOf(index int, uuid string, totalMemory uint64, memoryScaling, coresScaling float64) (Capacity, error) {
	whole, err := limits.CheckedQuota(totalMemory, 1, 1, memoryScaling, 1)
	if err != nil {
		return Capacity{}, err
	}
	// Scalings are read as the decimals they print as, as pkg/limits does,
	// so that 1.1 gives 110 percent and not 110.00000000000001 or 109.
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(coresScaling, 'f', -1, 64))
	if !ok {
		return Capacity{}, fmt.Errorf("cores scaling %v is not a number", coresScaling)
	}
	r.Mul(r, big.NewRat(100, 1))
	cores := new(big.Int).Quo(r.Num(), r.Denom())
	if !cores.IsInt64() || cores.Int64() > 1<<30 {
		return Capacity{}, fmt.Errorf("cores scaling %v is too large", coresScaling)
	}
	return Capacity{Index: index, UUID: uuid, Memory: whole.Memory, Total: totalMemory, Cores: int(cores.Int64())}, nil
}

// State is the content of the record file.
type State struct {
	Version    int               `json:"version"`
	Containers map[string]*Entry `json:"containers"`
}

func newState() *State { return &State{Version: Version, Containers: map[string]*Entry{}} }

// Add records e, replacing an earlier entry of the same container.
func (s *State) Add(e Entry) {
	e.GPUs = slices.Clone(e.GPUs)
	s.Containers[e.ID] = &e
}

// Remove forgets a container; it reports whether there was an entry.
func (s *State) Remove(id string) bool {
	_, ok := s.Containers[id]
	delete(s.Containers, id)
	return ok
}

// IDs returns the containers in the record, sorted.
func (s *State) IDs() []string {
	return slices.Sorted(maps.Keys(s.Containers))
}

// Promised is the sum of what the containers other than except hold of the
// GPU uuid, and how many containers hold a part of it.
func (s *State) Promised(uuid, except string) (memory uint64, cores, holders int) {
	for id, e := range s.Containers {
		if id == except {
			continue
		}
		held := false
		for _, r := range e.GPUs {
			if r.UUID == uuid {
				memory += r.Memory
				cores += r.Cores
				held = true
			}
		}
		if held {
			holders++
		}
	}
	return memory, cores, holders
}

// Check reports whether container id can be promised want on top of what
// the other containers hold, without any GPU going past its capacity. The
// error is an *OversubscribedError naming every GPU that is short. A GPU in
// want without a capacity is an error: nothing can be promised on it.
func (s *State) Check(id string, want []Reservation, capacity []Capacity) error {
	var short []Shortfall
	for _, w := range want {
		i := slices.IndexFunc(capacity, func(c Capacity) bool { return c.UUID == w.UUID })
		if i < 0 {
			return fmt.Errorf("no capacity known for GPU %s", w.UUID)
		}
		c := capacity[i]
		mem, cores, holders := s.Promised(w.UUID, id)
		freeMem := c.Memory - min(mem, c.Memory)
		freeCores := c.Cores - min(cores, c.Cores)
		if w.Memory > freeMem || w.Cores > freeCores {
			short = append(short, Shortfall{Capacity: c, FreeMemory: freeMem, FreeCores: freeCores, Holders: holders, Want: w})
		}
	}
	if len(short) > 0 {
		return &OversubscribedError{Short: short}
	}
	return nil
}

// Shortfall describes one GPU that cannot hold a request.
type Shortfall struct {
	Capacity   Capacity
	FreeMemory uint64
	FreeCores  int
	Holders    int // containers holding a part of the GPU
	Want       Reservation
}

func (f Shortfall) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d (%s): %s of %s memory and %d%% of cores free; asked for %s",
		f.Capacity.Index, f.Capacity.UUID, quantity.FormatBytes(f.FreeMemory), quantity.FormatBytes(f.Capacity.Memory),
		f.FreeCores, quantity.FormatBytes(f.Want.Memory))
	if f.Want.Cores > 0 {
		fmt.Fprintf(&b, " and %d%%", f.Want.Cores)
	}
	switch f.Holders {
	case 0:
	case 1:
		b.WriteString(" (1 other container holds the rest)")
	default:
		fmt.Fprintf(&b, " (%d other containers hold the rest)", f.Holders)
	}
	return b.String()
}

// OversubscribedError is returned by Check when a request does not fit.
type OversubscribedError struct {
	Short []Shortfall
}

func (e *OversubscribedError) Error() string {
	parts := make([]string, len(e.Short))
	for i, f := range e.Short {
		parts[i] = f.String()
	}
	return "not enough GPU capacity left: " + strings.Join(parts, "; ")
}

// Record is the admission record of one state directory.
type Record struct {
	dir string
	// LockTimeout bounds the wait for the lock (DefaultLockTimeout if 0).
	LockTimeout time.Duration
	// Log receives warnings about a damaged record file (nothing if nil).
	Log *slog.Logger
}

// New returns the admission record kept in stateDir.
func New(stateDir string) *Record { return &Record{dir: stateDir} }

// Path is the record file.
func (r *Record) Path() string { return filepath.Join(r.dir, FileName) }

// Update locks the record, reads it and calls fn with its content; when fn
// returns nil the content is written back (atomically) before the lock is
// released. fn runs with the lock held, so what it checks and what it
// records cannot be interleaved with another process's Update.
func (r *Record) Update(fn func(*State) error) error {
	d, unlock, err := r.lock()
	if err != nil {
		return err
	}
	defer unlock()
	s, err := r.read(d)
	if err != nil {
		return err
	}
	if err := fn(s); err != nil {
		return err
	}
	return r.write(d, s)
}

// lock opens the state directory and takes the lock; unlock releases both.
// Nothing below the state directory is reached through a symbolic link: a
// link planted at the lock file fails with an error naming it instead of
// having root create or open its target.
func (r *Record) lock() (d *safepath.Dir, unlock func(), err error) {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("admission record: state directory: %w", err)
	}
	d, err = safepath.OpenDir(r.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("admission record: state directory: %w", err)
	}
	path := d.Join(LockName)
	f, err := d.Open(LockName, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("admission record: lock file: %w", err)
	}
	timeout := r.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			d.Close()
			return nil, nil, fmt.Errorf("admission record: lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			d.Close()
			return nil, nil, fmt.Errorf("admission record: %s is still locked by another process after %s", path, timeout)
		}
		time.Sleep(wait)
	}
	// Closing the descriptor releases the lock.
	return d, func() { f.Close(); d.Close() }, nil
}

// maxFileSize bounds what is read of the record file: an entry takes a few
// hundred bytes, so this holds tens of thousands of containers.
const maxFileSize = 16 << 20

// read parses the record file. A missing file is an empty record; so is a
// damaged one (logged), since callers rebuild the record from the host
// directories anyway and a broken cache must not block every container. A
// symbolic link, or anything but a regular file, in the file's place counts
// as damage: it is not followed, and the next write replaces it.
func (r *Record) read(d *safepath.Dir) (*State, error) {
	data, err := d.ReadFile(FileName, maxFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return newState(), nil
	}
	damaged := errors.Is(err, safepath.ErrSymlink) || errors.Is(err, safepath.ErrNotRegular) || errors.Is(err, safepath.ErrTooLarge)
	if err != nil && !damaged {
		return nil, fmt.Errorf("admission record: %w", err)
	}
	s := newState()
	if err == nil {
		err = json.Unmarshal(data, s)
	}
	if err == nil && s.Version != Version {
		err = fmt.Errorf("version %d, want %d", s.Version, Version)
	}
	if err != nil {
		if r.Log != nil {
			r.Log.Warn("admission record is damaged; rebuilding it from the container directories", "path", r.Path(), "err", err)
		}
		return newState(), nil
	}
	if s.Containers == nil {
		s.Containers = map[string]*Entry{}
	}
	for id, e := range s.Containers {
		if e == nil {
			delete(s.Containers, id)
			continue
		}
		e.ID = id
	}
	return s, nil
}

func (r *Record) write(d *safepath.Dir, s *State) error {
	s.Version = Version
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("admission record: %w", err)
	}
	if err := atomicfile.WriteIn(d, FileName, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("admission record: %w", err)
	}
	return nil
}
