// Package bindings remembers, for good, which pod first presented each
// allocation ID (Contract 2): an ID serves one pod, ever, across the pod's
// removal and restarts of the plugin, containerd and the node.
//
// The record lives in one file under state_dir. It is bounded: when more than
// MaxReleased IDs of removed pods are remembered, the oldest (by the time the
// allocation was issued) are dropped and the store's floor rises to their
// issue time. An allocation issued at or before the floor that is not bound
// already is refused, so dropping a record never makes its ID usable again.
// The kubelet re-presents the same annotation when it restarts a container
// of the same pod, even after a node reboot: those stay accepted, because the
// ID is still bound to that pod's UID.
package bindings

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// FileName is the store's file under state_dir.
const FileName = "bindings.json"

// MaxReleased is how many IDs of removed pods the store remembers by name;
// older ones are covered by the floor.
const MaxReleased = 4096

// maxFileSize bounds what Open reads: MaxReleased released entries plus the
// live ones of a crowded node fit many times over.
const maxFileSize = 16 << 20

// fileVersion is the version of the file's format.
const fileVersion = 1

// entry is one bound allocation ID.
type entry struct {
	Pod      string `json:"pod"`
	Issued   int64  `json:"issued"`
	Released bool   `json:"released,omitempty"` // the pod was removed
}

// file is the on-disk form.
type file struct {
	Version int              `json:"version"`
	Floor   int64            `json:"floor"`
	IDs     map[string]entry `json:"ids"`
}

// Store is the set of bindings. It is safe for concurrent use.
type Store struct {
	path        string
	maxReleased int
	log         *slog.Logger
	now         func() time.Time

	mu    sync.Mutex
	floor int64 // unix seconds; see the package comment
	ids   map[string]entry
}

// Options configure Open.
type Options struct {
	// MaxReleased overrides MaxReleased (tests); 0 means the default.
	MaxReleased int
	// KeyPath is the node's allocation key. A store missing while the key
	// exists was lost, since a new key is published only after Seed laid
	// an empty store beside it: Open then treats it like a damaged one
	// instead of starting afresh, which would accept the allocations of
	// removed pods again. Empty: a missing store is a new one.
	KeyPath string
	Logger  *slog.Logger
	// Now overrides time.Now (tests).
	Now func() time.Time
}

// Open loads the store at <stateDir>/bindings.json, or starts an empty one
// when the file does not exist and the allocation key does not either. A
// file that cannot be read as a store (cut short, garbage, planted as a
// symlink) is moved aside, and a file missing beside an existing key (see
// Options.KeyPath) is lost: in both cases the store starts over with its
// floor at the current time, so every allocation issued until now is
// refused unless a container that still exists presents it (see Sync),
// which fails closed without losing a running pod.
func Open(stateDir string, opts Options) (*Store, error) {
	s := &Store{
		path:        filepath.Join(stateDir, FileName),
		maxReleased: opts.MaxReleased,
		log:         opts.Logger,
		now:         opts.Now,
		ids:         map[string]entry{},
	}
	if s.maxReleased <= 0 {
		s.maxReleased = MaxReleased
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	f, err := readFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if !keyExists(opts.KeyPath) {
			return s, nil
		}
		s.floor = s.now().Unix()
		s.log.Error("allocation bindings missing while the allocation key exists; refusing allocations issued before now unless their container exists",
			"path", s.path, "key", opts.KeyPath)
		if err := s.persistLocked(); err != nil {
			return nil, err
		}
		return s, nil
	case err != nil:
		aside := fmt.Sprintf("%s.corrupt-%d", s.path, s.now().Unix())
		if rerr := os.Rename(s.path, aside); rerr != nil {
			return nil, fmt.Errorf("allocation bindings: %w; and cannot move it aside: %w", err, rerr)
		}
		s.floor = s.now().Unix()
		s.log.Error("allocation bindings unreadable; moved aside, refusing allocations issued before now unless their container exists",
			"err", err, "moved_to", aside)
		if err := s.persistLocked(); err != nil {
			return nil, err
		}
		return s, nil
	}
	s.floor = f.Floor
	s.ids = f.IDs
	return s, nil
}

// keyExists reports whether the allocation key is at path. Anything there
// but "not found" counts: a key that cannot be read is still a key that may
// have signed allocations.
func keyExists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// Seed lays an empty store in d, the state directory, unless a store (or
// anything else) is there already. The allocation key's creator calls it
// before publishing a new key, so that a key without a store beside it
// always means a store that was lost (see Options.KeyPath).
func Seed(d *safepath.Dir) error {
	data, err := json.Marshal(file{Version: fileVersion, IDs: map[string]entry{}})
	if err != nil {
		return fmt.Errorf("allocation bindings: %w", err)
	}
	// Never replaces: a store already there is kept as it is.
	if err := atomicfile.CreateIn(d, FileName, data, 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("allocation bindings: %w", err)
	}
	return nil
}

// readFile reads and checks the store's file without following a link.
func readFile(path string) (*file, error) {
	dir, err := safepath.OpenDir(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("allocation bindings: %w", err)
	}
	defer dir.Close()
	data, err := dir.ReadFile(filepath.Base(path), maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("allocation bindings: %w", err)
	}
	var f file
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("allocation bindings %s: %w", path, err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("allocation bindings %s: version %d, want %d", path, f.Version, fileVersion)
	}
	if f.IDs == nil {
		return nil, fmt.Errorf("allocation bindings %s: no ids", path)
	}
	for id, e := range f.IDs {
		if id == "" || e.Pod == "" {
			return nil, fmt.Errorf("allocation bindings %s: an entry without an id or pod", path)
		}
	}
	return &f, nil
}

