package utilization

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

const (
	gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
	gpu1 = "GPU-11111111-1111-1111-1111-111111111111"
	uidB = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
)

// fakeNVML is a driver of GPUs by UUID, each answering
// GetProcessUtilization with util(uuid, lastSeen); it counts Init and
// Shutdown and records each call's lastSeen.
type fakeNVML struct {
	uuids        []string
	util         func(uuid string, since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return)
	inits, shuts int
	since        map[string][]uint64
	countReturn  nvml.Return
}

func (f *fakeNVML) lib() *mock.Interface {
	f.since = map[string][]uint64{}
	return &mock.Interface{
		InitFunc:     func() nvml.Return { f.inits++; return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { f.shuts++; return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) {
			if f.countReturn != nvml.SUCCESS {
				return 0, f.countReturn
			}
			return len(f.uuids), nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			uuid := f.uuids[i]
			return &mock.Device{
				GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
				GetProcessUtilizationFunc: func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
					f.since[uuid] = append(f.since[uuid], since)
					return f.util(uuid, since)
				},
			}, nvml.SUCCESS
		},
	}
}

// source is an NVML Source on f, its clock at now, reading cgroups from a
// fake /proc: pids 100-199 in container A of pod uid, 200-299 in container
// B of pod uidB, 300 a host process; others are gone.
// windowFromZero is a clock at which the window starts at timestamp 0, so
// that the tests' small timestamps all lie in it.
var windowFromZero = time.Unix(10, 0)

func source(t *testing.T, f *fakeNVML, now time.Time) *NVML {
	t.Helper()
	cg := map[uint32]string{300: "0::/system.slice/sshd.service\n"}
	for pid := uint32(100); pid < 110; pid++ {
		cg[pid] = "0::/kubepods/besteffort/pod" + uid + "/" + idA + "\n"
		cg[pid+100] = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(uidB, "-", "_") + ".slice/cri-containerd-" + idB + ".scope\n"
	}
	lib := f.lib()
	s := newNVML(func() (nvml.Interface, error) { return lib, initError(lib.Init()) }, fakeProc(t, cg))
	s.now = func() time.Time { return now }
	return s
}

func initError(r nvml.Return) error {
	if r != nvml.SUCCESS {
		return r
	}
	return nil
}

func at(pid uint32, ts uint64, sm uint32) nvml.ProcessUtilizationSample {
	return nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: sm}
}

