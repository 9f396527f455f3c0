package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
)

// DirPrefix starts the name of every temporary directory the end-to-end
// tests make (in os.TempDir()).
const DirPrefix = "nri-vgpu-e2e-"

// ownerFile records, in each such directory, the PID of the process that
// made it.
const ownerFile = ".owner"

// MkdirTemp makes a temporary directory os.TempDir()/nri-vgpu-e2e-<kind>-*
// owned by this process, which SweepStale removes once this process is
// gone if it did not remove it itself.
func MkdirTemp(kind string) (string, error) {
	dir, err := os.MkdirTemp("", DirPrefix+kind+"-")
	if err != nil {
		return "", fmt.Errorf("harness: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", errors.Join(fmt.Errorf("harness: %w", err), os.RemoveAll(dir))
	}
	return dir, nil
}

// SweepStale cleans up after earlier runs that died without doing so (a
// test binary killed at its timeout, say): for each directory made by
// MkdirTemp whose owner process is gone, it kills the processes started
// there (any whose command line or environment names the directory:
// containerd, its shims, the plugins), force-deletes the containers runc
// still has under it, detaches its mounts and removes it. Directories of
// live runs are left alone. It returns the directories it removed.
func SweepStale(runc string) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), DirPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	var swept []string
	var errs []error
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or being made right now
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || processAlive(pid) {
			continue
		}
		// Containers and shims first (removing the shims' sockets), then
		// whatever else runs from the directory: containerd, plugins.
		c := &Containerd{Dir: dir, Address: filepath.Join(dir, "containerd.sock"), RuncRoot: filepath.Join(dir, "runc"),
			opts: Options{Runc: runc}}
		errs = append(errs, c.killLeftovers()...)
		errs = append(errs, killProcessesNaming(dir)...)
		if err := mountinfo.UnmountUnder(dir); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("harness: removing stale %s: %w", dir, err))
			continue
		}
		swept = append(swept, dir)
	}
	return swept, errors.Join(errs...)
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killProcessesNaming SIGKILLs every process whose command line or
// environment contains dir/ (the processes a run started there).
func killProcessesNaming(dir string) []error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []error{fmt.Errorf("harness: %w", err)}
	}
	needle := []byte(dir + "/")
	self := os.Getpid()
	var errs []error
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		found := false
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), f))
			if err == nil && bytes.Contains(b, needle) {
				found = true
				break
			}
		}
		if !found {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("harness: killing stale process %d: %w", pid, err))
		}
	}
	return errs
}
