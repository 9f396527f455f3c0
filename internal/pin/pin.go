// Package pin is the createContainer hook of a vGPU container ("hook pin",
// Contract 3): it makes sure that nothing the container can write decides
// whether the shim loads and finds its limits.
//
// The runtime (runc) runs the hook in the container's mount namespace after
// all mounts and before it switches the root. For each of oci.PinnedPaths
// the hook checks that the file at that literal path in the container's
// root, reached without following any symbolic link, is the mount point of
// the host file the spec mounts there; a path that an image made unsafe (a
// link at /etc, /etc/ld.so.preload, /run/nri-vgpu, …, where the runtime has
// followed the link and mounted somewhere else) refuses the container,
// naming the path. Then it makes every directory on the way to those paths
// (/etc, /usr, /usr/local, /usr/local/nri-vgpu, /run, /run/nri-vgpu) a
// mount point of its own with a recursive bind mount onto itself: rename(2)
// and rmdir(2) refuse to move or remove a mount point (EBUSY), so the tenant
// can no longer rename a parent directory away with the mounts inside, nor
// unlink the preload. A container whose root is read-only gets those binds
// read-only too: the runtime remounts only "/" read-only after the hook.
package pin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// Main runs the pin hook as "prog ARGS", ARGS being every argument after
// the program's name, which must be oci.PinHookArgs ("hook pin", as
// oci.PinHook puts them into the spec): the container's state (OCI runtime
// spec, "state") on stdin; a message starting with prog on stderr and
// status 1 when the container must not start, 2 for other arguments.
func Main(prog string, args []string, stdin io.Reader, stderr io.Writer) int {
	if !slices.Equal(args, oci.PinHookArgs) {
		fmt.Fprintf(stderr, "usage: %s %s   (run by the container runtime as a createContainer hook)\n", prog, strings.Join(oci.PinHookArgs, " "))
		return 2
	}
	if err := run(stdin); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
	return 0
}