func samplesEqual(t *testing.T, got, want []Sample) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d samples %+v, want %+v", len(got), got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.ContainerID != w.ContainerID || g.PodUID != w.PodUID || g.UUID != w.UUID || g.SM < w.SM-1e-9 || g.SM > w.SM+1e-9 {
			t.Errorf("sample %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestSamplesAttributeToContainers: per GPU, a container's processes are
// summed, each the mean of its samples; processes of the host and exited
// ones are left out; a GPU with no samples (NOT_FOUND) gives none.
func TestSamplesAttributeToContainers(t *testing.T) {
	f := &fakeNVML{uuids: []string{gpu0, gpu1}}
	f.util = func(uuid string, _ uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		if uuid == gpu1 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return []nvml.ProcessUtilizationSample{
			at(100, 1000, 40), at(100, 1166, 60), // A's first process: mean 50 %
			at(101, 1000, 30), // A's second process (a fork)
			at(200, 1166, 20), // B
			at(300, 1000, 90), // a host process
			at(400, 1000, 70), // exited since
		}, nvml.SUCCESS
	}
	got, err := source(t, f, windowFromZero).Samples()
	if err != nil {
		t.Fatal(err)
	}
	samplesEqual(t, got, []Sample{
		{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 0.8},
		{ContainerID: idB, PodUID: uidB, UUID: gpu0, SM: 0.2},
	})
}

// TestSamplesCappedPerGPU: a tenant that forks many busy processes counts
// at most the whole GPU.
func TestSamplesCappedPerGPU(t *testing.T) {
	f := &fakeNVML{uuids: []string{gpu0}}
	f.util = func(string, uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return []nvml.ProcessUtilizationSample{at(100, 5, 50), at(101, 5, 50), at(102, 5, 50), at(200, 5, 10)}, nvml.SUCCESS
	}
	got, err := source(t, f, windowFromZero).Samples()
	if err != nil {
		t.Fatal(err)
	}
	samplesEqual(t, got, []Sample{
		{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 1},
		{ContainerID: idB, PodUID: uidB, UUID: gpu0, SM: 0.1},
	})
}

// TestSamplesWindow: every call asks NVML for the last Window, so that
// callers do not use up each other's samples (a second caller at the same
// moment sees what the first saw).
func TestSamplesWindow(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	// 10 s before now, in microseconds.
	const start = 1_000_000*1_000_000 - 10*1_000_000
	f := &fakeNVML{uuids: []string{gpu0}}
	f.util = func(_ string, since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return []nvml.ProcessUtilizationSample{
			at(100, start, 10), at(100, start+5_000_000, 30),
			at(200, start+9_000_000, 60),
		}, nvml.SUCCESS
	}
	s := source(t, f, now)
	want := []Sample{
		{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 0.2},
		{ContainerID: idB, PodUID: uidB, UUID: gpu0, SM: 0.6},
	}
	for call := 1; call <= 2; call++ {
		got, err := s.Samples()
		if err != nil {
			t.Fatal(err)
		}
		samplesEqual(t, got, want)
	}
	if got := f.since[gpu0]; len(got) != 2 || got[0] != start || got[1] != start {
		t.Errorf("lastSeenTimeStamp of the calls = %v, want [%d %d]", got, uint64(start), uint64(start))
	}
}

// TestSamplesReinitAfterDriverReload: NVML_ERROR_UNINITIALIZED fails the
// call, naming the GPU, and the next call initializes NVML again.
func TestSamplesReinitAfterDriverReload(t *testing.T) {
	calls := 0
	f := &fakeNVML{uuids: []string{gpu0}}
	f.util = func(string, uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		calls++
		if calls == 1 {
			return nil, nvml.ERROR_UNINITIALIZED
		}
		return []nvml.ProcessUtilizationSample{at(100, 5, 25)}, nvml.SUCCESS
	}
	s := source(t, f, windowFromZero)
	_, err := s.Samples()
	if !errors.Is(err, nvml.ERROR_UNINITIALIZED) || !strings.Contains(err.Error(), gpu0) {
		t.Fatalf("first call: %v; want NVML's uninitialized error naming %s", err, gpu0)
	}
	if f.inits != 1 || f.shuts != 1 {
		t.Errorf("after the error: %d inits, %d shutdowns; want 1, 1", f.inits, f.shuts)
	}
	got, err := s.Samples()
	if err != nil {
		t.Fatal(err)
	}
	if f.inits != 2 {
		t.Errorf("the next call initialized NVML %d times in all, want 2", f.inits)
	}
	samplesEqual(t, got, []Sample{{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 0.25}})
	// Other errors leave NVML initialized.
	f.countReturn = nvml.ERROR_UNKNOWN
	if _, err := s.Samples(); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("count failing: %v, want NVML's error", err)
	}
	if f.inits != 2 || f.shuts != 1 {
		t.Errorf("after an unknown error: %d inits, %d shutdowns; want 2, 1", f.inits, f.shuts)
	}
}

// TestSamplesOneGPUFails: the other GPUs' samples come with an error
// naming the GPU that failed; a GPU without per-process utilisation
// (NOT_SUPPORTED) is no error.
func TestSamplesOneGPUFails(t *testing.T) {
	const gpu2 = "GPU-22222222-2222-2222-2222-222222222222"
	f := &fakeNVML{uuids: []string{gpu0, gpu1, gpu2}}
	f.util = func(uuid string, _ uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		switch uuid {
		case gpu0:
			return nil, nvml.ERROR_GPU_IS_LOST
		case gpu1:
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return []nvml.ProcessUtilizationSample{at(200, 5, 45)}, nvml.SUCCESS
	}
	got, err := source(t, f, windowFromZero).Samples()
	if !errors.Is(err, nvml.ERROR_GPU_IS_LOST) || !strings.Contains(err.Error(), gpu0) || strings.Contains(err.Error(), gpu1) {
		t.Errorf("error %v; want GPU_IS_LOST naming %s only", err, gpu0)
	}
	samplesEqual(t, got, []Sample{{ContainerID: idB, PodUID: uidB, UUID: gpu2, SM: 0.45}})
}

// TestSamplesLoadFails: no library is an error, and the next call looks
// again.
func TestSamplesLoadFails(t *testing.T) {
	loads := 0
	s := newNVML(func() (nvml.Interface, error) {
		loads++
		return nil, errors.New("libnvidia-ml.so.1 not found")
	}, t.TempDir())
	for range 2 {
		if _, err := s.Samples(); err == nil || !strings.Contains(err.Error(), "libnvidia-ml.so.1 not found") {
			t.Errorf("Samples: %v, want the load error", err)
		}
	}
	if loads != 2 {
		t.Errorf("%d loads, want 2", loads)
	}
}
