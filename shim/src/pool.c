/*
 * Stream-ordered memory pools (cuMemAllocAsync, cuMemAllocFromPoolAsync).
 *
 * A pool holds device memory the application has freed: cuMemFreeAsync
 * returns the block to the pool, which keeps it up to its release threshold
 * (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; UINT64_MAX in PyTorch's cudaMallocAsync
 * backend, TensorFlow's cuda_malloc_async and RAPIDS) and gives the rest
 * back to the device only at the next stream, event or context
 * synchronisation, or at cuMemPoolTrimTo. So what a pool costs the quota is
 * its reserved memory (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the sum of
 * its live allocations:
 *
 *  - an allocation the pool can serve from what it already holds (by our
 *    count of what is in use) reserves nothing; one it cannot reserves its
 *    size rounded up to the pool's 2 MiB growth before the driver is asked;
 *  - after every allocation, free, trim, attribute change or read, and
 *    synchronisation, the pool's reserved memory is read back and the charge
 *    set to it (growth past the estimate, from fragmentation, is counted
 *    then, past the quota if need be: the driver already handed it out); a
 *    driver that cannot say (the attribute is from 11.3) is charged what is
 *    allocated from the pool, as any allocation;
 *  - an allocation refused for the quota first makes every pool on that GPU
 *    give back what it holds unused (cuMemPoolTrimTo down to what is in use),
 *    as an allocator under memory pressure would, and is retried once.
 *
 * A pool's location decides which GPU is charged: remembered from the calls
 * that hand out pools (cuMemPoolCreate, cuDeviceGetDefaultMemPool,
 * cuDeviceGetMemPool, and CUDA 13's cuMemGetDefaultMemPool and
 * cuMemGetMemPool by location and allocation type); the driver had no query
 * for it before CUDA 13.1. Host and host-NUMA pools are not GPU memory and
 * count nothing; a managed pool counts on its preferred device, or on the
 * stream's device when it prefers none (as cuMemAllocManaged counts on the
 * current one); a pool the shim never saw counts on the stream's device.
 */
#include "glibc_compat.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core.h"
#include "lifecycle.h"
#include "log.h"
#include "mem.h"
#include "pool.h"
#include "quota.h"
#include "real.h"

#define POOL_SLOTS 256
#define POOL_GRAIN (2ull << 20) /* a pool grows by whole 2 MiB pages */

/* Where a pool's memory lives. */
#define LOC_STREAM (-1) /* not known, or a managed pool without a preferred location: the stream's device */
#define LOC_HOST (-2)   /* host or host-NUMA memory: not counted */

struct pool {
	CUmemoryPool handle; /* NULL: free slot, or destroyed with allocations still out */
	int dev;             /* device ordinal, LOC_STREAM or LOC_HOST */
	int exact;           /* dev read from the pool's own location, not inferred */
	int idx;             /* limits index charged; -1 until the first counted allocation */
	int live;            /* allocations out */
	int destroyed;       /* destroyed while allocations were out: freed with the last one */
	uint64_t observed;   /* reserved memory, as last read from the driver: charged */
	uint64_t inflight;   /* growth reserved for allocations the driver has not answered yet */
	uint64_t used;       /* bytes of the allocations out, by our count */
};

static struct pool pools[POOL_SLOTS];
static int top; /* slots at and above this were never used: scans stop there */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Slots with a charge: lets a synchronisation skip the table when nothing is charged. */
static int charged_slots;

/* ---- the table of pools ----------------------------------------------------------------- */

/* Slot of a live pool; -1 when unknown. Caller holds mu. */
static int find_locked(CUmemoryPool h)
{
	for (int i = 0; h && i < top; i++)
		if (pools[i].handle == h)
			return i;
	return -1;
}

static int free_slot_locked(void)
{
	for (int i = 0; i < POOL_SLOTS; i++)
		if (!pools[i].handle && !pools[i].destroyed)
			return i;
	return -1;
}

/* Slot of pool h, made (located on the stream's device) when h is new; -1 when the table is full. */
static int slot_locked(CUmemoryPool h)
{
	int i = find_locked(h);
	if (i < 0 && (i = free_slot_locked()) >= 0) {
		if (i >= top)
			__atomic_store_n(&top, i + 1, __ATOMIC_RELAXED);
		memset(&pools[i], 0, sizeof(pools[i]));
		pools[i].handle = h;
		pools[i].idx = -1;
		pools[i].dev = LOC_STREAM;
	}
	return i;
}

