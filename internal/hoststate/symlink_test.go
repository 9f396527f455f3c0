package hoststate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// A directory and a file outside run_dir that a planted link points at;
// whatever Provision or Release does, they must keep their modes,
// content and entries.
type linkTarget struct{ dir, file string }

func newLinkTarget(t *testing.T) linkTarget {
	t.Helper()
	lt := linkTarget{dir: t.TempDir()}
	lt.file = filepath.Join(lt.dir, "secret")
	if err := os.WriteFile(lt.file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(lt.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return lt
}

func (lt linkTarget) untouched(t *testing.T) {
	t.Helper()
	for path, want := range map[string]fs.FileMode{lt.dir: 0o700, lt.file: 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v unchanged", path, st.Mode().Perm(), err, want)
		}
	}
	if data, err := os.ReadFile(lt.file); err != nil || string(data) != "keep me" {
		t.Errorf("%s = %q (%v), want it unchanged", lt.file, data, err)
	}
	if entries, err := os.ReadDir(lt.dir); err != nil || len(entries) != 1 {
		t.Errorf("%s holds %v (%v), want only its file", lt.dir, entries, err)
	}
}

func testLimits(t *testing.T) *limits.LimitsFile {
	t.Helper()
	lf, err := limits.ParseLimits([]byte("version=1\ngpu.0.uuid=" + uuid0 + "\ngpu.0.memory=1073741824\ngpu.0.cores=50\n"))
	if err != nil {
		t.Fatal(err)
	}
	return lf
}

func plant(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// A link planted at a container's directory or at its region directory
// fails Provision; its target is neither written nor made world-writable.
func TestProvisionFollowsNoLink(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   func(cfg *config.Config) string
	}{
		{"containers/<id>", func(cfg *config.Config) string { return ContainerDir(cfg, ctrID) }},
		{"containers/<id>/region", func(cfg *config.Config) string {
			return filepath.Join(ContainerDir(cfg, ctrID), RegionDirName)
		}},
		{"containers", ContainersDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			lt := newLinkTarget(t)
			plant(t, lt.dir, tc.at(cfg))
			_, err := New(cfg).Provision(&Info{ID: ctrID}, testLimits(t))
			if !errors.Is(err, ErrSymlink) {
				t.Errorf("Provision = %v, want an error wrapping ErrSymlink", err)
			}
			lt.untouched(t)
		})
	}
}

// A link planted at one of the files Provision writes is replaced by the file;
// its target is not written.
func TestProvisionReplacesLinkedFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   func(cfg *config.Config) string
	}{
		{"limits", func(cfg *config.Config) string { return filepath.Join(ContainerDir(cfg, ctrID), LimitsFileName) }},
		{"container.json", func(cfg *config.Config) string { return filepath.Join(ContainerDir(cfg, ctrID), InfoFileName) }},
		{"ld.so.preload", PreloadPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			lt := newLinkTarget(t)
			at := tc.at(cfg)
			plant(t, lt.file, at)
			if _, err := New(cfg).Provision(&Info{ID: ctrID}, testLimits(t)); err != nil {
				t.Fatal(err)
			}
			if st, err := os.Lstat(at); err != nil || !st.Mode().IsRegular() {
				t.Errorf("%s after Provision: %v (%v), want a regular file in place of the link", at, st.Mode(), err)
			}
			lt.untouched(t)
		})
	}
}

// Removing a container deletes a link in its place, and links inside its
// region directory (which the container can write), not their targets.
func TestReleaseFollowsNoLink(t *testing.T) {
	cfg := newConfig(t)
	lt := newLinkTarget(t)
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, testLimits(t)); err != nil {
		t.Fatal(err)
	}
	region := filepath.Join(ContainerDir(cfg, ctrID), RegionDirName)
	plant(t, lt.dir, filepath.Join(region, "dir"))
	if err := os.Remove(filepath.Join(region, "usage")); err != nil { // the host's, deleted by the tenant
		t.Fatal(err)
	}
	plant(t, lt.file, filepath.Join(region, "usage"))
	plant(t, lt.dir, ContainerDir(cfg, "linked"))
	for _, id := range []string{ctrID, "linked"} {
		if err := New(cfg).Release(id); err != nil {
			t.Fatalf("Release(%s): %v", id, err)
		}
		if _, err := os.Lstat(ContainerDir(cfg, id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there: %v", id, err)
		}
	}
	lt.untouched(t)
}

// Readers do not follow a link at a container's directory either.
func TestInfoFollowsNoLink(t *testing.T) {
	cfg := newConfig(t)
	target := t.TempDir()
	if err := os.WriteFile(filepath.Join(target, InfoFileName), []byte(`{"id":"forged"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	plant(t, target, ContainerDir(cfg, ctrID))
	if _, err := New(cfg).Info(ctrID); !errors.Is(err, ErrSymlink) {
		t.Errorf("Info through a link = %v, want an error wrapping ErrSymlink", err)
	}
	if ids, err := scanIDs(cfg); err != nil || len(ids) != 0 {
		t.Errorf("Scan = %v, %v; want no container (a link is not one)", ids, err)
	}
}

// The readers of status and metrics do not read a limits file through a
// link either: the limits they show come from the file Provision wrote.
func TestLimitsFollowsNoLink(t *testing.T) {
	cfg := newConfig(t)
	want := testLimits(t)
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, want); err != nil {
		t.Fatal(err)
	}
	c, err := openContainers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.limits(ctrID)
	if err != nil || len(got.GPUs) != 1 || got.GPUs[0].UUID != uuid0 || got.GPUs[0].Memory != 1<<30 || got.GPUs[0].Cores != 50 {
		t.Fatalf("Limits = %+v, %v; want the limits Provision wrote", got, err)
	}
	forged := filepath.Join(t.TempDir(), "limits")
	if err := os.WriteFile(forged, []byte("version=1\ngpu.0.uuid="+uuid0+"\ngpu.0.memory=0\ngpu.0.cores=100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ContainerDir(cfg, ctrID), LimitsFileName)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	plant(t, forged, path)
	if lf, err := c.limits(ctrID); !errors.Is(err, ErrSymlink) {
		t.Errorf("Limits through a link = %+v, %v; want an error wrapping ErrSymlink", lf, err)
	}
}
