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
	got, err := source(t, f, time.Unix(1000, 0)).Samples()
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
	got, err := source(t, f, time.Unix(1000, 0)).Samples()
	if err != nil {
		t.Fatal(err)
	}
	samplesEqual(t, got, []Sample{
		{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 1},
		{ContainerID: idB, PodUID: uidB, UUID: gpu0, SM: 0.1},
	})
}

// TestSamplesWindow: the first call asks for the last FirstWindow (in
// microseconds of the clock), each later one for what is newer than the
// newest sample it handed out; a sample at that instant, which NVML hands
// out again, is not counted twice.
func TestSamplesWindow(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	calls := 0
	f := &fakeNVML{uuids: []string{gpu0}}
	f.util = func(_ string, since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		calls++
		switch calls {
		case 1:
			return []nvml.ProcessUtilizationSample{at(100, 5000, 10), at(200, 7000, 30)}, nvml.SUCCESS
		case 2:
			return []nvml.ProcessUtilizationSample{at(200, 7000, 30), at(100, 8000, 60)}, nvml.SUCCESS
		default:
			return nil, nvml.ERROR_NOT_FOUND
		}
	}
	s := source(t, f, now)
	first, err := s.Samples()
	if err != nil {
		t.Fatal(err)
	}
	samplesEqual(t, first, []Sample{
		{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 0.1},
		{ContainerID: idB, PodUID: uidB, UUID: gpu0, SM: 0.3},
	})
	second, err := s.Samples()
	if err != nil {
		t.Fatal(err)
	}
	samplesEqual(t, second, []Sample{{ContainerID: idA, PodUID: uid, UUID: gpu0, SM: 0.6}})
	third, err := s.Samples()
	if err != nil || len(third) != 0 {
		t.Fatalf("third call: %+v, %v; want nothing", third, err)
	}
	want := []uint64{1_000_000*1_000_000 - 10*1_000_000, 7000, 8000}
	if got := f.since[gpu0]; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("lastSeenTimeStamp of the calls = %v, want %v", got, want)
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
	s := source(t, f, time.Unix(1000, 0))
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
	got, err := source(t, f, time.Unix(1000, 0)).Samples()
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
