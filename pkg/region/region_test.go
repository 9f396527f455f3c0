package region

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func shimDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "shim")
}

func needGCC(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
}

// The C compiler's view of region.h, as "name value" lines.
const layoutC = `
#include <stddef.h>
#include <stdio.h>
#include "region.h"
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
#define S(t) printf("sizeof." #t " %zu\n", sizeof(struct t))
int main(void) {
	O(vgpu_region_header, magic); O(vgpu_region_header, version); O(vgpu_region_header, header_size);
	O(vgpu_region_header, size); O(vgpu_region_header, device_count); O(vgpu_region_header, proc_slots);
	O(vgpu_region_header, reserved);
	O(vgpu_region_device, uuid); O(vgpu_region_device, limit); O(vgpu_region_device, used);
	O(vgpu_region_device, cores); O(vgpu_region_device, reserved0); O(vgpu_region_device, peak);
	O(vgpu_region_device, throttled_ns); O(vgpu_region_device, reserved);
	O(vgpu_region_proc, pid); O(vgpu_region_proc, host_pid); O(vgpu_region_proc, start_time);
	O(vgpu_region_proc, used); O(vgpu_region_proc, launches);
	O(vgpu_region, hdr); O(vgpu_region, devices); O(vgpu_region, procs);
	S(vgpu_region_header); S(vgpu_region_device); S(vgpu_region_proc); S(vgpu_region);
	printf("const.magic %llu\n", (unsigned long long)VGPU_REGION_MAGIC);
	printf("const.version %u\n", VGPU_REGION_VERSION);
	printf("const.max_devices %d\n", VGPU_MAX_DEVICES);
	printf("const.max_procs %d\n", VGPU_MAX_PROCS);
	printf("const.uuid_len %d\n", VGPU_UUID_LEN);
	printf("const.file %s\n", VGPU_REGION_FILE);
	return 0;
}
`

func TestLayoutMatchesC(t *testing.T) {
	needGCC(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(src, []byte(layoutC), 0o644); err != nil {
		t.Fatal(err)
	}
	inc := filepath.Join(shimDir(t), "include")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I", inc, "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("compiling the layout probe: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("running the layout probe: %v", err)
	}
	c := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		c[k] = v
	}

	var (
		h rawHeader
		d rawDevice
		p rawProc
		r rawRegion
	)
	goView := map[string]uintptr{
		"vgpu_region_header.magic":        unsafe.Offsetof(h.Magic),
		"vgpu_region_header.version":      unsafe.Offsetof(h.Version),
		"vgpu_region_header.header_size":  unsafe.Offsetof(h.HeaderSize),
		"vgpu_region_header.size":         unsafe.Offsetof(h.Size),
		"vgpu_region_header.device_count": unsafe.Offsetof(h.DeviceCount),
		"vgpu_region_header.proc_slots":   unsafe.Offsetof(h.ProcSlots),
		"vgpu_region_header.reserved":     unsafe.Offsetof(h.Reserved),
		"vgpu_region_device.uuid":         unsafe.Offsetof(d.UUID),
		"vgpu_region_device.limit":        unsafe.Offsetof(d.Limit),
		"vgpu_region_device.used":         unsafe.Offsetof(d.Used),
		"vgpu_region_device.cores":        unsafe.Offsetof(d.Cores),
		"vgpu_region_device.reserved0":    unsafe.Offsetof(d.Reserved0),
		"vgpu_region_device.peak":         unsafe.Offsetof(d.Peak),
		"vgpu_region_device.throttled_ns": unsafe.Offsetof(d.ThrottledNs),
		"vgpu_region_device.reserved":     unsafe.Offsetof(d.Reserved),
		"vgpu_region_proc.pid":            unsafe.Offsetof(p.PID),
		"vgpu_region_proc.host_pid":       unsafe.Offsetof(p.HostPID),
		"vgpu_region_proc.start_time":     unsafe.Offsetof(p.StartTime),
		"vgpu_region_proc.used":           unsafe.Offsetof(p.Used),
		"vgpu_region_proc.launches":       unsafe.Offsetof(p.Launches),
		"vgpu_region.hdr":                 unsafe.Offsetof(r.Header),
		"vgpu_region.devices":             unsafe.Offsetof(r.Devices),
		"vgpu_region.procs":               unsafe.Offsetof(r.Procs),
		"sizeof.vgpu_region_header":       unsafe.Sizeof(h),
		"sizeof.vgpu_region_device":       unsafe.Sizeof(d),
		"sizeof.vgpu_region_proc":         unsafe.Sizeof(p),
		"sizeof.vgpu_region":              unsafe.Sizeof(r),
		"const.max_devices":               MaxDevices,
		"const.max_procs":                 MaxProcs,
		"const.uuid_len":                  UUIDLen,
	}
	for name, want := range goView {
		got, ok := c[name]
		if !ok {
			t.Errorf("%s: missing from the C probe", name)
			continue
		}
		if got != strconv.FormatUint(uint64(want), 10) {
			t.Errorf("%s: C says %s, Go says %d", name, got, want)
		}
	}
	if got := c["const.magic"]; got != strconv.FormatUint(Magic, 10) {
		t.Errorf("magic: C says %s, Go says %d", got, Magic)
	}
	if got := c["const.version"]; got != strconv.FormatUint(uint64(Version), 10) {
		t.Errorf("version: C says %s, Go says %d", got, Version)
	}
	if got := c["const.file"]; got != FileName {
		t.Errorf("file name: C says %s, Go says %s", got, FileName)
	}
	// encoding/binary must see the same size as the C compiler (no implicit padding).
	if got := binary.Size(rawRegion{}); got != Size {
		t.Errorf("binary.Size = %d, unsafe.Sizeof = %d: implicit padding in the Go mirror", got, Size)
	}
}

