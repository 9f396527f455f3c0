package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Process is a program the tests run in the background (containerd,
// dockerd, nri-vgpu's daemons). It runs in its own process group, so that a
// Ctrl-C of the test run does not reach it before the cleanup has removed
// what depends on it, and its stdout and stderr go to a log file.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	// err is what Wait returned; written before exited is closed.
	err error
}

// StartProcess starts cmd with its output appended to the file at logPath,
// which it creates if need be. cmd's Stdout, Stderr and SysProcAttr are
// set here; anything else (Env, Dir) is the caller's.
func StartProcess(cmd *exec.Cmd, logPath string) (*Process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("harness: log of %s: %w", filepath.Base(cmd.Path), err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("harness: starting %s: %w", cmd.Path, err)
	}
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and its log is closed.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the process ended, as exec.Cmd.Wait reports it; call it only
// once Exited is closed.
func (p *Process) Err() error { return p.err }

// Stop sends the process SIGTERM and waits up to grace for it to exit, then
// kills it. It returns an error when grace was not enough; either way the
// process has exited when Stop returns.
func (p *Process) Stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("harness: %s did not stop within %v of SIGTERM; killed", filepath.Base(p.cmd.Path), grace)
	}
}
