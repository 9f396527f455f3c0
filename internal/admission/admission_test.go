package admission

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

const (
	uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01"
	uuid1 = "GPU-1f0e2d3c-4b5a-4968-8776-5a4b3c2d1e02"
	gib   = 1 << 30
)

func TestFromAllocated(t *testing.T) {
	tests := []struct {
		in   allocation.GPU
		want Reservation
	}{
		{allocation.GPU{UUID: uuid0, Memory: 4 * gib, Cores: 30}, Reservation{UUID: uuid0, Memory: 4 * gib, Cores: 30}},
		{allocation.GPU{UUID: uuid0, Memory: 4 * gib, Cores: 99}, Reservation{UUID: uuid0, Memory: 4 * gib, Cores: 99}},
		// Not throttled: no share of SM time reserved.
		{allocation.GPU{UUID: uuid0, Memory: 4 * gib, Cores: 100}, Reservation{UUID: uuid0, Memory: 4 * gib}},
	}
	for _, tt := range tests {
		if got := FromAllocated(tt.in); got != tt.want {
			t.Errorf("FromAllocated(%+v) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestCapacityOf(t *testing.T) {
	tests := []struct {
		total        uint64
		mem, cores   float64
		wantMem      uint64
		wantCores    int
		wantErrMatch string
	}{
		{total: 40 * gib, mem: 1, cores: 1, wantMem: 40 * gib, wantCores: 100},
		{total: 40 * gib, mem: 1.5, cores: 1.1, wantMem: 60 * gib, wantCores: 110},
		{total: 10, mem: 0.29, cores: 0.29, wantMem: 2, wantCores: 29},
		{total: 40 * gib, mem: 0, cores: 1, wantErrMatch: "memory scaling"},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%d×%v,%v", tt.total, tt.mem, tt.cores)
		c, err := CapacityOf(3, uuid0, tt.total, tt.mem, tt.cores)
		if tt.wantErrMatch != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErrMatch) {
				t.Errorf("%s: error %v, want one containing %q", name, err, tt.wantErrMatch)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := Capacity{Index: 3, UUID: uuid0, Memory: tt.wantMem, Total: tt.total, Cores: tt.wantCores}
		if c != want {
			t.Errorf("%s: %+v, want %+v", name, c, want)
		}
	}
}

func TestCheck(t *testing.T) {
	caps := []Capacity{
		{Index: 0, UUID: uuid0, Memory: 40 * gib, Total: 40 * gib, Cores: 100},
		{Index: 1, UUID: uuid1, Memory: 16 * gib, Total: 16 * gib, Cores: 100},
	}
	s := newState()
	s.Add(Entry{ID: "a", GPUs: []Reservation{{UUID: uuid0, Memory: 30 * gib, Cores: 40}}})
	s.Add(Entry{ID: "b", GPUs: []Reservation{{UUID: uuid0, Memory: 8*gib + gib/2, Cores: 30}, {UUID: uuid1, Memory: 4 * gib}}})

	tests := []struct {
		name    string
		id      string
		want    []Reservation
		wantErr string
	}{
		{name: "fits exactly", id: "c", want: []Reservation{{UUID: uuid0, Memory: 1*gib + gib/2, Cores: 30}}},
		{name: "other GPU", id: "c", want: []Reservation{{UUID: uuid1, Memory: 12 * gib, Cores: 100}}},
		{
			name:    "memory short",
			id:      "c",
			want:    []Reservation{{UUID: uuid0, Memory: 4 * gib, Cores: 10}},
			wantErr: "not enough GPU capacity left: GPU 0 (" + uuid0 + "): 1.5GiB of 40GiB memory and 30% of cores free; asked for 4GiB and 10% (2 other containers hold the rest)",
		},
		{
			name:    "cores short, memory-only wording",
			id:      "c",
			want:    []Reservation{{UUID: uuid0, Memory: gib, Cores: 31}},
			wantErr: "1.5GiB of 40GiB memory and 30% of cores free; asked for 1GiB and 31%",
		},
		{
			name:    "every short GPU is named",
			id:      "c",
			want:    []Reservation{{UUID: uuid0, Memory: 2 * gib}, {UUID: uuid1, Memory: 13 * gib}},
			wantErr: "asked for 2GiB (2 other containers hold the rest); GPU 1 (" + uuid1 + "): 12GiB of 16GiB memory and 100% of cores free; asked for 13GiB (1 other container holds the rest)",
		},
		{
			name: "the container's own entry does not count (re-create)",
			id:   "a",
			want: []Reservation{{UUID: uuid0, Memory: 31 * gib, Cores: 70}},
		},
		{name: "GPU without capacity", id: "c", want: []Reservation{{UUID: "GPU-other", Memory: 1}}, wantErr: "no capacity known for GPU GPU-other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Check(tt.id, tt.want, caps)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check error\n got %v\nwant one containing %q", err, tt.wantErr)
			}
		})
	}

	var over *OversubscribedError
	err := s.Check("c", []Reservation{{UUID: uuid0, Memory: 40 * gib}}, caps)
	if !errors.As(err, &over) || len(over.Short) != 1 || over.Short[0].FreeMemory != gib+gib/2 || over.Short[0].Holders != 2 {
		t.Errorf("Check error %#v, want one shortfall with 1.5GiB free and 2 holders", err)
	}
}

