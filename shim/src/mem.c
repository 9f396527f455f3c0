/*
 * Memory quota: every counted allocation is charged its size against the
 * quota (quota.c, decided from the ledger) *before* the driver is called and
 * gives it back if the driver fails, so two processes can never both pass
 * the limit. Over
 * the quota the caller gets CUDA_ERROR_OUT_OF_MEMORY, which every framework
 * handles (a -1 would not be), and one log line.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "footprint.h"
#include "graph.h"
#include "hostpid.h"
#include "import.h"
#include "lifecycle.h"
#include "log.h"
#include "mem.h"
#include "pool.h"
#include "quota.h"
#include "real.h"
#include "track.h"

/* ---- charge --------------------------------------------------------------------- */

static void over_quota(int idx, uint64_t bytes)
{
	LOGW("GPU memory quota exceeded on %s: %llu bytes requested, %llu of %llu in use by the container",
	     vgpu.limits.gpu[idx].uuid, (unsigned long long)bytes, (unsigned long long)vgpu_quota_used(idx),
	     (unsigned long long)vgpu.limits.gpu[idx].memory);
}

/* Charges bytes on idx for an allocation of asked bytes: 0, or -1 after
 * saying why (an unrecorded charge is reported once, where it failed). */
static int charge_or_reclaim(int idx, uint64_t bytes, uint64_t asked)
{
	int rc = vgpu_quota_charge(idx, bytes);
	/* Stream-ordered pools may hold freed memory for reuse: they give it
	 * back before anything is refused (pool.c). */
	if (rc == VGPU_OVER_QUOTA && vgpu_pool_reclaim(idx))
		rc = vgpu_quota_charge(idx, bytes);
	if (rc == VGPU_OVER_QUOTA)
		over_quota(idx, asked);
	return rc == 0 ? 0 : -1;
}

/*
 * Decides an allocation of bytes on limits index idx (from
 * vgpu_current_index or vgpu_device_index). On GO_COUNTED the bytes are
 * reserved and the caller must track or give them back.
 */
static int admit_index(int idx, uint64_t bytes)
{
	if (vgpu.mode == VGPU_PASSTHROUGH)
		return GO_FORWARD;
	if (vgpu.mode == VGPU_FAIL_CLOSED)
		return GO_REFUSE; /* reported once, when the limits file was read */
	if (idx == -2)
		return GO_FORWARD; /* no current context: the driver returns its own error */
	if (idx < 0) {
		LOGW("allocation refused: the device is not among the container's GPUs");
		return GO_REFUSE;
	}
	vgpu_fp_poll(); /* footprint growth since the last measure, if one is due */
	return charge_or_reclaim(idx, bytes, bytes) == 0 ? GO_COUNTED : GO_REFUSE;
}

int vgpu_mem_charge_current(uint64_t bytes, int *idx)
{
	vgpu_init();
	*idx = vgpu.mode == VGPU_ENFORCE ? vgpu_current_index(NULL) : -1;
	return admit_index(*idx, bytes);
}

/* The context whose end frees what is allocated now (a green context's memory is its primary's). */
static CUcontext current_ctx(void)
{
	CUcontext c = NULL;
	vgpu_cu_ctx_get_current(&c);
	return vgpu_ctx_owner(c);
}

/* After the driver call: track on success (under ctx, the context whose
 * destruction frees the memory), give back on failure. */
static CUresult settle_in(CUresult rc, int go, int kind, uint64_t key, uint64_t bytes, int idx, CUcontext ctx)
{
	if (go != GO_COUNTED)
		return rc;
	if (rc != CUDA_SUCCESS || vgpu_track_add(kind, key, bytes, idx, ctx) != 0)
		vgpu_quota_uncharge(idx, bytes);
	return rc;
}

CUresult vgpu_mem_settle(CUresult rc, int go, int kind, uint64_t key, uint64_t bytes, int idx)
{
	return settle_in(rc, go, kind, key, bytes, idx, go == GO_COUNTED ? current_ctx() : NULL);
}

