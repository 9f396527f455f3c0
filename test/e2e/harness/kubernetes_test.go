package harness

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSelectedKubernetesVersions(t *testing.T) {
	tests := []struct {
		env  string
		want []string // nil: an error
	}{
		{"", []string{"v1.37.2", "v1.36.3"}},
		{" ", []string{"v1.37.2", "v1.36.3"}},
		{"v1.34.4", []string{"v1.34.4"}},
		{"v1.37.2,v1.34.4 v1.37.2", []string{"v1.37.2", "v1.34.4"}},
		{"v1.33.9", nil},
		{"1.37.2", nil},
		{"v1.37", nil},
	}
	for _, tt := range tests {
		t.Setenv(EnvKubernetesVersions, tt.env)
		got, err := SelectedKubernetesVersions()
		if tt.want == nil {
			if err == nil || !strings.Contains(err.Error(), EnvKubernetesVersions) {
				t.Errorf("%s=%q: got %v, %v; want an error naming the variable", EnvKubernetesVersions, tt.env, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s=%q: got %v, %v; want %v", EnvKubernetesVersions, tt.env, got, err, tt.want)
		}
	}
}

// TestProgramVersion reads the release from --version as the Kubernetes
// components and etcd print it.
func TestProgramVersion(t *testing.T) {
	tests := []struct {
		output, want string // want "" means an error
	}{
		{"Kubernetes v1.37.2", "v1.37.2"},
		{"etcd Version: 3.7.0\nGit SHA: GitNotFound\nGo Version: go1.26.8", "v3.7.0"},
		{"Kubernetes v0.0.0-master+$Format:%H$", "v0.0.0-master+$Format:%H$"},
		{"kubelet", ""},
	}
	for _, tt := range tests {
		bin := filepath.Join(t.TempDir(), "prog")
		script := "#!/bin/sh\n[ \"$1\" = --version ] || exit 2\nprintf '%s\\n' " + shellQuote(tt.output) + "\n"
		if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		got, err := ProgramVersion(bin)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ProgramVersion for %q = %q, want an error", tt.output, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ProgramVersion for %q = %q, %v; want %s", tt.output, got, err, tt.want)
		}
	}
}

// TestKubernetesPreflight: an unstamped build (v0.0.0-master) and a missing
// binary are named; a complete set of the right version passes.
func TestKubernetesPreflight(t *testing.T) {
	dir := t.TempDir()
	write := func(name, output string) {
		t.Helper()
		script := "#!/bin/sh\nprintf '%s\\n' " + shellQuote(output) + "\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("etcd", "etcd Version: 3.7.0")
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		write(b, "Kubernetes v1.37.2")
	}
	write("kubelet", "Kubernetes v0.0.0-master+$Format:%H$")
	err := KubernetesPreflight(dir, "v1.37.2")
	if err == nil || !strings.Contains(err.Error(), "kubelet is v0.0.0-master") || !strings.Contains(err.Error(), "hack/k8s-deps.sh") {
		t.Errorf("preflight with an unstamped kubelet: %v; want it named, and hack/k8s-deps.sh", err)
	}
	write("kubelet", "Kubernetes v1.37.2")
	if err := KubernetesPreflight(dir, "v1.37.2"); err != nil {
		t.Errorf("preflight of a complete v1.37.2: %v", err)
	}
	os.Remove(filepath.Join(dir, "etcd"))
	if err := KubernetesPreflight(dir, "v1.37.2"); err == nil || !strings.Contains(err.Error(), "etcd --version") {
		t.Errorf("preflight without etcd: %v; want etcd named", err)
	}
}

func TestKubernetesBinDir(t *testing.T) {
	t.Setenv("NRI_VGPU_E2E_CACHE", "/cache")
	t.Setenv(EnvKubernetesBinDir, "")
	if got, want := KubernetesBinDir("v1.34.4"), "/cache/kubernetes-v1.34.4/bin"; got != want {
		t.Errorf("KubernetesBinDir(v1.34.4) = %s, want %s", got, want)
	}
	t.Setenv(EnvKubernetesBinDir, "/mine")
	if got := KubernetesBinDir(KubernetesVersion); got != "/mine" {
		t.Errorf("KubernetesBinDir(%s) with %s=/mine = %s", KubernetesVersion, EnvKubernetesBinDir, got)
	}
	if got, want := KubernetesBinDir("v1.34.4"), "/cache/kubernetes-v1.34.4/bin"; got != want {
		t.Errorf("KubernetesBinDir(v1.34.4) with %s set = %s, want %s", EnvKubernetesBinDir, got, want)
	}
}

// TestK8sScriptPinsTheSameVersion: hack/k8s-deps.sh builds by default the
// releases the cluster tests run, the newest first.
func TestK8sScriptPinsTheSameVersion(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "k8s-deps.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DEFAULT_VERSIONS=\(([^)]*)\)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("hack/k8s-deps.sh has no DEFAULT_VERSIONS=(...) line")
	}
	if got := strings.Fields(string(m[1])); !slices.Equal(got, KubernetesVersions) || got[0] != KubernetesVersion {
		t.Errorf("hack/k8s-deps.sh builds %v by default, the cluster tests run %v (%s first)", got, KubernetesVersions, KubernetesVersion)
	}
}

// TestLockNode: a second cluster waits for the first one's lock and gets it
// once the first lets go.
func TestLockNode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	ctx := context.Background()
	first, err := lockNode(ctx, path, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	short, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	if second, err := lockNode(short, path, func(f string, a ...any) { said = append(said, f) }); err == nil {
		second.Close()
		t.Fatal("a second lockNode got the lock while the first held it")
	} else if !strings.Contains(err.Error(), path) {
		t.Errorf("error %v does not name %s", err, path)
	}
	if len(said) != 1 {
		t.Errorf("the waiting lockNode said %d things, want 1 (that it waits)", len(said))
	}
	first.Close()
	second, err := lockNode(ctx, path, t.Logf)
	if err != nil {
		t.Fatalf("lockNode after the first let go: %v", err)
	}
	second.Close()
}
