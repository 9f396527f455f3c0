package configure

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

const (
	mainConfig = "/etc/containerd/config.toml"
	dropIn     = "/etc/containerd/conf.d/nri-vgpu.toml"
	pluginLink = "/opt/nri/plugins/10-nri-vgpu"
)

func fixture(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// replaceOnce edits a fixture, failing the test when old is not in it
// exactly once (so that a changed fixture cannot silently test nothing).
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("fixture has %d copies of %q, want 1", n, old)
	}
	return strings.Replace(s, old, new, 1)
}

// makeRoot writes files (host path -> content; a content starting with "->"
// makes a symlink) under a new temporary root.
func makeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// changedLines returns the -/+ lines of a unified diff, headers left out.
func changedLines(diff string) []string {
	var out []string
	for l := range strings.SplitSeq(diff, "\n") {
		if strings.HasPrefix(l, "---") || strings.HasPrefix(l, "+++") {
			continue
		}
		if strings.HasPrefix(l, "-") || strings.HasPrefix(l, "+") {
			out = append(out, l)
		}
	}
	return out
}

func changeFor(res *Result, path string) *Change {
	for i := range res.Changes {
		if res.Changes[i].Path == path {
			return &res.Changes[i]
		}
	}
	return nil
}

func nriOf(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := toml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
	sec, _ := nriSection(doc)
	return sec
}

