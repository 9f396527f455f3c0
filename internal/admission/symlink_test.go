package admission

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
)

// A link planted at the lock file fails the update with an error naming it;
// root neither creates nor opens the link's target.
func TestLockFileLinkIsNotFollowed(t *testing.T) {
	outside := t.TempDir()
	target := filepath.Join(outside, "created-by-root")
	l := New(t.TempDir())
	if err := os.Symlink(target, filepath.Join(l.dir, LockName)); err != nil {
		t.Fatal(err)
	}
	called := false
	err := l.Update(func(*State) error { called = true; return nil })
	if !errors.Is(err, safepath.ErrSymlink) {
		t.Errorf("Update with a linked lock file = %v, want an error wrapping safepath.ErrSymlink", err)
	}
	if called {
		t.Error("the update ran without the lock")
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link's target exists (%v): root created it", err)
	}
}

// A link planted at the record file is not read through (its target's
// entries are not counted) and is replaced by the next write; the target
// keeps its content and mode.
func TestRecordFileLinkIsReplaced(t *testing.T) {
	target := filepath.Join(t.TempDir(), "forged.json")
	forged := `{"version": 1, "containers": {"forged": {"gpus": [{"uuid": "` + uuid0 + `", "memory": 1}]}}}`
	if err := os.WriteFile(target, []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	l := New(t.TempDir())
	if err := os.Symlink(target, l.Path()); err != nil {
		t.Fatal(err)
	}
	var seen []string
	err := l.Update(func(s *State) error {
		seen = s.IDs()
		s.Add(Entry{ID: "a"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 0 {
		t.Errorf("the update saw %v through the link, want an empty record", seen)
	}
	if st, err := os.Lstat(l.Path()); err != nil || !st.Mode().IsRegular() {
		t.Errorf("record file after the update: %v (%v), want a regular file in place of the link", st.Mode(), err)
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != forged {
		t.Errorf("link target = %q (%v), want it unchanged", data, err)
	}
	if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("link target mode %v (%v), want 0600 unchanged", st.Mode(), err)
	}
}
