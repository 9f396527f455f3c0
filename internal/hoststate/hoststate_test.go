package hoststate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
	"github.com/nri-vgpu/nri-vgpu/pkg/region/regiontest"
)

const (
	uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01"
	ctrID = "0123456789abcdef"
)

var gpu0 = allocation.GPU{UUID: uuid0, Minor: 0, Slices: 2, Memory: 8 << 30, Cores: 50}

// newConfig returns a config whose run_dir is a fresh directory (not yet
// holding anything) and whose shim library exists.
func newConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Paths.RunDir = filepath.Join(hoststatetest.RunDir(t), "run")
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestProvision(t *testing.T) {
	cfg := newConfig(t)
	// Not the defaults, so that a policy or level left out shows.
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}, CoresPolicy: "burst", LogLevel: "debug"}
	info := &Info{ID: ctrID, Name: "train", Pod: "ml/job-0", PodUID: "uid-1", AllocationID: "00112233445566778899aabbccddeeff", GPUs: []allocation.GPU{gpu0}}
	old := setUmask(0o077)
	defer setUmask(old)
	files, err := New(cfg).Provision(info, lf)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.Paths.RunDir, "containers", ctrID)
	want := oci.HostFiles{
		Preload: filepath.Join(cfg.Paths.RunDir, "ld.so.preload"),
		Limits:  filepath.Join(dir, "limits"),
		Region:  filepath.Join(dir, "region"),
		Ledger:  filepath.Join(dir, "ledger"),
	}
	if files != want {
		t.Errorf("Provision returned %+v, want %+v", files, want)
	}
	wantLimits := "# written by nri-vgpu; read by libvgpu-shim.so\n" +
		"version=1\n" +
		"gpu.0.uuid=" + uuid0 + "\n" +
		"gpu.0.memory=8589934592\n" + // 8 GiB = 8 × 1073741824
		"gpu.0.cores=50\n" +
		"cores.policy=burst\n" +
		"log.level=debug\n" +
		"ledger.shards=64\n" // the record has its ledger directory
	if got, err := os.ReadFile(want.Limits); err != nil || string(got) != wantLimits {
		t.Errorf("limits file = %q (%v), want %q", got, err, wantLimits)
	}
	// Written whole, readable by the shim whatever the umask, and no
	// temporary file left beside.
	for _, name := range []string{"limits", "container.json"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode() != 0o644 {
			t.Errorf("%s: mode %v (%v), want a regular file 0644", name, st.Mode(), err)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 4 {
		t.Errorf("container directory holds %v (%v), want only container.json, ledger, limits and region", entries, err)
	}
	st, err := os.Stat(want.Region)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky != 0 {
		t.Errorf("region dir mode = %v, want 0777 without sticky bit", st.Mode())
	}
	preload, err := os.ReadFile(want.Preload)
	if err != nil || string(preload) != "/usr/local/nri-vgpu/libvgpu-shim.so\n" {
		t.Errorf("preload file = %q (%v), want the shim's path in the container", preload, err)
	}
	ri, err := New(cfg).Info(ctrID)
	if err != nil {
		t.Fatal(err)
	}
	if ri.Pod != "ml/job-0" || len(ri.GPUs) != 1 || ri.GPUs[0].Slices != 2 {
		t.Errorf("container info = %+v", ri)
	}

	// A restart provisions again over the existing directory.
	if _, err := New(cfg).Provision(info, lf); err != nil {
		t.Fatalf("second Provision: %v", err)
	}

	// Sweep keeps what is asked for and removes the rest.
	info2 := *info
	info2.ID = "other"
	if _, err := New(cfg).Provision(&info2, lf); err != nil {
		t.Fatal(err)
	}
	removed, err := New(cfg).Sweep(func(r *Record) bool { return r.ID == ctrID })
	if err != nil || len(removed) != 1 || removed[0] != "other" {
		t.Errorf("sweep removed %v (%v), want [other]", removed, err)
	}
	if err := New(cfg).Release(ctrID); err != nil {
		t.Fatal(err)
	}
	if ids, _ := scanIDs(cfg); len(ids) != 0 {
		t.Errorf("container dirs left: %v", ids)
	}
}

// checkLedger checks that dir is a ledger directory as the shim's ledger
// needs it and no tenant can change: root's, 0755, holding exactly the
// empty regular files 0 .. 63 of root's, each 0444.
func checkLedger(t *testing.T, dir string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		t.Fatalf("ledger directory: %v", err)
	}
	if st.Mode != unix.S_IFDIR|0o755 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("ledger directory: mode %#o, owner %d:%d; want a directory 0755 of 0:0", st.Mode, st.Uid, st.Gid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := make([]string, 64)
	for k := range want {
		want[k] = fmt.Sprint(k)
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("ledger directory holds %q, want %q", names, want)
	}
	for _, name := range want {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Errorf("ledger shard %s: %v", name, err)
			continue
		}
		if st.Mode != unix.S_IFREG|0o444 || st.Uid != 0 || st.Gid != 0 || st.Size != 0 {
			t.Errorf("ledger shard %s: mode %#o, owner %d:%d, %d bytes; want an empty regular file 0444 of 0:0", name, st.Mode, st.Uid, st.Gid, st.Size)
		}
	}
}

