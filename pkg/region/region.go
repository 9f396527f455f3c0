// Package region reads the usage region of a vGPU container (Contract 5): the
// fixed-size binary file that every process of the container maps and the
// shim library (shim/include/region.h, the one definition of the layout)
// updates under an fcntl OFD lock. This is its Go mirror: `nri-vgpu status`
// and metrics read it without the lock and check what they read, since the
// container can write anything into the file; the host writes the empty
// region a record starts with (Empty) before its container exists.
package region

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FileName is the region file inside the container's region directory.
const FileName = "usage"

// Layout constants; they must equal those of shim/include/region.h (a test
// compares them with the C compiler's view).
const (
	Magic uint64 = 0x3147455255504756 // the bytes "VGPUREG1", little-endian
	// Version is the layout the shim writes, and the newest this package
	// reads. Version 2 gave each device the peak and the throttled time
	// (DeviceUsage.Peak, DeviceUsage.ThrottledNs) in bytes that version 1
	// reserved; nothing moved.
	Version uint32 = 2
	// OldestVersion is the oldest layout the reader accepts: containers
	// started with an earlier shim keep their version 1 region until they
	// end. Usage.HasPeakAndThrottle tells the two apart.
	OldestVersion uint32 = 1
)

// Layout sizes, as in region.h.
const (
	MaxDevices = 16
	MaxProcs   = 1024
	UUIDLen    = 96
)

// The raw layout, field for field as in region.h (little-endian, naturally
// aligned, explicit padding), decoded with encoding/binary.
type rawHeader struct {
	Magic       uint64
	Version     uint32
	HeaderSize  uint32
	Size        uint64
	DeviceCount uint32
	ProcSlots   uint32
	Reserved    [32]byte
}

type rawDevice struct {
	UUID        [UUIDLen]byte
	Limit       uint64
	Used        uint64
	Cores       uint32
	Reserved0   uint32
	Peak        uint64 // version 2; reserved (0) in version 1
	ThrottledNs uint64 // version 2; reserved (0) in version 1
	Reserved    [1]uint64
}

type rawProc struct {
	PID       int32
	HostPID   int32
	StartTime uint64
	Used      [MaxDevices]uint64
	Launches  [MaxDevices]uint64
}

type rawRegion struct {
	Header  rawHeader
	Devices [MaxDevices]rawDevice
	Procs   [MaxProcs]rawProc
}

// Size is the size in bytes of a region file.
const Size = int(unsafe.Sizeof(rawRegion{}))

// Usage is what a container's processes hold, as the region records it.
type Usage struct {
	// Version is the region's layout version, OldestVersion to Version.
	// Only from version 2 on does a DeviceUsage carry Peak and ThrottledNs
	// (see HasPeakAndThrottle).
	Version   uint32
	Devices   []DeviceUsage
	Processes []ProcessUsage
}

// HasPeakAndThrottle reports whether the region records each GPU's peak
// and throttled time (version 2 and later). In a version 1 region, written
// by the shim of an earlier release, DeviceUsage.Peak and
// DeviceUsage.ThrottledNs are 0 because they are not known, and a reader
// must not show or export them.
func (u *Usage) HasPeakAndThrottle() bool {
	return u.Version >= 2
}

// DeviceUsage is one GPU of the container.
type DeviceUsage struct {
	UUID  string
	Limit uint64 // bytes; 0 = no memory limit
	Used  uint64 // bytes held by the whole container
	Cores uint32 // percent of SM time
	// Peak is the most bytes Used has reached since the region was created
	// or last rebuilt by the shim (a rebuild starts it at the rebuilt Used).
	// 0 in a version 1 region (see Usage.HasPeakAndThrottle).
	Peak uint64
	// ThrottledNs is how long, in nanoseconds, launches of the container's
	// processes waited on the SM limiter, summed over processes (each
	// process adds at most its wall time), since the region was created or
	// last rebuilt (a rebuild starts it at 0). It only grows otherwise.
	// 0 in a version 1 region (see Usage.HasPeakAndThrottle).
	ThrottledNs uint64
}

// ProcessUsage is one registered process; Used and Launches are indexed like
// Usage.Devices.
type ProcessUsage struct {
	PID       int32  // in the container's pid namespace
	HostPID   int32  // as NVML reports it (found by the shim at its first context); 0 = unknown
	StartTime uint64 // /proc/<pid>/stat field 22, in clock ticks since boot
	Used      []uint64
	Launches  []uint64
}

// ErrInvalid is wrapped by every error about a file that is not a valid region.
var ErrInvalid = errors.New("invalid usage region")

// readAttempts bounds how often a read is repeated when it caught a writer
// half-way (see ReadUsage).
const readAttempts = 3

