package ociruntime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/nri-vgpu/nri-vgpu/internal/atomicfile"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SpecFileName is the runtime spec inside an OCI bundle.
const SpecFileName = "config.json"

// Spec is the runtime spec of a bundle, loaded to be modified and written
// back.
type Spec struct {
	path string
	spec *specs.Spec
	mode os.FileMode
	uid  int
	gid  int
}

// LoadSpec reads <bundle>/config.json ("" is the current directory).
func LoadSpec(bundle string) (*Spec, error) {
	if bundle == "" {
		bundle = "."
	}
	path := filepath.Join(bundle, SpecFileName)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read runtime spec: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read runtime spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("runtime spec %s: %w", path, err)
	}
	out := &Spec{path: path, spec: &s, mode: st.Mode().Perm(), uid: -1, gid: -1}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		out.uid, out.gid = int(sys.Uid), int(sys.Gid)
	}
	return out, nil
}

// Env returns the container's environment.
func (s *Spec) Env() []string {
	if s.spec.Process == nil {
		return nil
	}
	return s.spec.Process.Env
}

// Modify edits the loaded spec with fn; nothing is written until Flush.
func (s *Spec) Modify(fn func(*specs.Spec) error) error { return fn(s.spec) }

// Flush writes the spec back atomically: to a temporary file in the bundle
// with the original file's mode and owner, then renamed over it, so that
// the next runtime never reads a partial spec.
func (s *Spec) Flush() error {
	data, err := json.Marshal(s.spec)
	if err != nil {
		return fmt.Errorf("write runtime spec: %w", err)
	}
	if err := atomicfile.WriteOwned(s.path, data, s.mode, s.uid, s.gid); err != nil {
		return fmt.Errorf("write runtime spec: %w", err)
	}
	return nil
}