static void ensure(CUmemoryPool h)
{
	pthread_mutex_lock(&mu);
	slot_locked(h);
	pthread_mutex_unlock(&mu);
}

/* Records where pool h lives; an exact location is never overridden by an
 * inferred one, nor one a charge was already taken on. */
static void remember(CUmemoryPool h, int dev, int exact)
{
	if (!h)
		return;
	pthread_mutex_lock(&mu);
	int i = slot_locked(h);
	if (i >= 0 && pools[i].idx < 0 && (exact || !pools[i].exact)) {
		pools[i].dev = dev;
		pools[i].exact = exact;
	}
	pthread_mutex_unlock(&mu);
	if (i < 0)
		LOGD("more than %d memory pools: pool %p counts per allocation on its stream's device", POOL_SLOTS,
		     (void *)h);
}

/* Where memory of a location and CUmemAllocationType lands. */
static int loc_of(const CUmemLocation *l, int alloc_type)
{
	if (!l)
		return LOC_STREAM;
	switch (l->type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		return l->id;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
		return LOC_HOST;
	default:
		/* No preferred location (managed), or a type this build does not
		 * know: the stream's device, an overestimate for host memory. */
		(void)alloc_type;
		return LOC_STREAM;
	}
}

/* ---- the charge: what the pool reserves ---------------------------------------------------- */

static CUresult read_reserved(CUmemoryPool h, uint64_t *v)
{
	cuuint64_t x = 0;
	CUresult rc = NEXT(cuMemPoolGetAttribute)(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &x);
	*v = x;
	return rc;
}

/*
 * Sets slot i's charge to what the driver says the pool reserves (read now,
 * or *value when the caller already read it), after dropping `done` bytes of
 * growth reserved for an allocation that has returned. mu is held across the
 * read (a host-side query that never waits for the GPU) so two refreshes
 * cannot apply their reads out of order; the quota is adjusted after.
 */
static void refresh(int i, const uint64_t *value, uint64_t done)
{
	pthread_mutex_lock(&mu);
	struct pool *p = &pools[i];
	uint64_t before = p->observed + p->inflight, r;
	p->inflight -= done < p->inflight ? done : p->inflight;
	if (value)
		p->observed = *value;
	else if (p->handle && !p->destroyed)
		/* A driver without the attribute (before 11.3): what is allocated. */
		p->observed = read_reserved(p->handle, &r) == CUDA_SUCCESS ? r : p->used;
	uint64_t after = p->observed + p->inflight;
	int idx = p->idx;
	if (before == 0 && after > 0)
		__atomic_add_fetch(&charged_slots, 1, __ATOMIC_RELAXED);
	else if (before > 0 && after == 0)
		__atomic_sub_fetch(&charged_slots, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&mu);
	if (idx < 0)
		return;
	if (after > before) {
		/* Grown past what was reserved for it: already handed out, so counted. */
		LOGD("memory pool on %s reserves %llu bytes more than reserved ahead", vgpu.limits.gpu[idx].uuid,
		     (unsigned long long)(after - before));
		vgpu_quota_charge_force(idx, after - before);
	} else if (after < before) {
		vgpu_quota_uncharge(idx, before - after);
	}
}

/* Gives back a destroyed pool's whole charge once its last allocation is freed. */
static void retire_if_done(int i)
{
	pthread_mutex_lock(&mu);
	struct pool *p = &pools[i];
	uint64_t bytes = 0;
	int idx = p->idx;
	if (p->destroyed && p->live == 0) {
		bytes = p->observed + p->inflight;
		if (bytes)
			__atomic_sub_fetch(&charged_slots, 1, __ATOMIC_RELAXED);
		memset(p, 0, sizeof(*p));
	}
	pthread_mutex_unlock(&mu);
	if (bytes && idx >= 0)
		vgpu_quota_uncharge(idx, bytes);
}

