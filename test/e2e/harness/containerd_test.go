package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// TestConfigTemplate checks the keys that matter in the config generated
// for each containerd line: 2.x reads version 3 with the split CRI plugins,
// 1.7 version 2 with the single CRI plugin.
func TestConfigTemplate(t *testing.T) {
	// lookup walks a path of table names in a decoded config.
	lookup := func(t *testing.T, cfg map[string]any, path ...string) any {
		t.Helper()
		var v any = cfg
		for i, k := range path {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%s is not a table", strings.Join(path[:i], "."))
			}
			v = m[k]
		}
		return v
	}
	tests := []struct {
		version string
		// keys maps a key path (table names joined by "/") to the value it
		// must have.
		keys func(c *Containerd) map[string]any
	}{
		{"v2.4.2", func(c *Containerd) map[string]any {
			rt := "plugins/io.containerd.cri.v1.runtime/"
			runc := rt + "containerd/runtimes/runc/options/"
			return map[string]any{
				"version":                     int64(3),
				rt + "restrict_oom_score_adj": true,
				rt + "disable_apparmor":       true,
				runc + "BinaryName":           "/usr/sbin/runc",
				runc + "Root":                 c.RuncRoot,
				runc + "SystemdCgroup":        false,
				"plugins/io.containerd.cri.v1.images/pinned_images/sandbox": PauseImage,
			}
		}},
		{"v1.7.35", func(c *Containerd) map[string]any {
			cri := "plugins/io.containerd.grpc.v1.cri/"
			runc := cri + "containerd/runtimes/runc/options/"
			return map[string]any{
				"version":                      int64(2),
				cri + "restrict_oom_score_adj": true,
				cri + "disable_apparmor":       true,
				cri + "sandbox_image":          PauseImage,
				runc + "BinaryName":            "/usr/sbin/runc",
				runc + "Root":                  c.RuncRoot,
				runc + "SystemdCgroup":         false,
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			dir := t.TempDir()
			c := &Containerd{
				Version: tt.version,
				Dir:     dir, Address: dir + "/containerd.sock", ConfigPath: filepath.Join(dir, "config.toml"),
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
			keys := tt.keys(c)
			// NRI: the same plugin ID and keys in both lines; 1.7 has it
			// off by default, so disable = false must be there.
			nri := "plugins/io.containerd.nri.v1.nri/"
			keys[nri+"disable"] = false
			keys[nri+"socket_path"] = c.NRISocket
			keys[nri+"plugin_path"] = c.NRIPluginDir
			keys[nri+"plugin_config_path"] = c.NRIConfigDir
			for key, want := range keys {
				path := strings.Split(key, "/")
				if got := lookup(t, cfg, path...); got != want {
					t.Errorf("%s = %v, want %v", strings.Join(path, "."), got, want)
				}
			}
		})
	}
}

func TestConfigTemplateRefusesContainerdWithoutNRI(t *testing.T) {
	for _, v := range []string{"v1.6.20", "1.5.0", "latest", ""} {
		if _, err := configTemplateFor(v); err == nil {
			t.Errorf("configTemplateFor(%q) accepted", v)
		}
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in, want string // want "" means rejected
	}{
		{"v1.7.35", "v1.7.35"},
		{"1.7.35", "v1.7.35"},
		{"2.4.2+unknown", "v2.4.2"},
		{"v2.1.0-rc.1", "v2.1.0"},
		{"v1.6.38", ""},
		{"v0.9.0", ""},
		{"v1.7", ""},
		{"1.7.x", ""},
		{"", ""},
	}
	for _, tt := range tests {
		v, err := parseVersion(tt.in)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("parseVersion(%q) = %v, want an error", tt.in, v)
		case tt.want != "" && err != nil:
			t.Errorf("parseVersion(%q): %v", tt.in, err)
		case tt.want != "" && v.String() != tt.want:
			t.Errorf("parseVersion(%q) = %v, want %s", tt.in, v, tt.want)
		}
	}
}

