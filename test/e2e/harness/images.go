package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// Image references of the images the harness builds.
const (
	PauseImage   = "nri-vgpu.test/pause:e2e"
	BusyboxImage = "nri-vgpu.test/busybox:e2e"
)

// BusyboxPath is Debian's busybox-static.
const BusyboxPath = "/bin/busybox"

// RepoRoot is the root of the source tree this package was built from.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("harness: cannot locate the source tree")
	}
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("harness: no go.mod at %s: %w", root, err)
	}
	return root, nil
}

// GoBuild builds the package pkg (relative to the repository root, e.g.
// "./cmd/nri-vgpu") into out. static builds with cgo off.
func GoBuild(ctx context.Context, pkg, out string, static bool) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go build %s: %w: %s", pkg, err, strings.TrimSpace(string(o)))
	}
	return nil
}

// BuildPauseImage builds the pause program (statically) and writes the pause
// image tarball into dir. It returns the tarball's path.
func BuildPauseImage(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	if err := GoBuild(ctx, "./test/e2e/cmd/pause", bin, true); err != nil {
		return "", err
	}
	return WritePauseImage(dir, bin)
}

// WritePauseImage writes the pause image tarball into dir from a pause
// program built before (a bundle's bin/pause, where there is no Go to
// build one). It returns the tarball's path.
func WritePauseImage(dir, bin string) (string, error) {
	out := filepath.Join(dir, "pause.tar")
	if err := image.Write(out, image.Spec{
		Ref:        PauseImage,
		Files:      []image.File{{Src: bin, Dst: "/pause", Mode: 0o755}},
		Entrypoint: []string{"/pause"},
	}); err != nil {
		return "", err
	}
	return out, nil
}

// BuildBusyboxImage writes a test image named ref into dir: a static busybox
// with a link for each applet in /bin, /tmp, the image environment env (after
// PATH), and extra (programs with WithLibs get their glibc libraries). Its
// default command sleeps until SIGTERM.
func BuildBusyboxImage(dir, ref string, env []string, extra ...image.File) (string, error) {
	return BuildBusyboxImageFrom(BusyboxPath, dir, ref, env, nil, extra...)
}

// BuildBusyboxImageFrom is BuildBusyboxImage with the static busybox at
// busybox (a bundle's bin/busybox) instead of Debian's, and the symbolic
// links links (path in the image -> target) besides busybox's applets.
func BuildBusyboxImageFrom(busybox, dir, ref string, env []string, links map[string]string, extra ...image.File) (string, error) {
	applets, err := image.BusyboxApplets(busybox)
	if err != nil {
		return "", fmt.Errorf("harness: %w (install busybox-static)", err)
	}
	for path, target := range links {
		applets[path] = target
	}
	spec := image.Spec{
		Ref:      ref,
		Files:    append([]image.File{{Src: busybox, Dst: "/bin/busybox", Mode: 0o755}}, extra...),
		Symlinks: applets,
		Dirs:     []string{"/tmp", "/etc", "/dev", "/proc", "/sys", "/run"},
		Env:      append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
		Cmd:      SleepCommand,
	}
	out := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := image.Write(out, spec); err != nil {
		return "", err
	}
	return out, nil
}

// SleepCommand keeps a container running until SIGTERM, which it honours at
// once (a bare `sleep` as PID 1 ignores SIGTERM and waits for SIGKILL).
var SleepCommand = []string{"/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"}