int vgpu_pool_reclaim(int idx)
{
	int gave = 0;
	if (!__atomic_load_n(&charged_slots, __ATOMIC_RELAXED))
		return 0;
	for (int i = 0; i < __atomic_load_n(&top, __ATOMIC_RELAXED); i++) {
		pthread_mutex_lock(&mu);
		struct pool *p = &pools[i];
		int mine = p->handle && !p->destroyed && p->idx == idx && p->observed > p->used;
		CUmemoryPool h = p->handle;
		uint64_t keep = p->used, before = p->observed;
		pthread_mutex_unlock(&mu);
		if (!mine || NEXT(cuMemPoolTrimTo)(h, keep) != CUDA_SUCCESS)
			continue;
		refresh(i, NULL, 0);
		pthread_mutex_lock(&mu);
		gave |= pools[i].handle == h && pools[i].observed < before;
		pthread_mutex_unlock(&mu);
	}
	if (gave)
		LOGD("GPU memory quota reached on %s: memory pools trimmed to what is in use", vgpu.limits.gpu[idx].uuid);
	return gave;
}

void vgpu_pool_sync(void)
{
	if (!__atomic_load_n(&charged_slots, __ATOMIC_RELAXED))
		return;
	for (int i = 0; i < __atomic_load_n(&top, __ATOMIC_RELAXED); i++) {
		pthread_mutex_lock(&mu);
		int charged = pools[i].handle && !pools[i].destroyed && pools[i].observed + pools[i].inflight > 0;
		pthread_mutex_unlock(&mu);
		if (charged)
			refresh(i, NULL, 0);
	}
}

/* ---- allocations and frees ------------------------------------------------------------------ */

/* Live pool allocations: address -> slot (-1: counted per allocation), bytes, limits index. */
#define NBUCKETS 4096
struct ptr {
	struct ptr *next;
	CUdeviceptr p;
	uint64_t bytes;
	int slot;
	int idx;
	CUcontext ctx; /* current at the allocation: the allocation goes with it */
};
static struct ptr *ptrs[NBUCKETS];
static pthread_mutex_t ptr_mu = PTHREAD_MUTEX_INITIALIZER;
static int nptrs; /* lets a free of ordinary memory skip the table */

static unsigned hash(CUdeviceptr p)
{
	return (unsigned)((p * 0x9e3779b97f4a7c15ull) >> 52) & (NBUCKETS - 1);
}

static int ptr_add(CUdeviceptr p, int slot, int idx, uint64_t bytes)
{
	struct ptr *e = malloc(sizeof(*e));
	if (!e)
		return -1;
	CUcontext ctx = NULL;
	vgpu_cu_ctx_get_current(&ctx);
	*e = (struct ptr){NULL, p, bytes, slot, idx, vgpu_ctx_owner(ctx)};
	unsigned b = hash(p);
	pthread_mutex_lock(&ptr_mu);
	e->next = ptrs[b];
	ptrs[b] = e;
	nptrs++;
	pthread_mutex_unlock(&ptr_mu);
	return 0;
}

static int ptr_take(CUdeviceptr p, struct ptr *out)
{
	if (!__atomic_load_n(&nptrs, __ATOMIC_RELAXED))
		return 0;
	pthread_mutex_lock(&ptr_mu);
	for (struct ptr **pp = &ptrs[hash(p)]; *pp; pp = &(*pp)->next)
		if ((*pp)->p == p) {
			struct ptr *e = *pp;
			*pp = e->next;
			nptrs--;
			pthread_mutex_unlock(&ptr_mu);
			*out = *e;
			free(e);
			return 1;
		}
	pthread_mutex_unlock(&ptr_mu);
	return 0;
}

/*
 * Limits index of the device stream s belongs to (as vgpu_current_index
 * answers: -2 without a current context) and its device ordinal. NULL and
 * the special handles name a stream of the current context; so does a
 * stream whose context cannot be asked (a driver without cuStreamGetCtx).
 */
int vgpu_stream_index(CUstream s, CUdevice *dev)
{
	CUcontext cur = NULL, sc = NULL;
	vgpu_cu_ctx_get_current(&cur);
	if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
	    vgpu_cu_stream_get_ctx(s, &sc) != CUDA_SUCCESS || !sc || sc == cur)
		return vgpu_current_index(dev);
	if (vgpu_cu_ctx_device(sc, dev) != CUDA_SUCCESS) {
		LOGD("device of stream %p unknown: counted on the current context's device", (void *)s);
		return vgpu_current_index(dev);
	}
	return vgpu_device_index(*dev);
}

