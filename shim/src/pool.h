/* Stream-ordered memory pools: what they reserve is what they cost (pool.c). */
#ifndef VGPU_POOL_H
#define VGPU_POOL_H

#include <stdint.h>

#include "common.h"

/* An allocation from a pool between its charge and the driver's answer. */
struct vgpu_pool_op {
	int go;        /* GO_FORWARD, GO_COUNTED or GO_REFUSE (mem.h) */
	int slot;      /* the pool's entry; -1: counted per allocation */
	int idx;       /* limits index charged */
	uint64_t bytes;
	uint64_t need; /* growth reserved ahead of the driver */
};

/* A pool allocation being freed. */
struct vgpu_pool_free {
	CUdeviceptr p;
	uint64_t bytes;
	int slot, idx;
};

/* Decides an allocation of bytes from pool (NULL: the current pool of the
 * stream's device, as cuMemAllocAsync) on stream s; returns op->go. */
int vgpu_pool_charge(CUmemoryPool pool, CUstream s, uint64_t bytes, struct vgpu_pool_op *op);
/* After the driver call: records *dptr on success; returns rc. */
CUresult vgpu_pool_settle(CUresult rc, struct vgpu_pool_op *op, CUdeviceptr *dptr);
/* Before a free of p: 1 (and *f) when p came from a pool, forgotten until vgpu_pool_free_end. */
int vgpu_pool_free_begin(CUdeviceptr p, struct vgpu_pool_free *f);
/* After the driver's free: the charge follows the pool; returns rc. */
CUresult vgpu_pool_free_end(CUresult rc, const struct vgpu_pool_free *f);
/* Over the quota on idx: trims the pools there to what they have in use;
 * 1 when that gave memory back (worth trying again). */
int vgpu_pool_reclaim(int idx);
/* Re-reads what every charged pool reserves (after a synchronisation). */
void vgpu_pool_sync(void);
/* Context ctx is gone (destroyed, released for the last time, reset): its
 * pool allocations went with it; every pool is read again. */
void vgpu_pool_ctx_gone(CUcontext ctx);
/* Limits index and ordinal of the device stream s belongs to. */
int vgpu_stream_index(CUstream s, CUdevice *dev);

#endif
