package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
)

func TestWriteReplacesWithModeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	if err := Write(path, []byte("new"), 0o644); err != nil {
		t.Fatalf("Write: %v", err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content = %q, %v; want \"new\"", got, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644 whatever the umask", st.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file", len(entries))
	}
}

func TestWriteFailureLeavesTargetUntouched(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "target")
	if err := os.Mkdir(path, 0o755); err != nil { // a directory cannot be renamed over
		t.Fatal(err)
	}
	if err := Write(path, []byte("x"), 0o644); err == nil {
		t.Fatal("Write over a directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !entries[0].IsDir() {
		t.Errorf("temporary file left behind: %v", entries)
	}
}

func TestWriteOwned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root")
	}
	path := filepath.Join(t.TempDir(), "spec")
	if err := WriteOwned(path, []byte("{}"), 0o640, 1234, 5678); err != nil {
		t.Fatalf("WriteOwned: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Uid != 1234 || sys.Gid != 5678 || st.Mode().Perm() != 0o640 {
		t.Errorf("owner %d:%d mode %v, want 1234:5678 0640", sys.Uid, sys.Gid, st.Mode().Perm())
	}
}

// A link planted where the file goes is replaced, and a linked directory on
// the way is refused: neither target changes.
func TestWriteInFollowsNoLink(t *testing.T) {
	outside := t.TempDir()
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.Symlink(target, filepath.Join(root, "limits")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "dir")); err != nil {
		t.Fatal(err)
	}
	d, err := safepath.OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	if err := WriteIn(d, "limits", []byte("new"), 0o644); err != nil {
		t.Fatalf("WriteIn over a link: %v", err)
	}
	if st, err := os.Lstat(filepath.Join(root, "limits")); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o644 {
		t.Errorf("limits after WriteIn: %v (%v), want a regular file with mode 0644 in place of the link", st.Mode(), err)
	}
	if err := WriteIn(d, "dir/target", []byte("new"), 0o644); !errors.Is(err, safepath.ErrSymlink) {
		t.Errorf("WriteIn through a linked directory: %v, want safepath.ErrSymlink", err)
	}
	st, err := os.Stat(target)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("target mode %v (%v), want 0600 unchanged", st.Mode(), err)
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != "keep me" {
		t.Errorf("target = %q (%v), want it unchanged", data, err)
	}
	if entries, err := os.ReadDir(outside); err != nil || len(entries) != 1 {
		t.Errorf("outside holds %v (%v), want only the target (no temporary file)", entries, err)
	}
}

// TestCreateInNeverReplaces: the first CreateIn makes the file with its
// mode; a second one leaves it as it is and says it exists; no temporary
// file is left either way.
func TestCreateInNeverReplaces(t *testing.T) {
	dir := t.TempDir()
	d, err := safepath.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := CreateIn(d, "f", []byte("first"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := CreateIn(d, "f", []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second CreateIn: %v, want fs.ErrExist", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || string(data) != "first" {
		t.Fatalf("f holds %q (%v), want %q", data, err, "first")
	}
	if fi, err := os.Stat(filepath.Join(dir, "f")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("f: %v %v, want mode 0640", fi.Mode(), err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %v (%v), want only f", entries, err)
	}
}
