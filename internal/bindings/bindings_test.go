package bindings

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

func open(t *testing.T, dir string, max int) *Store {
	t.Helper()
	s, err := Open(dir, Options{MaxReleased: max, Now: func() time.Time { return time.Unix(5000, 0) }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func wantReplay(t *testing.T, err error, contains string) {
	t.Helper()
	if !errors.Is(err, allocation.ErrReplay) || !errors.Is(err, allocation.ErrRejected) {
		t.Fatalf("err = %v, want a replay rejection", err)
	}
	if !strings.Contains(err.Error(), contains) {
		t.Fatalf("err = %q, want it to mention %q", err, contains)
	}
}

func TestBindOnePodEver(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0)
	if err := s.Bind("a1", "pod-1", 100); err != nil {
		t.Fatal(err)
	}
	// The same pod again: a container restart.
	if err := s.Bind("a1", "pod-1", 100); err != nil {
		t.Fatalf("same pod again: %v", err)
	}
	wantReplay(t, s.Bind("a1", "pod-2", 100), "already bound to pod pod-1")

	if err := s.ReleasePod("pod-1"); err != nil {
		t.Fatal(err)
	}
	// The attack: the annotation of a removed pod, presented by a new pod.
	wantReplay(t, s.Bind("a1", "pod-2", 100), "belonged to pod pod-1, which was removed")

	// The plugin restarts (or the node reboots): the record is on disk.
	s2 := open(t, dir, 0)
	wantReplay(t, s2.Bind("a1", "pod-3", 100), "pod-1")
	// The removed pod's sandbox recreated (same UID) is accepted again.
	if err := s2.Bind("a1", "pod-1", 100); err != nil {
		t.Fatalf("same pod after its sandbox was removed: %v", err)
	}
	if owner, ok := s2.Owner("a1"); !ok || owner != "pod-1" {
		t.Fatalf("Owner = %q, %v", owner, ok)
	}
}

func TestReleasedAreBoundedByTheFloor(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 3)
	// Five removed pods, issued at 10, 20, ..., 50; one live pod issued at 5.
	if err := s.Bind("live", "pod-live", 5); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		id, pod := fmt.Sprintf("id%d", i), fmt.Sprintf("pod%d", i)
		if err := s.Bind(id, pod, int64(10*i)); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleasePod(pod); err != nil {
			t.Fatal(err)
		}
	}
	// 3 released kept by name (id3..id5) + the live one; id1, id2 dropped,
	// the floor at id2's issue time.
	if got := s.Len(); got != 4 {
		t.Fatalf("Len = %d, want 4", got)
	}
	if got := s.Floor(); got != 20 {
		t.Fatalf("Floor = %d, want 20", got)
	}
	// Dropped by name, still refused by the floor.
	wantReplay(t, s.Bind("id1", "pod-new", 10), "oldest allocation")
	wantReplay(t, s.Bind("id2", "pod-new", 20), "oldest allocation")
	// Kept by name.
	wantReplay(t, s.Bind("id3", "pod-new", 30), "pod3")
	// A live binding older than the floor stays usable by its pod.
	if err := s.Bind("live", "pod-live", 5); err != nil {
		t.Fatalf("live pod below the floor: %v", err)
	}
	// A fresh allocation after the floor is fine.
	if err := s.Bind("fresh", "pod-new", 21); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	// Survives a restart.
	s2 := open(t, dir, 3)
	if s2.Floor() != 20 || s2.Len() != 5 {
		t.Fatalf("after reopen: floor %d len %d, want 20 and 5", s2.Floor(), s2.Len())
	}
}

func TestSync(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0)
	for _, b := range []Binding{{"a", "pod-a", 1}, {"b", "pod-b", 2}, {"c", "pod-c", 3}} {
		if err := s.Bind(b.ID, b.Pod, b.Issued); err != nil {
			t.Fatal(err)
		}
	}
	// After a restart: pod-a's container exists, pod-b still exists without
	// containers, pod-c is gone; pod-d's container was created while the
	// plugin was away (its ID is new to the store); pod-e presents pod-a's ID.
	conflicts, err := s.Sync([]Binding{{"a", "pod-a", 1}, {"d", "pod-d", 4}, {"a", "pod-e", 1}}, []string{"pod-a", "pod-b", "pod-d", "pod-e"})
	if err != nil {
		t.Fatal(err)
	}
	if len(conflicts) != 1 || !strings.Contains(conflicts[0].Error(), "pod-e") {
		t.Fatalf("conflicts = %v, want one naming pod-e", conflicts)
	}
	if err := s.Bind("b", "pod-b", 2); err != nil {
		t.Fatalf("pod-b still exists: %v", err)
	}
	if err := s.Bind("d", "pod-d", 4); err != nil {
		t.Fatalf("pod-d: %v", err)
	}
	wantReplay(t, s.Bind("c", "pod-x", 3), "which was removed")
	if owner, _ := s.Owner("a"); owner != "pod-a" {
		t.Fatalf("a owned by %q after a conflicting sync", owner)
	}
}

