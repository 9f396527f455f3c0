package allockey

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

func TestLoadOrCreate(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "var", "lib", "nri-vgpu")
	if _, err := Load(stateDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load before creation: %v, want ErrNotExist", err)
	}
	k1, err := LoadOrCreate(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if k1 == (allocation.Key{}) {
		t.Fatal("key is all zeros")
	}
	assertMode(t, stateDir, fs.ModeDir|0o700)
	assertMode(t, filepath.Join(stateDir, FileName), 0o600)
	data, err := os.ReadFile(filepath.Join(stateDir, FileName))
	if err != nil || !bytes.Equal(data, k1[:]) {
		t.Fatalf("key file holds %x (%v), want %x", data, err, k1[:])
	}
	k2, err := LoadOrCreate(stateDir)
	if err != nil || k2 != k1 {
		t.Fatalf("second LoadOrCreate = %x, %v; want %x", k2, err, k1)
	}
	k3, err := Load(stateDir)
	if err != nil || k3 != k1 {
		t.Fatalf("Load = %x, %v; want %x", k3, err, k1)
	}
	assertOnlyKey(t, stateDir)

	// An existing, wider state directory is narrowed: see
	// TestLoadOrCreateNarrowsStateDir.
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// assertOnlyKey checks that the key and the bindings store seeded before it
// are there, and that no temporary file was left behind.
func assertOnlyKey(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name() != FileName || entries[1].Name() != "bindings.json" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v, want only %s and bindings.json", dir, names, FileName)
	}
}

func TestLoadOrCreateConcurrent(t *testing.T) {
	for round := range 20 {
		stateDir := filepath.Join(t.TempDir(), "state")
		const n = 8
		keys := make([]allocation.Key, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				keys[i], errs[i] = LoadOrCreate(stateDir)
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: goroutine %d: %v", round, i, errs[i])
			}
			if keys[i] != keys[0] {
				t.Fatalf("round %d: goroutine %d got key %x, goroutine 0 got %x", round, i, keys[i], keys[0])
			}
		}
		if k, err := Load(stateDir); err != nil || k != keys[0] {
			t.Fatalf("round %d: key on disk %x (%v), handed out %x", round, k, err, keys[0])
		}
		assertOnlyKey(t, stateDir)
	}
}

// keyHelperEnv makes the test binary act as a separate process creating the
// key (see TestLoadOrCreateProcesses).
const keyHelperEnv = "NRI_VGPU_TEST_KEY_DIR"

func TestLoadOrCreateHelperProcess(t *testing.T) {
	dir := os.Getenv(keyHelperEnv)
	if dir == "" {
		t.Skip("helper process for TestLoadOrCreateProcesses")
	}
	k, err := LoadOrCreate(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("key=%x\n", k[:])
}

func TestLoadOrCreateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	const n = 4
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	for i := range n {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestLoadOrCreateHelperProcess$", "-test.count=1")
		cmds[i].Env = append(os.Environ(), keyHelperEnv+"="+stateDir)
		outs[i] = new(bytes.Buffer)
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	inProcess, err := LoadOrCreate(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	want := "key=" + hex.EncodeToString(inProcess[:])
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, outs[i])
		}
		if !strings.Contains(outs[i].String(), want+"\n") {
			t.Errorf("process %d: output %q, want %q", i, outs[i], want)
		}
	}
	assertOnlyKey(t, stateDir)
}

func TestLoadRejectsExistingFiles(t *testing.T) {
	tests := []struct {
		name    string
		content []byte
		mode    fs.FileMode
		dir     bool
		want    string // after the path
	}{
		{"empty", nil, 0o600, false, ": holds 0 bytes, want exactly 32"},
		{"short", []byte("0123456789"), 0o600, false, ": holds 10 bytes, want exactly 32"},
		{"long", bytes.Repeat([]byte{7}, 33), 0o600, false, ": holds more than 32 bytes, want exactly 32"},
		{"hex text", []byte(strings.Repeat("ab", 32) + "\n"), 0o600, false, ": holds more than 32 bytes, want exactly 32"},
		{"readable by others", bytes.Repeat([]byte{7}, 32), 0o644, false, ": mode 0644 lets group or others read it; it must be 0600"},
		{"readable by group", bytes.Repeat([]byte{7}, 32), 0o640, false, ": mode 0640 lets group or others read it; it must be 0600"},
		{"directory", nil, 0o700, true, ": not a regular file (d---------)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			if tt.dir {
				if err := os.Mkdir(path, tt.mode); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.WriteFile(path, tt.content, tt.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			for _, load := range []func(string) (allocation.Key, error){Load, LoadOrCreate} {
				_, err := load(dir)
				if err == nil || !strings.HasPrefix(err.Error(), "allocation key "+path+tt.want) {
					t.Errorf("error %v, want %q", err, "allocation key "+path+tt.want)
				}
			}
			if !tt.dir {
				// Never truncated or replaced.
				data, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(data, tt.content) {
					t.Errorf("key file now holds %q (%v), want %q", data, err, tt.content)
				}
				assertMode(t, path, tt.mode)
			}
		})
	}
}

// TestLoadOrCreateNarrowsStateDir: kubelet creates hostPath directories
// 0755; the state directory is narrowed to 0700 on first use.
func TestLoadOrCreateNarrowsStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err != nil {
		t.Fatalf("LoadOrCreate: %v", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory mode %04o, want 0700", fi.Mode().Perm())
	}
}

// TestKeyOwnedByAnotherUser: a key file or state directory owned by another
// (non-root) user could have been planted; both are refused.
func TestKeyOwnedByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("changing a file's owner needs root")
	}
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := LoadOrCreate(dir); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, FileName)
	if err := os.Chown(key, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err == nil || !strings.Contains(err.Error(), "owned by uid 4242") {
		t.Errorf("key owned by uid 4242: err = %v, want a refusal naming the owner", err)
	}
	if err := os.Chown(dir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err == nil || !strings.Contains(err.Error(), "state directory") {
		t.Errorf("state directory owned by uid 4242: err = %v, want a refusal", err)
	}
}
