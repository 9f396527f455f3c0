// Package atomicfile replaces files so that a reader sees either the old
// content or the new, never a partial file: the limits file the shim reads,
// the runtime spec runc reads, the admission record, the runtime configs.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
)

// Write replaces path with data, readable with perm. See WriteOwned.
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteOwned(path, data, perm, -1, -1)
}

// WriteOwned replaces path with data: the data goes to a temporary file in
// the same directory (so the rename cannot cross file systems), which is
// given perm and, when uid >= 0, the owner uid:gid, synced, and renamed over
// path. On any error the temporary file is removed and path is untouched.
// Links in path's directory are followed; a link at path itself is replaced,
// never written through.
func WriteOwned(path string, data []byte, perm fs.FileMode, uid, gid int) error {
	d, err := safepath.OpenDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer d.Close()
	return write(d, filepath.Base(path), data, perm, uid, gid)
}

// WriteIn replaces rel below the directory d with data, readable with perm,
// as WriteOwned does, without following any link below d: a link on the way
// fails with safepath.ErrSymlink, a link at rel itself is replaced.
func WriteIn(d *safepath.Dir, rel string, data []byte, perm fs.FileMode) error {
	return write(d, rel, data, perm, -1, -1)
}

// CreateIn creates rel below the directory d with data, readable with perm,
// only if nothing is there yet: the data is written and synced to a
// temporary file first, which is then hard-linked to rel. A link never
// replaces, so of several creators one wins and the others get an error
// wrapping fs.ErrExist, and nobody ever sees a partial file. The new
// directory entry is synced, best effort (not every file system can).
func CreateIn(d *safepath.Dir, rel string, data []byte, perm fs.FileMode) error {
	tmpRel, err := prepare(d, rel, data, perm, -1, -1)
	if err != nil {
		return err
	}
	defer func() { _ = d.Remove(tmpRel) }()
	if err := d.Link(tmpRel, rel); err != nil {
		return fmt.Errorf("create %s: %w", d.Join(rel), err)
	}
	_ = d.Sync()
	return nil
}

func write(d *safepath.Dir, rel string, data []byte, perm fs.FileMode, uid, gid int) error {
	tmpRel, err := prepare(d, rel, data, perm, uid, gid)
	if err != nil {
		return err
	}
	if err := d.Rename(tmpRel, rel); err != nil {
		_ = d.Remove(tmpRel)
		return fmt.Errorf("write %s: %w", d.Join(rel), err)
	}
	return nil
}

// prepare writes data to a new temporary file beside rel, with perm and,
// when uid >= 0, the owner uid:gid, synced and closed, and returns its
// name below d. On any error nothing is left behind.
func prepare(d *safepath.Dir, rel string, data []byte, perm fs.FileMode, uid, gid int) (tmpRel string, err error) {
	tmp, tmpRel, err := d.CreateTemp(filepath.Dir(rel), "."+filepath.Base(rel)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", d.Join(rel), err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			_ = d.Remove(tmpRel)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	// Chmod on the descriptor: the umask applies at creation, not here.
	if err := tmp.Chmod(perm); err != nil {
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if uid >= 0 && (uid != os.Geteuid() || gid != os.Getegid()) {
		if err := tmp.Chown(uid, gid); err != nil {
			return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
		}
	}
	if err := tmp.Sync(); err != nil {
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	return tmpRel, nil
}
