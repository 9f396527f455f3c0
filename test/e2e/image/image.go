// Package image builds small container images from host files, without a
// registry: a single-layer image written as a docker-archive tarball (what
// `ctr images import` and `docker load` read), with os/arch set in its config
// so that containerd's platform filter keeps it.
package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File copies one host file into the image.
type File struct {
	// Src is the host path. Symlinks are followed: the image gets the content.
	Src string
	// Dst is the absolute path in the image.
	Dst string
	// Mode is the permission bits in the image; 0 keeps the host file's.
	Mode os.FileMode
	// WithLibs also copies the shared libraries the file needs (as ldd
	// resolves them on this host) to the same paths in the image, with the
	// dynamic loader. Use it for glibc programs and libraries.
	WithLibs bool
}

// Spec describes an image.
type Spec struct {
	// Ref is the image reference recorded in the archive, e.g.
	// "nri-vgpu.test/busybox:e2e".
	Ref string
	// Files are copied from the host.
	Files []File
	// Symlinks maps an absolute path in the image to a link target.
	Symlinks map[string]string
	// Dirs are created empty (mode 0755), e.g. "/tmp".
	Dirs []string
	// Env is the image config's environment ("KEY=value").
	Env []string
	// Entrypoint and Cmd are the image config's.
	Entrypoint []string
	Cmd        []string
	// OS and Arch default to linux and the Go runtime's architecture.
	OS, Arch string
}

// entry is one tar entry of the layer.
type entry struct {
	typeflag byte
	mode     int64
	content  []byte // regular files
	target   string // symlinks
}

// Write builds the image described by spec and writes it to dst as a
// docker-archive tarball.
func Write(dst string, spec Spec) error {
	img, err := Build(spec)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(spec.Ref)
	if err != nil {
		return fmt.Errorf("image %q: bad reference: %w", spec.Ref, err)
	}
	if err := tarball.WriteToFile(dst, tag, img); err != nil {
		return fmt.Errorf("image %q: writing %s: %w", spec.Ref, dst, err)
	}
	return nil
}

// Build returns the image described by spec.
func Build(spec Spec) (v1.Image, error) {
	entries := map[string]*entry{}
	for _, d := range spec.Dirs {
		if err := addDir(entries, d); err != nil {
			return nil, fmt.Errorf("image %q: %w", spec.Ref, err)
		}
	}
	for _, f := range spec.Files {
		if err := addFile(entries, f); err != nil {
			return nil, fmt.Errorf("image %q: %w", spec.Ref, err)
		}
	}
	for dst, target := range spec.Symlinks {
		if err := add(entries, dst, &entry{typeflag: tar.TypeSymlink, mode: 0o777, target: target}); err != nil {
			return nil, fmt.Errorf("image %q: %w", spec.Ref, err)
		}
	}
	layerTar, err := writeLayer(entries)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", spec.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("image %q: layer: %w", spec.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("image %q: appending layer: %w", spec.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %q: config: %w", spec.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = spec.OS
	if cfg.OS == "" {
		cfg.OS = "linux"
	}
	cfg.Architecture = spec.Arch
	if cfg.Architecture == "" {
		cfg.Architecture = runtime.GOARCH
	}
	cfg.Config.Env = spec.Env
	cfg.Config.Entrypoint = spec.Entrypoint
	cfg.Config.Cmd = spec.Cmd
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("image %q: setting config: %w", spec.Ref, err)
	}
	return img, nil
}

func cleanAbs(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("image path %q is not absolute", p)
	}
	c := path.Clean(p)
	if c == "/" {
		return "", errors.New("image path / cannot be an entry")
	}
	return c, nil
}

