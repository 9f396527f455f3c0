package allockey

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/internal/safepath"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// A link planted at the key file is refused, not followed: a root-owned
// 0600 file of 32 bytes elsewhere would otherwise become the signing key,
// and a dangling link must not make root create its target.
func TestKeyFileLinkIsNotFollowed(t *testing.T) {
	outside := t.TempDir()
	planted := bytes.Repeat([]byte{7}, allocation.KeySize)
	existing := filepath.Join(outside, "existing")
	if err := os.WriteFile(existing, planted, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, target string }{
		{"to a key-shaped file", existing},
		{"dangling", filepath.Join(outside, "new")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			if err := os.Chmod(state, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(tc.target, filepath.Join(state, FileName)); err != nil {
				t.Fatal(err)
			}
			for name, load := range map[string]func(string) (allocation.Key, error){"Load": Load, "LoadOrCreate": LoadOrCreate} {
				key, err := load(state)
				if !errors.Is(err, safepath.ErrSymlink) {
					t.Errorf("%s = %x, %v; want an error wrapping safepath.ErrSymlink", name, key, err)
				}
			}
			if data, err := os.ReadFile(existing); err != nil || !bytes.Equal(data, planted) {
				t.Errorf("the existing target = %x (%v), want it unchanged", data, err)
			}
			if entries, err := os.ReadDir(outside); err != nil || len(entries) != 1 {
				t.Errorf("outside holds %v (%v), want only the existing file", entries, err)
			}
			if entries, err := os.ReadDir(state); err != nil || len(entries) != 1 {
				t.Errorf("state directory holds %v (%v), want only the link (no temporary file left)", entries, err)
			}
		})
	}
}
