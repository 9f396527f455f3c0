// Package configure prepares a node's container runtime for nri-vgpu: it
// enables NRI in containerd and registers the plugin (`nri-vgpu configure
// containerd`), or adds the runtime wrapper to Docker's daemon.json (`nri-vgpu
// configure docker`).
//
// Both work in two steps. Containerd and Docker compute a Result (the files
// to write, with their old and new content) without touching anything;
// Result.Diff shows it (--dry-run) and Result.Apply writes it. Neither ever
// restarts a daemon: the Result's notes say what to restart.
package configure

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"
)

// Change is one file to write or one symlink to create.
type Change struct {
	// Path is the file's path on the host (without Result.Root).
	Path string
	// Old is the current content; nil when the file does not exist.
	Old []byte
	// New is the content to write (unused for a symlink).
	New []byte
	// Mode is the mode of a new file; an existing file keeps its own.
	Mode fs.FileMode
	// LinkTarget, when set, makes this change a symlink Path -> LinkTarget.
	LinkTarget string
}

// Result is what a configure step would do.
type Result struct {
	// Root stands for / when reading and writing (empty = /).
	Root string
	// Changes are the files to write, in order; empty when the runtime is
	// already configured.
	Changes []Change
	// Notes describe what was found, such as a setting that was replaced.
	Notes []string
	// Reload says how to make the daemon load the change (such as
	// "systemctl restart containerd"); set when there are changes.
	Reload string
}

// Changed reports whether applying the result would write anything.
func (r *Result) Changed() bool { return len(r.Changes) > 0 }

// Diff returns the changes as a unified diff (diff -u) of every file, and one
// line per symlink to create; "" when nothing changes.
func (r *Result) Diff() string {
	var out strings.Builder
	for _, c := range r.Changes {
		if c.LinkTarget != "" {
			fmt.Fprintf(&out, "symlink %s -> %s\n", c.Path, c.LinkTarget)
			continue
		}
		oldName := c.Path
		if c.Old == nil {
			oldName = "/dev/null"
		}
		out.WriteString(unifiedDiff(oldName, c.Path, string(c.Old), string(c.New)))
	}
	return out.String()
}

// Apply makes the changes. Files are replaced atomically (a temporary file in
// the same directory, then rename) and keep their mode and owner; missing
// parent directories are created with mode 0755. A file that is a symlink
// (a config kept elsewhere, or by a configuration manager) is written where
// the link points, inside Root, and the link stays. Apply refuses to write a
// file that changed since the Result was computed.
func (r *Result) Apply() error {
	for _, c := range r.Changes {
		if c.LinkTarget != "" {
			path := filepath.Join(r.root(), c.Path)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fmt.Errorf("creating the directory of %s: %w", c.Path, err)
			}
			if err := os.Symlink(c.LinkTarget, path); err != nil {
				return fmt.Errorf("registering the plugin: %w", err)
			}
			continue
		}
		target, err := resolveLink(r.root(), c.Path)
		if err != nil {
			return err
		}
		path := filepath.Join(r.root(), target)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("creating the directory of %s: %w", c.Path, err)
		}
		if err := writeFileAtomic(path, c); err != nil {
			return fmt.Errorf("writing %s: %w", c.Path, err)
		}
	}
	return nil
}

func (r *Result) root() string {
	if r.Root == "" {
		return "/"
	}
	return r.Root
}

func writeFileAtomic(path string, c Change) error {
	mode := c.Mode
	uid, gid := -1, -1
	current, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if c.Old != nil {
			return fmt.Errorf("the file was removed since it was read")
		}
	case err != nil:
		return err
	case c.Old == nil || !bytes.Equal(current, c.Old):
		return fmt.Errorf("the file changed since it was read; run the command again")
	default:
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		mode = st.Mode().Perm()
		uid, gid = fileOwner(st)
	}

	return atomicfile.WriteOwned(path, c.New, mode, uid, gid)
}

// maxLinks bounds the symlinks resolveLink follows, as the kernel's
// ELOOP limit does.
const maxLinks = 40

// resolveLink returns the host path (without root) that path names once the
// symlinks of its last element are followed, each read relative to root: an
// absolute target is taken under root, as a program inside root would see
// it. A path that is not a symlink, or does not exist, is returned as is.
// Replacing the file by rename must happen at the returned path: a rename
// over the link itself would replace the link with a plain file.
func resolveLink(root, path string) (string, error) {
	for range maxLinks {
		full := filepath.Join(root, path)
		st, err := os.Lstat(full)
		if err != nil || st.Mode()&fs.ModeSymlink == 0 {
			return path, nil
		}
		target, err := os.Readlink(full)
		if err != nil {
			return "", fmt.Errorf("reading the symlink %s: %w", path, err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = filepath.Clean(target)
	}
	return "", fmt.Errorf("%s: more than %d levels of symlinks", path, maxLinks)
}

// readOptional reads root/path, following symlinks as resolveLink does; a
// missing file gives (nil, nil).
func readOptional(root, path string) ([]byte, error) {
	target, err := resolveLink(root, path)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, target))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}
