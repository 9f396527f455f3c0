// Package pintest holds what the tests of the binaries that run the pin
// hook share: a bundle as runc hands it to the hook.
package pintest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// WriteBundle writes bundle/config.json: the root at bundle/rootfs and a
// bind mount at each pinned path (its source never compared: the tests
// plant a link in the root that is refused before). The caller makes the
// root's contents.
func WriteBundle(t testing.TB, bundle string) {
	t.Helper()
	spec := specs.Spec{Root: &specs.Root{Path: "rootfs"}}
	for _, p := range oci.PinnedPaths {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: p, Type: "bind", Source: "/"})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}