func TestContainerd(t *testing.T) {
	v17 := fixture(t, "containerd-1.7.29-default.toml")
	v21 := fixture(t, "containerd-2.1.5-default.toml")
	v24 := fixture(t, "containerd-2.4.2-default.toml")

	tests := []struct {
		name    string
		version string
		files   map[string]string
		// mainLines: the -/+ lines expected in the main config's diff
		// (nil: the main config is not changed).
		mainLines []string
		// dropIn: expected NRI settings of the drop-in (nil: not written).
		dropIn map[string]any
		// dropInVersion of the drop-in when written.
		dropInVersion int64
		link          string // expected symlink change ("" = none)
		note          string // expected in the notes
		noRegister    bool
	}{{
		name:          "containerd 1.7 default config: NRI off",
		version:       "1.7.29",
		files:         map[string]string{mainConfig: v17},
		mainLines:     []string{`-imports = []`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 2,
		// 1.7 replaces the whole section: the others are repeated.
		dropIn: map[string]any{
			"disable": false, "disable_connections": false,
			"plugin_config_path": "/etc/nri/conf.d", "plugin_path": "/opt/nri/plugins",
			"plugin_registration_timeout": "5s", "plugin_request_timeout": "2s",
			"socket_path": "/var/run/nri/nri.sock",
		},
		link: pluginLink,
	}, {
		name:    "containerd 1.7 with a custom plugin_path",
		version: "v1.7.29",
		files: map[string]string{mainConfig: replaceOnce(t, v17,
			`plugin_path = "/opt/nri/plugins"`, `plugin_path = "/usr/local/lib/nri" # ours`)},
		mainLines:     []string{`-imports = []`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 2,
		dropIn: map[string]any{
			"disable": false, "disable_connections": false,
			"plugin_config_path": "/etc/nri/conf.d", "plugin_path": "/usr/local/lib/nri",
			"plugin_registration_timeout": "5s", "plugin_request_timeout": "2s",
			"socket_path": "/var/run/nri/nri.sock",
		},
		link: "/usr/local/lib/nri/10-nri-vgpu",
		note: "plugin_path is /usr/local/lib/nri",
	}, {
		name:    "containerd 1.7 with NRI already on and the plugin registered",
		version: "1.7.29",
		files: map[string]string{
			mainConfig: replaceOnce(t, v17, "disable = true", "disable = false"),
			pluginLink: "->/usr/bin/nri-vgpu",
		},
		note: "nothing to change",
	}, {
		name:          "containerd 1.7 without a config file",
		version:       "1.7.0",
		files:         map[string]string{},
		mainLines:     []string{`+version = 2`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 2,
		dropIn:        map[string]any{"disable": false},
		link:          pluginLink,
	}, {
		name:    "containerd 1.7, config already importing conf.d/*.toml",
		version: "1.7.29",
		files: map[string]string{
			mainConfig:                              replaceOnce(t, v17, "imports = []", `imports = ["/etc/containerd/conf.d/*.toml"]`),
			"/etc/containerd/conf.d/10-mirror.toml": "version = 2\n",
		},
		dropInVersion: 2,
		dropIn: map[string]any{
			"disable": false, "disable_connections": false,
			"plugin_config_path": "/etc/nri/conf.d", "plugin_path": "/opt/nri/plugins",
			"plugin_registration_timeout": "5s", "plugin_request_timeout": "2s",
			"socket_path": "/var/run/nri/nri.sock",
		},
		link: pluginLink,
	}, {
		name:    "containerd 2.1 default config: NRI on, only the registration",
		version: "2.1.5",
		files:   map[string]string{mainConfig: v21},
		link:    pluginLink,
	}, {
		name:    "containerd 2.1, NRI turned off by the user",
		version: "2.1.5",
		files: map[string]string{mainConfig: replaceOnce(t, v21,
			"[plugins.'io.containerd.nri.v1.nri']\n    disable = false",
			"[plugins.'io.containerd.nri.v1.nri']\n    disable = true")},
		mainLines:     []string{`-imports = []`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 3,
		// 2.x merges key by key: the drop-in sets only what it changes.
		dropIn: map[string]any{"disable": false},
		link:   pluginLink,
	}, {
		name:    "containerd 2.4 default config (version 4): nothing but the registration",
		version: "2.4.2",
		files:   map[string]string{mainConfig: v24},
		link:    pluginLink,
	}, {
		name:    "containerd 2.4, NRI off: the default conf.d glob already imports the drop-in",
		version: "2.4.2",
		files: map[string]string{mainConfig: replaceOnce(t, v24,
			"[plugins.'io.containerd.nri.v1.nri']\n    disable = false",
			"[plugins.'io.containerd.nri.v1.nri']\n    disable = true")},
		// 2.4 writes version 4 and warns at every start about a file it migrates.
		dropInVersion: 4,
		dropIn:        map[string]any{"disable": false},
		link:          pluginLink,
	}, {
		name:          "containerd 1.7, NRI only: the plugin runs as a DaemonSet",
		version:       "1.7.29",
		files:         map[string]string{mainConfig: v17},
		noRegister:    true,
		mainLines:     []string{`-imports = []`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 2,
		dropIn: map[string]any{
			"disable": false, "disable_connections": false,
			"plugin_config_path": "/etc/nri/conf.d", "plugin_path": "/opt/nri/plugins",
			"plugin_registration_timeout": "5s", "plugin_request_timeout": "2s",
			"socket_path": "/var/run/nri/nri.sock",
		},
	}, {
		name:       "containerd 2.4 default config, NRI only: nothing to change",
		version:    "2.4.2",
		files:      map[string]string{mainConfig: v24},
		noRegister: true,
		note:       "already has NRI enabled: nothing to change",
	}, {
		name:    "containerd 2.x reading a version 2 config",
		version: "2.1.5",
		files: map[string]string{
			mainConfig: v17, // disable = true, version 2: migrated by containerd
			pluginLink: "->/usr/bin/nri-vgpu",
		},
		mainLines:     []string{`-imports = []`, `+imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`},
		dropInVersion: 3,
		dropIn:        map[string]any{"disable": false},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := makeRoot(t, tt.files)
			// The validator has a test of its own (TestContainerdValidator).
			opts := ContainerdOptions{Root: root, Version: tt.version, NoRegister: tt.noRegister, NoRequire: true}
			res, err := Containerd(opts)
			if err != nil {
				t.Fatalf("Containerd: %v", err)
			}

			main := changeFor(res, mainConfig)
			switch {
			case tt.mainLines == nil && main != nil:
				t.Errorf("main config changed:\n%s", res.Diff())
			case tt.mainLines != nil && main == nil:
				t.Errorf("main config not changed, want %q", tt.mainLines)
			case main != nil:
				got := changedLines(unifiedDiff("a", "b", string(main.Old), string(main.New)))
				if strings.Join(got, "\n") != strings.Join(tt.mainLines, "\n") {
					t.Errorf("main config diff lines = %q, want %q", got, tt.mainLines)
				}
			}

			d := changeFor(res, dropIn)
			switch {
			case tt.dropIn == nil && d != nil:
				t.Errorf("drop-in written:\n%s", d.New)
			case tt.dropIn != nil && d == nil:
				t.Errorf("no drop-in written")
			case d != nil:
				got := nriOf(t, d.New)
				if !mapsEqual(got, tt.dropIn) {
					t.Errorf("drop-in NRI section = %v, want %v", got, tt.dropIn)
				}
				var doc struct{ Version int64 }
				if _, err := toml.Decode(string(d.New), &doc); err != nil || doc.Version != tt.dropInVersion {
					t.Errorf("drop-in version = %d (%v), want %d", doc.Version, err, tt.dropInVersion)
				}
			}

			var link *Change
			for i := range res.Changes {
				if res.Changes[i].LinkTarget != "" {
					link = &res.Changes[i]
				}
			}
			switch {
			case tt.link == "" && link != nil:
				t.Errorf("unexpected registration %s", link.Path)
			case tt.link != "" && (link == nil || link.Path != tt.link || link.LinkTarget != "/usr/bin/nri-vgpu"):
				t.Errorf("registration = %+v, want %s -> /usr/bin/nri-vgpu", link, tt.link)
			}
			if tt.note != "" && !strings.Contains(strings.Join(res.Notes, "\n"), tt.note) {
				t.Errorf("notes %q do not mention %q", res.Notes, tt.note)
			}
			if res.Changed() != (res.Reload != "") {
				t.Errorf("Changed() = %v but Reload = %q", res.Changed(), res.Reload)
			}

			// Applying, then running again, changes nothing more.
			if err := res.Apply(); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			again, err := Containerd(opts)
			if err != nil {
				t.Fatalf("second run: %v", err)
			}
			if again.Changed() {
				t.Errorf("second run still changes:\n%s", again.Diff())
			}
		})
	}
}

func mapsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestContainerdApplyKeepsTheRestOfTheFile(t *testing.T) {
	// A hand-edited 1.7 config: comments, odd spacing, a registry mirror.
	const user = `# Managed by hand. Do not lose this comment.
version = 2
imports = [
  "/etc/containerd/mirrors.toml", # registry mirrors
]

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image   =   "registry.k8s.io/pause:3.9"   # pinned
`
	root := makeRoot(t, map[string]string{
		mainConfig:                     user,
		"/etc/containerd/mirrors.toml": "version = 2\n",
	})
	if err := os.Chmod(filepath.Join(root, mainConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Containerd(ContainerdOptions{Root: root, Version: "1.7.29"})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Apply(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, mainConfig))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(user, `"/etc/containerd/mirrors.toml", # registry mirrors`,
		`"/etc/containerd/mirrors.toml", "/etc/containerd/conf.d/nri-vgpu.toml", # registry mirrors`, 1)
	if string(got) != want {
		t.Errorf("config after Apply:\n%s\nwant:\n%s", got, want)
	}
	st, err := os.Stat(filepath.Join(root, mainConfig))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode after Apply = %v, want the original 0600", st.Mode().Perm())
	}
	target, err := os.Readlink(filepath.Join(root, pluginLink))
	if err != nil || target != "/usr/bin/nri-vgpu" {
		t.Errorf("plugin link = %q, %v; want /usr/bin/nri-vgpu", target, err)
	}
}

func TestContainerdErrors(t *testing.T) {
	v17 := fixture(t, "containerd-1.7.29-default.toml")
	v21 := fixture(t, "containerd-2.1.5-default.toml")
	tests := []struct {
		name    string
		version string
		files   map[string]string
		is      error
		want    string
	}{{
		name: "containerd 1.6 has no NRI", version: "1.6.20~ds1",
		files: map[string]string{mainConfig: v17},
		is:    ErrContainerdTooOld, want: "containerd 1.6.20~ds1 has no NRI support (NRI arrived in containerd 1.7)",
	}, {
		name: "version 1 config", version: "1.7.29",
		files: map[string]string{mainConfig: "[plugins.cri]\n  sandbox_image = \"pause\"\n"},
		want:  "is a version 1 containerd config",
	}, {
		name: "version 3 config on containerd 1.7", version: "1.7.29",
		files: map[string]string{mainConfig: v21},
		want:  "has config version 3, which needs containerd 2.0 or later",
	}, {
		name: "config that does not parse", version: "1.7.29",
		files: map[string]string{mainConfig: "version = = 2\n"},
		want:  "parsing /etc/containerd/config.toml",
	}, {
		name: "an import that does not exist", version: "1.7.29",
		files: map[string]string{mainConfig: replaceOnce(t, v17, "imports = []", `imports = ["/etc/containerd/gone.toml"]`)},
		want:  "imports /etc/containerd/gone.toml, which does not exist",
	}, {
		name: "a later import turns NRI off again", version: "1.7.29",
		files: map[string]string{
			mainConfig:                            replaceOnce(t, v17, "imports = []", `imports = ["/etc/containerd/conf.d/*.toml"]`),
			"/etc/containerd/conf.d/zz-site.toml": "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n",
		},
		want: "NRI would still be disabled",
	}, {
		name: "no version anywhere", version: "containerd github.com/containerd/containerd",
		files: map[string]string{},
		want:  "no version number",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := makeRoot(t, tt.files)
			_, err := Containerd(ContainerdOptions{Root: root, Version: tt.version})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

// TestContainerdPluginRegistrations checks that configure never leaves two
// registrations of the plugin behind, and says when the one it finds starts
// another binary.
func TestContainerdPluginRegistrations(t *testing.T) {
	v24 := fixture(t, "containerd-2.4.2-default.toml")
	tests := []struct {
		name       string
		files      map[string]string
		noRegister bool
		err        string // expected in the error ("" = none)
		note       string // expected in the notes
	}{{
		name:  "registered under another index",
		files: map[string]string{mainConfig: v24, "/opt/nri/plugins/05-nri-vgpu": "->/usr/bin/nri-vgpu"},
		err:   "already registered as /opt/nri/plugins/05-nri-vgpu, under another index than 10: remove it, or pass --plugin-index 05",
	}, {
		name:       "registered, but the plugin runs another way",
		files:      map[string]string{mainConfig: v24, pluginLink: "->/usr/bin/nri-vgpu"},
		noRegister: true,
		err:        "registered as /opt/nri/plugins/10-nri-vgpu",
	}, {
		name:  "registered, linking to another binary",
		files: map[string]string{mainConfig: v24, pluginLink: "->/usr/local/bin/nri-vgpu"},
		note:  "/opt/nri/plugins/10-nri-vgpu links to /usr/local/bin/nri-vgpu, not /usr/bin/nri-vgpu",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := makeRoot(t, tt.files)
			// The validator has a test of its own (TestContainerdValidator).
			res, err := Containerd(ContainerdOptions{Root: root, Version: "2.4.2", NoRegister: tt.noRegister, NoRequire: true})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Containerd: %v", err)
			}
			if res.Changed() {
				t.Errorf("changes:\n%s", res.Diff())
			}
			if !strings.Contains(strings.Join(res.Notes, "\n"), tt.note) {
				t.Errorf("notes %q do not mention %q", res.Notes, tt.note)
			}
		})
	}
}

func TestParseContainerdVersion(t *testing.T) {
	tests := []struct {
		in           string
		major, minor int
	}{
		{"containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376\n", 2, 1},
		{"containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", 1, 7},
		{"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1", 1, 6},
		{"containerd github.com/containerd/containerd/v2 2.4.2+unknown ", 2, 4},
		{"1.7.29", 1, 7},
		{"v2.0.0", 2, 0},
	}
	for _, tt := range tests {
		v, err := parseContainerdVersion(tt.in)
		if err != nil || v.major != tt.major || v.minor != tt.minor {
			t.Errorf("parseContainerdVersion(%q) = %+v, %v; want %d.%d", tt.in, v, err, tt.major, tt.minor)
		}
	}
}

// TestContainerdDetectsVersion runs a stand-in containerd executable, as the
// command does on a node.
func TestContainerdDetectsVersion(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "containerd")
	script := "#!/bin/sh\n[ \"$1\" = --version ] || exit 2\necho 'containerd github.com/containerd/containerd v1.6.9 1c90a442489720eec95342e1789ee8a5e1b9536f'\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Containerd(ContainerdOptions{Root: makeRoot(t, nil), Binary: bin})
	if !errors.Is(err, ErrContainerdTooOld) || !strings.Contains(err.Error(), "1.6.9") {
		t.Fatalf("error = %v, want ErrContainerdTooOld naming 1.6.9", err)
	}

	_, err = Containerd(ContainerdOptions{Root: makeRoot(t, nil), Binary: filepath.Join(dir, "missing")})
	if err == nil || !strings.Contains(err.Error(), "--containerd-version") {
		t.Fatalf("error = %v, want advice to pass --containerd-version", err)
	}
}

// TestRealContainerdLoadsTheChange lets real containerd binaries judge the
// result: each one's own default config, with NRI turned off, is configured,
// and `containerd config dump` must then show NRI enabled. Binaries come from
// NRI_VGPU_TEST_CONTAINERD (a colon-separated list), the cache of
// hack/e2e-deps.sh and /var/cache/nri-vgpu-test/containerd-<version>/ (where
// a containerd built from a release's source can be put); the test is skipped
// when there are none.
func TestRealContainerdLoadsTheChange(t *testing.T) {
	const ownDefault = "own default"
	var bins []string
	if env := os.Getenv("NRI_VGPU_TEST_CONTAINERD"); env != "" {
		bins = strings.Split(env, ":")
	}
	for _, pattern := range []string{
		"/var/cache/nri-vgpu-e2e/containerd-*/bin/containerd", // hack/e2e-deps.sh
		"/var/cache/nri-vgpu-test/containerd-*/containerd",    // older releases, built by hand
	} {
		matches, _ := filepath.Glob(pattern)
		bins = append(bins, matches...)
	}
	if len(bins) == 0 {
		t.Skip("no containerd binary: set NRI_VGPU_TEST_CONTAINERD or run hack/e2e-deps.sh")
	}
	for _, bin := range bins {
		defaults, err := exec.Command(bin, "config", "default").Output()
		if err != nil {
			t.Fatalf("%s config default: %v", bin, err)
		}
		mains := map[string]string{ownDefault: nriOff(string(defaults))}
		if !strings.Contains(string(defaults), "version = 2") {
			// containerd 2.x migrates a 1.7 (version 2) config as it loads it.
			mains["1.7 default"] = fixture(t, "containerd-1.7.29-default.toml")
		}
		// containerd 2.2 and later have NRI's default validator.
		validator := strings.Contains(string(defaults), validatorKey)
		for name, main := range mains {
			t.Run(bin+"/"+name, func(t *testing.T) {
				testRealContainerd(t, bin, main, validator, name == ownDefault)
			})
		}
	}
}

// nriOff turns NRI off in a containerd config default output (1.7 ships it
// off already).
func nriOff(config string) string {
	at := strings.Index(config, nriPluginID)
	if at < 0 {
		return config
	}
	return config[:at] + strings.Replace(config[at:], "disable = false", "disable = true", 1)
}

// testRealContainerd configures main (a config with NRI off) for bin and
// checks with `bin config dump` that containerd now sees NRI enabled and,
// where it has a validator, the validator requiring nri-vgpu.
func testRealContainerd(t *testing.T, bin, main string, validator, ownVersion bool) {
	if sec := nriOf(t, []byte(main)); sec["disable"] != true {
		t.Fatalf("could not turn NRI off: %v", sec)
	}
	dir := t.TempDir()
	opts := ContainerdOptions{
		Root:       "/",
		ConfigPath: filepath.Join(dir, "config.toml"),
		DropInDir:  filepath.Join(dir, "conf.d"),
		Binary:     bin,
		// The plugin link would go to this machine's /opt/nri/plugins.
		NoRegister: true,
	}
	if err := os.WriteFile(opts.ConfigPath, []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Containerd(opts)
	if err != nil {
		t.Fatalf("Containerd: %v", err)
	}
	if err := res.Apply(); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	cmd := exec.Command(bin, "--config", opts.ConfigPath, "config", "dump")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dump, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s config dump: %v\n%s", bin, err, stderr.Bytes())
	}
	// A config of containerd's own version loads without a migration
	// warning; the drop-in must not bring one in at every start.
	if ownVersion && strings.Contains(stderr.String(), "migrated") {
		t.Errorf("%s config dump warns of a migration:\n%s", bin, stderr.Bytes())
	}
	sec := nriOf(t, dump)
	if sec["disable"] != false {
		t.Errorf("after configuring, %s config dump shows NRI %v", bin, sec)
	}
	if !validator {
		return
	}
	v, _ := sec[validatorKey].(map[string]any)
	if v["enable"] != true || fmt.Sprint(v["required_plugins"]) != "[nri-vgpu]" ||
		v["tolerate_missing_plugins_annotation"] != "nri-vgpu.io/tolerate-missing-plugin" {
		t.Errorf("after configuring, %s config dump shows the validator %v", bin, v)
	}
}

// TestContainerdValidator: on containerd 2.2 and later the drop-in makes
// NRI's default validator require nri-vgpu, keeping what the operator set;
// before 2.2, or with NoRequire, it leaves the validator alone.
func TestContainerdValidator(t *testing.T) {
	v21 := fixture(t, "containerd-2.1.5-default.toml")
	v24 := fixture(t, "containerd-2.4.2-default.toml")
	const oursTol = "nri-vgpu.io/tolerate-missing-plugin"
	operatorSet := replaceOnce(t, v24, "      required_plugins = []", `      required_plugins = ["other"]`)
	operatorSet = replaceOnce(t, operatorSet, "tolerate_missing_plugins_annotation = ''", `tolerate_missing_plugins_annotation = "example.com/tolerate"`)
	operatorSet = replaceOnce(t, operatorSet, "reject_namespace_adjustment = false", "reject_namespace_adjustment = true")
	tests := []struct {
		name      string
		version   string
		files     map[string]string
		noRequire bool
		// want is the drop-in's validator as "enable required tolerate
		// reject_namespace_adjustment"; "" = no drop-in.
		want string
		note string
		err  string
	}{{
		name: "2.4 default", version: "2.4.2", files: map[string]string{mainConfig: v24},
		want: "true [nri-vgpu] " + oursTol + " false", note: "refuses every container while nri-vgpu is not connected",
	}, {
		name: "2.4, operator's validator settings kept", version: "2.4.2", files: map[string]string{mainConfig: operatorSet},
		want: "true [other nri-vgpu] example.com/tolerate true", note: "already honours the annotation example.com/tolerate",
	}, {
		name: "2.4, --no-require", version: "2.4.2", files: map[string]string{mainConfig: v24}, noRequire: true,
	}, {
		name: "2.1: no validator", version: "2.1.5", files: map[string]string{mainConfig: v21},
		note: "has no NRI validator",
	}, {
		name: "2.4, a later import turns it off", version: "2.4.2",
		files: map[string]string{mainConfig: v24, "/etc/containerd/conf.d/zz.toml": "version = 3\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\nenable = false\n"},
		err:   "NRI's validator would not require nri-vgpu: a file imported after /etc/containerd/conf.d/nri-vgpu.toml",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := ContainerdOptions{Root: makeRoot(t, tt.files), Version: tt.version, NoRegister: true, NoRequire: tt.noRequire}
			res, err := Containerd(opts)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d := changeFor(res, dropIn)
			if tt.want == "" {
				if d != nil {
					t.Fatalf("drop-in written:\n%s", d.New)
				}
			} else {
				if d == nil {
					t.Fatal("no drop-in written")
				}
				v, _ := nriOf(t, d.New)[validatorKey].(map[string]any)
				got := fmt.Sprint(v["enable"], " ", v["required_plugins"], " ", v["tolerate_missing_plugins_annotation"], " ", v["reject_namespace_adjustment"])
				if got != tt.want {
					t.Errorf("drop-in validator = %q, want %q\n%s", got, tt.want, d.New)
				}
			}
			if !strings.Contains(strings.Join(res.Notes, "\n"), tt.note) {
				t.Errorf("notes %q do not mention %q", res.Notes, tt.note)
			}
			if err := res.Apply(); err != nil {
				t.Fatal(err)
			}
			again, err := Containerd(opts)
			if err != nil {
				t.Fatalf("second run: %v", err)
			}
			if again.Changed() {
				t.Errorf("second run still changes:\n%s", again.Diff())
			}
		})
	}
}