// validRegion builds a region image the way the shim initialises one.
func validRegion(t *testing.T) *rawRegion {
	t.Helper()
	r := &rawRegion{}
	r.Header = rawHeader{Magic: Magic, Version: Version, HeaderSize: uint32(unsafe.Offsetof(r.Procs)),
		Size: uint64(Size), DeviceCount: 1, ProcSlots: MaxProcs}
	copy(r.Devices[0].UUID[:], "GPU-1")
	r.Devices[0].Limit = 100
	r.Devices[0].Used = 40
	r.Devices[0].Cores = 50
	r.Devices[0].Peak = 60
	r.Devices[0].ThrottledNs = 5_000_000_000
	r.Procs[7] = rawProc{PID: 42, HostPID: 4242, StartTime: 9}
	r.Procs[7].Used[0] = 40
	r.Procs[7].Launches[0] = 3
	return r
}

func writeRegion(t *testing.T, r *rawRegion, trim int) string {
	t.Helper()
	var b bytes.Buffer
	if err := binary.Write(&b, binary.LittleEndian, r); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, b.Bytes()[:b.Len()-trim], 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadUsage(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(r *rawRegion)
		trim    int
		wantErr string
	}{
		{name: "valid"},
		{name: "bad magic", mutate: func(r *rawRegion) { r.Header.Magic = 1 }, wantErr: "magic"},
		{name: "newer version", mutate: func(r *rawRegion) { r.Header.Version = 3 }, wantErr: "version 3"},
		{name: "version 0", mutate: func(r *rawRegion) { r.Header.Version = 0 }, wantErr: "version 0"},
		{name: "wrong size field", mutate: func(r *rawRegion) { r.Header.Size = 12 }, wantErr: "header says size"},
		{name: "too many devices", mutate: func(r *rawRegion) { r.Header.DeviceCount = 17 }, wantErr: "17 devices"},
		{name: "wrong slot count", mutate: func(r *rawRegion) { r.Header.ProcSlots = 5 }, wantErr: "5 process slots"},
		{name: "short file", trim: 1, wantErr: "bytes, want"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRegion(t)
			if tt.mutate != nil {
				tt.mutate(r)
			}
			u, err := ReadUsage(writeRegion(t, r, tt.trim))
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%+v", Usage{Version: 2,
				Devices:   []DeviceUsage{{UUID: "GPU-1", Limit: 100, Used: 40, Cores: 50, Peak: 60, ThrottledNs: 5_000_000_000}},
				Processes: []ProcessUsage{{PID: 42, HostPID: 4242, StartTime: 9, Used: []uint64{40}, Launches: []uint64{3}}}})
			if got := fmt.Sprintf("%+v", *u); got != want {
				t.Errorf("got %s\nwant %s", got, want)
			}
		})
	}
	if _, err := ReadUsage(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent file: err = %v, want os.ErrNotExist", err)
	}
}

