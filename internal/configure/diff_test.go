package configure

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestUnifiedDiff(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{{
		name: "equal",
		old:  "a\nb\n", new: "a\nb\n",
		want: "",
	}, {
		name: "one line changed in the middle",
		old:  "1\n2\n3\n4\n5\n6\n7\n8\n9\n", new: "1\n2\n3\n4\nfive\n6\n7\n8\n9\n",
		want: "--- a\n+++ b\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n",
	}, {
		name: "new file",
		old:  "", new: "x\ny\n",
		want: "--- a\n+++ b\n@@ -0,0 +1,2 @@\n+x\n+y\n",
	}, {
		name: "emptied file",
		old:  "x\n", new: "",
		want: "--- a\n+++ b\n@@ -1 +0,0 @@\n-x\n",
	}, {
		name: "missing final newline",
		old:  "a\nb", new: "a\nb\n",
		want: "--- a\n+++ b\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n",
	}, {
		name: "two hunks far apart",
		old:  "a\n1\n2\n3\n4\n5\n6\n7\n8\nz\n", new: "A\n1\n2\n3\n4\n5\n6\n7\n8\nZ\n",
		want: "--- a\n+++ b\n@@ -1,4 +1,4 @@\n-a\n+A\n 1\n 2\n 3\n@@ -7,4 +7,4 @@\n 6\n 7\n 8\n-z\n+Z\n",
	}, {
		name: "changes six lines apart share a hunk",
		old:  "a\n1\n2\n3\n4\n5\n6\nz\n", new: "A\n1\n2\n3\n4\n5\n6\nZ\n",
		want: "--- a\n+++ b\n@@ -1,8 +1,8 @@\n-a\n+A\n 1\n 2\n 3\n 4\n 5\n 6\n-z\n+Z\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := unifiedDiff("a", "b", tt.old, tt.new); got != tt.want {
				t.Errorf("unifiedDiff:\n got: %q\nwant: %q", got, tt.want)
			}
		})
	}
}

// TestUnifiedDiffApplies feeds the diffs to patch(1): whatever a user does
// with --dry-run's output, it must be a real patch.
func TestUnifiedDiffApplies(t *testing.T) {
	patch, err := exec.LookPath("patch")
	if err != nil {
		t.Skip("patch(1) is not installed")
	}
	fixture, err := os.ReadFile("testdata/containerd-1.7.29-default.toml")
	if err != nil {
		t.Fatal(err)
	}
	old := string(fixture)
	cases := map[string]string{
		"imports":       strings.Replace(old, "imports = []", `imports = ["/etc/containerd/conf.d/nri-vgpu.toml"]`, 1),
		"top and tail":  "# added\n" + strings.TrimSuffix(old, "\n"),
		"several edits": strings.NewReplacer("disable = true", "disable = false", "oom_score = 0", "oom_score = -999", "[cgroup]\n", "").Replace(old),
	}
	for name, new := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(file, []byte(old), 0o644); err != nil {
				t.Fatal(err)
			}
			d := unifiedDiff("config.toml", "config.toml", old, new)
			cmd := exec.Command(patch, "--quiet", "--force", file)
			cmd.Stdin = strings.NewReader(d)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("patch: %v\n%s\ndiff:\n%s", err, out, d)
			}
			got, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != new {
				t.Fatalf("patched file differs from the new text; diff:\n%s", d)
			}
		})
	}
}
