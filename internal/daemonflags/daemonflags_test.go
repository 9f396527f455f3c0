package daemonflags

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/version"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		done     bool
		stderr   string // a substring of what is said; "" = nothing
		config   string
		extraSet string // the daemon's own flag, after parsing
	}{
		{name: "no flags", args: nil},
		{name: "config and own flag", args: []string{"-config", "/etc/x.toml", "-own", "v"}, config: "/etc/x.toml", extraSet: "v"},
		{name: "help", args: []string{"-h"}, done: true, stderr: "-log-format"},
		{name: "unknown flag", args: []string{"-nope"}, code: 2, done: true, stderr: "flag provided but not defined: -nope"},
		{name: "stray argument", args: []string{"-log-level", "debug", "serve"}, code: 2, done: true,
			stderr: `prog: unexpected arguments ["serve"]`},
		{name: "version", args: []string{"-version"}, done: true, stderr: "prog " + version.Version + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			fs := flag.NewFlagSet("prog", flag.ContinueOnError)
			fs.SetOutput(&stderr)
			c := Register(fs, "prog")
			own := fs.String("own", "", "the daemon's own flag")
			code, done := c.Parse(fs, tt.args, &stderr)
			if code != tt.code || done != tt.done {
				t.Errorf("Parse(%q) = %d, %v; want %d, %v", tt.args, code, done, tt.code, tt.done)
			}
			if tt.stderr == "" && stderr.Len() != 0 || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q, want it to hold %q", stderr.String(), tt.stderr)
			}
			if c.ConfigPath() != tt.config {
				t.Errorf("ConfigPath() = %q, want %q", c.ConfigPath(), tt.config)
			}
			if *own != tt.extraSet {
				t.Errorf("-own = %q, want %q", *own, tt.extraSet)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Register(fs, "prog")
	if _, done := c.Parse(fs, []string{"-log-format", "json", "-log-level", "warn"}, io.Discard); done {
		t.Fatal("Parse says done")
	}
	var out bytes.Buffer
	logger, err := c.Logger(&out)
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("hidden")
	logger.Warn("shown", "k", "v")
	if got := out.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `"msg":"shown"`) {
		t.Errorf("log output %q: want only the warning, as JSON", got)
	}

	fs = flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c = Register(fs, "prog")
	c.Parse(fs, []string{"-log-level", "loud"}, io.Discard)
	if _, err := c.Logger(io.Discard); err == nil || !strings.Contains(err.Error(), "loud") {
		t.Errorf("Logger with -log-level loud: %v, want an error naming it", err)
	}
}

// RegisterBase leaves -metrics-listen to the program, which may register a
// flag of that name with a meaning of its own, and -version to its parsing.
func TestRegisterBase(t *testing.T) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := RegisterBase(fs, "prog")
	own := fs.String("metrics-listen", "", "the program's own metrics address")
	if err := fs.Parse([]string{"-metrics-listen", ":9", "-version", "-config", "/etc/x.toml", "status"}); err != nil {
		t.Fatal(err)
	}
	if *own != ":9" || c.MetricsListen() != "" {
		t.Errorf("own -metrics-listen %q, MetricsListen() %q; want \":9\" and \"\"", *own, c.MetricsListen())
	}
	if !c.VersionAsked() || c.ConfigPath() != "/etc/x.toml" || !slices.Equal(fs.Args(), []string{"status"}) {
		t.Errorf("VersionAsked() %v, ConfigPath() %q, args %q", c.VersionAsked(), c.ConfigPath(), fs.Args())
	}
	c.ServeMetrics(nil, nil)() // nothing to serve: no logger needed
}

func TestSetup(t *testing.T) {
	good := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(good, []byte("[limits]\nlog_level = \"info\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // a substring of what is said
	}{
		{"bad log level", []string{"-log-level", "loud"}, 2, `prog: --log-level "loud"`},
		{"missing config", []string{"-config", filepath.Join(t.TempDir(), "none.toml")}, 1, "cannot load the configuration"},
		{"good", []string{"-config", good}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev := slog.Default()
			t.Cleanup(func() { slog.SetDefault(prev) })
			fs := flag.NewFlagSet("prog", flag.ContinueOnError)
			c := Register(fs, "prog")
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			logger, cfg, code := c.Setup(&stderr)
			if code != tt.code || (code == 0) != (logger != nil && cfg != nil) || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("Setup: code %d, logger %v, config %v, stderr %q; want code %d and %q", code, logger != nil, cfg != nil, stderr.String(), tt.code, tt.stderr)
			}
			if code == 0 && cfg.Source != good {
				t.Errorf("config read from %q, want %q", cfg.Source, good)
			}
		})
	}
}