/*
 * Whether the GPU's usage is past its limit, once the pools gave back what
 * they keep unused. An allocation that fits in what a pool holds by the
 * shim's count is not reserved ahead, but the count and the driver's free
 * space in the pool drift apart (alignment, reuse policies, fragmentation):
 * the driver may still grow the pool, and that growth is charged when seen,
 * so it can carry the container past its limit. From then on no pool
 * allocation is charged until frees bring the usage back: the overshoot is
 * one growth of the allocations in flight at that moment, not unbounded.
 * Exactly at the limit a pool still serves from what it holds (a pool that
 * grew to the quota by charged growth keeps working, as PyTorch's does).
 */
static int past_limit(int idx)
{
	uint64_t limit = vgpu.limits.gpu[idx].memory;
	if (!limit || vgpu_quota_used(idx) <= limit)
		return 0;
	return !(vgpu_pool_reclaim(idx) && vgpu_quota_used(idx) <= limit);
}

int vgpu_pool_charge(CUmemoryPool pool, CUstream s, uint64_t bytes, struct vgpu_pool_op *op)
{
	vgpu_init();
	*op = (struct vgpu_pool_op){.go = GO_FORWARD, .slot = -1, .idx = -1};
	if (vgpu.mode != VGPU_ENFORCE)
		return op->go = vgpu_mem_charge_index(-1, bytes);
	CUdevice sdev = -1;
	int sidx = vgpu_stream_index(s, &sdev);
	if (sidx == -2)
		return op->go; /* no current context: the driver returns its own error */
	if (pool) {
		ensure(pool); /* one the shim never saw: the stream's device */
	} else if (sdev >= 0 && NEXT(cuDeviceGetMemPool)(&pool, sdev) == CUDA_SUCCESS) {
		/* cuMemAllocAsync takes from the current pool of the stream's
		 * device, which the driver requires to live there. */
		remember(pool, sdev, 1);
	} else {
		pool = NULL; /* counted per allocation on the stream's device */
	}
	pthread_mutex_lock(&mu);
	int i = find_locked(pool);
	int dev = i >= 0 ? pools[i].dev : LOC_STREAM;
	int idx = i >= 0 && pools[i].idx >= 0 ? pools[i].idx : dev >= 0 ? vgpu_device_index(dev) : sidx;
	if (dev == LOC_HOST) {
		pthread_mutex_unlock(&mu);
		return op->go; /* host memory is not ours to count */
	}
	if (i < 0 || idx < 0) {
		/* Not in the table (full), or on a GPU the limits file does not
		 * list: counted per allocation, or refused, as any allocation. */
		pthread_mutex_unlock(&mu);
		op->idx = idx;
		op->bytes = bytes;
		return op->go = vgpu_mem_charge_index(idx, bytes);
	}
	struct pool *p = &pools[i];
	uint64_t held = p->observed + p->inflight;
	uint64_t spare = held > p->used ? held - p->used : 0;
	uint64_t need = bytes <= spare ? 0 : (bytes + POOL_GRAIN - 1) / POOL_GRAIN * POOL_GRAIN;
	p->idx = idx;
	p->used += bytes;
	p->live++;
	pthread_mutex_unlock(&mu);
	*op = (struct vgpu_pool_op){.go = GO_COUNTED, .slot = i, .idx = idx, .bytes = bytes};
	int refuse;
	if (need) {
		refuse = vgpu_mem_charge_index(idx, need) != GO_COUNTED;
	} else if ((refuse = past_limit(idx))) {
		LOGW("GPU memory quota exceeded on %s: %llu bytes requested from a memory pool, %llu of %llu in use by "
		     "the container", vgpu.limits.gpu[idx].uuid, (unsigned long long)bytes,
		     (unsigned long long)vgpu_quota_used(idx), (unsigned long long)vgpu.limits.gpu[idx].memory);
	}
	if (refuse) {
		pthread_mutex_lock(&mu);
		p->used -= bytes;
		p->live--;
		pthread_mutex_unlock(&mu);
		retire_if_done(i);
		return op->go = GO_REFUSE;
	}
	if (need) {
		/* Reserved (above) before the driver grows the pool, as any allocation. */
		pthread_mutex_lock(&mu);
		if (p->observed + p->inflight == 0)
			__atomic_add_fetch(&charged_slots, 1, __ATOMIC_RELAXED);
		p->inflight += need;
		pthread_mutex_unlock(&mu);
		op->need = need;
	}
	return op->go;
}

