package safepath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// eachResolver runs f once with openat2 and once with the component-wise
// walk of kernels that lack it.
func eachResolver(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	if hasOpenat2() {
		t.Run("openat2", f)
	} else {
		t.Log("this kernel has no openat2: only the walk runs")
	}
	t.Run("walk", func(t *testing.T) {
		noOpenat2.Store(true)
		defer noOpenat2.Store(false)
		f(t)
	})
}

// outside is a directory outside the trusted one, with a file whose mode and
// content must survive whatever is done through links to them.
type outside struct {
	dir, file string
}

func newOutside(t *testing.T) outside {
	t.Helper()
	o := outside{dir: t.TempDir()}
	o.file = filepath.Join(o.dir, "secret")
	if err := os.WriteFile(o.file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(o.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return o
}

// untouched fails the test if the outside directory or file changed.
func (o outside) untouched(t *testing.T) {
	t.Helper()
	for path, want := range map[string]fs.FileMode{o.dir: 0o700, o.file: 0o600} {
		st, err := os.Lstat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
	if data, err := os.ReadFile(o.file); err != nil || string(data) != "keep me" {
		t.Errorf("%s: %q (%v), want it unchanged", o.file, data, err)
	}
	entries, err := os.ReadDir(o.dir)
	if err != nil || len(entries) != 1 {
		t.Errorf("%s holds %v (%v), want only its file", o.dir, entries, err)
	}
}

// trusted returns an open trusted directory holding "sub/", "other/" and
// links "sub/dirlink" -> outside dir, "sub/filelink" -> outside file,
// "sub/inlink" -> ../other.
func trusted(t *testing.T, o outside) *Dir {
	t.Helper()
	root := t.TempDir()
	sub := filepath.Join(root, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(o.dir, filepath.Join(sub, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(o.file, filepath.Join(sub, "filelink")); err != nil {
		t.Fatal(err)
	}
	// A link that stays inside the trusted directory is not followed either:
	// containers/<id> must not lead to another container's directory.
	if err := os.Mkdir(filepath.Join(root, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../other", filepath.Join(sub, "inlink")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func wantSymlinkErr(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrSymlink) {
		t.Errorf("%s: %v, want an error wrapping ErrSymlink", what, err)
	}
}

func TestNoLinkIsFollowed(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		o := newOutside(t)
		d := trusted(t, o)

		_, err := d.Open("sub/filelink", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		wantSymlinkErr(t, "open a link for writing", err)
		_, err = d.Open("sub/dirlink/new", os.O_WRONLY|os.O_CREATE, 0o644)
		wantSymlinkErr(t, "create through a linked directory", err)
		_, err = d.Open("sub/dirlink/secret", os.O_RDONLY, 0)
		wantSymlinkErr(t, "read through a linked directory", err)
		_, err = d.OpenDir("sub/dirlink")
		wantSymlinkErr(t, "open a linked directory", err)
		_, err = d.EnsureDir("sub/dirlink", 0o777)
		wantSymlinkErr(t, "ensure a linked directory", err)
		_, err = d.EnsureDir("sub/dirlink/new", 0o777)
		wantSymlinkErr(t, "ensure a directory through a linked one", err)
		wantSymlinkErr(t, "mkdir through a linked directory", d.Mkdir("sub/dirlink/new", 0o777))
		_, err = d.ReadFile("sub/filelink", 100)
		wantSymlinkErr(t, "read a linked file", err)
		_, _, err = d.CreateTemp("sub/dirlink", "t-*")
		wantSymlinkErr(t, "temporary file through a linked directory", err)
		wantSymlinkErr(t, "link into a linked directory", d.Link("sub", "sub/dirlink/x"))
		wantSymlinkErr(t, "remove through a linked directory", d.Remove("sub/dirlink/secret"))
		wantSymlinkErr(t, "remove all through a linked directory", d.RemoveAll("sub/dirlink/secret"))
		_, err = d.EnsureDir("sub/inlink", 0o777)
		wantSymlinkErr(t, "ensure a directory linked inside", err)
		_, err = d.Open("sub/inlink/new", os.O_WRONLY|os.O_CREATE, 0o644)
		wantSymlinkErr(t, "create through a directory linked inside", err)
		if entries, err := os.ReadDir(d.Join("other")); err != nil || len(entries) != 0 {
			t.Errorf("other/ holds %v (%v), want nothing created through the link", entries, err)
		}
		if st, err := os.Stat(d.Join("other")); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("other/ mode %v (%v), want 0755 unchanged", st.Mode(), err)
		}
		if err := d.Mkdir("sub/dirlink", 0o777); !errors.Is(err, fs.ErrExist) {
			t.Errorf("mkdir over a link: %v, want fs.ErrExist", err)
		}
		if err := d.Link("sub/filelink", "sub/filelink"); !errors.Is(err, fs.ErrExist) {
			t.Errorf("link over a link: %v, want fs.ErrExist", err)
		}
		o.untouched(t)
	})
}

func TestRenameAndRemoveReplaceLinksNotTargets(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		o := newOutside(t)
		d := trusted(t, o)
		f, tmp, err := d.CreateTemp("sub", ".x-*.tmp")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tmp, "sub/.x-") || !strings.HasSuffix(tmp, ".tmp") {
			t.Errorf("temporary file %q, want sub/.x-….tmp", tmp)
		}
		if st, err := f.Stat(); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("temporary file mode %v (%v), want 0600", st.Mode(), err)
		}
		if _, err := f.WriteString("new"); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := d.Rename(tmp, "sub/filelink"); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(d.Join("sub/filelink")); err != nil || string(data) != "new" {
			t.Errorf("renamed over the link: %q (%v), want the new file in its place", data, err)
		}
		if err := d.Remove("sub/dirlink"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d.Join("sub/dirlink")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("link still there after Remove: %v", err)
		}
		o.untouched(t)
	})
}

func TestRemoveAll(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		o := newOutside(t)
		d := trusted(t, o)
		// A tree with links to the outside at several depths, as a
		// container could leave in its region directory.
		deep := d.Join("sub/a/b/c")
		if err := os.MkdirAll(deep, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, l := range []string{"sub/a/l1", "sub/a/b/c/l2"} {
			if err := os.Symlink(o.dir, d.Join(l)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(deep, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.Join("sub/a/b"), 0o500); err != nil { // root removes anyway
			t.Fatal(err)
		}
		if err := d.RemoveAll("sub"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d.Join("sub")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("sub still there: %v", err)
		}
		if err := d.RemoveAll("sub"); err != nil {
			t.Errorf("RemoveAll of a missing entry: %v, want nil", err)
		}
		o.untouched(t)

		// A link as the entry itself goes, not its target.
		if err := os.Symlink(o.dir, d.Join("top")); err != nil {
			t.Fatal(err)
		}
		if err := d.RemoveAll("top"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(d.Join("top")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("link still there: %v", err)
		}
		o.untouched(t)
	})
}

func TestEnsureDir(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		d := trusted(t, newOutside(t))
		old := unix.Umask(0o077)
		defer unix.Umask(old)
		for _, step := range []string{"create", "exists"} {
			sub, err := d.EnsureDir("sub/r", 0o777)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			sub.Close()
			if st, err := os.Lstat(d.Join("sub/r")); err != nil || st.Mode().Perm() != 0o777 || !st.IsDir() {
				t.Errorf("%s: %v (%v), want a directory with mode 0777 whatever the umask", step, st.Mode(), err)
			}
			if err := os.Chmod(d.Join("sub/r"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(d.Join("sub/file"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := d.EnsureDir("sub/file", 0o755); err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Errorf("EnsureDir over a file: %v, want an error saying it is not a directory", err)
		}
	})
}

func TestReadFile(t *testing.T) {
	eachResolver(t, func(t *testing.T) {
		d := trusted(t, newOutside(t))
		if err := os.WriteFile(d.Join("sub/f"), []byte("12345"), 0o644); err != nil {
			t.Fatal(err)
		}
		if data, err := d.ReadFile("sub/f", 5); err != nil || string(data) != "12345" {
			t.Errorf("ReadFile at its limit = %q, %v", data, err)
		}
		if _, err := d.ReadFile("sub/f", 4); !errors.Is(err, ErrTooLarge) {
			t.Errorf("ReadFile over its limit: %v, want ErrTooLarge", err)
		}
		if err := unix.Mkfifo(d.Join("sub/fifo"), 0o666); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := d.ReadFile("sub/fifo", 5); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("ReadFile of a FIFO: %v, want ErrNotRegular", err)
			}
		case <-time.After(30 * time.Second): // a failure detector, not a timing
			t.Fatal("ReadFile of a FIFO blocked")
		}
		if _, err := d.ReadFile("sub/missing", 5); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadFile of a missing file: %v, want fs.ErrNotExist", err)
		}
	})
}

func TestRefusesPathsThatLeave(t *testing.T) {
	d := trusted(t, newOutside(t))
	for _, rel := range []string{"..", "../x", "sub/../../x", "/etc/passwd", ""} {
		if _, err := d.Open(rel, os.O_RDONLY, 0); err == nil {
			t.Errorf("Open(%q) succeeded", rel)
		}
		if err := d.Remove(rel); err == nil {
			t.Errorf("Remove(%q) succeeded", rel)
		}
	}
}

func TestReadDir(t *testing.T) {
	d := trusted(t, newOutside(t))
	for range 2 { // a second listing sees the same
		entries, err := d.ReadDir()
		if err != nil || len(entries) != 2 || entries[0].Name() != "other" || entries[1].Name() != "sub" || !entries[1].IsDir() {
			t.Errorf("ReadDir = %v, %v; want [other/ sub/]", entries, err)
		}
	}
}