func TestDamagedFileFailsClosed(t *testing.T) {
	cases := map[string]func(path string) error{
		"garbage":   func(p string) error { return os.WriteFile(p, []byte("\x00\xffnot json"), 0o600) },
		"truncated": func(p string) error { return os.WriteFile(p, []byte(`{"version":1,"floor":0,"ids":{"a":`), 0o600) },
		"empty":     func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"version":   func(p string) error { return os.WriteFile(p, []byte(`{"version":9,"floor":0,"ids":{}}`), 0o600) },
		"no pod": func(p string) error {
			return os.WriteFile(p, []byte(`{"version":1,"floor":0,"ids":{"a":{"issued":1}}}`), 0o600)
		},
		"symlink": func(p string) error {
			target := filepath.Join(filepath.Dir(p), "elsewhere.json")
			if err := os.WriteFile(target, []byte(`{"version":1,"floor":0,"ids":{}}`), 0o600); err != nil {
				return err
			}
			return os.Symlink(target, p)
		},
		"directory": func(p string) error { return os.Mkdir(p, 0o700) },
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 0)
			if err := s.Bind("old", "pod-1", 4000); err != nil {
				t.Fatal(err)
			}
			if err := s.ReleasePod("pod-1"); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, FileName)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := damage(path); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(dir, Options{Now: func() time.Time { return time.Unix(5000, 0) }})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			// The record of "old" is lost: the floor (now) refuses it.
			wantReplay(t, s2.Bind("old", "pod-2", 4000), "oldest allocation")
			// A container that still exists is rebound by Sync.
			if _, err := s2.Sync([]Binding{{"old", "pod-1", 4000}}, nil); err != nil {
				t.Fatal(err)
			}
			if err := s2.Bind("old", "pod-1", 4000); err != nil {
				t.Fatalf("existing container's pod after Sync: %v", err)
			}
			// A new allocation is accepted.
			if err := s2.Bind("new", "pod-3", 5001); err != nil {
				t.Fatal(err)
			}
			// The damaged file was moved aside, not deleted.
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved aside: %v", aside)
			}
			if name == "symlink" {
				data, err := os.ReadFile(filepath.Join(dir, "elsewhere.json"))
				if err != nil || string(data) != `{"version":1,"floor":0,"ids":{}}` {
					t.Fatalf("symlink target changed: %q %v", data, err)
				}
			}
		})
	}
}

func TestFileIsPrivate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0)
	if err := s.Bind("a", "pod", 1); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
}

// Many pods present one ID at once: exactly one wins.
func TestBindRace(t *testing.T) {
	s := open(t, t.TempDir(), 0)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = s.Bind("contested", fmt.Sprintf("pod-%d", i), 100) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, allocation.ErrReplay):
			t.Errorf("Bind: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d pods bound the same ID, want 1", won)
	}
}

func TestBindNeedsAPod(t *testing.T) {
	s := open(t, t.TempDir(), 0)
	if err := s.Bind("a", "", 100); err == nil || !strings.Contains(err.Error(), "empty allocation ID or pod UID") {
		t.Fatalf("Bind with no pod: %v", err)
	}
}

// TestMissingFileBesideKeyFailsClosed: deleting the store while the
// allocation key exists must not make the IDs it remembered usable again.
func TestMissingFileBesideKeyFailsClosed(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "allocation.key")
	now := func() time.Time { return time.Unix(5000, 0) }
	s, err := Open(dir, Options{KeyPath: key, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	// No key yet: a missing store is a new one, with no floor.
	if s.Floor() != 0 {
		t.Fatalf("floor without a key = %d, want 0", s.Floor())
	}
	if err := s.Bind("old", "pod-1", 4000); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePod("pod-1"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, make([]byte, allocation.KeySize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, FileName)); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, Options{KeyPath: key, Now: now})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	// The removed pod's ID presented by a new pod: refused by the floor.
	wantReplay(t, s2.Bind("old", "pod-2", 4000), "oldest allocation")
	if s2.Floor() != 5000 {
		t.Fatalf("floor = %d, want 5000 (now)", s2.Floor())
	}
	// The floor is on disk: a second restart keeps refusing.
	s3, err := Open(dir, Options{KeyPath: key, Now: func() time.Time { return time.Unix(6000, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	wantReplay(t, s3.Bind("old", "pod-2", 4000), "oldest allocation")
	if err := s3.Bind("new", "pod-3", 5001); err != nil {
		t.Fatalf("an allocation issued after the loss: %v", err)
	}
}

// TestSeed: Seed lays an empty store that Open reads as new, and never
// replaces a store that is there.
func TestSeed(t *testing.T) {
	dir := t.TempDir()
	d, err := safepath.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := Seed(d); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != `{"version":1,"floor":0,"ids":{}}` {
		t.Fatalf("seeded store = %s", data)
	}
	if fi, _ := os.Stat(filepath.Join(dir, FileName)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("seeded store mode = %v, want 0600", fi.Mode().Perm())
	}
	s := open(t, dir, 0)
	if err := s.Bind("a1", "pod-1", 100); err != nil {
		t.Fatal(err)
	}
	if err := Seed(d); err != nil {
		t.Fatal(err)
	}
	if owner, ok := open(t, dir, 0).Owner("a1"); !ok || owner != "pod-1" {
		t.Fatalf("after a second Seed: owner of a1 = %q, %v; the store was replaced", owner, ok)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}