/* Gives back what a successful free/release/destroy of key released. */
CUresult vgpu_mem_uncharge(int kind, uint64_t key, CUresult (*call)(void *), void *arg)
{
	struct vgpu_tracked t;
	/* Untrack first: once the driver has freed the address, another thread may
	 * get it back from a new allocation and track it. */
	int had = vgpu_track_take(kind, key, &t) == 0;
	/* Not an allocation of ours: perhaps a pool pointer imported from
	 * another process (import.c), which cuMemFree[Async] frees too. */
	if (!had && kind == TRACK_PTR && vgpu_track_take(TRACK_POOL_IMPORT, key, &t) == 0) {
		had = 1;
		kind = TRACK_POOL_IMPORT;
	}
	CUresult rc = call(arg);
	if (had) {
		if (rc == CUDA_SUCCESS)
			vgpu_quota_uncharge(t.idx, t.bytes);
		else
			vgpu_track_add(kind, key, t.bytes, t.idx, t.ctx);
	}
	return rc;
}

#define REFUSED CUDA_ERROR_OUT_OF_MEMORY

/* ---- linear allocations ---------------------------------------------------------- */

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemAlloc_v2)(dptr, bytes);
	return vgpu_mem_settle(rc, go, TRACK_PTR, dptr ? *dptr : 0, bytes, idx);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags)
{
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemAllocManaged)(dptr, bytes, flags);
	return vgpu_mem_settle(rc, go, TRACK_PTR, dptr ? *dptr : 0, bytes, idx);
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
					unsigned elem)
{
	/* Reserve a bound first (pitch alignment is at most 512 bytes on every
	 * GPU we know of), then settle on the real pitch × height. */
	uint64_t est = ((uint64_t)width + 511) / 512 * 512 * height;
	int idx, go = vgpu_mem_charge_current(est, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemAllocPitch_v2)(dptr, pitch, width, height, elem);
	if (go != GO_COUNTED)
		return rc;
	if (rc != CUDA_SUCCESS) {
		vgpu_quota_uncharge(idx, est);
		return rc;
	}
	uint64_t real = (uint64_t)*pitch * height;
	if (real > est) {
		if (charge_or_reclaim(idx, real - est, real) != 0) {
			vgpu_quota_uncharge(idx, est);
			NEXT(cuMemFree_v2)(*dptr);
			*dptr = 0;
			return REFUSED;
		}
	} else {
		vgpu_quota_uncharge(idx, est - real);
	}
	return vgpu_mem_settle(rc, go, TRACK_PTR, *dptr, real, idx);
}

/* Stream-ordered allocations: what their pool reserves counts, on the
 * device the pool lives on (pool.c).
 *
 * While the stream captures, an allocation or a free is a node of the graph
 * being captured: no memory moves until the graph is uploaded or launched,
 * where graph.c counts it (so a graph may be captured that would not fit;
 * its launch is refused). A captured free of cuMemAlloc memory is left
 * counted: whatever it frees, it frees when (and if) the graph runs, which
 * the shim cannot see; an overcount until the context goes, never an escape.
 * (A pool's memory is counted by what the pool holds, read back.) */
VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	if (vgpu_graph_capturing(s, 0))
		return NEXT(cuMemAllocAsync)(dptr, bytes, s);
	struct vgpu_pool_op op;
	if (vgpu_pool_charge(NULL, s, bytes, &op) == GO_REFUSE)
		return REFUSED;
	return vgpu_pool_settle(NEXT(cuMemAllocAsync)(dptr, bytes, s), &op, dptr);
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
	if (vgpu_graph_capturing(s, 1))
		return NEXT(cuMemAllocAsync_ptsz)(dptr, bytes, s);
	struct vgpu_pool_op op;
	if (vgpu_pool_charge(NULL, s, bytes, &op) == GO_REFUSE)
		return REFUSED;
	return vgpu_pool_settle(NEXT(cuMemAllocAsync_ptsz)(dptr, bytes, s), &op, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
	if (vgpu_graph_capturing(s, 0))
		return NEXT(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s);
	struct vgpu_pool_op op;
	if (vgpu_pool_charge(pool, s, bytes, &op) == GO_REFUSE)
		return REFUSED;
	return vgpu_pool_settle(NEXT(cuMemAllocFromPoolAsync)(dptr, bytes, pool, s), &op, dptr);
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
						  CUstream s)
{
	if (vgpu_graph_capturing(s, 1))
		return NEXT(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s);
	struct vgpu_pool_op op;
	if (vgpu_pool_charge(pool, s, bytes, &op) == GO_REFUSE)
		return REFUSED;
	return vgpu_pool_settle(NEXT(cuMemAllocFromPoolAsync_ptsz)(dptr, bytes, pool, s), &op, dptr);
}