// Every record gets its ledger directory before its limits file, with
// modes that do not depend on the umask; provisioning it again keeps the
// shards (processes may hold locks on them) and corrects a mode; Release
// and Sweep remove it with the record.
func TestProvisionLedger(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the shards are root's only when root provisions them")
	}
	cfg := newConfig(t)
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	old := setUmask(0o077)
	files, err := New(cfg).Provision(&Info{ID: ctrID}, lf)
	setUmask(old)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cfg.Paths.RunDir, "containers", ctrID, "ledger"); files.Ledger != want {
		t.Fatalf("Provision: Ledger = %q, want %q", files.Ledger, want)
	}
	checkLedger(t, files.Ledger)

	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(files.Ledger, "7"), &before); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(files.Ledger, "9"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(files.Ledger, "63")); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, lf); err != nil {
		t.Fatalf("second Provision: %v", err)
	}
	checkLedger(t, files.Ledger)
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(files.Ledger, "7"), &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino {
		t.Error("provisioning again replaced ledger shard 7: processes created later would keep a ledger of their own")
	}
	got, err := New(cfg).Files(ctrID)
	if err != nil || got != files {
		t.Errorf("Files = %+v (%v), want %+v", got, err, files)
	}

	if err := New(cfg).Release(ctrID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(files.Ledger); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ledger directory after Release: %v, want it gone", err)
	}
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, lf); err != nil {
		t.Fatal(err)
	}
	if removed, err := New(cfg).Sweep(func(*Record) bool { return false }); err != nil || len(removed) != 1 {
		t.Fatalf("Sweep removed %v (%v), want the record", removed, err)
	}
	if _, err := os.Lstat(files.Ledger); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ledger directory after Sweep: %v, want it gone", err)
	}
}

// A shard that is not a regular file (only root can write below the
// containers directory, but a FIFO must not hang a provision) fails the
// provision, naming it, without blocking.
func TestProvisionLedgerRefusesOddShard(t *testing.T) {
	cfg := newConfig(t)
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	files, err := New(cfg).Provision(&Info{ID: ctrID}, lf)
	if err != nil {
		t.Fatal(err)
	}
	shard := filepath.Join(files.Ledger, "5")
	if err := os.Remove(shard); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(shard, 0o444); err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg).Provision(&Info{ID: ctrID}, lf)
	if want := shard + " is not a regular file"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Provision over a FIFO shard: %v, want an error containing %q", err, want)
	}
}

