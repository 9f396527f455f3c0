// Package safepath reaches files beneath a trusted directory without ever
// following a symbolic link. Root creates, writes, chmods and removes files
// under run_dir and state_dir; each container's region directory below
// run_dir is writable from inside the container, so a link planted there (or
// anywhere below those directories by someone who could write them) must
// never make root act on the file it points at.
//
// The trusted directory itself is named by configuration and resolved like
// any path (/var/run is a link to /run on most distributions). Everything
// below it is resolved by the kernel with openat2(2) and
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS; on kernels without openat2 (before
// 5.6) it is walked one component at a time with O_NOFOLLOW. Modes are set
// with fchmod on a descriptor opened that way, entries are created, renamed
// and removed with the *at calls relative to a parent opened that way, and
// none of those calls follows a link in its last component.
package safepath

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrSymlink is wrapped by the errors of operations that met a symbolic link
// below the trusted directory.
var ErrSymlink = errors.New("a symbolic link is in the way (links are not followed here)")

// ErrNotRegular is wrapped by the errors of OpenRegular and ReadFile about
// something other than a regular file (a FIFO, a device, a directory).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error of ReadFile about a file over its size
// limit.
var ErrTooLarge = errors.New("file too large")

// noOpenat2 is set when the kernel lacks openat2 (or a seccomp filter
// refuses it); the tests set it to exercise the component-wise walk.
var noOpenat2 atomic.Bool

// Dir is an open directory. Paths given to its methods are relative to it,
// use "/" between components, and never contain "..".
type Dir struct {
	f    *os.File
	path string // for messages
}

// OpenDir opens the trusted directory at path, following symbolic links in
// path itself.
func OpenDir(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Join returns the path of rel below d, for messages.
func (d *Dir) Join(rel string) string { return filepath.Join(d.path, rel) }

func (d *Dir) fd() int { return int(d.f.Fd()) }

// ProcPath names the opened directory itself as /proc/self/fd/N, for
// system calls that take a path but must act on exactly this directory
// (mount(2), umount(2)): the kernel resolves that link to the open
// directory, whatever has been renamed or planted since. Valid while d is
// open.
func (d *Dir) ProcPath() string { return fmt.Sprintf("/proc/self/fd/%d", d.fd()) }

// Stat returns the open directory's stat.
func (d *Dir) Stat() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		return st, &fs.PathError{Op: "fstat", Path: d.path, Err: err}
	}
	return st, nil
}

// ReadDir lists the directory (sorted by name).
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	// A fresh descriptor for every listing, so that one Dir can be listed
	// again after entries changed.
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, nil
}

// Open opens rel below d with flag (os.O_* or unix.O_* flags) and, when it
// creates the file, perm (before the umask). No component of rel may be a
// symbolic link, the last one included: such a link fails with ErrSymlink
// and is left alone.
func (d *Dir) Open(rel string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := d.openat(rel, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, d.pathErr("open", rel, err)
	}
	return os.NewFile(uintptr(fd), d.Join(rel)), nil
}

// OpenDir opens the directory rel below d; see Open.
func (d *Dir) OpenDir(rel string) (*Dir, error) {
	fd, err := d.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, d.pathErr("open", rel, err)
	}
	return &Dir{f: os.NewFile(uintptr(fd), d.Join(rel)), path: d.Join(rel)}, nil
}

// OpenRegular opens rel below d for reading if it is a regular file. It
// never blocks: a FIFO or a device fails with ErrNotRegular.
func (d *Dir) OpenRegular(rel string) (*os.File, error) {
	f, err := d.Open(rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: d.Join(rel), Err: fmt.Errorf("%w (%v)", ErrNotRegular, fi.Mode().Type())}
	}
	return f, nil
}

// ReadFile reads the regular file rel below d; a file of more than limit
// bytes fails with ErrTooLarge.
func (d *Dir) ReadFile(rel string, limit int64) ([]byte, error) {
	f, err := d.OpenRegular(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: d.Join(rel), Err: err}
	}
	if int64(len(data)) > limit {
		return nil, &fs.PathError{Op: "read", Path: d.Join(rel), Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)}
	}
	return data, nil
}