struct free_args {
	CUdeviceptr p;
	CUstream s;
	int ptsz;
};

static CUresult do_free(void *a)
{
	return NEXT(cuMemFree_v2)(((struct free_args *)a)->p);
}

static CUresult do_free_async(void *a)
{
	struct free_args *f = a;
	return f->ptsz ? NEXT(cuMemFreeAsync_ptsz)(f->p, f->s) : NEXT(cuMemFreeAsync)(f->p, f->s);
}

/* A pointer from a pool goes back to its pool (pool.c); any other is given back. */
static CUresult release_ptr(CUdeviceptr p, CUresult (*call)(void *), void *arg)
{
	struct vgpu_pool_free f;
	if (vgpu_pool_free_begin(p, &f))
		return vgpu_pool_free_end(call(arg), &f);
	return vgpu_mem_uncharge(TRACK_PTR, p, call, arg);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	struct free_args a = {p, NULL, 0};
	return release_ptr(p, do_free, &a);
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
	if (vgpu_graph_capturing(s, 0))
		return NEXT(cuMemFreeAsync)(p, s);
	struct free_args a = {p, s, 0};
	return release_ptr(p, do_free_async, &a);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
	if (vgpu_graph_capturing(s, 1))
		return NEXT(cuMemFreeAsync_ptsz)(p, s);
	struct free_args a = {p, s, 1};
	return release_ptr(p, do_free_async, &a);
}

/* ---- virtual memory management (PyTorch expandable segments, vLLM, llama.cpp) ---- */

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes, const CUmemAllocationProp *prop,
				 unsigned long long flags)
{
	vgpu_init();
	/* Host (and host-NUMA) locations are not GPU memory: not ours to count. */
	if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return NEXT(cuMemCreate)(h, bytes, prop, flags);
	int idx = vgpu.mode == VGPU_ENFORCE ? vgpu_device_index(prop->location.id) : -1;
	int go = admit_index(idx, bytes);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemCreate)(h, bytes, prop, flags);
	return vgpu_mem_settle(rc, go, TRACK_HANDLE, h ? *h : 0, bytes, idx);
}

/*
 * A VMM allocation is freed when its handle has neither references nor
 * mappings left: cuMemRelease right after cuMemMap is the documented idiom,
 * and the memory stays in use until the unmap. Counting it free at the
 * release would let a create/map/release loop take the whole GPU.
 */
VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct vgpu_tracked t;
	/* Adjust first: once the driver has freed the handle, a new allocation
	 * may get the same value and be tracked under it. */
	int r = vgpu_track_handle_adjust(h, -1, 0, &t);
	CUresult rc = NEXT(cuMemRelease)(h);
	if (r < 0 && rc == CUDA_SUCCESS)
		vgpu_vmm_import_release(h);
	if (r == 1) {
		if (rc == CUDA_SUCCESS)
			vgpu_quota_uncharge(t.idx, t.bytes);
		else
			vgpu_track_add(TRACK_HANDLE, h, t.bytes, t.idx, t.ctx);
	} else if (r == 0 && rc != CUDA_SUCCESS) {
		vgpu_track_handle_adjust(h, 1, 0, NULL);
	}
	return rc;
}

VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
	CUresult rc = NEXT(cuMemRetainAllocationHandle)(h, addr);
	if (rc == CUDA_SUCCESS && h)
		vgpu_track_handle_adjust(*h, 1, 0, NULL);
	return rc;
}

VGPU_EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
			      unsigned long long flags)
{
	int idx = -1, go = vgpu_vmm_import_map_begin(h, size, &idx); /* an imported handle's first mapping */
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemMap)(va, size, offset, h, flags);
	vgpu_vmm_import_map_end(h, rc, go, size, idx);
	if (rc == CUDA_SUCCESS && vgpu_track_handle_adjust(h, 0, 1, NULL) == 0 && vgpu_track_map_add(va, h) != 0)
		vgpu_track_handle_adjust(h, 0, -1, NULL); /* cannot remember the mapping: count as unmapped */
	return rc;
}

VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size)
{
	CUresult rc = NEXT(cuMemUnmap)(va, size);
	if (rc == CUDA_SUCCESS) {
		uint64_t freed[VGPU_MAX_DEVICES] = {0};
		vgpu_track_unmap(va, size, freed);
		for (int d = 0; d < VGPU_MAX_DEVICES; d++)
			vgpu_quota_uncharge(d, freed[d]);
	}
	return rc;
}

