/* limiter.c: the SM-time quota. */
#ifndef VGPU_LIMITER_H
#define VGPU_LIMITER_H

#include "common.h"

/* Counts the waits still in progress up to now (vgpu_count_throttled), so a
 * long one reaches the region before it ends: the watcher's flush, the exit. */
void vgpu_limiter_count_waits(void);
/* Blocks until a launch of this many thread blocks on dev (limits index idx) may go. */
void vgpu_limiter_charge(int idx, CUdevice dev, uint64_t blocks);

#endif
