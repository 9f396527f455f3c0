/* footprint.c: the driver's own memory for this process (the context footprint). */
#ifndef VGPU_FOOTPRINT_H
#define VGPU_FOOTPRINT_H

#include "common.h"

/* What a new context is charged as its own memory when NVML cannot measure it
 * (footprint.c says why this much). */
#define VGPU_FP_BOUND (1024ull << 20)

/* A context was created on dev: measures its footprint and counts it under ctx.
 * Returns 1 when that grew the count and the container is now past its limit
 * on dev (the caller undoes the creation), else 0. */
int vgpu_fp_ctx_created(CUcontext ctx, CUdevice dev);
/* ctx was destroyed (or its primary context released or reset): gives back its footprint. */
void vgpu_fp_ctx_gone(CUcontext ctx);
/* After a call that may have changed the footprint (module load, set-limit): measures now. */
void vgpu_fp_changed(void);
/* Marks the footprint for measuring at the next counted allocation (a function lookup). */
void vgpu_fp_mark(void);
/* The allocation path: measures when marked or a second after the last measure; else
 * two relaxed loads and a coarse clock read, no lock. */
void vgpu_fp_poll(void);
/* The limiter's watcher, once a period (n counts them): measures every 25th. */
void vgpu_fp_watch(unsigned n);
/* cuCtxSetLimit while the host pid is unknown (no measure possible): the growth the
 * requested value implies, reserved before the call; settled after it. */
struct vgpu_fp_limit {
	CUcontext ctx;
	int idx, which;
	int64_t delta; /* bytes reserved (> 0) or to give back (< 0) once the call succeeds */
};
/* 0 (l filled, maybe with nothing to do), or -1: the growth does not fit the quota (said). */
int vgpu_fp_limit_charge(CUlimit limit, size_t value, struct vgpu_fp_limit *l);
void vgpu_fp_limit_settle(CUresult rc, const struct vgpu_fp_limit *l);

#endif
