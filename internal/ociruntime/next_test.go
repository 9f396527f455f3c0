package ociruntime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindNext(t *testing.T) {
	dir := t.TempDir()
	mk := func(rel string, mode os.FileMode) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	self := mk("usr/bin/nri-vgpu-runtime", 0o755)
	runcA := mk("a/runc", 0o755)
	runcB := mk("b/runc", 0o755)
	mk("c/runc", 0o644) // not executable
	nvidia := mk("b/nvidia-container-runtime", 0o755)
	// The wrapper under a next runtime's name (a symlink to itself).
	if err := os.MkdirAll(filepath.Join(dir, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "self", "runc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "d", "runc"), 0o755); err != nil { // a directory
		t.Fatal(err)
	}
	p := func(dirs ...string) string {
		for i, d := range dirs {
			if !strings.HasPrefix(d, ".") {
				dirs[i] = filepath.Join(dir, d)
			}
		}
		return strings.Join(dirs, string(os.PathListSeparator))
	}

	tests := []struct {
		name    string
		names   []string
		path    string
		want    string
		wantErr string
	}{
		{name: "default order, first found", names: []string{"nvidia-container-runtime", "runc"}, path: p("a", "b"), want: nvidia},
		{name: "falls back", names: []string{"nvidia-container-runtime", "runc"}, path: p("a"), want: runcA},
		{name: "PATH order", names: []string{"runc"}, path: p("b", "a"), want: runcB},
		{name: "skips non-executables and directories", names: []string{"runc"}, path: p("c", "d", "b"), want: runcB},
		{name: "skips itself on PATH", names: []string{"runc"}, path: p("self", "a"), want: runcA},
		{name: "skips itself by path", names: []string{self, runcB}, path: "", want: runcB},
		{name: "absolute path", names: []string{runcA}, path: "", want: runcA},
		{name: "relative PATH entries are ignored", names: []string{"runc"}, path: ".:" + p("a"), want: runcA},
		{name: "nothing found", names: []string{"nvidia-container-runtime", "runc"}, path: p("c"),
			wantErr: "no next runtime found: none of nvidia-container-runtime, runc is installed"},
		{name: "only itself", names: []string{"runc"}, path: p("self"), wantErr: "other than this wrapper"},
		{name: "empty list", names: nil, path: p("a"), wantErr: "[runtime] next is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "relative PATH entries are ignored" {
				t.Chdir(filepath.Join(dir, "b"))
			}
			got, err := FindNext(tt.names, tt.path, self)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FindNext = %q, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("FindNext = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