// ReadUsage reads the region at path and validates its magic, version and
// size. A file that does not exist returns an error wrapping
// fs.ErrNotExist.
//
// The region is written by the container (it is tenant-writable), and the
// readers (nri-vgpu status, the metrics collector) run as root on the host,
// so the read never waits on the container: it takes no lock (a tenant
// could hold the region's lock for ever), it opens the file without
// following a symlink and without blocking, and anything but a regular file
// is refused (a container cannot make it open a host device or hang on a
// FIFO). An unlocked read may catch a writer between its two stores of an
// update; such a snapshot breaks the invariant that a device's total is the
// sum of its processes', and is read again, up to readAttempts times in
// all. What comes back may still be impossible (forged, or torn every
// time): Check says whether a GPU's counters can be believed.
func ReadUsage(path string) (*Usage, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, fmt.Errorf("reading usage region: %w", err)
	}
	defer f.Close()
	return readUsage(f)
}

// ReadUsageFrom is ReadUsage for a region its caller opened, read-only,
// without following a symbolic link and without blocking, and found to be a
// regular file: the host's readers reach each container's region below
// run_dir that way (internal/hoststate). It is read from offset 0 and never
// locked.
func ReadUsageFrom(f *os.File) (*Usage, error) {
	return readUsage(f)
}

// readAt is the read of readUsage; tests replace it to play a writer caught
// half-way.
var readAt = (*os.File).ReadAt

func readUsage(f *os.File) (*Usage, error) {
	// One byte more than a region, so that a longer file is refused.
	buf := make([]byte, Size+1)
	var u *Usage
	for range readAttempts {
		n, err := readAt(f, buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading usage region %s: %w", f.Name(), err)
		}
		u, err = decode(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name(), err)
		}
		if u.consistent() {
			break
		}
	}
	return u, nil
}

// openRegular opens path read-only if it is a regular file, and fails at
// once otherwise (a symlink, a FIFO, a device, a directory).
func openRegular(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s: %w: is a symbolic link", path, ErrInvalid)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w: not a regular file (%s)", path, ErrInvalid, fi.Mode().Type())
	}
	return f, nil
}

func decode(b []byte) (*Usage, error) {
	if len(b) != Size {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrInvalid, len(b), Size)
	}
	// Only the header, the devices and the process slots in use are
	// decoded: encoding/binary decodes field by field, and decoding all
	// 1024 slots, most of them empty, was most of a metrics scrape.
	const procsOff = int(unsafe.Offsetof(rawRegion{}.Procs))
	const procSize = int(unsafe.Sizeof(rawProc{}))
	var front struct {
		Header  rawHeader
		Devices [MaxDevices]rawDevice
	}
	if _, err := binary.Decode(b[:procsOff], binary.LittleEndian, &front); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	h := front.Header
	switch {
	case h.Magic != Magic:
		return nil, fmt.Errorf("%w: magic %#x, want %#x", ErrInvalid, h.Magic, Magic)
	case h.Version < OldestVersion || h.Version > Version:
		return nil, fmt.Errorf("%w: version %d, this build reads %d to %d", ErrInvalid, h.Version, OldestVersion, Version)
	case h.Size != uint64(Size) || h.HeaderSize != uint32(procsOff):
		return nil, fmt.Errorf("%w: header says size %d / header %d, want %d / %d", ErrInvalid,
			h.Size, h.HeaderSize, Size, procsOff)
	case h.DeviceCount > MaxDevices:
		return nil, fmt.Errorf("%w: %d devices, at most %d", ErrInvalid, h.DeviceCount, MaxDevices)
	case h.ProcSlots != MaxProcs:
		return nil, fmt.Errorf("%w: %d process slots, want %d", ErrInvalid, h.ProcSlots, MaxProcs)
	}
	nd := int(h.DeviceCount)
	u := &Usage{Version: h.Version, Devices: make([]DeviceUsage, nd)}
	for i := range nd {
		d := &front.Devices[i]
		u.Devices[i] = DeviceUsage{UUID: cString(d.UUID[:]), Limit: d.Limit, Used: d.Used, Cores: d.Cores}
		if u.HasPeakAndThrottle() {
			// Version 1 reserved these bytes: whatever they hold there means nothing.
			u.Devices[i].Peak, u.Devices[i].ThrottledNs = d.Peak, d.ThrottledNs
		}
	}
	for i := range MaxProcs {
		slot := b[procsOff+i*procSize : procsOff+(i+1)*procSize]
		if binary.LittleEndian.Uint32(slot) == 0 { // the PID, first field of a slot: 0 = free
			continue
		}
		var p rawProc
		if _, err := binary.Decode(slot, binary.LittleEndian, &p); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		u.Processes = append(u.Processes, ProcessUsage{
			PID:       p.PID,
			HostPID:   p.HostPID,
			StartTime: p.StartTime,
			Used:      append([]uint64(nil), p.Used[:nd]...),
			Launches:  append([]uint64(nil), p.Launches[:nd]...),
		})
	}
	return u, nil
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
