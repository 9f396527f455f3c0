package ociruntime

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// FindNext returns the runtime to exec after the wrapper: the first of
// names ([runtime] next) that exists, as an absolute path. A name with a
// slash is a path; a bare name is looked up in each directory of path (the
// PATH variable) in turn. Candidates that are the wrapper itself (self, an
// absolute path; symlinks resolved on both sides) are skipped, so that a
// runtime entry naming the wrapper, or the wrapper installed under a next
// runtime's name, cannot exec itself forever.
func FindNext(names []string, path, self string) (string, error) {
	selfReal := resolve(self)
	var tried []string
	for _, name := range names {
		var candidates []string
		if strings.Contains(name, "/") {
			candidates = []string{name}
		} else {
			for _, dir := range filepath.SplitList(path) {
				// Relative PATH entries depend on the working directory,
				// which the caller chose for the container, not for us.
				if filepath.IsAbs(dir) {
					candidates = append(candidates, filepath.Join(dir, name))
				}
			}
		}
		for _, c := range candidates {
			if !isExecutable(c) {
				continue
			}
			if selfReal != "" && resolve(c) == selfReal {
				continue
			}
			abs, err := filepath.Abs(c)
			if err != nil {
				return "", fmt.Errorf("next runtime %s: %w", c, err)
			}
			return abs, nil
		}
		tried = append(tried, name)
	}
	if len(names) == 0 {
		return "", errors.New("no next runtime configured ([runtime] next is empty)")
	}
	return "", fmt.Errorf("no next runtime found: none of %s is installed (on PATH %q), other than this wrapper; set [runtime] next",
		strings.Join(tried, ", "), path)
}

// resolve returns p with symlinks resolved, or "" when it cannot.
func resolve(p string) string {
	if p == "" {
		return ""
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	abs, err := filepath.Abs(r)
	if err != nil {
		return ""
	}
	return abs
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// forwardedSignals are passed on to a child runtime, so that a caller
// stopping the wrapper stops the runtime as it would have with an exec.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// runChild runs the next runtime as a child process with the wrapper's
// stdio and environment env, and returns its exit status (128 + the signal
// number when a signal ended it, as shells report it). Signals the wrapper
// gets are forwarded, and the child is killed if the wrapper dies first
// (SIGKILL cannot be forwarded).
func runChild(path string, argv, env []string) (int, error) {
	cmd := &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         env,
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	// Pdeathsig fires when the thread that forked the child exits, not the
	// process: keep this goroutine on one thread until the child is reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exitErr.ExitCode(), nil
	}
	return 0, err
}
