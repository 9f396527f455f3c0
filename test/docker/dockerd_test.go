//go:build e2e

package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/configure"
	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
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
			return fmt.Errorf("apt-get install %s: %w: %s", strings.Join(pkgs, " "), err, harness.TailLines(string(out), 10))
		}
		return nil
	}
	if err := install(); err == nil {
		return nil
	}
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w: %s", err, harness.TailLines(string(out), 10))
	}
	return install()
}

// daemon is a dockerd running in its own temporary root.
type daemon struct {
	dir    string // root of everything the daemon writes
	socket string
	proc   *harness.Process
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
	cmd := exec.Command(dockerdPath, "--config-file", filepath.Join(dir, "daemon.json"))
	cmd.Env = append(os.Environ(), env...)
	// A process group of its own (StartProcess): a Ctrl-C of the test does
	// not hit dockerd before the cleanup has removed the containers.
	if d.proc, err = harness.StartProcess(cmd, d.log); err != nil {
		return nil, err
	}

	for {
		if _, err := d.docker(ctx, "version"); err == nil {
			return d, nil
		}
		select {
		case <-d.proc.Exited():
			return nil, fmt.Errorf("dockerd exited: %v\n%s", d.proc.Err(), d.logTail(30))
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

func (d *daemon) logTail(n int) string { return harness.Tail(d.log, n) }

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
	if d.proc != nil {
		if err := d.proc.Stop(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := mountinfo.UnmountUnder(d.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