// add records e at p, with its parent directories. Adding the same path twice
// is accepted when both entries are equal (a library needed by two programs),
// an error otherwise.
func add(entries map[string]*entry, p string, e *entry) error {
	p, err := cleanAbs(p)
	if err != nil {
		return err
	}
	for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
		if old, ok := entries[dir]; ok && old.typeflag != tar.TypeDir {
			return fmt.Errorf("%s: parent %s is not a directory in the image", p, dir)
		}
		if _, ok := entries[dir]; !ok {
			entries[dir] = &entry{typeflag: tar.TypeDir, mode: 0o755}
		}
	}
	if old, ok := entries[p]; ok {
		if old.typeflag == e.typeflag && old.target == e.target && bytes.Equal(old.content, e.content) {
			return nil
		}
		return fmt.Errorf("%s is added twice with different contents", p)
	}
	entries[p] = e
	return nil
}

func addDir(entries map[string]*entry, p string) error {
	c, err := cleanAbs(p)
	if err != nil {
		return err
	}
	if old, ok := entries[c]; ok {
		if old.typeflag != tar.TypeDir {
			return fmt.Errorf("%s is both a directory and a file", c)
		}
		return nil
	}
	return add(entries, c, &entry{typeflag: tar.TypeDir, mode: 0o755})
}

func addFile(entries map[string]*entry, f File) error {
	data, err := os.ReadFile(f.Src)
	if err != nil {
		return fmt.Errorf("reading %s for %s: %w", f.Src, f.Dst, err)
	}
	mode := int64(f.Mode.Perm())
	if f.Mode == 0 {
		st, err := os.Stat(f.Src)
		if err != nil {
			return fmt.Errorf("stat %s: %w", f.Src, err)
		}
		mode = int64(st.Mode().Perm())
	}
	if err := add(entries, f.Dst, &entry{typeflag: tar.TypeReg, mode: mode, content: data}); err != nil {
		return err
	}
	if !f.WithLibs {
		return nil
	}
	libs, err := SharedLibs(f.Src)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := addFile(entries, File{Src: lib, Dst: lib}); err != nil {
			return fmt.Errorf("library of %s: %w", f.Src, err)
		}
	}
	return nil
}

// lddLine matches the two shapes of ldd output that name a file:
//
//	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
//	/lib64/ld-linux-x86-64.so.2 (0x...)
var lddLine = regexp.MustCompile(`^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$`)

// SharedLibs returns the absolute paths of the shared libraries (and the
// dynamic loader) that the ELF file at p loads, as ldd resolves them on this
// host; nil for a static executable. A library ldd cannot find is an error:
// the image would not run.
func SharedLibs(p string) ([]string, error) {
	out, err := exec.Command("ldd", p).CombinedOutput()
	text := string(out)
	if strings.Contains(text, "not a dynamic executable") || strings.Contains(text, "statically linked") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", p, err, strings.TrimSpace(text))
	}
	var libs []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("ldd %s: %s", p, strings.TrimSpace(line))
		}
		if m := lddLine.FindStringSubmatch(line); m != nil {
			libs = append(libs, m[1])
		}
	}
	sort.Strings(libs)
	return libs, nil
}

// epoch is the modification time of every entry, so that the same inputs give
// the same layer digest.
var epoch = time.Unix(0, 0).UTC()

func writeLayer(entries map[string]*entry) ([]byte, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	// Sorted paths put every directory before what it holds.
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		hdr := &tar.Header{
			Name:     strings.TrimPrefix(n, "/"),
			Typeflag: e.typeflag,
			Mode:     e.mode,
			ModTime:  epoch,
			Linkname: e.target,
			Format:   tar.FormatPAX,
		}
		if e.typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if e.typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", n, err)
		}
		if e.typeflag == tar.TypeReg {
			if _, err := tw.Write(e.content); err != nil {
				return nil, fmt.Errorf("layer entry %s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing layer: %w", err)
	}
	return buf.Bytes(), nil
}

// BusyboxApplets returns symlinks /bin/<applet> -> busybox for every applet
// the busybox binary at p provides (as `busybox --list` prints them), so that
// an image with that binary at /bin/busybox has sh, cat, ls and the rest.
func BusyboxApplets(p string) (map[string]string, error) {
	out, err := exec.Command(p, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("listing the applets of %s: %w", p, err)
	}
	links := map[string]string{}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		links[filepath.Join("/bin", a)] = "busybox"
	}
	if len(links) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", p)
	}
	return links, nil
}
