package configure

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDocker(t *testing.T) {
	tests := []struct {
		name     string
		existing *string // nil: no daemon.json
		opts     DockerOptions
		want     string // "" = unchanged
		note     string
	}{{
		name: "no daemon.json",
		want: "{\n  \"runtimes\": {\n    \"nri-vgpu\": {\n      \"path\": \"/usr/bin/nri-vgpu-runtime\"\n    }\n  }\n}\n",
	}, {
		name:     "empty daemon.json",
		existing: ptr(""),
		want:     "{\n  \"runtimes\": {\n    \"nri-vgpu\": {\n      \"path\": \"/usr/bin/nri-vgpu-runtime\"\n    }\n  }\n}\n",
	}, {
		name: "other keys and runtimes keep their order and values",
		existing: ptr(`{
    "data-root": "/srv/docker",
    "runtimes": {
        "nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}
    },
    "log-opts": {"max-size": "10m", "max-file": "3"},
    "default-shm-size": 67108864
}`),
		want: `{
    "data-root": "/srv/docker",
    "runtimes": {
        "nvidia": {
            "path": "nvidia-container-runtime",
            "runtimeArgs": []
        },
        "nri-vgpu": {
            "path": "/usr/bin/nri-vgpu-runtime"
        }
    },
    "log-opts": {
        "max-size": "10m",
        "max-file": "3"
    },
    "default-shm-size": 67108864
}
`,
	}, {
		name:     "an old entry gets the new path and keeps its arguments",
		existing: ptr(`{"runtimes": {"nri-vgpu": {"path": "/opt/old/nri-vgpu-runtime", "runtimeArgs": ["--debug"]}}}`),
		want:     "{\n  \"runtimes\": {\n    \"nri-vgpu\": {\n      \"path\": \"/usr/bin/nri-vgpu-runtime\",\n      \"runtimeArgs\": [\n        \"--debug\"\n      ]\n    }\n  }\n}\n",
		note:     "pointed at /opt/old/nri-vgpu-runtime",
	}, {
		name:     "default runtime replaces another",
		existing: ptr("{\n\t\"default-runtime\": \"nvidia\"\n}\n"),
		opts:     DockerOptions{DefaultRuntime: true},
		want:     "{\n\t\"default-runtime\": \"nri-vgpu\",\n\t\"runtimes\": {\n\t\t\"nri-vgpu\": {\n\t\t\t\"path\": \"/usr/bin/nri-vgpu-runtime\"\n\t\t}\n\t}\n}\n",
		note:     `the default runtime was "nvidia"`,
	}, {
		name:     "custom name and path",
		existing: ptr("{}"),
		opts:     DockerOptions{RuntimeName: "vgpu", RuntimePath: "/usr/local/bin/nri-vgpu-runtime"},
		want:     "{\n  \"runtimes\": {\n    \"vgpu\": {\n      \"path\": \"/usr/local/bin/nri-vgpu-runtime\"\n    }\n  }\n}\n",
	}, {
		name:     "already configured, formatted differently",
		existing: ptr(`{"runtimes":{"nri-vgpu":{"path":"/usr/bin/nri-vgpu-runtime"}}}`),
		note:     "nothing to change",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{}
			if tt.existing != nil {
				files[DefaultDaemonJSON] = *tt.existing
			}
			opts := tt.opts
			opts.Root = makeRoot(t, files)
			res, err := Docker(opts)
			if err != nil {
				t.Fatalf("Docker: %v", err)
			}
			c := changeFor(res, DefaultDaemonJSON)
			switch {
			case tt.want == "" && c != nil:
				t.Errorf("changed:\n%s", res.Diff())
			case tt.want != "" && c == nil:
				t.Errorf("unchanged, want:\n%s", tt.want)
			case c != nil && string(c.New) != tt.want:
				t.Errorf("daemon.json:\n%s\nwant:\n%s", c.New, tt.want)
			}
			if tt.note != "" && !strings.Contains(strings.Join(res.Notes, "\n"), tt.note) {
				t.Errorf("notes %q do not mention %q", res.Notes, tt.note)
			}
			if err := res.Apply(); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			again, err := Docker(opts)
			if err != nil || again.Changed() {
				t.Errorf("second run: %v, changes:\n%s", err, again.Diff())
			}
		})
	}
}

func TestDockerErrors(t *testing.T) {
	tests := []struct{ name, existing, want string }{
		{"not JSON", "{runtimes: {}}", "parsing /etc/docker/daemon.json: not valid JSON"},
		{"not an object", `["a"]`, "want a JSON object"},
		{"duplicate key", `{"a": 1, "a": 2}`, `key "a" appears twice`},
		{"trailing text", `{} {}`, "text after the JSON object"},
		{"runtimes not an object", `{"runtimes": []}`, `"runtimes": want a JSON object`},
		{"entry not an object", `{"runtimes": {"nri-vgpu": "/usr/bin/x"}}`, `"runtimes"."nri-vgpu": want a JSON object`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := makeRoot(t, map[string]string{DefaultDaemonJSON: tt.existing})
			_, err := Docker(DockerOptions{Root: root})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestApplyRefusesAFileChangedMeanwhile(t *testing.T) {
	root := makeRoot(t, map[string]string{DefaultDaemonJSON: "{}"})
	res, err := Docker(DockerOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	// Someone else edits the file between the diff and the write.
	root2 := makeRoot(t, map[string]string{DefaultDaemonJSON: `{"debug": true}`})
	res.Root = root2
	if err := res.Apply(); err == nil || !strings.Contains(err.Error(), "changed since it was read") {
		t.Fatalf("Apply = %v, want a refusal", err)
	}
}

func ptr(s string) *string { return &s }

func TestApplyWritesThroughASymlink(t *testing.T) {
	const kept = "/etc/config-management/daemon.json"
	tests := []struct{ name, link string }{
		{"relative link", "->../config-management/daemon.json"},
		{"absolute link, taken under the root", "->" + kept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := makeRoot(t, map[string]string{kept: `{"debug": true}`, DefaultDaemonJSON: tt.link})
			res, err := Docker(DockerOptions{Root: root})
			if err != nil {
				t.Fatalf("Docker: %v", err)
			}
			if c := changeFor(res, DefaultDaemonJSON); c == nil || string(c.Old) != `{"debug": true}` {
				t.Fatalf("change = %+v, want one from the linked file's content", c)
			}
			if err := res.Apply(); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			st, err := os.Lstat(filepath.Join(root, DefaultDaemonJSON))
			if err != nil || st.Mode()&fs.ModeSymlink == 0 {
				t.Fatalf("%s is no longer a symlink (%v, %v)", DefaultDaemonJSON, st, err)
			}
			data, err := os.ReadFile(filepath.Join(root, kept))
			if err != nil || !strings.Contains(string(data), `"nri-vgpu"`) || !strings.Contains(string(data), `"debug": true`) {
				t.Errorf("linked file = %q, %v; want the runtime added to it", data, err)
			}
			if again, err := Docker(DockerOptions{Root: root}); err != nil || again.Changed() {
				t.Errorf("second run: %v, changes:\n%s", err, again.Diff())
			}
		})
	}
}
