package nrivgpu

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// fakeProc makes a /proc whose processes link ns/pid as given (pid →
// link target).
func fakeProc(t *testing.T, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, target := range links {
		dir := filepath.Join(root, pid, "ns")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, "pid")); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Utilisation is measured only where the processes NVML names by host pid
// can be found: on NVML GPUs, with the host's /proc. A pod's own /proc
// (its pid 1 and 2 in its namespace) turns it off, with a warning, rather
// than show every container idle.
func TestUtilizationSource(t *testing.T) {
	const podNS = "pid:[4026532301]"
	tests := []struct {
		name    string
		backend string
		links   map[string]string
		want    bool
	}{
		{"host /proc", config.BackendNVML, map[string]string{"1": initPIDNamespace, "2": initPIDNamespace}, true},
		{"host /proc, init's links unreadable", config.BackendNVML, map[string]string{"2": initPIDNamespace}, true},
		{"a pod's /proc", config.BackendNVML, map[string]string{"1": podNS, "2": podNS}, false},
		{"a pod's /proc with one process", config.BackendNVML, map[string]string{"1": podNS}, false},
		{"no /proc", config.BackendNVML, nil, false},
		{"simulated GPUs", config.BackendSimulated, map[string]string{"1": initPIDNamespace}, false},
		{"simulated GPUs, a driver root with an NVML", config.BackendSimulated, map[string]string{"1": initPIDNamespace}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.GPU.Backend = tt.backend
			// A driver root of its own, with an NVML where the case says.
			cfg.Driver.DevRoot = t.TempDir()
			if strings.Contains(tt.name, "with an NVML") {
				lib := filepath.Join(cfg.Driver.DevRoot, "usr", "lib64", "libnvidia-ml.so.1")
				if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			src := utilizationSource(cfg, fakeProc(t, tt.links), slog.New(slog.NewTextHandler(&logs, nil)))
			if got := src != nil; got != tt.want {
				t.Errorf("source: %v, want %v", got, tt.want)
			}
			warned := strings.Contains(logs.String(), "no SM utilisation series")
			if wantWarn := !tt.want && tt.backend == config.BackendNVML; warned != wantWarn {
				t.Errorf("warned: %v, want %v; logs:\n%s", warned, wantWarn, logs.String())
			}
		})
	}
}
