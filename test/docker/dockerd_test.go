//go:build e2e

package docker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/configure"
)

// Debian's docker.io: the daemon and its own client (/usr/local/bin/docker
// on some machines is a lone client of another version).
const (
	dockerdPath = "/usr/sbin/dockerd"
	dockerPath  = "/usr/bin/docker"
)

// runtimeName is the wrapper's name in daemon.json (docker run --runtime).
const runtimeName = configure.DefaultRuntimeName

// ensurePackages installs the Debian packages the tests need when their
// files are missing. It returns an error only when they cannot be had.
func ensurePackages(logf func(string, ...any)) error {
	var pkgs []string
	if _, err := os.Stat(dockerdPath); err != nil {
		pkgs = append(pkgs, "docker.io")
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "busybox-static").Output(); err != nil || !bytes.Contains(out, []byte("ok installed")) {
		pkgs = append(pkgs, "busybox-static")
	}
	if len(pkgs) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s missing and not root to install them", strings.Join(pkgs, ", "))
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%s missing and no apt-get to install them", strings.Join(pkgs, ", "))
	}
	logf("installing %s with apt-get", strings.Join(pkgs, ", "))
	install := func() error {
		cmd := exec.Command("apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
		// policy-rc.d-less hosts would start the packaged docker service;
		// RUNLEVEL=1 keeps invoke-rc.d from starting anything.
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "RUNLEVEL=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get install %s: %w: %s", strings.Join(pkgs, " "), err, tail(string(out), 10))
		}
		return nil
	}
	if err := install(); err == nil {
		return nil
	}
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w: %s", err, tail(string(out), 10))
	}
	return install()
}

// daemon is a dockerd running in its own temporary root.
type daemon struct {
	dir    string // root of everything the daemon writes
	socket string
	cmd    *exec.Cmd
	done   chan error
	log    string // dockerd's output
}

// startDaemon starts dockerd under dir with the wrapper at wrapperPath
// registered as runtimeName; env is added to the daemon's environment
// (containerd and its shims inherit it, and so does the runtime).
func startDaemon(ctx context.Context, dir, wrapperPath string, env []string) (*daemon, error) {
	d := &daemon{dir: dir, socket: filepath.Join(dir, "docker.sock"), log: filepath.Join(dir, "dockerd.log")}
	base := map[string]any{
		"data-root":      filepath.Join(dir, "data"),
		"exec-root":      filepath.Join(dir, "exec"),
		"pidfile":        filepath.Join(dir, "docker.pid"),
		"hosts":          []string{"unix://" + d.socket},
		"iptables":       false,
		"ip6tables":      false,
		"bridge":         "none",
		"storage-driver": "vfs", // works on any backing filesystem; the images are tiny
		// The trust key goes to /etc/docker/key.json unless moved.
		"deprecated-key-path": filepath.Join(dir, "key.json"),
	}
	data, err := json.MarshalIndent(base, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), data, 0o644); err != nil {
		return nil, err
	}
	// Register the runtime the way `nri-vgpu configure docker` does.
	res, err := configure.Docker(configure.DockerOptions{Root: dir, DaemonJSON: "/daemon.json", RuntimePath: wrapperPath})
	if err != nil {
		return nil, fmt.Errorf("configure docker: %w", err)
	}
	if err := res.Apply(); err != nil {
		return nil, fmt.Errorf("configure docker: %w", err)
	}
	logFile, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(dockerdPath, "--config-file", filepath.Join(dir, "daemon.json"))
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C of the test does not hit dockerd
	// before the cleanup has removed the containers.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start dockerd: %w", err)
	}
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait(); logFile.Close() }()

	for {
		if _, err := d.docker(ctx, "version"); err == nil {
			return d, nil
		}
		select {
		case err := <-d.done:
			d.done <- err
			return nil, fmt.Errorf("dockerd exited: %v\n%s", err, d.logTail(30))
		case <-ctx.Done():
			d.stop()
			return nil, fmt.Errorf("dockerd not ready: %w\n%s", ctx.Err(), d.logTail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// docker runs the docker client against the daemon and returns its combined
// output.
func (d *daemon) docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, dockerPath, append([]string{"-H", "unix://" + d.socket}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Join(d.dir, "client"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (d *daemon) logTail(n int) string {
	data, _ := os.ReadFile(d.log)
	return tail(string(data), n)
}

// stop removes every container, stops dockerd (and with it the containerd
// it started), and unmounts what it left under its root (the netns bind
// mount at <exec-root>/netns/default, layer mounts).
func (d *daemon) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := d.docker(ctx, "ps", "-aq"); err == nil {
		if ids := strings.Fields(out); len(ids) > 0 {
			if out, err := d.docker(ctx, append([]string{"rm", "-f"}, ids...)...); err != nil {
				errs = append(errs, fmt.Errorf("docker rm -f: %w: %s", err, out))
			}
		}
	}
	if d.cmd != nil && d.cmd.Process != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
			errs = append(errs, errors.New("dockerd did not stop on SIGTERM within 30s; killed"))
		}
	}
	if err := unmountUnder(d.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount point at or below dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountinfo(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	points = slices.Compact(points)
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