/* ---- arrays ------------------------------------------------------------------------ */

static uint64_t max1(uint64_t v)
{
	return v ? v : 1;
}

/*
 * Bytes per element of a CUarray_format with ch channels. A switch, not a
 * table: formats run up to 0xcb and a table indexed by them overflows.
 * UNORM/SNORM_INT{8,16}X{1,2,4} (0xc0-0xcb) name their element size, so
 * NumChannels can only make it larger, never smaller. Formats whose size we
 * do not know (packed 0x50, BCn, planar video) count 4 bytes per channel:
 * an overestimate, never an underestimate.
 */
static uint64_t element_bytes(int f, unsigned ch)
{
	uint64_t per, named = 0;
	switch (f) {
	case 0x01: case 0x08: /* (UN)SIGNED_INT8 */
		per = 1;
		break;
	case 0x02: case 0x09: case 0x10: /* (UN)SIGNED_INT16, HALF */
		per = 2;
		break;
	case 0x03: case 0x0a: case 0x20: /* (UN)SIGNED_INT32, FLOAT */
		per = 4;
		break;
	case 0xc0 ... 0xcb: /* UNORM_INT8X1 0xc0 ... UNORM_INT16X4 0xc5, SNORM_INT8X1 0xc6 ... SNORM_INT16X4 0xcb */
		per = (f - 0xc0) % 6 < 3 ? 1 : 2;
		named = per << ((f - 0xc0) % 3);
		break;
	default:
		per = 4;
	}
	uint64_t b = per * max1(ch);
	return b > named ? b : named;
}

uint64_t vgpu_array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch)
{
	return max1(w) * max1(h) * max1(d) * element_bytes(fmt, ch);
}

static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels)
{
	int layered = (a->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
	uint64_t total = 0, w = max1(a->Width), h = a->Height, d = a->Depth;
	for (unsigned l = 0; l < max1(levels) && l < 64; l++) {
		total += vgpu_array_bytes(w, h, d, a->Format, a->NumChannels);
		w = max1(w >> 1);
		h = h ? max1(h >> 1) : 0;
		if (!layered)
			d = d ? max1(d >> 1) : 0;
	}
	return total;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *a)
{
	uint64_t bytes = a ? vgpu_array_bytes(a->Width, a->Height, 0, a->Format, a->NumChannels) : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuArrayCreate_v2)(arr, a);
	return vgpu_mem_settle(rc, go, TRACK_ARRAY, arr ? (uint64_t)(uintptr_t)*arr : 0, bytes, idx);
}

/* A sparse array, or one whose memory is mapped later, holds none of its own:
 * what is mapped into it is counted as the allocation it is (import.c). */
#define ARRAY_NO_MEMORY (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *a)
{
	uint64_t bytes = a && !(a->Flags & ARRAY_NO_MEMORY)
				 ? vgpu_array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels)
				 : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuArray3DCreate_v2)(arr, a);
	return vgpu_mem_settle(rc, go, TRACK_ARRAY, arr ? (uint64_t)(uintptr_t)*arr : 0, bytes, idx);
}

static CUresult do_array_destroy(void *a)
{
	return NEXT(cuArrayDestroy)(*(CUarray *)a);
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
	CUresult rc = vgpu_mem_uncharge(TRACK_ARRAY, (uint64_t)(uintptr_t)arr, do_array_destroy, &arr);
	if (rc == CUDA_SUCCESS)
		vgpu_array_maps_gone(arr);
	return rc;
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *a,
					    unsigned levels)
{
	uint64_t bytes = a && !(a->Flags & ARRAY_NO_MEMORY) ? mipmap_bytes(a, levels) : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMipmappedArrayCreate)(m, a, levels);
	return vgpu_mem_settle(rc, go, TRACK_MIPMAP, m ? (uint64_t)(uintptr_t)*m : 0, bytes, idx);
}

static CUresult do_mipmap_destroy(void *a)
{
	return NEXT(cuMipmappedArrayDestroy)(*(CUmipmappedArray *)a);
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
	CUresult rc = vgpu_mem_uncharge(TRACK_MIPMAP, (uint64_t)(uintptr_t)m, do_mipmap_destroy, &m);
	if (rc == CUDA_SUCCESS)
		vgpu_array_maps_gone(m);
	return rc;
}