// A record of the previous release has no ledger directory: it is still
// served (Files names no ledger, so no mount of a missing directory, and
// its limits file is left as it is), and Release removes it.
func TestPreviousReleaseRecordWithoutLedger(t *testing.T) {
	cfg := newConfig(t)
	id := ClaimID(claimUID)
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}}
	provisioned, err := New(cfg).Provision(&Info{ID: id, Source: SourceDRA, Claim: &ClaimInfo{UID: claimUID}}, lf)
	if err != nil {
		t.Fatal(err)
	}
	// As the previous release left it.
	if err := os.RemoveAll(provisioned.Ledger); err != nil {
		t.Fatal(err)
	}
	limitsBefore, err := os.ReadFile(provisioned.Limits)
	if err != nil {
		t.Fatal(err)
	}
	files, err := New(cfg).Files(id)
	if err != nil {
		t.Fatal(err)
	}
	want := provisioned
	want.Ledger = ""
	if files != want {
		t.Errorf("Files of a record without a ledger directory = %+v, want %+v", files, want)
	}
	if got, err := os.ReadFile(provisioned.Limits); err != nil || string(got) != string(limitsBefore) {
		t.Errorf("limits file after Files = %q (%v), want it unchanged", got, err)
	}
	// A link in the ledger's place is neither followed nor taken for none.
	if err := os.Symlink(t.TempDir(), provisioned.Ledger); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg).Files(id); !errors.Is(err, ErrSymlink) {
		t.Errorf("Files with a link as the ledger directory: %v, want ErrSymlink", err)
	}
	if err := os.Remove(provisioned.Ledger); err != nil {
		t.Fatal(err)
	}
	if err := New(cfg).Release(id); err != nil {
		t.Fatalf("Release of a record without a ledger directory: %v", err)
	}
	if _, err := os.Lstat(filepath.Dir(provisioned.Limits)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("record after Release: %v, want it gone", err)
	}
}

// TestContainersDirClosed checks that <run_dir>/containers is open to root
// only, whatever the umask, and that a directory left with a wider mode
// (by an earlier version) is closed at the next Provision: the region
// directories below it are world-writable.
func TestContainersDirClosed(t *testing.T) {
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	for _, existing := range []os.FileMode{0, 0o755, 0o711, 0o777} {
		t.Run(fmt.Sprintf("existing %#o", existing), func(t *testing.T) {
			cfg := newConfig(t)
			if existing != 0 {
				if err := os.MkdirAll(ContainersDir(cfg), existing); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(ContainersDir(cfg), existing); err != nil {
					t.Fatal(err)
				}
			}
			old := setUmask(0)
			defer setUmask(old)
			if _, err := New(cfg).Provision(&Info{ID: ctrID}, lf); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(ContainersDir(cfg))
			if err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("containers directory mode %v (%v), want 0700", st.Mode(), err)
			}
		})
	}
	cfg := newConfig(t)
	if err := os.MkdirAll(cfg.Paths.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ContainersDir(cfg), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, lf); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("Provision over a file at containers/: %v, want an error saying it is not a directory", err)
	}
}

// TestSweepSparesDirsBeingProvisioned checks that a sweep never removes the
// directory of a container being provisioned right now (container.json is
// written last), but does remove debris of a create that died long ago.
func TestSweepSparesDirsBeingProvisioned(t *testing.T) {
	old := time.Now().Add(-2 * ProvisionGrace)
	tests := []struct {
		name    string
		info    string // container.json content; "" = none
		mtime   time.Time
		removed bool
	}{
		{name: "provisioned", info: "{}", mtime: time.Now(), removed: true},
		{name: "provisioned long ago", info: "{}", mtime: old, removed: true},
		{name: "being provisioned", mtime: time.Now()},
		{name: "container.json half written", info: "{", mtime: time.Now()},
		{name: "abandoned", mtime: old, removed: true},
		{name: "damaged long ago", info: "{", mtime: old, removed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := newConfig(t)
			dir := ContainerDir(cfg, ctrID)
			if err := os.MkdirAll(filepath.Join(dir, RegionDirName), 0o755); err != nil {
				t.Fatal(err)
			}
			if tt.info != "" {
				if err := os.WriteFile(filepath.Join(dir, InfoFileName), []byte(tt.info), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chtimes(dir, tt.mtime, tt.mtime); err != nil {
				t.Fatal(err)
			}
			removed, err := New(cfg).Sweep(func(*Record) bool { return false })
			if err != nil {
				t.Fatal(err)
			}
			if got := len(removed) == 1; got != tt.removed {
				t.Errorf("removed %v, want removed: %v", removed, tt.removed)
			}
			if _, err := os.Stat(dir); os.IsNotExist(err) != tt.removed {
				t.Errorf("directory after the sweep: %v, want removed: %v", err, tt.removed)
			}
		})
	}
}

func TestProvisionErrors(t *testing.T) {
	cfg := newConfig(t)
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	if _, err := New(cfg).Provision(&Info{ID: ".."}, lf); !errors.Is(err, ErrInvalidID) || err.Error() != `invalid container ID ".."` {
		t.Errorf("Provision(..) = %v, want invalid container ID \"..\" wrapping ErrInvalidID", err)
	}
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "missing.so")
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, lf); err == nil || !strings.Contains(err.Error(), "shim_path") {
		t.Errorf("Provision without shim = %v, want an error naming shim_path", err)
	}
}