func TestSelectedContainerdVersions(t *testing.T) {
	tests := []struct {
		env  string
		want []string // nil: an error
	}{
		{"", ContainerdVersions},
		{"  ", ContainerdVersions},
		{"v1.7.35", []string{"v1.7.35"}},
		{"v1.7.35 v2.4.2", []string{"v1.7.35", "v2.4.2"}},
		{"v2.4.2,v1.7.35, v2.4.2", []string{"v2.4.2", "v1.7.35"}},
		{"v1.6.38", nil},
		{"v2.4.2 latest", nil},
	}
	for _, tt := range tests {
		t.Setenv(EnvContainerdVersions, tt.env)
		got, err := SelectedContainerdVersions()
		if tt.want == nil {
			if err == nil || !strings.Contains(err.Error(), EnvContainerdVersions) {
				t.Errorf("%s=%q: got %v, %v; want an error naming the variable", EnvContainerdVersions, tt.env, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s=%q: got %v, %v; want %v", EnvContainerdVersions, tt.env, got, err, tt.want)
		}
	}
}

// TestBinaryVersion reads the version from `containerd --version` as a
// go-install build and a release build print it.
func TestBinaryVersion(t *testing.T) {
	tests := []struct {
		output, want string // want "" means an error
	}{
		{"containerd github.com/containerd/containerd/v2 2.4.2+unknown ", "v2.4.2"},
		{"containerd github.com/containerd/containerd v1.7.35 2c0b3b1ba6b1d48b6ddcd1bd1e0b9a1c0a0c7f46", "v1.7.35"},
		{"containerd github.com/containerd/containerd v1.6.38 abc", ""},
		{"containerd", ""},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		script := "#!/bin/sh\n[ \"$1\" = --version ] || exit 2\necho " + shellQuote(tt.output) + "\n"
		if err := os.WriteFile(filepath.Join(dir, "containerd"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := BinaryVersion(dir)
		if tt.want == "" {
			if err == nil {
				t.Errorf("BinaryVersion for %q = %q, want an error", tt.output, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("BinaryVersion for %q = %q, %v; want %s", tt.output, got, err, tt.want)
		}
	}
	if _, err := BinaryVersion(t.TempDir()); err == nil {
		t.Error("BinaryVersion of an empty directory succeeded")
	}
}

func TestBinDir(t *testing.T) {
	t.Setenv("NRI_VGPU_E2E_CACHE", "/cache")
	t.Setenv(EnvBinDir, "")
	if got, want := BinDir("v1.7.35"), "/cache/containerd-v1.7.35/bin"; got != want {
		t.Errorf("BinDir(v1.7.35) = %s, want %s", got, want)
	}
	if got, want := DefaultBinDir(), "/cache/containerd-"+ContainerdVersion+"/bin"; got != want {
		t.Errorf("DefaultBinDir() = %s, want %s", got, want)
	}
	// NRI_VGPU_E2E_BIN stands for ContainerdVersion only.
	t.Setenv(EnvBinDir, "/mine")
	if got := DefaultBinDir(); got != "/mine" {
		t.Errorf("DefaultBinDir() with %s=/mine = %s", EnvBinDir, got)
	}
	if got, want := BinDir("v1.7.35"), "/cache/containerd-v1.7.35/bin"; got != want {
		t.Errorf("BinDir(v1.7.35) with %s set = %s, want %s", EnvBinDir, got, want)
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

func TestTailLines(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"a\n\n\n", 1, "a"},
		{"", 3, ""},
	}
	for _, tt := range tests {
		if got := TailLines(tt.in, tt.n); got != tt.want {
			t.Errorf("TailLines(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
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
	c := &Containerd{Version: ContainerdVersion, Dir: dir, ConfigPath: filepath.Join(dir, "config.toml"),
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

// TestInstallScriptPinsTheSameVersions: hack/e2e-deps.sh installs by default
// the versions the tests run against by default.
func TestInstallScriptPinsTheSameVersions(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "e2e-deps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DEFAULT_VERSIONS=\(([^)]*)\)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("hack/e2e-deps.sh has no DEFAULT_VERSIONS=(...) line")
	}
	if got := strings.Fields(string(m[1])); !slices.Equal(got, ContainerdVersions) {
		t.Errorf("hack/e2e-deps.sh installs %v by default, the tests run against %v", got, ContainerdVersions)
	}
}

// The optional tables: pod annotation pass-through on both lines, NRI's
// default validator on 2.x, refused on 1.7.
func TestConfigTemplateOptions(t *testing.T) {
	setup := func(t *testing.T, version string, opts Options) (*Containerd, error) {
		dir := t.TempDir()
		opts.Runc, opts.SandboxImage = "/usr/sbin/runc", PauseImage
		c := &Containerd{
			Version: version, Dir: dir, ConfigPath: filepath.Join(dir, "config.toml"),
			NRISocket: dir + "/nri.sock", NRIPluginDir: dir + "/plugins", NRIConfigDir: dir + "/conf.d",
			RuncRoot: dir + "/runc", opts: opts,
		}
		return c, c.setup()
	}
	opts := Options{
		PodAnnotations: []string{"*/*", `we"ird`},
		Validator:      &Validator{RequiredPlugins: []string{"nri-vgpu"}, TolerateMissingAnnotation: "example.com/tolerate"},
	}
	c, err := setup(t, "v2.4.2", opts)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					PodAnnotations []string `toml:"pod_annotations"`
				}
			}
			DefaultValidator struct {
				Enable          bool
				RequiredPlugins []string `toml:"required_plugins"`
				Tolerate        string   `toml:"tolerate_missing_plugins_annotation"`
			} `toml:"default_validator"`
		}
	}
	if _, err := toml.DecodeFile(c.ConfigPath, &cfg); err != nil {
		t.Fatalf("the generated config is not valid TOML: %v", err)
	}
	got := cfg.Plugins["io.containerd.cri.v1.runtime"].Containerd.Runtimes["runc"].PodAnnotations
	if strings.Join(got, "|") != `*/*|we"ird` {
		t.Errorf("pod_annotations = %q", got)
	}
	v := cfg.Plugins["io.containerd.nri.v1.nri"].DefaultValidator
	if !v.Enable || strings.Join(v.RequiredPlugins, ",") != "nri-vgpu" || v.Tolerate != "example.com/tolerate" {
		t.Errorf("default_validator = %+v", v)
	}

	if _, err := setup(t, "v1.7.35", opts); err == nil || !strings.Contains(err.Error(), "no NRI validator") {
		t.Errorf("validator on 1.7: err = %v, want a refusal", err)
	}
	opts.Validator = nil
	c, err = setup(t, "v1.7.35", opts)
	if err != nil {
		t.Fatal(err)
	}
	var cfg17 struct {
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					PodAnnotations []string `toml:"pod_annotations"`
				}
			}
		}
	}
	if _, err := toml.DecodeFile(c.ConfigPath, &cfg17); err != nil {
		t.Fatalf("the generated 1.7 config is not valid TOML: %v", err)
	}
	if got := cfg17.Plugins["io.containerd.grpc.v1.cri"].Containerd.Runtimes["runc"].PodAnnotations; len(got) != 2 {
		t.Errorf("1.7 pod_annotations = %q", got)
	}
}