/* ---- contexts: their own footprint, and everything freed with them ---------------------- */

/*
 * A context costs device memory of its own (hundreds of MiB on real GPUs),
 * and grows with what is loaded and reserved in it: footprint.c measures it
 * through NVML and counts it under the context, so destroying the context
 * gives it back.
 */
static int count_ctx(CUcontext ctx, CUdevice dev)
{
	return vgpu_fp_ctx_created(ctx, dev);
}

/* A context is gone (destroyed, or a primary one released or reset): so is everything it held. */
static void ctx_gone(CUcontext ctx)
{
	vgpu_track_drop_ctx(ctx);
	vgpu_pool_ctx_gone(ctx);
	vgpu_fp_ctx_gone(ctx);
}

/*
 * A context whose own memory takes the container past its limit is undone,
 * and its creation fails as out of memory: the driver holds that memory for
 * as long as the context lives, and nothing can refuse it later. Without
 * this, processes that created their contexts after the others had filled
 * the quota carried the container past it by a context each (518 MiB on an
 * H200: validate.sh check 11). Measured, not guessed: a context that cannot
 * be measured (no host pid yet, NVML silent) is let be, as before.
 */
static void refused_ctx(CUdevice dev)
{
	static int warned;
	int idx = vgpu_device_index(dev); /* listed: count_ctx found it past its limit */
	if (idx >= 0 && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		LOGW("GPU memory quota exceeded on %s: a new context's own memory would take the container past "
		     "its limit (%llu of %llu bytes in use with it); the context is destroyed and its creation "
		     "fails",
		     vgpu.limits.gpu[idx].uuid, (unsigned long long)vgpu_quota_used(idx),
		     (unsigned long long)vgpu.limits.gpu[idx].memory);
}

/* After cuCtxCreate*: undoes a context that count_ctx found past the limit. */
static CUresult created(CUresult rc, CUcontext *ctx, CUdevice dev)
{
	if (rc != CUDA_SUCCESS || !ctx || !count_ctx(*ctx, dev))
		return rc;
	refused_ctx(dev);
	if (NEXT(cuCtxDestroy_v2)(*ctx) == CUDA_SUCCESS)
		ctx_gone(*ctx);
	*ctx = NULL;
	return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUcontext primary[VGPU_MAX_DEVICES * 4];
static int primary_refs[VGPU_MAX_DEVICES * 4];
static pthread_mutex_t primary_mu = PTHREAD_MUTEX_INITIALIZER;

/* Evaluates call, a context creation on dev that stores the new context
 * through ctxp, inside host-pid discovery (hostpid.c); yields its CUresult. */
#define WITH_DISCOVERY(dev, call, ctxp)                                                  \
	({                                                                               \
		struct vgpu_hostpid_scan s_;                                             \
		vgpu_hostpid_before((dev), &s_);                                         \
		CUresult rc_ = (call);                                                   \
		vgpu_hostpid_after(&s_, rc_ == CUDA_SUCCESS && (ctxp) ? *(ctxp) : NULL); \
		rc_;                                                                     \
	})

/* Failed closed (limits file invalid, or missing in a vGPU container): no
 * context either, whose own memory nothing would count (said once, when the
 * limits file was read). */
#define CLOSED() (vgpu_init(), vgpu.mode == VGPU_FAIL_CLOSED)

/* A context creation on dev, through ctxp: inside host-pid discovery, its
 * footprint counted, undone past the limit. */
#define NEW_CTX(dev, ctxp, call) \
	(CLOSED() ? CUDA_ERROR_OUT_OF_MEMORY : created(WITH_DISCOVERY((dev), (call), (ctxp)), (ctxp), (dev)))

static void primary_gone(CUdevice dev, int reset);
static void greens_after_fork(void);

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	if (CLOSED())
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = WITH_DISCOVERY(dev, NEXT(cuDevicePrimaryCtxRetain)(ctx, dev), ctx);
	if (rc != CUDA_SUCCESS || vgpu.mode != VGPU_ENFORCE || dev < 0 || dev >= VGPU_MAX_DEVICES * 4)
		return rc;
	pthread_mutex_lock(&primary_mu);
	int first = primary_refs[dev]++ == 0;
	primary[dev] = *ctx;
	pthread_mutex_unlock(&primary_mu);
	if (first && count_ctx(*ctx, dev)) {
		refused_ctx(dev);
		if (NEXT(cuDevicePrimaryCtxRelease_v2)(dev) == CUDA_SUCCESS)
			primary_gone(dev, 0);
		*ctx = NULL;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return rc;
}

/* The primary context of dev is gone (last release or reset): so is its memory. */
static void primary_gone(CUdevice dev, int reset)
{
	CUcontext c = NULL;
	pthread_mutex_lock(&primary_mu);
	if (reset || (primary_refs[dev] > 0 && --primary_refs[dev] == 0))
		c = primary[dev];
	if (reset)
		primary_refs[dev] = 0;
	pthread_mutex_unlock(&primary_mu);
	if (c)
		ctx_gone(c);
}

static void after_fork(void)
{
	/* The child holds none of the parent's primary contexts; retaining one
	 * there creates a context of its own, with its own footprint. */
	pthread_mutex_init(&primary_mu, NULL);
	memset(primary, 0, sizeof(primary));
	memset(primary_refs, 0, sizeof(primary_refs));
	greens_after_fork();
}
VGPU_LIFECYCLE(ctx, .order = VGPU_ORDER_CTX, .after_fork = after_fork);

/* After a release (reset = 0) or reset (1) of dev's primary context that the
 * driver accepted: what that context held goes. Returns the driver's rc. */
static CUresult primary_released(CUresult rc, CUdevice dev, int reset)
{
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE && dev >= 0 && dev < VGPU_MAX_DEVICES * 4)
		primary_gone(dev, reset);
	return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	return primary_released(NEXT(cuDevicePrimaryCtxRelease_v2)(dev), dev, 0);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	return primary_released(NEXT(cuDevicePrimaryCtxReset_v2)(dev), dev, 1);
}

/*
 * The pre-11.0 ABIs under the bare names: the same argument and the same
 * effect on what the context holds (the CUDA 9.1 reference documents both;
 * how their other behaviour differs from the _v2s is unverified, see the
 * ABI notes). NVIDIA's cudart 11.8 and 12.4 ask for these at 7000, and
 * release (cudaDeviceReset, exit) through them.
 */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return primary_released(NEXT(cuDevicePrimaryCtxRelease)(dev), dev, 0);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	return primary_released(NEXT(cuDevicePrimaryCtxReset)(dev), dev, 1);
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuCtxCreate_v2)(ctx, flags, dev));
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, void *affinity, int n, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuCtxCreate_v3)(ctx, affinity, n, flags, dev));
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuCtxCreate_v4)(ctx, params, flags, dev));
}