func run(stdin io.Reader) error {
	var state specs.State
	if err := json.NewDecoder(io.LimitReader(stdin, 1<<20)).Decode(&state); err != nil {
		return fmt.Errorf("pin hook: read the container state on stdin: %w", err)
	}
	if !filepath.IsAbs(state.Bundle) {
		return fmt.Errorf("pin hook: container state: bundle %q is not an absolute path", state.Bundle)
	}
	data, err := os.ReadFile(filepath.Join(state.Bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("pin hook: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("pin hook: %s: %w", filepath.Join(state.Bundle, "config.json"), err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return errors.New("pin hook: the spec has no root.path")
	}
	rootfs := spec.Root.Path
	if !filepath.IsAbs(rootfs) {
		rootfs = filepath.Join(state.Bundle, rootfs)
	}
	sources, err := Sources(spec.Mounts)
	if err != nil {
		return err
	}
	return Pin(rootfs, sources, spec.Root.Readonly)
}

// Sources returns, for each of oci.PinnedPaths, the host source of the last
// mount at it in mounts (the one the runtime leaves on top), as the
// runtime mounts it: destinations compared cleaned and absolute. Only the
// oci.OptionalPinnedPaths may be missing; they are then left out.
func Sources(mounts []specs.Mount) (map[string]string, error) {
	src := map[string]string{}
	for _, m := range mounts {
		d := path.Join("/", m.Destination)
		if slices.Contains(oci.PinnedPaths, d) {
			src[d] = m.Source
		}
	}
	for _, p := range oci.PinnedPaths {
		if src[p] == "" && !slices.Contains(oci.OptionalPinnedPaths, p) {
			return nil, fmt.Errorf("pin hook: the spec has no mount at %s", p)
		}
	}
	return src, nil
}

// Pin checks each destination of sources (a container path → the host
// path mounted there) in the root file system at rootfs, makes every
// directory on the way to one a mount point, and checks them again. With
// readonly, those new mount points are read-only.
func Pin(rootfs string, sources map[string]string, readonly bool) error {
	root, err := os.OpenFile(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("pin hook: open the container's root: %w", err)
	}
	defer root.Close()
	dests := slices.Sorted(func(yield func(string) bool) {
		for d := range sources {
			if !yield(d) {
				return
			}
		}
	})
	if err := check(root, dests, sources); err != nil {
		return err
	}
	for _, dir := range Ancestors(dests) {
		if err := bindSelf(root, dir, readonly); err != nil {
			return err
		}
	}
	// Again, through the new mounts: what the container will see.
	return check(root, dests, sources)
}

// check verifies that each destination is the mount of its host source.
// The shape of every path is checked first, so that an image's link is
// what the refusal names, whichever path it lies on.
func check(root *os.File, dests []string, sources map[string]string) error {
	fds := make([]int, 0, len(dests))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, d := range dests {
		fd, err := Walk(root, d)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
	}
	for i, d := range dests {
		var host unix.Stat_t
		if err := unix.Stat(sources[d], &host); err != nil {
			return fmt.Errorf("pin hook: host source %s of %s: %w", sources[d], d, err)
		}
		var stx unix.Statx_t
		if err := unix.Statx(fds[i], "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO, &stx); err != nil {
			return fmt.Errorf("pin hook: stat %s: %w", d, err)
		}
		if unix.Mkdev(stx.Dev_major, stx.Dev_minor) != host.Dev || stx.Ino != host.Ino {
			return fmt.Errorf("nri-vgpu's mount is not at %s in the container (the image has something else there); refusing", d)
		}
		if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
			return fmt.Errorf("%s in the container is nri-vgpu's file but not its mount point; refusing", d)
		}
	}
	return nil
}

// Ancestors returns the directories strictly between "/" and each of
// dests, parents first, each once.
func Ancestors(dests []string) []string {
	var out []string
	for _, d := range dests {
		for dir := path.Dir(d); dir != "/"; dir = path.Dir(dir) {
			if !slices.Contains(out, dir) {
				out = append(out, dir)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if n := strings.Count(a, "/") - strings.Count(b, "/"); n != 0 {
			return n
		}
		return strings.Compare(a, b)
	})
	return out
}

// Walk opens the container path p (absolute, clean) below root one
// component at a time, refusing a symbolic link anywhere on the way (the
// image's links are what let the runtime mount elsewhere, and what the
// tenant can remove afterwards) and anything but a directory before the
// last component. It returns an O_PATH descriptor of p.
func Walk(root *os.File, p string) (int, error) {
	dir := int(root.Fd())
	owned := false
	defer func() {
		if owned {
			unix.Close(dir)
		}
	}()
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, name := range parts {
		at := "/" + strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(dir, name, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.ELOOP) {
			return -1, fmt.Errorf("%s in the image is a symbolic link; refusing", at)
		}
		if err != nil {
			return -1, fmt.Errorf("pin hook: open %s in the container: %w", at, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("pin hook: stat %s in the container: %w", at, err)
		}
		mode := st.Mode & unix.S_IFMT
		if mode == unix.S_IFLNK {
			unix.Close(fd)
			return -1, fmt.Errorf("%s in the image is a symbolic link; refusing", at)
		}
		if owned {
			unix.Close(dir)
		}
		dir, owned = fd, true
		if i < len(parts)-1 && mode != unix.S_IFDIR {
			return -1, fmt.Errorf("%s in the image is not a directory; refusing", at)
		}
	}
	owned = false
	return dir, nil
}

// bindSelf stacks a recursive bind mount of dir onto itself: a copy of the
// mount tree at dir (the mounts below it included) whose root is a mount
// point the container cannot rename or remove. The copy keeps the flags of
// the mount it copies (nosuid, nodev of the root); readonly makes its top
// read-only, since the runtime's later read-only remount of "/" does not
// reach it.
func bindSelf(root *os.File, dir string, readonly bool) error {
	fd, err := Walk(root, dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("pin hook: copy the mounts at %s: %w", dir, err)
	}
	defer unix.Close(tree)
	if readonly {
		// Not AT_RECURSIVE: the mounts below keep their own flags.
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return fmt.Errorf("pin hook: make the bind mount of %s read-only: %w", dir, err)
		}
	}
	if err := unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("pin hook: mount %s onto itself: %w", dir, err)
	}
	return nil
}