// Mkdir creates the directory rel below d with perm (before the umask). An
// existing entry, a symbolic link included, fails with fs.ErrExist.
func (d *Dir) Mkdir(rel string, perm fs.FileMode) error {
	return d.atParent("mkdir", rel, func(pfd int, name string) error {
		return unix.Mkdirat(pfd, name, uint32(perm.Perm()))
	})
}

// EnsureDir creates the directory rel below d unless it exists, opens it and
// gives it exactly perm, whatever the umask did at creation or an earlier
// version left. A symbolic link at rel fails with ErrSymlink, anything else
// that is not a directory with an error saying so; neither is touched.
func (d *Dir) EnsureDir(rel string, perm fs.FileMode) (*Dir, error) {
	if err := d.Mkdir(rel, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	sub, err := d.OpenDir(rel)
	if errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("%s is not a directory", d.Join(rel))
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(sub.fd(), &st); err != nil {
		sub.Close()
		return nil, &fs.PathError{Op: "stat", Path: sub.path, Err: err}
	}
	if want := uint32(perm.Perm()); st.Mode&0o7777 != want {
		if err := unix.Fchmod(sub.fd(), want); err != nil {
			sub.Close()
			return nil, &fs.PathError{Op: "chmod", Path: sub.path, Err: err}
		}
	}
	return sub, nil
}

// CreateTemp creates a new file with mode 0600 in the directory dirRel below
// d ("." for d itself), named by pattern with its last "*" replaced by a
// random string, and returns it with its path relative to d.
func (d *Dir) CreateTemp(dirRel, pattern string) (*os.File, string, error) {
	prefix, suffix := pattern, ""
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		prefix, suffix = pattern[:i], pattern[i+1:]
	}
	for range 100 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", fmt.Errorf("create temporary file in %s: %w", d.Join(dirRel), err)
		}
		rel := filepath.Join(dirRel, prefix+hex.EncodeToString(b[:])+suffix)
		f, err := d.Open(rel, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		return f, rel, nil
	}
	return nil, "", fmt.Errorf("create temporary file in %s: %w", d.Join(dirRel), fs.ErrExist)
}

// Rename renames oldRel to newRel, both below d. An entry at newRel is
// replaced, a symbolic link included (the link goes, its target stays).
func (d *Dir) Rename(oldRel, newRel string) error {
	return d.atParent("rename", oldRel, func(opfd int, oldName string) error {
		return d.atParent("rename", newRel, func(npfd int, newName string) error {
			return unix.Renameat(opfd, oldName, npfd, newName)
		})
	})
}

// Link makes newRel a hard link to oldRel, both below d. It never replaces
// an entry at newRel (fs.ErrExist), and a symbolic link at oldRel is linked
// itself, not its target.
func (d *Dir) Link(oldRel, newRel string) error {
	return d.atParent("link", oldRel, func(opfd int, oldName string) error {
		return d.atParent("link", newRel, func(npfd int, newName string) error {
			return unix.Linkat(opfd, oldName, npfd, newName, 0)
		})
	})
}

// Remove removes the file, symbolic link or empty directory rel below d.
func (d *Dir) Remove(rel string) error {
	return d.atParent("remove", rel, func(pfd int, name string) error {
		err := unix.Unlinkat(pfd, name, 0)
		if errors.Is(err, unix.EISDIR) {
			err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		}
		return err
	})
}

// Sync flushes the directory's entries to disk.
func (d *Dir) Sync() error { return d.f.Sync() }

// RemoveAll removes rel below d and everything under it; a missing rel is
// not an error. A symbolic link anywhere in the tree is removed itself: its
// target is never touched.
func (d *Dir) RemoveAll(rel string) error {
	err := d.atParent("remove", rel, func(pfd int, name string) error {
		return removeAllAt(pfd, name)
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// removeAllAt removes name in the directory pfd and everything under it.
func removeAllAt(pfd int, name string) error {
	// Unlinking first covers files and links in one call; only a directory
	// needs more. Whatever replaces an entry between two calls is looked at
	// again through the no-follow open below, never followed.
	for range 10 {
		err := unix.Unlinkat(pfd, name, 0)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EISDIR) {
			return err
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // replaced by a file or a link since: unlink that
		}
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		err = removeContents(fd)
		unix.Close(fd)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return err
		}
		// Something was created in it meanwhile: go round again.
	}
	return fmt.Errorf("%s keeps changing while it is removed", name)
}

// removeContents removes every entry of the open directory fd.
func removeContents(fd int) error {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dfd), ".")
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAllAt(fd, n); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// atParent resolves the parent directory of rel below d without following
// links and calls fn with it and rel's last component.
func (d *Dir) atParent(op, rel string, fn func(pfd int, name string) error) error {
	dir, name, err := split(rel)
	if err != nil {
		return d.pathErr(op, rel, err)
	}
	pfd := d.fd()
	if dir != "." {
		fd, err := d.openat(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return d.pathErr(op, rel, err)
		}
		defer unix.Close(fd)
		pfd = fd
	}
	if err := fn(pfd, name); err != nil {
		return d.pathErr(op, rel, err)
	}
	return nil
}