CUresult vgpu_pool_settle(CUresult rc, struct vgpu_pool_op *op, CUdeviceptr *dptr)
{
	if (op->go != GO_COUNTED)
		return rc;
	if (op->slot < 0) {
		if (rc != CUDA_SUCCESS || !dptr || ptr_add(*dptr, -1, op->idx, op->bytes) != 0)
			vgpu_quota_uncharge(op->idx, op->bytes);
		return rc;
	}
	if (rc != CUDA_SUCCESS || !dptr || ptr_add(*dptr, op->slot, op->idx, op->bytes) != 0) {
		pthread_mutex_lock(&mu);
		pools[op->slot].used -= op->bytes;
		pools[op->slot].live--;
		pthread_mutex_unlock(&mu);
	}
	refresh(op->slot, NULL, op->need);
	retire_if_done(op->slot);
	return rc;
}

int vgpu_pool_free_begin(CUdeviceptr p, struct vgpu_pool_free *f)
{
	struct ptr e;
	if (!ptr_take(p, &e))
		return 0;
	*f = (struct vgpu_pool_free){p, e.bytes, e.slot, e.idx};
	return 1;
}

CUresult vgpu_pool_free_end(CUresult rc, const struct vgpu_pool_free *f)
{
	if (rc != CUDA_SUCCESS) {
		if (ptr_add(f->p, f->slot, f->idx, f->bytes) != 0 && f->slot < 0)
			vgpu_quota_uncharge(f->idx, f->bytes);
		return rc;
	}
	if (f->slot < 0) {
		vgpu_quota_uncharge(f->idx, f->bytes);
		return rc;
	}
	/* The block goes back to the pool, which keeps it up to its release
	 * threshold: the charge follows what the pool says it reserves. */
	pthread_mutex_lock(&mu);
	struct pool *p = &pools[f->slot];
	p->used -= f->bytes < p->used ? f->bytes : p->used;
	p->live--;
	pthread_mutex_unlock(&mu);
	refresh(f->slot, NULL, 0);
	retire_if_done(f->slot);
	return rc;
}

/*
 * A context is gone, and with it what was allocated from pools while it was
 * current (cuDevicePrimaryCtxReset: "destroy all allocations"). Those
 * allocations are forgotten, and every pool is read back: what the driver
 * says a pool still reserves is charged, a pool it no longer knows is
 * charged what is still allocated from it by our count. What the real driver
 * does with a pool's unused memory when a context goes is not documented:
 * reading back charges whatever it kept.
 */
void vgpu_pool_ctx_gone(CUcontext ctx)
{
	if (!ctx)
		return;
	struct ptr *gone = NULL;
	pthread_mutex_lock(&ptr_mu);
	for (unsigned b = 0; b < NBUCKETS && nptrs; b++)
		for (struct ptr **pp = &ptrs[b]; *pp;) {
			struct ptr *e = *pp;
			if (e->ctx != ctx) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			nptrs--;
			e->next = gone;
			gone = e;
		}
	pthread_mutex_unlock(&ptr_mu);
	while (gone) {
		struct ptr *e = gone;
		gone = e->next;
		if (e->slot < 0) {
			vgpu_quota_uncharge(e->idx, e->bytes);
		} else {
			pthread_mutex_lock(&mu);
			struct pool *p = &pools[e->slot];
			p->used -= e->bytes < p->used ? e->bytes : p->used;
			p->live -= p->live > 0;
			pthread_mutex_unlock(&mu);
		}
		free(e);
	}
	for (int i = 0; i < __atomic_load_n(&top, __ATOMIC_RELAXED); i++) {
		pthread_mutex_lock(&mu);
		int charged = (pools[i].handle && !pools[i].destroyed && pools[i].idx >= 0) ||
			      (pools[i].destroyed && pools[i].live == 0);
		pthread_mutex_unlock(&mu);
		if (charged) {
			refresh(i, NULL, 0);
			retire_if_done(i);
		}
	}
}

/* ---- hooks: where pools live --------------------------------------------------------------- */

VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	CUresult rc = NEXT(cuMemPoolCreate)(pool, props);
	if (rc == CUDA_SUCCESS && pool && props)
		remember(*pool, loc_of(&props->location, props->allocType), 1);
	return rc;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	CUresult rc = NEXT(cuMemPoolDestroy)(pool);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* The driver frees the pool's memory once its last allocation is freed;
	 * the handle may be handed out again at once, so the slot lets go of it. */
	pthread_mutex_lock(&mu);
	int i = find_locked(pool);
	if (i >= 0) {
		pools[i].handle = NULL;
		pools[i].destroyed = 1;
	}
	pthread_mutex_unlock(&mu);
	if (i >= 0)
		retire_if_done(i);
	return rc;
}