// A Provision that fails half-way leaves no directory behind: neither one
// it made (the limits file cannot be written) nor what it met in the way
// of the region directory.
func TestProvisionRemovesWhatItMade(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		lf    *limits.LimitsFile
		want  string // the error, after the container directory's path
	}{
		{"invalid limits", func(*testing.T, string) {}, &limits.LimitsFile{}, "/limits: limits file: no GPUs"},
		{"a file at region", func(t *testing.T, dir string) {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "region"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits(""), "/region is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			dir := filepath.Join(cfg.Paths.RunDir, "containers", ctrID)
			tc.setup(t, dir)
			_, err := New(cfg).Provision(&Info{ID: ctrID}, tc.lf)
			if err == nil || !strings.HasSuffix(err.Error(), dir+tc.want) {
				t.Errorf("Provision = %v, want an error ending in %q", err, dir+tc.want)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("container directory after a failed Provision: %v, want it gone", err)
			}
		})
	}
}

// The readers tell a container without a directory (ErrNotFound) from a
// file missing in a directory that exists (being provisioned), and refuse
// IDs that could leave the containers directory.
func TestReaderErrors(t *testing.T) {
	cfg := newConfig(t)
	if _, err := New(cfg).Info(ctrID); !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Info before anything was provisioned = %v, want ErrNotFound and fs.ErrNotExist", err)
	}
	if _, err := New(cfg).Provision(&Info{ID: "other"}, (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(ContainerDir(cfg, "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := openContainers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := map[string]func(id string) error{
		"Store.Info": func(id string) error { _, err := New(cfg).Info(id); return err },
		"info":       func(id string) error { _, err := c.info(id); return err },
		"limits":     func(id string) error { _, err := c.limits(id); return err },
		"usage":      func(id string) error { _, err := c.usage(id); return err },
	}
	for name, f := range read {
		if err := f(ctrID); !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s of a container without a directory = %v, want ErrNotFound and fs.ErrNotExist", name, err)
		}
		if err := f("half"); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrNotFound) {
			t.Errorf("%s of a directory without the file = %v, want fs.ErrNotExist but not ErrNotFound", name, err)
		}
		for _, id := range []string{"..", "a/b", ""} {
			if err := f(id); !errors.Is(err, ErrInvalidID) {
				t.Errorf("%s(%q) = %v, want ErrInvalidID", name, id, err)
			}
		}
	}
	if err := New(cfg).Release("../run"); !errors.Is(err, ErrInvalidID) {
		t.Errorf("Release(../run) = %v, want ErrInvalidID", err)
	}
	if _, err := os.Stat(cfg.Paths.RunDir); err != nil {
		t.Errorf("run_dir after Release(../run): %v", err)
	}
}

// Limits refuses a limits file that is not one (the shim would fail closed
// on it; status and metrics say so), naming the file and the reason.
func TestLimitsErrors(t *testing.T) {
	cfg := newConfig(t)
	if _, err := New(cfg).Provision(&Info{ID: ctrID}, (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.Paths.RunDir, "containers", ctrID, "limits")
	c, err := openContainers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct{ name, content, want string }{
		{"invalid", "version=1\ngpu.0.cores=0\n", "limits file " + path + `: line 2: gpu.0.cores: "0" is not an integer in 1..100`},
		{"oversize", strings.Repeat("#", 10000), "more than 4096 bytes"},
	} {
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if lf, err := c.limits(ctrID); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Limits = %+v, %v; want an error containing %q", tc.name, lf, err, tc.want)
		}
	}
}