/* After a context's destruction that the driver accepted: what it held goes. */
static CUresult destroyed(CUresult rc, CUcontext ctx)
{
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE)
		ctx_gone(ctx);
	return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	return destroyed(NEXT(cuCtxDestroy_v2)(ctx), ctx);
}

/*
 * The pre-3.2 cuCtxCreate and cuCtxDestroy, still exported (the 580 driver
 * does) and reached by a dlsym of the bare name or cuGetProcAddress below
 * 3020: the same arguments, a context holding the same memory. Passed
 * through, they made contexts the shim never counted or refused (the way
 * past the quota that check 11 found, by another door), and destroyed ones
 * whose memory it kept counting.
 */
VGPU_EXPORT CUresult cuCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuCtxCreate)(ctx, flags, dev));
}

VGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
	return destroyed(NEXT(cuCtxDestroy)(ctx), ctx);
}

/*
 * Contexts made for OpenGL or VDPAU interoperability (deprecated since CUDA
 * 5.0, still exported by the 580 driver, in both ABIs): contexts like any
 * other, with memory of their own.
 */
VGPU_EXPORT CUresult cuGLCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuGLCtxCreate_v2)(ctx, flags, dev));
}

VGPU_EXPORT CUresult cuGLCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev)
{
	return NEW_CTX(dev, ctx, NEXT(cuGLCtxCreate)(ctx, flags, dev));
}

VGPU_EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev, uint32_t vdp, void *get_proc)
{
	return NEW_CTX(dev, ctx, NEXT(cuVDPAUCtxCreate_v2)(ctx, flags, dev, vdp, get_proc));
}

