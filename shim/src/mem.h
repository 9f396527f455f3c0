/* mem.c: the charge and uncharge steps of the allocation hooks, for those
 * kept in files of their own (legacy.c, pool.c, import.c, footprint.c); the
 * context that owns an allocation. */
#ifndef VGPU_MEM_H
#define VGPU_MEM_H

#include <stdint.h>

#include "common.h"

/* What a charge decided: forward uncounted, counted (bytes reserved:
 * the caller must track them or give them back), or refuse. */
enum { GO_FORWARD, GO_COUNTED, GO_REFUSE };

/* Decides an allocation of bytes on the current context's device; *idx gets
 * its limits index. */
int vgpu_mem_charge_current(uint64_t bytes, int *idx);
/* Decides an allocation of bytes on limits index idx (vgpu_device_index). */
int vgpu_mem_charge_index(int idx, uint64_t bytes);
/* After the driver call: tracks key (kind from track.h) under the current
 * context on success, gives the reservation back on failure; returns rc. */
CUresult vgpu_mem_settle(CUresult rc, int go, int kind, uint64_t key, uint64_t bytes, int idx);
/* Frees key through call(arg) and gives back what it held when that succeeds. */
CUresult vgpu_mem_uncharge(int kind, uint64_t key, CUresult (*call)(void *), void *arg);
/* Bytes an array of w x h x d elements of CUarray_format fmt takes (counted). */
uint64_t vgpu_array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch);
/* The context that owns memory allocated while ctx is current: for the
 * CUcontext of a green context its device's primary context, else ctx. */
CUcontext vgpu_ctx_owner(CUcontext ctx);

#endif
