package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcess(t *testing.T) {
	tests := []struct {
		name   string
		script string
		// stopErr: Stop must report that SIGTERM was not enough.
		stopErr bool
		// signal is the signal that must have ended the process.
		signal syscall.Signal
	}{
		{"stops on SIGTERM", "echo started; exec sleep 60", false, syscall.SIGTERM},
		// An ignored signal stays ignored across exec.
		{"killed past the grace period", "trap '' TERM; echo started; exec sleep 60", true, syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "out.log")
			p, err := StartProcess(exec.Command("/bin/sh", "-c", tt.script), log)
			if err != nil {
				t.Fatal(err)
			}
			// The script has set its signal disposition once it prints.
			deadline := time.Now().Add(10 * time.Second)
			for Tail(log, 1) != "started" {
				if time.Now().After(deadline) {
					t.Fatalf("the process did not start: log %q", Tail(log, 5))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if pgid, err := syscall.Getpgid(p.Pid()); err != nil || pgid != p.Pid() {
				t.Errorf("process group = %d (%v), want its own (%d)", pgid, err, p.Pid())
			}
			err = p.Stop(300 * time.Millisecond)
			if (err != nil) != tt.stopErr {
				t.Fatalf("Stop = %v, want an error: %v", err, tt.stopErr)
			}
			if err != nil && !strings.Contains(err.Error(), "sh did not stop within 300ms of SIGTERM") {
				t.Errorf("Stop error %q does not name the program and the grace period", err)
			}
			select {
			case <-p.Exited():
			default:
				t.Fatal("Exited is open after Stop returned")
			}
			ee, ok := p.Err().(*exec.ExitError)
			if !ok {
				t.Fatalf("Err = %v, want an *exec.ExitError", p.Err())
			}
			if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != tt.signal {
				t.Errorf("wait status %v, want ended by %v", ws, tt.signal)
			}
		})
	}
}

func TestStartProcessErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := StartProcess(exec.Command("/bin/true"), filepath.Join(dir, "missing", "out.log")); err == nil || !strings.Contains(err.Error(), "log of true") {
		t.Errorf("StartProcess with an unwritable log: error = %v, want one naming the log", err)
	}
	log := filepath.Join(dir, "out.log")
	if _, err := StartProcess(exec.Command(filepath.Join(dir, "no-such-program")), log); err == nil || !strings.Contains(err.Error(), "starting ") {
		t.Errorf("StartProcess of a missing program: error = %v, want one naming it", err)
	}
	// The log is created even when the program cannot start, and left empty.
	if data, err := os.ReadFile(log); err != nil || len(data) != 0 {
		t.Errorf("log after a failed start: %q, %v", data, err)
	}
}
