package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// readBack loads the archive written by Write and returns its config and a
// map path -> tar header (with file contents in contents).
func readBack(t *testing.T, archive, ref string) (os_, arch string, env []string, hdrs map[string]*tar.Header, contents map[string]string) {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatalf("reading back %s: %v", archive, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	hdrs = map[string]*tar.Header{}
	contents = map[string]string{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.TrimSuffix(h.Name, "/")
		hdrs[p] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			contents[p] = string(b)
		}
	}
	return cfg.OS, cfg.Architecture, cfg.Config.Env, hdrs, contents
}

func TestWriteRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "hello")
	if err := os.WriteFile(src, []byte("hello\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "img.tar")
	const ref = "nri-vgpu.test/unit:1"
	err := Write(archive, Spec{
		Ref:      ref,
		Files:    []File{{Src: src, Dst: "/usr/share/hello"}, {Src: src, Dst: "/bin/hello", Mode: 0o755}},
		Symlinks: map[string]string{"/bin/hi": "hello"},
		Dirs:     []string{"/tmp", "/usr/share"},
		Env:      []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"},
		Cmd:      []string{"/bin/hello"},
	})
	if err != nil {
		t.Fatal(err)
	}
	gotOS, gotArch, env, hdrs, contents := readBack(t, archive, ref)
	if gotOS != "linux" || gotArch != runtime.GOARCH {
		t.Errorf("os/arch = %s/%s, want linux/%s", gotOS, gotArch, runtime.GOARCH)
	}
	if !slices.Equal(env, []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}) {
		t.Errorf("env = %q", env)
	}
	tests := []struct {
		path     string
		typeflag byte
		mode     int64
		content  string
		link     string
	}{
		{"/usr", tar.TypeDir, 0o755, "", ""},
		{"/usr/share", tar.TypeDir, 0o755, "", ""},
		{"/tmp", tar.TypeDir, 0o755, "", ""},
		{"/usr/share/hello", tar.TypeReg, 0o640, "hello\n", ""},
		{"/bin/hello", tar.TypeReg, 0o755, "hello\n", ""},
		{"/bin/hi", tar.TypeSymlink, 0o777, "", "hello"},
	}
	for _, tt := range tests {
		h, ok := hdrs[tt.path]
		if !ok {
			t.Errorf("%s missing from the layer", tt.path)
			continue
		}
		if h.Typeflag != tt.typeflag || h.Mode != tt.mode || h.Linkname != tt.link {
			t.Errorf("%s: type %c mode %o link %q, want %c %o %q", tt.path, h.Typeflag, h.Mode, h.Linkname, tt.typeflag, tt.mode, tt.link)
		}
		if tt.typeflag == tar.TypeReg && contents[tt.path] != tt.content {
			t.Errorf("%s content = %q, want %q", tt.path, contents[tt.path], tt.content)
		}
	}
}

func TestWriteIsReproducible(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	if err := os.WriteFile(src, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Ref: "nri-vgpu.test/r:1", Files: []File{{Src: src, Dst: "/a/f"}, {Src: src, Dst: "/b/f"}}}
	var digests []string
	for range 2 {
		img, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Errorf("same spec gave digests %s and %s", digests[0], digests[1])
	}
}

func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	b := filepath.Join(dir, "b")
	for p, c := range map[string]string{a: "a", b: "b"} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"relative path", Spec{Ref: "x:1", Files: []File{{Src: a, Dst: "etc/a"}}}, "not absolute"},
		{"missing source", Spec{Ref: "x:1", Files: []File{{Src: filepath.Join(dir, "nope"), Dst: "/a"}}}, "reading"},
		{"conflicting files", Spec{Ref: "x:1", Files: []File{{Src: a, Dst: "/x"}, {Src: b, Dst: "/x"}}}, "added twice"},
		{"file under a file", Spec{Ref: "x:1", Files: []File{{Src: a, Dst: "/x"}, {Src: b, Dst: "/x/y"}}}, "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Build(tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Build error = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if err := Write(filepath.Join(dir, "o.tar"), Spec{Ref: "Bad Ref"}); err == nil || !strings.Contains(err.Error(), "bad reference") {
		t.Errorf("Write with a bad reference: error = %v", err)
	}
}

func TestSharedLibs(t *testing.T) {
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("ldd not installed")
	}
	// The test binary is a dynamically linked Go program only with cgo;
	// /bin/sh is a glibc program on every Debian machine.
	libs, err := SharedLibs("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	var hasLibc, hasLoader bool
	for _, l := range libs {
		hasLibc = hasLibc || strings.Contains(filepath.Base(l), "libc.so")
		hasLoader = hasLoader || strings.HasPrefix(filepath.Base(l), "ld-linux")
		if !filepath.IsAbs(l) {
			t.Errorf("library path %q is not absolute", l)
		}
	}
	if !hasLibc || !hasLoader {
		t.Errorf("SharedLibs(/bin/sh) = %q, want libc and the loader", libs)
	}
	if p := "/bin/busybox"; isStatic(p) {
		libs, err := SharedLibs(p)
		if err != nil || libs != nil {
			t.Errorf("SharedLibs(static busybox) = %q, %v; want nil, nil", libs, err)
		}
	}
}

// isStatic reports whether p exists and ldd calls it static (glibc's ldd
// exits 1 with "not a dynamic executable" for those).
func isStatic(p string) bool {
	if _, err := os.Stat(p); err != nil {
		return false
	}
	out, _ := exec.Command("ldd", p).CombinedOutput()
	return strings.Contains(string(out), "statically linked") || strings.Contains(string(out), "not a dynamic executable")
}
