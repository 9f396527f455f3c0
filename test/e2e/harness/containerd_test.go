package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestConfigTemplate(t *testing.T) {
	dir := t.TempDir()
	c := &Containerd{
		Dir: dir, Address: dir + "/containerd.sock", ConfigPath: filepath.Join(dir, "config.toml"),
		NRISocket: dir + "/nri/nri.sock", NRIPluginDir: dir + "/nri/plugins", NRIConfigDir: dir + "/nri/conf.d",
		RuncRoot: dir + "/runc",
		opts:     Options{Runc: "/usr/sbin/runc", SandboxImage: PauseImage},
	}
	if err := c.setup(); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if _, err := toml.DecodeFile(c.ConfigPath, &cfg); err != nil {
		t.Fatalf("the generated config is not valid TOML: %v", err)
	}
	plugins := cfg["plugins"].(map[string]any)
	rt := plugins["io.containerd.cri.v1.runtime"].(map[string]any)
	runc := rt["containerd"].(map[string]any)["runtimes"].(map[string]any)["runc"].(map[string]any)["options"].(map[string]any)
	nri := plugins["io.containerd.nri.v1.nri"].(map[string]any)
	images := plugins["io.containerd.cri.v1.images"].(map[string]any)
	tests := []struct {
		key  string
		got  any
		want any
	}{
		{"version", cfg["version"], int64(3)},
		{"restrict_oom_score_adj", rt["restrict_oom_score_adj"], true},
		{"disable_apparmor", rt["disable_apparmor"], true},
		{"runc BinaryName", runc["BinaryName"], "/usr/sbin/runc"},
		{"runc Root", runc["Root"], c.RuncRoot},
		{"SystemdCgroup", runc["SystemdCgroup"], false},
		{"sandbox image", images["pinned_images"].(map[string]any)["sandbox"], PauseImage},
		{"nri disable", nri["disable"], false},
		{"nri socket_path", nri["socket_path"], c.NRISocket},
		{"nri plugin_path", nri["plugin_path"], c.NRIPluginDir},
		{"nri plugin_config_path", nri["plugin_config_path"], c.NRIConfigDir},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.key, tt.got, tt.want)
		}
	}
}

func TestInstallPlugin(t *testing.T) {
	dir := t.TempDir()
	c := &Containerd{Dir: dir, NRIPluginDir: filepath.Join(dir, "plugins"), NRIConfigDir: filepath.Join(dir, "conf.d")}
	for _, d := range []string{c.NRIPluginDir, c.NRIConfigDir, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A "plugin" that prints its environment: the wrapper must add Env,
	// keep what containerd sets, and send the output to PluginLog.
	plugin := filepath.Join(dir, "printenv.sh")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\nenv\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := NRIPlugin{Name: "10-test", Path: plugin, Env: []string{"A=it's quoted", "B=$HOME"}, Config: "x = 1\n"}
	if err := c.installPlugin(p); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(c.NRIPluginDir, p.Name))
	cmd.Env = []string{"NRI_PLUGIN_NAME=test", "PATH=/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running the wrapper: %v: %s", err, out)
	}
	log, err := os.ReadFile(c.PluginLog(p.Name))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"A=it's quoted\n", "B=$HOME\n", "NRI_PLUGIN_NAME=test\n"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("plugin environment lacks %q:\n%s", want, log)
		}
	}
	if conf, err := os.ReadFile(filepath.Join(c.NRIConfigDir, "10-test.conf")); err != nil || string(conf) != "x = 1\n" {
		t.Errorf("plugin config = %q, %v", conf, err)
	}

	for _, bad := range []NRIPlugin{
		{Name: "nri-vgpu", Path: plugin},
		{Name: "1-x", Path: plugin},
		{Name: "ab-x", Path: plugin},
		{Name: "10-x", Path: filepath.Join(dir, "missing")},
		{Name: "10-x", Path: plugin, Env: []string{"NOEQUALS"}},
	} {
		if err := c.installPlugin(bad); err == nil {
			t.Errorf("installPlugin(%+v) accepted", bad)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	tests := map[string]string{
		`/tmp/a`:           "/tmp/a",
		`/tmp/with\040sp`:  "/tmp/with sp",
		`/tmp/tab\011x`:    "/tmp/tab\tx",
		`/tmp/back\134sl`:  `/tmp/back\sl`,
		`/tmp/trailing\04`: `/tmp/trailing\04`,
	}
	for in, want := range tests {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPreflightNamesWhatIsMissing(t *testing.T) {
	err := Preflight(t.TempDir(), "/nonexistent/runc")
	if err == nil {
		t.Fatal("Preflight passed with nothing installed")
	}
	for _, want := range []string{"containerd not found", "containerd-shim-runc-v2 not found", "runc not found", "hack/e2e-deps.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Preflight error %q lacks %q", err, want)
		}
	}
}

func TestSweepStale(t *testing.T) {
	// A run that died: its owner is a process that has exited, and it left
	// a process behind that names its directory.
	stale, err := MkdirTemp("unit")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(stale)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, ownerFile), []byte(strconv.Itoa(gone.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	leftover := exec.Command("sleep", "300")
	leftover.Env = []string{"LEFT_BY=" + stale + "/run"}
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- leftover.Wait() }()
	defer leftover.Process.Kill()

	// A live run: owned by this process.
	live, err := MkdirTemp("unit")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(live)

	swept, err := SweepStale(DefaultRunc())
	if err != nil {
		t.Logf("SweepStale reported: %v", err)
	}
	if !slices.Contains(swept, stale) || slices.Contains(swept, live) {
		t.Errorf("swept %v; want %s and not %s", swept, stale, live)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale directory still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live directory removed: %v", err)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Errorf("the process left behind was not killed")
	}
}

// TestLogDir: with Options.LogDir, setup creates it and the plugins' output
// goes there, outside Dir, so that it outlives Close.
func TestLogDir(t *testing.T) {
	dir, logs := t.TempDir(), filepath.Join(t.TempDir(), "kept")
	plugin := filepath.Join(dir, "hello.sh")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Dir: dir, ConfigPath: filepath.Join(dir, "config.toml"),
		NRIPluginDir: filepath.Join(dir, "nri", "plugins"), NRIConfigDir: filepath.Join(dir, "nri", "conf.d"),
		opts: Options{Runc: "/usr/sbin/runc", SandboxImage: PauseImage, LogDir: logs,
			NRIPlugins: []NRIPlugin{{Name: "10-hello", Path: plugin}}}}
	if err := c.setup(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(c.NRIPluginDir, "10-hello")).CombinedOutput(); err != nil {
		t.Fatalf("running the wrapper: %v: %s", err, out)
	}
	if got := c.PluginLog("10-hello"); got != filepath.Join(logs, "nri-10-hello.log") {
		t.Errorf("PluginLog = %s, want it in %s", got, logs)
	}
	if b, err := os.ReadFile(filepath.Join(logs, "nri-10-hello.log")); err != nil || string(b) != "hello\n" {
		t.Errorf("plugin log in LogDir = %q, %v; want \"hello\\n\"", b, err)
	}
}