VGPU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult rc = NEXT(cuDeviceGetDefaultMemPool)(pool, dev);
	if (rc == CUDA_SUCCESS && pool)
		remember(*pool, dev, 1);
	return rc;
}

VGPU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult rc = NEXT(cuDeviceGetMemPool)(pool, dev);
	/* Inferred: cuDeviceSetMemPool may have set a pool made elsewhere. */
	if (rc == CUDA_SUCCESS && pool)
		remember(*pool, dev, 0);
	return rc;
}

/* CUDA 13: pools by location and allocation type. The pool a location hands
 * out lives there (cuMemSetMemPool requires it), so the location is exact. */
VGPU_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
	CUresult rc = NEXT(cuMemGetDefaultMemPool)(pool, loc, type);
	if (rc == CUDA_SUCCESS && pool && loc)
		remember(*pool, loc_of(loc, type), 1);
	return rc;
}

VGPU_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
	CUresult rc = NEXT(cuMemGetMemPool)(pool, loc, type);
	if (rc == CUDA_SUCCESS && pool && loc)
		remember(*pool, loc_of(loc, type), 1);
	return rc;
}

VGPU_EXPORT CUresult cuMemSetMemPool(CUmemLocation *loc, int type, CUmemoryPool pool)
{
	/* The driver accepts only a pool of that location and type: it lives there. */
	CUresult rc = NEXT(cuMemSetMemPool)(loc, type, pool);
	if (rc == CUDA_SUCCESS && loc)
		remember(pool, loc_of(loc, type), 1);
	return rc;
}

/* ---- hooks: what pools hold ------------------------------------------------------------------ */

static void refresh_pool(CUmemoryPool pool, const uint64_t *value)
{
	pthread_mutex_lock(&mu);
	int i = find_locked(pool);
	int charged = i >= 0 && pools[i].idx >= 0;
	pthread_mutex_unlock(&mu);
	if (charged)
		refresh(i, value, 0);
}

VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	CUresult rc = NEXT(cuMemPoolTrimTo)(pool, keep);
	if (rc == CUDA_SUCCESS)
		refresh_pool(pool, NULL);
	return rc;
}

VGPU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
	/* A lower release threshold frees memory at the next synchronisation,
	 * a reset watermark nothing; read back all the same, it is cheap. */
	CUresult rc = NEXT(cuMemPoolSetAttribute)(pool, attr, value);
	if (rc == CUDA_SUCCESS)
		refresh_pool(pool, NULL);
	return rc;
}

VGPU_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
	/* What the application reads is what the quota is charged. */
	CUresult rc = NEXT(cuMemPoolGetAttribute)(pool, attr, value);
	if (rc == CUDA_SUCCESS && value && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) {
		uint64_t v = *(cuuint64_t *)value;
		refresh_pool(pool, &v);
	}
	return rc;
}

/* Synchronisation is where pools above their release threshold give memory back. */
VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
	CUresult rc = NEXT(cuCtxSynchronize)();
	vgpu_pool_sync();
	return rc;
}

/* CUDA 13: a context named, current or not. */
VGPU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	CUresult rc = NEXT(cuCtxSynchronize_v2)(ctx);
	vgpu_pool_sync();
	return rc;
}

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	CUresult rc = NEXT(cuStreamSynchronize)(s);
	vgpu_pool_sync();
	return rc;
}

VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	CUresult rc = NEXT(cuStreamSynchronize_ptsz)(s);
	vgpu_pool_sync();
	return rc;
}

VGPU_EXPORT CUresult cuEventSynchronize(CUevent e)
{
	CUresult rc = NEXT(cuEventSynchronize)(e);
	vgpu_pool_sync();
	return rc;
}

static void after_fork(void)
{
	/* Pools, like every CUDA object, do not survive fork; entries leak on
	 * purpose (a parent thread may have been mid-update). */
	pthread_mutex_init(&mu, NULL);
	pthread_mutex_init(&ptr_mu, NULL);
	memset(pools, 0, sizeof(pools));
	memset(ptrs, 0, sizeof(ptrs));
	charged_slots = 0;
	nptrs = 0;
	top = 0;
}

VGPU_LIFECYCLE(pool, .order = VGPU_ORDER_POOL, .after_fork = after_fork);
