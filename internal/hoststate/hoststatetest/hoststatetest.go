// Package hoststatetest gives tests a run_dir whose region filesystems
// (hoststate mounts a tmpfs on each container's region directory) are
// unmounted when the test ends, so that the temporary directory can be
// removed even when a test leaves containers behind, and claim records as
// the previous release wrote them.
package hoststatetest

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
)

// RunDir returns a new temporary directory to use as paths.run_dir.
func RunDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	// Registered after TempDir's own cleanup, so it runs before it.
	t.Cleanup(func() {
		if err := mountinfo.UnmountUnder(dir); err != nil {
			t.Errorf("unmounting region filesystems under %s: %v", dir, err)
		}
	})
	return dir
}

// AsPreviousRelease rewrites the container.json at path, a claim's record,
// as the previous release wrote it: without the claim's podNames, the pods'
// names only in the pod field ("namespace/name1,name2").
func AsPreviousRelease(t testing.TB, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var record map[string]any
	if err := json.Unmarshal(data, &record); err != nil {
		t.Fatal(err)
	}
	claim, ok := record["claim"].(map[string]any)
	if !ok || claim["podNames"] == nil || record["name"] == nil || record["pod"] == nil {
		t.Fatalf("%s = %s, want a claim with podNames and name and pod fields", path, data)
	}
	delete(claim, "podNames")
	if data, err = json.Marshal(record); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
