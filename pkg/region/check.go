package region

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrSuspect is wrapped by Check's errors: the region's counters for a GPU
// cannot be true, so they are not to be shown or exported as usage.
var ErrSuspect = errors.New("usage region counters are impossible")

const (
	// MaxPlausibleMemory bounds the memory in use of a container without a
	// memory limit. The GPU's own total is no bound: managed memory, which
	// the shim counts, can oversubscribe a GPU into host memory. No machine
	// comes near a pebibyte.
	MaxPlausibleMemory uint64 = 1 << 50
	// MaxPlausibleLaunches bounds a process's kernel launch counter: a
	// million launches a second for a century stays below it, and it is the
	// largest count a float64 sample holds exactly.
	MaxPlausibleLaunches uint64 = 1 << 53
	// ContextAllowance is how far past the limit one process's memory may
	// legitimately take a container: the shim counts a context's own
	// footprint after the driver created it, even past the quota (a few
	// hundred MiB on current GPUs, per context).
	ContextAllowance uint64 = 1 << 30
	// MaxPlausibleThrottledNs bounds a GPU's throttled time (version 2's
	// throttled_ns): 2^62 ns, about 146 years. Each process adds at most
	// the wall time during which it had a launch waiting on the SM limiter,
	// so the counter grows at most as fast as the wall clock times the
	// number of processes: 146 years of one process, or more than two years
	// of 64 processes throttled without a pause. The tighter "a century
	// times MaxProcs" does not fit in 64 bits; the bound stays below 2^63,
	// so the counter is never read as a negative int64, and keeps a factor
	// of four below the wrap of a uint64.
	MaxPlausibleThrottledNs uint64 = 1 << 62
)

// consistent reports whether every device's total equals the sum of its
// processes' slots and (version 2) is not above the device's peak, the
// invariants every update of the shim keeps under the lock (it raises the
// peak before the total). A read without the lock that caught a writer
// half-way breaks them.
func (u *Usage) consistent() bool {
	for i, d := range u.Devices {
		if problem := u.sumProblem(i); problem != "" {
			return false
		}
		if u.HasPeakAndThrottle() && d.Peak < d.Used {
			return false
		}
	}
	return true
}

// sumProblem says how device i's total disagrees with its processes' slots,
// or "" when it does not.
func (u *Usage) sumProblem(i int) string {
	var sum uint64
	for _, p := range u.Processes {
		if i >= len(p.Used) {
			continue
		}
		var carry uint64
		sum, carry = bits.Add64(sum, p.Used[i], 0)
		if carry != 0 {
			return "the processes' bytes overflow 64 bits"
		}
	}
	used := u.Devices[i].Used
	if used == sum {
		return ""
	}
	// With every slot taken, the shim accounts a further process in the
	// total without a slot of its own: the total may exceed the slots.
	if len(u.Processes) >= MaxProcs && used > sum {
		return ""
	}
	return fmt.Sprintf("the GPU's total %d bytes is not the sum %d bytes of its processes", used, sum)
}

// Check reports whether the region's counters for GPU uuid can be believed,
// given the container's memory limit on it from its limits file
// (host-written, read-only in the container; 0 = no limit). It returns nil
// when they can, or an error wrapping ErrSuspect that names what is
// impossible: the GPU missing from the region or listed twice, a total that
// is not the sum of the processes' slots, more memory in use than the limit
// plus ContextAllowance per process holding memory on the GPU (without a
// limit: more than MaxPlausibleMemory), or a launch counter beyond
// MaxPlausibleLaunches. In a version 2 region also: a peak below the memory
// in use, a peak beyond what the limit allows with every process slot
// holding memory (without a limit: beyond MaxPlausibleMemory), or a
// throttled time beyond MaxPlausibleThrottledNs. Values the container
// forges within those bounds (such as 0 everywhere) cannot be told from
// real ones.
func (u *Usage) Check(uuid string, limit uint64) error {
	i, n := -1, 0
	for j, d := range u.Devices {
		if d.UUID == uuid {
			if i < 0 {
				i = j
			}
			n++
		}
	}
	suspect := func(format string, args ...any) error {
		return fmt.Errorf("GPU %s: %w: %s", uuid, ErrSuspect, fmt.Sprintf(format, args...))
	}
	switch {
	case n == 0:
		return suspect("the GPU is missing from the region")
	case n > 1:
		return suspect("the GPU is listed %d times", n)
	}
	if problem := u.sumProblem(i); problem != "" {
		return suspect("%s", problem)
	}
	var holders uint64
	for _, p := range u.Processes {
		if i < len(p.Used) && p.Used[i] > 0 {
			holders++
		}
		if i < len(p.Launches) && p.Launches[i] > MaxPlausibleLaunches {
			return suspect("process %d counts %d kernel launches", p.PID, p.Launches[i])
		}
	}
	d := u.Devices[i]
	if limit == 0 {
		if d.Used > MaxPlausibleMemory {
			return suspect("%d bytes in use, more than any machine has", d.Used)
		}
	} else if allowed, carry := bits.Add64(limit, holders*ContextAllowance, 0); carry == 0 && d.Used > allowed {
		// holders ≤ MaxProcs and ContextAllowance = 2^30: the product fits.
		return suspect("%d bytes in use, more than the limit of %d bytes allows (with the contexts of %d processes)", d.Used, limit, holders)
	}
	if !u.HasPeakAndThrottle() {
		return nil
	}
	if d.Peak < d.Used {
		return suspect("a peak of %d bytes, below the %d bytes in use", d.Peak, d.Used)
	}
	// The peak may have been reached by processes that have left since, so
	// the processes holding memory now do not bound it: every slot may have
	// held memory then, each with a context counted past the limit.
	if limit == 0 {
		if d.Peak > MaxPlausibleMemory {
			return suspect("a peak of %d bytes, more than any machine has", d.Peak)
		}
	} else if allowed, carry := bits.Add64(limit, MaxProcs*ContextAllowance, 0); carry == 0 && d.Peak > allowed {
		return suspect("a peak of %d bytes, more than the limit of %d bytes allows (with the contexts of %d processes)", d.Peak, limit, MaxProcs)
	}
	if d.ThrottledNs > MaxPlausibleThrottledNs {
		return suspect("%d ns throttled, more than %d ns (146 years)", d.ThrottledNs, MaxPlausibleThrottledNs)
	}
	return nil
}
