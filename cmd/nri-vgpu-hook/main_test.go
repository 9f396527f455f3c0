package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/pin/pintest"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// built is the hook as the Makefile builds it (its rule for
// bin/nri-vgpu-hook, with BIN pointed at a directory of the test's), once
// for all tests.
var built struct {
	once sync.Once
	path string
	err  error
	dir  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// makeHook runs the Makefile's rule of bin/nri-vgpu-hook into a temporary
// BIN and returns the binary's path.
func makeHook(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "nri-vgpu-hook"); built.err != nil {
			return
		}
		out := filepath.Join(built.dir, "nri-vgpu-hook")
		// The repository root is two levels up from this package; the go
		// that runs the test is first on the PATH it gives make.
		cmd := exec.Command("make", "-s", "-C", filepath.Join("..", ".."), "BIN="+built.dir, out)
		if o, err := cmd.CombinedOutput(); err != nil {
			built.err = err
			t.Logf("make %s: %s", out, o)
			return
		}
		built.path = out
	})
	if built.err != nil {
		t.Fatalf("make bin/nri-vgpu-hook: %v", built.err)
	}
	return built.path
}

// TestStatic: runc runs the hook on the host, whose C library may be older
// than the build machine's (or missing): the binary the Makefile builds has
// no ELF interpreter and needs no shared library.
func TestStatic(t *testing.T) {
	f, err := elf.Open(makeHook(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := progString(p)
			t.Errorf("the hook has an ELF interpreter (%s): it is dynamically linked", interp)
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Errorf("the hook has a dynamic section: it is dynamically linked")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 0 {
		t.Errorf("the hook needs shared libraries %q", libs)
	}
}

// progString is a program header's contents as a string (the interpreter's path).
func progString(p *elf.Prog) (string, error) {
	b := make([]byte, p.Filesz)
	_, err := p.ReadAt(b, 0)
	return strings.TrimRight(string(b), "\x00"), err
}

// TestHookPin runs the built hook the way runc runs it (oci.PinHook's
// arguments, the state on stdin) for a root whose /etc is a symbolic link:
// exit 1 and the message naming the path; other arguments are a usage
// error.
func TestHookPin(t *testing.T) {
	hook := makeHook(t)
	bundle := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(bundle, "rootfs", "etc")); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	pinHook := oci.PinHook(hook)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		// Exactly the spec's hook: Args[0] is the program's name.
		{pinHook.Args[1:], 1, "nri-vgpu-hook: /etc in the image is a symbolic link; refusing\n"},
		{[]string{"pin"}, 2, "usage: nri-vgpu-hook hook pin"},
		{nil, 2, "usage: nri-vgpu-hook hook pin"},
	} {
		cmd := exec.Command(pinHook.Path, tt.args...)
		cmd.Stdin = strings.NewReader(`{"ociVersion":"1.2.0","id":"c1","status":"creating","bundle":"` + bundle + `"}`)
		out, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != tt.code || !strings.HasPrefix(string(out), tt.want) {
			t.Errorf("nri-vgpu-hook %q: exit %d, %q; want exit %d, %q", tt.args, code, out, tt.code, tt.want)
		}
	}
}

// TestHookPinChecksTheLedger: the built hook checks the ledger directory
// like the other pinned paths: a root whose /run/nri-vgpu/ledger is a
// symbolic link (the runtime would have mounted the shards elsewhere, and
// the tenant could swap them) is refused, naming it.
func TestHookPinChecksTheLedger(t *testing.T) {
	hook := makeHook(t)
	bundle := t.TempDir()
	root := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"etc", "run/nri-vgpu"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.preload"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(root, "run/nri-vgpu/ledger")); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	pinHook := oci.PinHook(hook)
	cmd := exec.Command(pinHook.Path, pinHook.Args[1:]...)
	cmd.Stdin = strings.NewReader(`{"ociVersion":"1.2.0","id":"c1","status":"creating","bundle":"` + bundle + `"}`)
	out, _ := cmd.CombinedOutput()
	want := "nri-vgpu-hook: /run/nri-vgpu/ledger in the image is a symbolic link; refusing\n"
	if code := cmd.ProcessState.ExitCode(); code != 1 || string(out) != want {
		t.Errorf("nri-vgpu-hook hook pin: exit %d, %q; want exit 1, %q", code, out, want)
	}
}

// TestNVIDIACDIHooks runs the built hook as the generated driver edits name
// it (argv[0] "nvidia-cdi-hook", oci.CDIHookName): NVIDIA's create-symlinks
// makes its link in the container's root, and update-ldcache runs the
// host's ldconfig in that root (re-executing the static binary) so that
// the container's loader cache holds a library of the added folder.
func TestNVIDIACDIHooks(t *testing.T) {
	hook := makeHook(t)
	if _, err := os.Stat("/sbin/ldconfig"); err != nil {
		t.Skipf("no ldconfig on this host: %v", err)
	}
	bundle := t.TempDir()
	root := filepath.Join(bundle, "rootfs")
	lib := filepath.Join(root, "opt/drv")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A real shared library (SONAME libutil.so.1) under another name, as
	// a driver's versioned file.
	data, err := os.ReadFile("/lib/x86_64-linux-gnu/libutil.so.1")
	if err != nil {
		t.Skipf("no libutil.so.1 to stand for a driver library: %v", err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libutil.so.580.1"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	state := `{"ociVersion":"1.2.0","id":"c1","status":"creating","bundle":"` + bundle + `"}`
	// As runc runs it: in a mount namespace of the container's own,
	// where its root is a mount (which pivot_root needs).
	run := func(args ...string) {
		t.Helper()
		script := `mount --bind "$1" "$1" && shift && exec -a ` + oci.CDIHookName + ` "$@"`
		cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "bash", "-c", script, "hook", root, hook}, args...)...)
		cmd.Stdin = strings.NewReader(state)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nvidia-cdi-hook %q: %v: %s", args, err, out)
		}
	}
	run("create-symlinks", "--link", "libutil.so.1::/opt/drv/libutil.so")
	if target, err := os.Readlink(filepath.Join(lib, "libutil.so")); err != nil || target != "libutil.so.1" {
		t.Errorf("create-symlinks: link %q, %v; want libutil.so.1", target, err)
	}
	run("update-ldcache", "--folder", "/opt/drv")
	cache, err := os.ReadFile(filepath.Join(root, "etc/ld.so.cache"))
	if err != nil {
		t.Fatalf("update-ldcache wrote no loader cache: %v", err)
	}
	if !strings.Contains(string(cache), "/opt/drv/libutil.so.1") {
		t.Errorf("the container's loader cache does not name /opt/drv/libutil.so.1")
	}
	// An unknown hook is a warning, as with NVIDIA's binary (a spec from
	// a newer toolkit must not fail containers).
	run("no-such-hook")
}