// Bind binds id, issued at issued (unix seconds), to podUID, or accepts it
// again for the pod it is bound to. It refuses, with an error wrapping
// allocation.ErrReplay, an id bound to another pod, and an unbound id issued at
// or before the floor. A new binding is on disk before Bind returns.
func (s *Store) Bind(id, podUID string, issued int64) error {
	if id == "" || podUID == "" {
		return fmt.Errorf("bind allocation %q: empty allocation ID or pod UID", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.ids[id]; ok {
		if e.Pod != podUID {
			if e.Released {
				return replay("id %s belonged to pod %s, which was removed", id, e.Pod)
			}
			return replay("id %s already bound to pod %s", id, e.Pod)
		}
		if e.Released {
			// The same pod again (a sandbox recreated after its removal,
			// e.g. after a node reboot): it is live once more.
			e.Released = false
			s.ids[id] = e
			return s.persistLocked()
		}
		return nil
	}
	if issued <= s.floor {
		return replay("id %s issued at %s, not after %s, the oldest allocation this node still remembers",
			id, time.Unix(issued, 0).UTC().Format(time.RFC3339), time.Unix(s.floor, 0).UTC().Format(time.RFC3339))
	}
	s.ids[id] = entry{Pod: podUID, Issued: issued}
	if err := s.persistLocked(); err != nil {
		delete(s.ids, id)
		return err
	}
	return nil
}

// ReleasePod marks the IDs bound to podUID as belonging to a removed pod.
// They stay bound to it.
func (s *Store) ReleasePod(podUID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for id, e := range s.ids {
		if e.Pod == podUID && !e.Released {
			e.Released = true
			s.ids[id] = e
			changed = true
		}
	}
	if !changed {
		return nil
	}
	s.trimLocked()
	return s.persistLocked()
}

// Binding is one allocation ID presented by an existing container.
type Binding struct {
	ID     string
	Pod    string
	Issued int64
}

// Sync makes the store agree with the containers and pods that exist (NRI's
// Synchronize): the IDs the containers present are bound to their pods
// (even if issued before the floor: they exist), and the IDs of pods that no
// longer exist are released. It returns the existing containers' bindings
// that conflict with the store (an ID presented by two pods), which are left
// as they were.
func (s *Store) Sync(existing []Binding, pods []string) ([]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := make(map[string]bool, len(pods))
	for _, p := range pods {
		live[p] = true
	}
	var conflicts []error
	for _, b := range existing {
		live[b.Pod] = true
		e, ok := s.ids[b.ID]
		if ok && e.Pod != b.Pod {
			conflicts = append(conflicts, replay("id %s presented by pod %s is bound to pod %s", b.ID, b.Pod, e.Pod))
			continue
		}
		s.ids[b.ID] = entry{Pod: b.Pod, Issued: b.Issued}
	}
	for id, e := range s.ids {
		if !e.Released && !live[e.Pod] {
			e.Released = true
			s.ids[id] = e
		}
	}
	s.trimLocked()
	return conflicts, s.persistLocked()
}

// Owner returns the pod an ID is bound to.
func (s *Store) Owner(id string) (podUID string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.ids[id]
	return e.Pod, ok
}

// Len returns the number of IDs the store remembers by name.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// Floor returns the issue time at or before which unbound IDs are refused.
func (s *Store) Floor() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.floor
}

// trimLocked drops the oldest released IDs beyond maxReleased and raises the
// floor to cover them.
func (s *Store) trimLocked() {
	var released []string
	for id, e := range s.ids {
		if e.Released {
			released = append(released, id)
		}
	}
	excess := len(released) - s.maxReleased
	if excess <= 0 {
		return
	}
	sort.Slice(released, func(i, j int) bool {
		a, b := s.ids[released[i]], s.ids[released[j]]
		if a.Issued != b.Issued {
			return a.Issued < b.Issued
		}
		return released[i] < released[j]
	})
	for _, id := range released[:excess] {
		if t := s.ids[id].Issued; t > s.floor {
			s.floor = t
		}
		delete(s.ids, id)
	}
}

func (s *Store) persistLocked() error {
	data, err := json.Marshal(file{Version: fileVersion, Floor: s.floor, IDs: s.ids})
	if err != nil {
		return fmt.Errorf("allocation bindings: %w", err)
	}
	dir, err := safepath.OpenDir(filepath.Dir(s.path))
	if err != nil {
		return fmt.Errorf("allocation bindings: %w", err)
	}
	defer dir.Close()
	if err := atomicfile.WriteIn(dir, filepath.Base(s.path), data, 0o600); err != nil {
		return fmt.Errorf("allocation bindings: %w", err)
	}
	return nil
}

// rejection reads like the other rejections of an allocation
// ("allocation rejected: <detail>") and is errors.Is allocation.ErrReplay.
type rejection struct{ msg string }

func (r *rejection) Error() string { return allocation.ErrRejected.Error() + ": " + r.msg }
func (r *rejection) Unwrap() error { return allocation.ErrReplay }

func replay(format string, args ...any) error {
	return &rejection{msg: fmt.Sprintf(format, args...)}
}