// split checks rel and returns its parent and last component.
func split(rel string) (dir, name string, err error) {
	if err := check(rel); err != nil {
		return "", "", err
	}
	dir, name = filepath.Split(rel)
	if name == "" || name == "." {
		return "", "", fmt.Errorf("%q names no entry", rel)
	}
	if dir == "" {
		dir = "."
	}
	return filepath.Clean(dir), name, nil
}

// check refuses paths that could leave the directory they are relative to.
func check(rel string) error {
	if rel == "" || filepath.IsAbs(rel) {
		return fmt.Errorf("%q is not a relative path", rel)
	}
	for c := range strings.SplitSeq(rel, "/") {
		if c == ".." {
			return fmt.Errorf("%q leaves its directory", rel)
		}
	}
	return nil
}

// openat opens rel below d; see Open.
func (d *Dir) openat(rel string, flag int, mode uint32) (int, error) {
	if err := check(rel); err != nil {
		return -1, err
	}
	rel = filepath.Clean(rel)
	flag |= unix.O_CLOEXEC
	if !noOpenat2.Load() {
		how := &unix.OpenHow{
			Flags:   uint64(flag),
			Mode:    uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		for {
			fd, err := unix.Openat2(d.fd(), rel, how)
			switch {
			case err == nil:
				return fd, nil
			case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
				// EAGAIN: a rename elsewhere raced the resolution.
				continue
			case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM) && !hasOpenat2():
				noOpenat2.Store(true)
				return walk(d.fd(), rel, flag, mode)
			case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
				return -1, ErrSymlink
			}
			return -1, err
		}
	}
	return walk(d.fd(), rel, flag, mode)
}

// hasOpenat2 tells a refused openat2 (seccomp filters answer EPERM) from a
// real permission error: it asks for a path that always exists.
func hasOpenat2() bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// walk is openat for kernels without openat2: every directory on the way is
// opened with O_PATH|O_NOFOLLOW and checked to be a directory, and the last
// component is opened with O_NOFOLLOW. rel is clean.
func walk(base int, rel string, flag int, mode uint32) (int, error) {
	comps := strings.Split(rel, "/")
	cur := base
	closeCur := func() {
		if cur != base {
			unix.Close(cur)
		}
	}
	defer func() { closeCur() }()
	for _, c := range comps[:len(comps)-1] {
		fd, err := unix.Openat(cur, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		closeCur()
		cur = fd
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return -1, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return -1, ErrSymlink
		default:
			return -1, unix.ENOTDIR
		}
	}
	last := comps[len(comps)-1]
	fd, err := unix.Openat(cur, last, flag|unix.O_NOFOLLOW, mode)
	switch {
	case errors.Is(err, unix.ELOOP):
		return -1, ErrSymlink
	case errors.Is(err, unix.ENOTDIR) && flag&unix.O_DIRECTORY != 0:
		// O_DIRECTORY|O_NOFOLLOW on a link answers ENOTDIR.
		var st unix.Stat_t
		if unix.Fstatat(cur, last, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, ErrSymlink
		}
	case err == nil && flag&unix.O_PATH != 0:
		// O_PATH|O_NOFOLLOW opens a link itself.
		var st unix.Stat_t
		if serr := unix.Fstat(fd, &st); serr != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(fd)
			return -1, ErrSymlink
		}
	}
	return fd, err
}

func (d *Dir) pathErr(op, rel string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &fs.PathError{Op: op, Path: d.Join(rel), Err: err}
}
