// Package allockey keeps the node's allocation key, <state_dir>/allocation.key
// (Contract 2): the device plugin signs allocations with it, the NRI plugin
// and the runtime wrapper verify them with it. The key is node state under
// state_dir; what is done with it (allocation.Sign, allocation.Verify) lives in
// pkg/limits.
package allockey

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
	"github.com/nri-vgpu/nri-vgpu/internal/bindings"
	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// FileName is the allocation key's file name inside the state directory.
const FileName = "allocation.key"

// Load reads the allocation key from <stateDir>/allocation.key. The file
// must hold exactly allocation.KeySize bytes and must not be accessible to group
// or others, and a symbolic link in its place is refused, not followed.
func Load(stateDir string) (allocation.Key, error) {
	d, err := safepath.OpenDir(stateDir)
	if err != nil {
		return allocation.Key{}, fmt.Errorf("allocation key: state directory: %w", err)
	}
	defer d.Close()
	return load(d)
}

func load(d *safepath.Dir) (allocation.Key, error) {
	path := d.Join(FileName)
	var key allocation.Key
	// Not through a link (a key planted elsewhere, or a file root should
	// not be made to read), and without blocking on a FIFO.
	f, err := d.Open(FileName, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, safepath.ErrSymlink) {
		return key, fmt.Errorf("allocation key: %w; remove it to have a new key made", err)
	}
	if err != nil {
		return key, fmt.Errorf("allocation key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return key, fmt.Errorf("allocation key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return key, fmt.Errorf("allocation key %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return key, fmt.Errorf("allocation key %s: mode %04o lets group or others read it; it must be 0600", path, perm)
	}
	// A key planted by another user would let that user sign allocations.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return key, fmt.Errorf("allocation key %s: owned by uid %d, not by this process (uid %d) or root; remove it to have a new one made", path, st.Uid, os.Geteuid())
	}
	// Read one byte more than a key so that a longer file is detected even
	// if it grows after the Stat.
	data, err := io.ReadAll(io.LimitReader(f, allocation.KeySize+1))
	if err != nil {
		return key, fmt.Errorf("allocation key %s: %w", path, err)
	}
	if len(data) != allocation.KeySize {
		what := fmt.Sprintf("%d bytes", len(data))
		if len(data) > allocation.KeySize {
			what = "more than 32 bytes"
		}
		return key, fmt.Errorf("allocation key %s: holds %s, want exactly %d; it is not a key nri-vgpu wrote (remove it to have a new one made, which invalidates the allocations of running containers)", path, what, allocation.KeySize)
	}
	copy(key[:], data)
	return key, nil
}

// ensureStateDir creates the state directory with mode 0700, or narrows an
// existing one to 0700 (kubelet, for one, creates hostPath directories
// 0755). Anyone who can write the directory could plant a key before the
// first one is made, so a directory owned by another user is refused.
func ensureStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("allocation key: create state directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("allocation key: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("allocation key: state directory %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return fmt.Errorf("allocation key: state directory %s is owned by uid %d, not by this process (uid %d) or root", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("allocation key: narrow state directory %s to 0700: %w", dir, err)
		}
	}
	return nil
}

// LoadOrCreate loads the allocation key, first creating it with
// allocation.KeySize random bytes if it does not exist yet. It is safe for
// concurrent use by any number of goroutines and processes: all of them end
// up with the same key.
//
// The key is written to a temporary file in the state directory, synced, and
// then hard-linked to its final name. A link never replaces an existing file,
// so whoever links first wins and everyone else reads the winner's key; a
// reader can never see a partly written key, and an existing key (or garbage
// in its place) is never truncated or overwritten. The state directory is
// created with mode 0700 when missing, and narrowed to 0700 when wider.
func LoadOrCreate(stateDir string) (allocation.Key, error) {
	if err := ensureStateDir(stateDir); err != nil {
		return allocation.Key{}, err
	}
	d, err := safepath.OpenDir(stateDir)
	if err != nil {
		return allocation.Key{}, fmt.Errorf("allocation key: state directory: %w", err)
	}
	defer d.Close()
	key, err := load(d)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if _, err := rand.Read(key[:]); err != nil {
		return allocation.Key{}, fmt.Errorf("allocation key: %w", err)
	}
	// The bindings store first: a key without one beside it means a store
	// that was lost, which the NRI plugin treats as damaged.
	if err := bindings.Seed(d); err != nil {
		return allocation.Key{}, fmt.Errorf("allocation key: %w", err)
	}
	// The key becomes durable before it can sign anything, so that it does
	// not vanish in a crash.
	if err := atomicfile.CreateIn(d, FileName, key[:], 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another process or goroutine created the key first (or a
			// link sits there, which load refuses).
			return load(d)
		}
		return allocation.Key{}, fmt.Errorf("allocation key: %w", err)
	}
	return key, nil
}