// handBuilt lays a region out byte by byte at the offsets region.h gives
// (written out here, not taken from the Go mirror): one device "GPU-7" with
// a limit of 1000, 300 bytes used, 40 % cores, and in its version 2 fields
// (which version 1 reserved) a peak of 700 and 9 s throttled; one process,
// pid 5, in slot 2, holding the 300 bytes after 11 launches.
func handBuilt(version uint32) []byte {
	b := make([]byte, 280896)
	le := binary.LittleEndian
	le.PutUint64(b[0:], 0x3147455255504756)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[12:], 2368) // header_size: 64 + 16*144
	le.PutUint64(b[16:], 280896)
	le.PutUint32(b[24:], 1) // device_count
	le.PutUint32(b[28:], 1024)
	copy(b[64:], "GPU-7")
	le.PutUint64(b[64+96:], 1000)           // limit
	le.PutUint64(b[64+104:], 300)           // used
	le.PutUint32(b[64+112:], 40)            // cores
	le.PutUint64(b[64+120:], 700)           // peak
	le.PutUint64(b[64+128:], 9_000_000_000) // throttled_ns
	slot := 2368 + 2*272
	le.PutUint32(b[slot:], 5)
	le.PutUint32(b[slot+4:], 1005)
	le.PutUint64(b[slot+8:], 77)
	le.PutUint64(b[slot+16:], 300) // used[0]
	le.PutUint64(b[slot+144:], 11) // launches[0]
	return b
}

// Both versions of the layout are read; version 1's reserved bytes, where
// version 2 keeps the peak and the throttled time, are not.
func TestReadUsageVersions(t *testing.T) {
	for _, tc := range []struct {
		version          uint32
		peak, throttled  uint64
		peakAndThrottled bool
	}{
		{version: 1, peak: 0, throttled: 0, peakAndThrottled: false},
		{version: 2, peak: 700, throttled: 9_000_000_000, peakAndThrottled: true},
	} {
		t.Run(fmt.Sprintf("version %d", tc.version), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			if err := os.WriteFile(path, handBuilt(tc.version), 0o644); err != nil {
				t.Fatal(err)
			}
			u, err := ReadUsage(path)
			if err != nil {
				t.Fatal(err)
			}
			if u.Version != tc.version || u.HasPeakAndThrottle() != tc.peakAndThrottled {
				t.Errorf("version %d, HasPeakAndThrottle %v; want %d, %v", u.Version, u.HasPeakAndThrottle(), tc.version, tc.peakAndThrottled)
			}
			want := DeviceUsage{UUID: "GPU-7", Limit: 1000, Used: 300, Cores: 40, Peak: tc.peak, ThrottledNs: tc.throttled}
			if len(u.Devices) != 1 || u.Devices[0] != want {
				t.Errorf("devices = %+v, want [%+v]", u.Devices, want)
			}
			if len(u.Processes) != 1 || u.Processes[0].PID != 5 || u.Processes[0].HostPID != 1005 ||
				u.Processes[0].Used[0] != 300 || u.Processes[0].Launches[0] != 11 {
				t.Errorf("processes = %+v, want pid 5 (host 1005) holding 300 bytes after 11 launches", u.Processes)
			}
			if err := u.Check("GPU-7", 1000); err != nil {
				t.Errorf("Check: %v", err)
			}
		})
	}
}