// Usage reads the region the shim wrote, and refuses what a container can
// plant in its region directory, without blocking: a link (at the region
// file, or at the container's directory on the way) and a FIFO.
func TestUsage(t *testing.T) {
	cfg := newConfig(t)
	lf := (&allocation.Allocation{GPUs: []allocation.GPU{gpu0}}).Limits("")
	for _, id := range []string{"good", "linked", "fifo"} {
		if _, err := New(cfg).Provision(&Info{ID: id}, lf); err != nil {
			t.Fatal(err)
		}
	}
	usagePath := func(id string) string { return filepath.Join(ContainerDir(cfg, id), "region", "usage") }
	regiontest.Write(t, usagePath("good"), []region.DeviceUsage{{UUID: uuid0, Limit: 8 << 30, Used: 1 << 30, Cores: 50}},
		[]region.ProcessUsage{{PID: 7, HostPID: 1007, StartTime: 1, Used: []uint64{1 << 30}, Launches: []uint64{3}}})
	// The tenant deletes the region the host made and plants a link, or a FIFO.
	for _, id := range []string{"linked", "fifo"} {
		if err := os.Remove(usagePath(id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(usagePath("good"), usagePath("linked")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(usagePath("fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ContainerDir(cfg, "good"), ContainerDir(cfg, "dir-link")); err != nil {
		t.Fatal(err)
	}
	c, err := openContainers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := c.usage("good")
	if err != nil || len(u.Devices) != 1 || u.Devices[0].UUID != uuid0 || u.Devices[0].Used != 1<<30 || len(u.Processes) != 1 || u.Processes[0].HostPID != 1007 {
		t.Fatalf("Usage = %+v, %v; want the region written: one GPU with 1GiB used by host pid 1007", u, err)
	}
	for _, tc := range []struct {
		id   string
		want error
	}{{"linked", ErrSymlink}, {"dir-link", ErrSymlink}, {"fifo", region.ErrInvalid}} {
		done := make(chan error, 1)
		go func() { _, err := c.usage(tc.id); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, region.ErrInvalid) || !errors.Is(err, tc.want) {
				t.Errorf("Usage(%s) = %v, want an error wrapping region.ErrInvalid and %v", tc.id, err, tc.want)
			}
		case <-time.After(30 * time.Second): // a failure detector, not a timing
			t.Fatalf("Usage(%s) blocked", tc.id)
		}
	}
}

// A claim's directory (Contract 8) is provisioned once; later preparations
// only bring its pods up to date, and the containers of the claim mount the
// files Files names.
func TestClaimDirectory(t *testing.T) {
	cfg := newConfig(t)
	id := ClaimID("6f1c2a3b-0000-4000-8000-000000000001")
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}}
	info := &Info{ID: id, Source: "dra", GPUs: []allocation.GPU{gpu0},
		Claim: &ClaimInfo{Namespace: "ml", Name: "job-gpu", UID: "6f1c2a3b-0000-4000-8000-000000000001", PodUIDs: []string{"pod-1"}}}

	if _, err := New(cfg).Files(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("Files before Provision: %v, want ErrNotFound", err)
	}
	if err := New(cfg).UpdateInfo(info); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateInfo before Provision: %v, want ErrNotFound", err)
	}
	provisioned, err := New(cfg).Provision(info, lf)
	if err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Stat(provisioned.Limits, &before); err != nil {
		t.Fatal(err)
	}

	update := *info
	update.Claim = &ClaimInfo{Namespace: "ml", Name: "job-gpu", UID: info.Claim.UID, PodUIDs: []string{"pod-1", "pod-2"}}
	if err := New(cfg).UpdateInfo(&update); err != nil {
		t.Fatal(err)
	}
	got, err := New(cfg).Info(id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Claim == nil || strings.Join(got.Claim.PodUIDs, ",") != "pod-1,pod-2" || got.Claim.Name != "job-gpu" {
		t.Errorf("claim info after UpdateInfo = %+v, want pods pod-1,pod-2", got.Claim)
	}
	var after unix.Stat_t
	if err := unix.Stat(provisioned.Limits, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino {
		t.Error("UpdateInfo replaced the limits file: containers created later would get a ledger of their own")
	}

	files, err := New(cfg).Files(id)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.Paths.RunDir, "containers", id)
	want := oci.HostFiles{
		Preload: filepath.Join(cfg.Paths.RunDir, "ld.so.preload"),
		Limits:  filepath.Join(dir, "limits"),
		Region:  filepath.Join(dir, "region"),
		Ledger:  filepath.Join(dir, "ledger"),
	}
	if files != want {
		t.Errorf("Files = %+v, want %+v", files, want)
	}

	// A link in place of the limits file is never followed.
	if err := os.Rename(want.Limits, want.Limits+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(want.Limits+".real", want.Limits); err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg).Files(id); !errors.Is(err, ErrSymlink) {
		t.Errorf("Files with a link as the limits file: %v, want ErrSymlink", err)
	}
	if err := New(cfg).Release(id); err != nil {
		t.Fatal(err)
	}
}

// scanIDs returns the IDs of the records Scan meets.
func scanIDs(cfg *config.Config) ([]string, error) {
	var ids []string
	err := New(cfg).Scan(func(r *Record) error {
		ids = append(ids, r.ID)
		return nil
	})
	return ids, err
}

const claimUID = "6f1c2a3b-0000-4000-8000-000000000001"

// A claim's container.json written by the previous release names the
// claim and its pods in the container fields (name "claim <name>", pod
// "<namespace>/<pod>,<pod>") and has no podNames: it is read as a claim's
// record all the same, its pods' names taken from the pod field.
func TestClaimRecordOfThePreviousRelease(t *testing.T) {
	cfg := newConfig(t)
	s := New(cfg)
	id := ClaimID(claimUID)
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}}
	if _, err := s.Provision(&Info{ID: id, Source: SourceDRA, Claim: &ClaimInfo{UID: claimUID}}, lf); err != nil {
		t.Fatal(err)
	}
	old := `{
  "id": "` + id + `",
  "name": "claim job-gpu",
  "pod": "ml/job-0,job-1",
  "allocationID": "` + claimUID + `",
  "gpus": [{"uuid": "` + uuid0 + `", "minor": 0, "slices": 0, "memory": 8589934592, "cores": 50}],
  "source": "dra",
  "created": "2026-11-20T10:00:00Z",
  "claim": {"namespace": "ml", "name": "job-gpu", "uid": "` + claimUID + `", "podUIDs": ["pod-1", "pod-2"]}
}
`
	if err := os.WriteFile(filepath.Join(ContainerDir(cfg, id), InfoFileName), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(what string, info *Info, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if info.Kind() != KindClaim || info.Claim.Namespace != "ml" || info.Claim.Name != "job-gpu" || info.Claim.UID != claimUID ||
			strings.Join(info.Claim.PodUIDs, ",") != "pod-1,pod-2" || strings.Join(info.Claim.PodNames, ",") != "job-0,job-1" {
			t.Errorf("%s = %+v, claim %+v; want claim ml/job-gpu of pods job-0 (pod-1) and job-1 (pod-2)", what, info, info.Claim)
		}
		if info.Name != "" || info.Pod != "" {
			t.Errorf("%s: name %q, pod %q; a claim's record has no container fields", what, info.Name, info.Pod)
		}
		if name, pod := info.Names(); name != "claim job-gpu" || pod != "ml/job-0,job-1" {
			t.Errorf("%s: Names() = %q, %q; want what the previous release showed", what, name, pod)
		}
	}
	info, err := s.Info(id)
	check("Info", info, err)
	info, err = s.Claim(claimUID)
	check("Claim", info, err)
	if err := s.Scan(func(r *Record) error {
		info, err := r.Claim()
		check("Record.Claim", info, err)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A claim's record written now still holds the name and pod fields where
// the previous release reads a claim's name and pods; a container's
// record holds its own.
func TestRecordReadableByThePreviousRelease(t *testing.T) {
	cfg := newConfig(t)
	s := New(cfg)
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}}
	records := []*Info{
		{ID: ClaimID(claimUID), Source: SourceDRA, Claim: &ClaimInfo{Namespace: "ml", Name: "job-gpu", UID: claimUID,
			PodUIDs: []string{"pod-1", "pod-2"}, PodNames: []string{"job-0", "job-1"}}},
		{ID: ctrID, Name: "train", Pod: "ml/job-0", PodUID: "pod-1", Source: SourceNRI},
	}
	want := map[string][2]string{ClaimID(claimUID): {"claim job-gpu", "ml/job-0,job-1"}, ctrID: {"train", "ml/job-0"}}
	for _, info := range records {
		if _, err := s.Provision(info, lf); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(ContainerDir(cfg, info.ID), InfoFileName))
		if err != nil {
			t.Fatal(err)
		}
		// The fields the previous release reads.
		var previous struct {
			Name, Pod string
			Source    string
			Claim     *struct {
				Namespace, Name, UID string
				PodUIDs              []string
			}
		}
		if err := json.Unmarshal(data, &previous); err != nil {
			t.Fatal(err)
		}
		if w := want[info.ID]; previous.Name != w[0] || previous.Pod != w[1] || previous.Source != string(info.Source) {
			t.Errorf("%s: container.json has name %q, pod %q, source %q; want %q, %q, %q", info.ID, previous.Name, previous.Pod, previous.Source, w[0], w[1], info.Source)
		}
		if info.Claim != nil && (previous.Claim == nil || previous.Claim.UID != claimUID || strings.Join(previous.Claim.PodUIDs, ",") != "pod-1,pod-2") {
			t.Errorf("%s: container.json has claim %+v, want its UID and pod UIDs", info.ID, previous.Claim)
		}
	}
}

// Claim accepts only the record of that claim as the DRA driver provisions
// it, and tells a claim never prepared from a directory without a readable
// record and from one holding something else.
func TestClaimCheck(t *testing.T) {
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 50}}}
	claim := func() *Info {
		return &Info{ID: ClaimID(claimUID), Source: SourceDRA, Claim: &ClaimInfo{Namespace: "ml", Name: "job-gpu", UID: claimUID}}
	}
	for _, tc := range []struct {
		name string
		edit func(*Info)
		want error // nil: accepted
	}{
		{"the claim's", func(*Info) {}, nil},
		{"another component's", func(i *Info) { i.Source = SourceNRI }, ErrNotClaim},
		{"no source", func(i *Info) { i.Source = "" }, ErrNotClaim},
		{"a container's", func(i *Info) { i.Claim = nil }, ErrNotClaim},
		{"another claim's", func(i *Info) { i.Claim.UID = "6f1c2a3b-0000-4000-8000-000000000002" }, ErrNotClaim},
		{"another ID", func(i *Info) { i.ID = ClaimID("6f1c2a3b-0000-4000-8000-000000000002") }, ErrNotClaim},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(t)
			s := New(cfg)
			if _, err := s.Provision(claim(), lf); err != nil {
				t.Fatal(err)
			}
			info := claim()
			tc.edit(info)
			data, err := json.Marshal(info)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(ContainerDir(cfg, ClaimID(claimUID)), InfoFileName), data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := s.Claim(claimUID)
			if tc.want == nil && (err != nil || got.Claim.UID != claimUID) {
				t.Errorf("Claim = %+v, %v; want the claim's record", got, err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Claim = %+v, %v; want an error wrapping %v", got, err, tc.want)
			}
		})
	}
	cfg := newConfig(t)
	s := New(cfg)
	if _, err := s.Claim(claimUID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Claim of a claim never prepared = %v, want ErrNotFound", err)
	}
	if err := os.MkdirAll(ContainerDir(cfg, ClaimID(claimUID)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(claimUID); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotClaim) {
		t.Errorf("Claim of a directory without container.json = %v, want fs.ErrNotExist alone", err)
	}
}