VGPU_EXPORT CUresult cuVDPAUCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev, uint32_t vdp, void *get_proc)
{
	return NEW_CTX(dev, ctx, NEXT(cuVDPAUCtxCreate)(ctx, flags, dev, vdp, get_proc));
}

/*
 * Green contexts (CUDA 12.4): a share of a device's SMs on its primary
 * context. Creating one retains the primary context inside the driver,
 * making it (with its memory) if there was none, and destroying it releases
 * that; memory allocated while its CUcontext (cuCtxFromGreenCtx) is current
 * is the primary context's. The shim sees none of that retain: a process
 * that used only green contexts made its context unseen, with no host-pid
 * discovery, no footprint and no refusal past the limit, and memory it
 * allocated was tracked under a context whose end the shim never saw. So
 * the shim takes a primary reference of its own through its own retain (the
 * footprint counted, a context past the limit refused) before the green
 * context is made, and gives it back when that is destroyed: the primary
 * context lives exactly as long as it would without the shim. Allocations
 * are tracked under the primary context (vgpu_ctx_owner).
 */
#define MAX_GREEN 256

static struct green {
	CUgreenCtx g;
	CUcontext as_ctx; /* cuCtxFromGreenCtx(g) */
	CUcontext primary;
	CUdevice dev;
} greens[MAX_GREEN];
static int ngreen; /* entries in use (a hint for the allocation path; under green_mu) */
static pthread_mutex_t green_mu = PTHREAD_MUTEX_INITIALIZER;

CUcontext vgpu_ctx_owner(CUcontext ctx)
{
	if (likely(!__atomic_load_n(&ngreen, __ATOMIC_RELAXED)) || !ctx)
		return ctx;
	CUcontext owner = ctx;
	pthread_mutex_lock(&green_mu);
	for (int i = 0; i < MAX_GREEN; i++)
		if (greens[i].g && greens[i].as_ctx == ctx) {
			owner = greens[i].primary;
			break;
		}
	pthread_mutex_unlock(&green_mu);
	return owner;
}

static void greens_after_fork(void)
{
	/* The child holds none of the parent's green contexts. */
	pthread_mutex_init(&green_mu, NULL);
	memset(greens, 0, sizeof(greens));
	ngreen = 0;
}

VGPU_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned flags)
{
	static int warned;
	if (CLOSED())
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (vgpu.mode != VGPU_ENFORCE || !g)
		return NEXT(cuGreenCtxCreate)(g, desc, dev, flags);
	CUcontext primary = NULL, as_ctx = NULL;
	CUresult rc = cuDevicePrimaryCtxRetain(&primary, dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = NEXT(cuGreenCtxCreate)(g, desc, dev, flags);
	if (rc != CUDA_SUCCESS) {
		cuDevicePrimaryCtxRelease_v2(dev);
		return rc;
	}
	vgpu_cu_ctx_from_green(&as_ctx, *g);
	pthread_mutex_lock(&green_mu);
	int i = 0;
	while (i < MAX_GREEN && greens[i].g)
		i++;
	if (i < MAX_GREEN) {
		greens[i] = (struct green){*g, as_ctx, primary, dev};
		ngreen++;
	}
	pthread_mutex_unlock(&green_mu);
	/* Past the table, the shim's reference stays until the process ends: the
	 * primary context may outlive the green ones, never the other way round. */
	if (i == MAX_GREEN && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		LOGW("more than %d green contexts at once: the primary context of device %d is kept until exit",
		     MAX_GREEN, dev);
	return rc;
}

VGPU_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g)
{
	CUresult rc = NEXT(cuGreenCtxDestroy)(g);
	if (rc != CUDA_SUCCESS || !g)
		return rc;
	CUdevice dev = -1;
	pthread_mutex_lock(&green_mu);
	for (int i = 0; i < MAX_GREEN; i++)
		if (greens[i].g == g) {
			dev = greens[i].dev;
			greens[i] = (struct green){0};
			ngreen--;
			break;
		}
	pthread_mutex_unlock(&green_mu);
	if (dev >= 0)
		cuDevicePrimaryCtxRelease_v2(dev);
	return rc;
}

/* ---- for the hooks in other files (mem.h) ------------------------------------------------ */

int vgpu_mem_charge_index(int idx, uint64_t bytes)
{
	vgpu_init();
	return admit_index(vgpu.mode == VGPU_ENFORCE ? idx : -1, bytes);
}
