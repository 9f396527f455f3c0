package reload

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

const base = `[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-aaaa"
name = "Sim"
memory = "16GiB"
minor = 0
`

// setup writes base as the configuration and returns a watcher on a
// simulated backend built from it, and the log it writes.
func setup(t *testing.T) (Watcher, *gpu.Simulated, *bytes.Buffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.toml")
	write(t, path, base)
	cfg, err := config.LoadResolved(path)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	w := Watcher{ConfigPath: path, Current: cfg, Backend: sim, Logger: slog.New(slog.NewTextHandler(&log, nil))}
	return w, sim, &log
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func healthy(t *testing.T, sim *gpu.Simulated) bool {
	t.Helper()
	devs, err := sim.Devices()
	if err != nil || len(devs) != 1 {
		t.Fatalf("devices %v, %v", devs, err)
	}
	return devs[0].Healthy
}

func TestOnce(t *testing.T) {
	for _, tc := range []struct {
		name        string
		config      string // written before the reload
		applied     error  // what Applied returns
		want        bool
		wantHealthy bool
		wantLog     string
	}{
		{"unhealthy GPU applied", base + "healthy = false\n", nil, true, false, "simulated GPUs updated"},
		{"syntax error keeps the GPUs", base + "healthy = \n", nil, false, true, "keeping the running configuration"},
		{"a duplicate GPU keeps the GPUs, naming file:line", base + "healthy = false\n[[gpu.simulated]]\nuuid = \"GPU-aaaa\"\nname = \"Dup\"\nmemory = \"1GiB\"\nminor = 1\n",
			nil, false, true, "config.toml:10: gpu.simulated[1].uuid"},
		{"refresh failure is reported", base + "healthy = false\n", errors.New("boom"), false, false, "re-reading the GPUs failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, sim, log := setup(t)
			calls := 0
			w.Applied = func() error { calls++; return tc.applied }
			write(t, w.ConfigPath, tc.config)
			if got := w.Once(); got != tc.want {
				t.Errorf("Once() = %v, want %v; log:\n%s", got, tc.want, log)
			}
			if got := healthy(t, sim); got != tc.wantHealthy {
				t.Errorf("GPU healthy = %v after the reload, want %v", got, tc.wantHealthy)
			}
			if !strings.Contains(log.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, log)
			}
			wantCalls := 0 // Applied runs once the GPUs were updated
			if !tc.wantHealthy {
				wantCalls = 1
			}
			if calls != wantCalls {
				t.Errorf("Applied ran %d times, want %d", calls, wantCalls)
			}
		})
	}
}

func TestOnceRestartOnly(t *testing.T) {
	w, _, log := setup(t)
	var seen [2]*config.Config
	w.RestartOnly = func(cur, next *config.Config) string {
		seen = [2]*config.Config{cur, next}
		if next.Paths.RunDir != cur.Paths.RunDir {
			return "paths"
		}
		return ""
	}
	write(t, w.ConfigPath, base)
	w.Once()
	if strings.Contains(log.String(), "take effect on restart") {
		t.Errorf("warned with nothing changed:\n%s", log)
	}
	if seen[0] != w.Current || seen[1] == nil || seen[1] == w.Current {
		t.Errorf("RestartOnly got %p, %p; want the running configuration and a new one", seen[0], seen[1])
	}
	write(t, w.ConfigPath, "[paths]\nrun_dir = \"/run/elsewhere\"\n"+base)
	w.Once()
	if !strings.Contains(log.String(), "paths changes take effect on restart") {
		t.Errorf("no restart warning for a changed run_dir:\n%s", log)
	}
}

func TestOnceNotSimulated(t *testing.T) {
	w, sim, log := setup(t)
	// The file now names another backend: nothing is applied live.
	write(t, w.ConfigPath, strings.Replace(base, `backend = "simulated"`, `backend = "nvml"`, 1)+"healthy = false\n")
	if w.Once() {
		t.Errorf("Once() applied a configuration whose backend is not simulated; log:\n%s", log)
	}
	if !healthy(t, sim) {
		t.Error("the simulated GPUs changed")
	}
}

func TestRunStopsWithContext(t *testing.T) {
	w, sim, _ := setup(t)
	write(t, w.ConfigPath, base+"healthy = false\n")
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() { w.Run(ctx, sig); close(done) }()
	sig <- syscall.SIGHUP
	for deadline := time.Now().Add(10 * time.Second); healthy(t, sim); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a signal did not reload")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
