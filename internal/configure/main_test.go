package configure

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runMain(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestMainContainerdDryRunThenApply(t *testing.T) {
	t.Setenv("NRI_VGPU_CONFIG", "")
	v17 := fixture(t, "containerd-1.7.29-default.toml")
	root := makeRoot(t, map[string]string{mainConfig: v17})

	code, out, errOut := runMain("containerd", "--root", root, "--containerd-version", "1.7.29", "--dry-run")
	if code != 0 {
		t.Fatalf("dry run exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"--- /etc/containerd/config.toml\n+++ /etc/containerd/config.toml\n",
		"-imports = []\n+imports = [\"/etc/containerd/conf.d/nri-vgpu.toml\"]\n",
		"--- /dev/null\n+++ /etc/containerd/conf.d/nri-vgpu.toml\n",
		"+[plugins]\n+  [plugins.\"io.containerd.nri.v1.nri\"]\n+    disable = false\n",
		"symlink /opt/nri/plugins/10-nri-vgpu -> /usr/bin/nri-vgpu\n",
		"dry run: nothing written\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry-run output lacks %q:\n%s", want, out)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(root, mainConfig)); string(got) != v17 {
		t.Fatal("--dry-run changed the config")
	}
	if _, err := os.Lstat(filepath.Join(root, dropIn)); err == nil {
		t.Fatal("--dry-run wrote the drop-in")
	}

	code, out, errOut = runMain("containerd", "--root", root, "--containerd-version", "1.7.29")
	if code != 0 {
		t.Fatalf("apply exit %d: %s", code, errOut)
	}
	for _, want := range []string{"wrote /etc/containerd/conf.d/nri-vgpu.toml\n", "wrote /etc/containerd/config.toml\n", "restart containerd"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runMain("containerd", "--root", root, "--containerd-version", "1.7.29", "--dry-run")
	if code != 0 || !strings.Contains(out, "nothing to change") || strings.Contains(out, "+++") {
		t.Errorf("second dry run: exit %d, output:\n%s", code, out)
	}
}

func TestMainPluginIndexFromConfig(t *testing.T) {
	t.Setenv("NRI_VGPU_CONFIG", "")
	root := makeRoot(t, map[string]string{
		mainConfig:                  fixture(t, "containerd-2.4.2-default.toml"),
		"/etc/nri-vgpu/config.toml": "[nri]\nplugin_index = \"42\"\n",
	})
	code, out, errOut := runMain("containerd", "--root", root, "--containerd-version", "2.4.2", "--dry-run")
	if code != 0 || !strings.Contains(out, "symlink /opt/nri/plugins/42-nri-vgpu -> /usr/bin/nri-vgpu") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
	// The flag wins.
	code, out, errOut = runMain("containerd", "--root", root, "--containerd-version", "2.4.2", "--dry-run", "--plugin-index", "05")
	if code != 0 || !strings.Contains(out, "symlink /opt/nri/plugins/05-nri-vgpu") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
	// A broken config falls back to the default index, saying why.
	if err := os.WriteFile(filepath.Join(root, "/etc/nri-vgpu/config.toml"), []byte("[nri]\nplugin_idx = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runMain("containerd", "--root", root, "--containerd-version", "2.4.2", "--dry-run")
	if code != 0 || !strings.Contains(out, "/opt/nri/plugins/10-nri-vgpu") || !strings.Contains(errOut, "plugin_idx") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

func TestMainDocker(t *testing.T) {
	root := makeRoot(t, map[string]string{DefaultDaemonJSON: "{\n\t\"log-driver\": \"journald\"\n}\n"})
	code, out, errOut := runMain("docker", "--root", root, "--default-runtime")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "+\t\"runtimes\": {\n") || !strings.Contains(out, "reload dockerd") {
		t.Errorf("output:\n%s", out)
	}
	got, err := os.ReadFile(filepath.Join(root, DefaultDaemonJSON))
	if err != nil {
		t.Fatal(err)
	}
	want := "{\n\t\"log-driver\": \"journald\",\n\t\"runtimes\": {\n\t\t\"nri-vgpu\": {\n\t\t\t\"path\": \"/usr/bin/nri-vgpu-runtime\"\n\t\t}\n\t},\n\t\"default-runtime\": \"nri-vgpu\"\n}\n"
	if string(got) != want {
		t.Errorf("daemon.json:\n%s\nwant:\n%s", got, want)
	}
}

func TestMainUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: nri-vgpu configure containerd"},
		{[]string{"podman"}, 2, `unknown runtime "podman"`},
		{[]string{"containerd", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"docker", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"containerd", "--root", "/nonexistent-root", "--containerd-version", "1.6.1"}, 1, "has no NRI support"},
		{[]string{"containerd", "--containerd-version", "1.7.0", "--plugin-index", "7"}, 1, `plugin index "7": want two digits`},
	}
	for _, tt := range tests {
		code, out, errOut := runMain(tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("Main(%q) = %d, %q; want %d and output containing %q", tt.args, code, out+errOut, tt.code, tt.want)
		}
	}
	for _, cmd := range []string{"containerd", "docker"} {
		// The options once, on stdout; nothing on stderr.
		code, out, errOut := runMain(cmd, "-h")
		if code != 0 || strings.Count(out, "-dry-run") != 1 || errOut != "" {
			t.Errorf("%s -h: exit %d, stdout %q, stderr %q", cmd, code, out, errOut)
		}
	}
	// A bad flag: the problem and the usage, on stderr.
	if code, out, errOut := runMain("docker", "--bogus"); code != 2 || out != "" ||
		!strings.Contains(errOut, "flag provided but not defined: -bogus") || !strings.Contains(errOut, "-dry-run") {
		t.Errorf("docker --bogus: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