// TestReadsTheShimsRegion runs the real shim against the fake driver and reads
// what it wrote while the process holds memory. In a simulated pid namespace
// (the fake NVML reports pid+offset) the shim must still record the pid NVML
// reports as the process's host pid.
func TestReadsTheShimsRegion(t *testing.T) {
	needGCC(t)
	if _, err := os.Stat("/run/nri-vgpu/limits"); err == nil {
		t.Skip("/run/nri-vgpu/limits exists: the shim would ignore the test's overrides")
	}
	shim := shimDir(t)
	if out, err := exec.Command("make", "-s", "-C", shim).CombinedOutput(); err != nil {
		t.Fatalf("building the shim: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name   string
		offset int32 // FAKECUDA_PIDNS_OFFSET: what NVML adds to every pid
	}{
		{"host pid namespace", 0},
		{"own pid namespace", 1000000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			readShimRegion(t, filepath.Join(shim, "build"), tc.offset)
		})
	}
}

func readShimRegion(t *testing.T, build string, offset int32) {
	dir := t.TempDir()
	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	limits := fmt.Sprintf("version=1\ngpu.0.uuid=%s\ngpu.0.memory=%d\ngpu.0.cores=100\n", uuid, 1<<30)
	if err := os.WriteFile(filepath.Join(dir, "limits"), []byte(limits), 0o644); err != nil {
		t.Fatal(err)
	}
	regionDir := filepath.Join(dir, "region")
	if err := os.Mkdir(regionDir, 0o755); err != nil {
		t.Fatal(err)
	}
	held, release := filepath.Join(dir, "held"), filepath.Join(dir, "release")
	cmd := exec.Command(filepath.Join(build, "cudaprog"), "init", "alloc:100MiB", "alloc:28MiB", "launch:3",
		"touch:"+held, "waitfile:"+release)
	cmd.Env = append(os.Environ(),
		"LD_PRELOAD="+filepath.Join(build, "libvgpu-shim.so"),
		"LD_LIBRARY_PATH="+filepath.Join(build, "fake"),
		"NRI_VGPU_LIMITS="+filepath.Join(dir, "limits"),
		"NRI_VGPU_REGION_DIR="+regionDir,
		"FAKECUDA_STATE="+dir,
		"FAKECUDA_DEVICES="+uuid+":16GiB:132",
		"FAKECUDA_KERNEL_US=10",
		"FAKECUDA_PIDNS_OFFSET="+strconv.Itoa(int(offset)),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = os.WriteFile(release, nil, 0o644)
		if err := cmd.Wait(); err != nil {
			t.Errorf("cudaprog: %v\n%s", err, stderr.String())
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cudaprog did not get to its allocations; stderr:\n%s", stderr.String())
		}
	}

	u, err := ReadUsage(filepath.Join(regionDir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	const want = 128 << 20
	if len(u.Devices) != 1 || u.Devices[0].UUID != uuid || u.Devices[0].Limit != 1<<30 || u.Devices[0].Used != want {
		t.Errorf("devices = %+v, want one %s with limit 1GiB and used 128MiB", u.Devices, uuid)
	}
	// Version 2: the peak is what is held (nothing was freed), nothing waited at cores=100.
	if !u.HasPeakAndThrottle() || len(u.Devices) != 1 || u.Devices[0].Peak != want || u.Devices[0].ThrottledNs != 0 {
		t.Errorf("version %d, devices = %+v; want version 2 with a peak of 128MiB and 0 ns throttled", u.Version, u.Devices)
	}
	if err := u.Check(uuid, 1<<30); err != nil {
		t.Errorf("Check of the shim's region: %v", err)
	}
	pid := int32(cmd.Process.Pid)
	if len(u.Processes) != 1 || u.Processes[0].PID != pid || u.Processes[0].Used[0] != want ||
		u.Processes[0].StartTime == 0 || u.Processes[0].HostPID != pid+offset {
		t.Errorf("processes = %+v, want pid %d (host pid %d) holding 128MiB", u.Processes, pid, pid+offset)
	}
}

// TestReadUsageRefusesWhatAContainerCanPlant: the region directory is
// writable from the container, the readers run as root on the host.
func TestReadUsageRefusesWhatAContainerCanPlant(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, link, sub, "/dev/null"} {
		done := make(chan error, 1)
		go func() { _, err := ReadUsage(path); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("ReadUsage(%s) = %v, want an error wrapping ErrInvalid", path, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("ReadUsage(%s) blocked", path)
		}
	}
	if _, err := ReadUsage(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadUsage(missing) = %v, want an error wrapping os.ErrNotExist", err)
	}
}
