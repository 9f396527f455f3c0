package admission

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// SyncResult says what Sync changed.
type SyncResult struct {
	// Added are containers found in a host directory but not in the record
	// (prepared by another component, or a lost record file).
	Added []string
	// Dropped are entries whose host directory is gone.
	Dropped []string
	// Gone are containers of source own whose runtime no longer knows them
	// (their delete was never seen); their host directories were removed.
	Gone []string
	// Skipped are host directories without a readable container.json:
	// directories being prepared right now (container.json is written last)
	// or damaged ones. They are not counted.
	Skipped []string
	// Errors are host directories of gone containers that could not be
	// removed; their entries are kept, so nothing is promised twice.
	Errors []error
}

// Sync reconciles s with the container directories under run_dir, which are
// what the node's vGPU containers actually hold:
//
//   - an entry whose directory is gone is dropped (its container was
//     deleted, or the node rebooted and run_dir, a tmpfs, was emptied);
//   - a directory without an entry is added from its container.json, so that
//     containers prepared by the NRI plugin count too;
//   - an entry of source own with a known runtime root whose state
//     directory (<root>/<id>) was seen before and is gone now belongs to a
//     container that was deleted without the wrapper seeing it: its host
//     directory is removed and the entry dropped. Entries whose state
//     directory was never seen are kept: the runtime may keep its state
//     elsewhere, and keeping a reservation is the safe mistake.
//
// Only an error listing run_dir fails Sync; a single bad directory does not.
func (s *State) Sync(cfg *config.Config, own hoststate.Source) (SyncResult, error) {
	var res SyncResult
	state := hoststate.New(cfg)
	present := map[string]bool{}
	err := state.Scan(func(r *hoststate.Record) error {
		present[r.ID] = true
		if _, ok := s.Containers[r.ID]; ok {
			return nil
		}
		info, err := r.Info()
		if err != nil {
			res.Skipped = append(res.Skipped, r.ID)
			return nil
		}
		e := Entry{ID: r.ID, Source: info.Source, Created: info.Created}
		for _, g := range info.GPUs {
			e.GPUs = append(e.GPUs, FromAllocated(g))
		}
		s.Add(e)
		res.Added = append(res.Added, r.ID)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("admission record: %w", err)
	}
	for _, id := range s.IDs() {
		if !present[id] {
			s.Remove(id)
			res.Dropped = append(res.Dropped, id)
		}
	}
	for _, id := range s.IDs() {
		e := s.Containers[id]
		if e.RuntimeRoot == "" || hoststate.ValidID(id) != nil {
			continue
		}
		_, err := os.Stat(filepath.Join(e.RuntimeRoot, id))
		switch {
		case err == nil:
			e.Seen = true
		case errors.Is(err, fs.ErrNotExist) && e.Seen && e.Source == own:
			if err := state.Release(id); err != nil {
				res.Errors = append(res.Errors, err)
				continue
			}
			s.Remove(id)
			res.Gone = append(res.Gone, id)
		}
	}
	return res, nil
}