func TestCheckCapacityShrunk(t *testing.T) {
	// Scaling lowered after containers were admitted: free is 0, not a
	// wrapped-around huge number.
	s := newState()
	s.Add(Entry{ID: "a", GPUs: []Reservation{{UUID: uuid0, Memory: 20 * gib, Cores: 80}}})
	caps := []Capacity{{UUID: uuid0, Memory: 10 * gib, Total: 10 * gib, Cores: 50}}
	err := s.Check("b", []Reservation{{UUID: uuid0, Memory: 1}}, caps)
	if err == nil || !strings.Contains(err.Error(), "0B of 10GiB memory and 0% of cores free") {
		t.Errorf("Check error %v", err)
	}
}

// readBack returns r's content as the wrapper sees it, through Update; the
// sentinel error keeps Update from writing the content back.
func readBack(t *testing.T, r *Record) *State {
	t.Helper()
	errRead := errors.New("read only")
	var s *State
	if err := r.Update(func(st *State) error { s = st; return errRead }); !errors.Is(err, errRead) {
		t.Fatalf("reading the admission record: %v", err)
	}
	return s
}

func TestUpdateRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // created on first use
	l := New(dir)
	created := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	e := Entry{ID: "a", Source: "nri-vgpu-runtime", Created: created, RuntimeRoot: "/run/r", GPUs: []Reservation{{UUID: uuid0, Memory: gib, Cores: 10}}}
	if err := l.Update(func(s *State) error { s.Add(e); return nil }); err != nil {
		t.Fatal(err)
	}
	s := readBack(t, l)
	if got := s.Containers["a"]; got == nil || !reflect.DeepEqual(*got, e) {
		t.Fatalf("read back %+v, want %+v", got, e)
	}
	st, err := os.Stat(l.Path())
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("record file: %v, mode %v", err, st.Mode())
	}

	// A failing update writes nothing.
	boom := errors.New("boom")
	if err := l.Update(func(s *State) error { s.Remove("a"); return boom }); !errors.Is(err, boom) {
		t.Fatalf("Update error %v, want boom", err)
	}
	if s := readBack(t, l); s.Containers["a"] == nil {
		t.Error("a failed update changed the record")
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

func TestDamagedFileIsRebuilt(t *testing.T) {
	for name, content := range map[string]string{
		"not JSON":      "{garbage",
		"other version": `{"version": 99, "containers": {"x": {"gpus": []}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			l := New(t.TempDir())
			if err := os.WriteFile(l.Path(), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			s := readBack(t, l)
			if len(s.Containers) != 0 {
				t.Errorf("damaged record read as %+v, want empty", s.Containers)
			}
		})
	}
}

// TestConcurrentAdmission runs many check-and-add updates at once, each with
// its own lock file descriptor as separate processes have: the capacity must
// hold exactly.
func TestConcurrentAdmission(t *testing.T) {
	l := New(t.TempDir())
	caps := []Capacity{{UUID: uuid0, Memory: 10 * gib, Total: 10 * gib, Cores: 100}}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for i := range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", i)
			err := l.Update(func(s *State) error {
				want := []Reservation{{UUID: uuid0, Memory: gib}}
				if err := s.Check(id, want, caps); err != nil {
					return err
				}
				s.Add(Entry{ID: id, GPUs: want})
				return nil
			})
			var over *OversubscribedError
			switch {
			case err == nil:
				mu.Lock()
				admitted++
				mu.Unlock()
			case !errors.As(err, &over):
				t.Errorf("update %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	s := readBack(t, l)
	if admitted != 10 || len(s.Containers) != 10 {
		t.Errorf("admitted %d, record holds %d; want 10 and 10", admitted, len(s.Containers))
	}
}

func TestLockTimeout(t *testing.T) {
	l := New(t.TempDir())
	l.LockTimeout = 50 * time.Millisecond
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- l.Update(func(*State) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	err := l.Update(func(*State) error { return nil })
	close(release)
	if err == nil || !strings.Contains(err.Error(), "still locked by another process") {
		t.Errorf("Update while locked: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestSync(t *testing.T) {
	cfg := config.Default()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(cfg.Paths.RunDir, "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	runtimeRoot := t.TempDir()
	prepare := func(id string, source hoststate.Source, g allocation.GPU) {
		t.Helper()
		info := &hoststate.Info{ID: id, AllocationID: "00112233445566778899aabbccddeeff", GPUs: []allocation.GPU{g}, Source: source}
		lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: g.UUID, Memory: g.Memory, Cores: g.Cores}}}
		if _, err := hoststate.New(cfg).Provision(info, lf); err != nil {
			t.Fatal(err)
		}
	}
	const own = "nri-vgpu-runtime"
	prepare("live", own, allocation.GPU{UUID: uuid0, Memory: gib, Cores: 30})
	prepare("nri-pod", "nri", allocation.GPU{UUID: uuid0, Slices: 2, Memory: 8 * gib, Cores: 20})
	prepare("gone-runtime", own, allocation.GPU{UUID: uuid1, Memory: gib, Cores: 100})
	prepare("unseen", own, allocation.GPU{UUID: uuid1, Memory: gib, Cores: 100})
	// A directory being prepared: no container.json yet.
	if err := os.MkdirAll(hoststate.ContainerDir(cfg, "preparing"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(runtimeRoot, "live"), 0o755); err != nil {
		t.Fatal(err)
	}

	s := newState()
	s.Add(Entry{ID: "live", Source: own, RuntimeRoot: runtimeRoot, GPUs: []Reservation{{UUID: uuid0, Memory: gib, Cores: 30}}})
	s.Add(Entry{ID: "deleted", Source: own, GPUs: []Reservation{{UUID: uuid0, Memory: 4 * gib}}})
	s.Add(Entry{ID: "gone-runtime", Source: own, RuntimeRoot: runtimeRoot, Seen: true, GPUs: []Reservation{{UUID: uuid1, Memory: gib}}})
	s.Add(Entry{ID: "unseen", Source: own, RuntimeRoot: runtimeRoot, GPUs: []Reservation{{UUID: uuid1, Memory: gib}}})

	res, err := s.Sync(cfg, own)
	if err != nil {
		t.Fatal(err)
	}
	want := SyncResult{Added: []string{"nri-pod"}, Dropped: []string{"deleted"}, Gone: []string{"gone-runtime"}, Skipped: []string{"preparing"}}
	if !reflect.DeepEqual(res, want) {
		t.Errorf("Sync = %+v, want %+v", res, want)
	}
	if got := s.IDs(); !reflect.DeepEqual(got, []string{"live", "nri-pod", "unseen"}) {
		t.Errorf("entries after Sync: %v", got)
	}
	if !s.Containers["live"].Seen {
		t.Error("the live container's runtime state was not marked seen")
	}
	if got := s.Containers["nri-pod"].GPUs; !reflect.DeepEqual(got, []Reservation{{UUID: uuid0, Memory: 8 * gib, Cores: 20}}) {
		t.Errorf("entry rebuilt from container.json: %+v", got)
	}
	if _, err := os.Stat(hoststate.ContainerDir(cfg, "gone-runtime")); !os.IsNotExist(err) {
		t.Errorf("directory of a container gone from its runtime: %v", err)
	}
	if _, err := os.Stat(hoststate.ContainerDir(cfg, "unseen")); err != nil {
		t.Errorf("directory of a container never seen in its runtime root was removed: %v", err)
	}
	mem, cores, holders := s.Promised(uuid0, "")
	if mem != 9*gib || cores != 50 || holders != 2 {
		t.Errorf("promised on GPU 0: %d bytes, %d%%, %d holders", mem, cores, holders)
	}
}
