/*
 * A fake libcuda.so.1 for tests: the driver functions the shim wraps (and
 * those test programs need), with memory and GPU time kept in fakestate so
 * several processes see one consistent device, a simulated SM timeline (a
 * launch "runs" for FAKECUDA_KERNEL_US per wave of SM-count blocks, one
 * kernel at a time per device, FK_QUEUE_LEN launches queued), version-dependent cuGetProcAddress tables
 * whose legacy ABIs abort() when called, and fault injection (fakestate.h).
 * Streams belong to the context current at their creation and memory pools
 * have a device location: cuMemAllocAsync allocates on the stream's device,
 * cuMemAllocFromPoolAsync on the pool's, as the real driver does.
 * FAKECUDA_CTX_SLEEP_MS makes creating a context take that long before and
 * again after it becomes visible to NVML, as a slow context start on
 * hardware does (concurrent starts overlap).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fakegraph.h"
#include "fakestate.h"
#include "fakeexport.h"

#define EXPORT __attribute__((visibility("default")))

struct CUctx_st {
	int dev;
	int primary;
	int refs;
	struct CUctx_st *owner; /* a green context's CUcontext: the primary context whose memory it uses */
};

/* A green context: a view of its device's primary context, which it retains. */
struct CUgreenCtx_st {
	struct CUctx_st view;
};

/* A stream belongs to the context that was current when it was created. */
struct CUstream_st {
	CUcontext ctx;
};

/*
 * A memory pool has a location (the device its memory is allocated on, or
 * the host) and reserves device memory in grains (FAKECUDA_POOL_GRAIN bytes,
 * default 2 MiB): an allocation it cannot serve from what it holds unused
 * grows it by the request rounded up to a grain. A free returns the block to
 * the pool; the pool gives back what it holds unused above its release
 * threshold (default 0) at the next stream, event or context
 * synchronisation, and down to minBytesToKeep at cuMemPoolTrimTo, in whole
 * grains. Frees complete at once (the fake's queue runs no memory work).
 */
struct CUmemPoolHandle_st {
	int dev; /* device ordinal; -1: host memory, nothing taken on a device */
	int loc_type, loc_id, alloc_type;
	int destroyed; /* its memory goes with the last allocation still out */
	uint64_t threshold, reserved, reserved_high, used, used_high;
	struct CUmemPoolHandle_st *next; /* every pool of this process */
};

/* Default (and current) pools, by location and allocation type (see pool_key). */
#define FK_POOL_KEYS (2 * FK_MAX_DEV + 4)
static struct CUctx_st primary_ctx[FK_MAX_DEV];
static struct CUmemPoolHandle_st default_pool[FK_POOL_KEYS];
static CUmemoryPool current_pool[FK_POOL_KEYS]; /* NULL: the default pool */
static struct CUmemPoolHandle_st *all_pools;
static pthread_mutex_t pmu = PTHREAD_MUTEX_INITIALIZER;
static __thread CUcontext current;
/* cuCtxPushCurrent/PopCurrent: the contexts below the current one. */
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth;
static int initialized;
static int64_t last_end_ns; /* when this process's last kernel finishes */

/* Allocations of this process: address -> size, device. */
struct alloc {
	uint64_t key;
	uint64_t size;
	int dev;
	int kind;
	struct CUmemPoolHandle_st *pool; /* K_POOL: the pool it came from */
	CUcontext ctx;                   /* current when it was made: destroyed with it */
};
enum { K_PTR, K_HANDLE, K_ARRAY, K_MIPMAP, K_POOL, K_EXT, K_MC, K_IPC };
static struct alloc *allocs;
static size_t nallocs, capallocs;
static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x700000000000ull;

static uint64_t ctx_bytes(void)
{
	const char *e = getenv("FAKECUDA_CTX_BYTES");
	return e ? strtoull(e, NULL, 10) : 0;
}

/* A new context of this process on dev: visible in NVML's process list from now on. */
static void ctx_born(int dev)
{
	const char *e = getenv("FAKECUDA_CTX_SLEEP_MS");
	int64_t ns = e ? atoll(e) * 1000000ll : 0;
	/* FAKECUDA_CTX_STARTED=PATH: made when a creation starts, for a test to act mid-way. */
	const char *mark = getenv("FAKECUDA_CTX_STARTED");
	if (mark && *mark)
		close(open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
	fk_sleep_ns(ns);
	const char *kind = getenv("FAKECUDA_PROC_KIND"); /* "graphics", "mps" or both */
	fk_lock();
	struct fk_proc *p = fk_me();
	p->ctxs[dev]++;
	if (kind && strstr(kind, "graphics"))
		p->also |= FK_ALSO_GRAPHICS;
	if (kind && strstr(kind, "mps"))
		p->also |= FK_ALSO_MPS;
	fk_unlock();
	fk_sleep_ns(ns);
}

static void ctx_died(int dev)
{
	fk_lock();
	struct fk_proc *p = fk_me();
	if (p->ctxs[dev] > 0)
		p->ctxs[dev]--;
	fk_unlock();
}

/*
 * A callback the program registers (fakecudaSetContextCallback), called once
 * a new context exists, with it current, while its creation is still under
 * way: as a profiler's context-creation callback runs on the creating thread.
 * Whatever driver functions the callback calls reach the interposers (the
 * shim included) the way the program's own calls do.
 */
static void (*ctx_cb)(CUcontext);

EXPORT void fakecudaSetContextCallback(void (*cb)(CUcontext))
{
	__atomic_store_n(&ctx_cb, cb, __ATOMIC_RELEASE);
}

static void ctx_callback(CUcontext c)
{
	void (*cb)(CUcontext) = __atomic_load_n(&ctx_cb, __ATOMIC_ACQUIRE);
	if (!cb)
		return;
	CUcontext prev = current;
	current = c;
	cb(c);
	current = prev;
}

/* Set by fakecudaSetKernelUs (a test hook): this process's kernels take that
 * long a wave, whatever FAKECUDA_KERNEL_US says, so one program can run a mix
 * of short and long kernels. */
static int64_t kernel_ns_set;

static int64_t kernel_ns(void)
{
	int64_t set = __atomic_load_n(&kernel_ns_set, __ATOMIC_RELAXED);
	if (set > 0)
		return set;
	const char *e = getenv("FAKECUDA_KERNEL_US");
	return (e ? atoll(e) : 1000) * 1000;
}

/* Takes bytes on dev for this process; CUDA_ERROR_OUT_OF_MEMORY when the device is full. */
static CUresult take(int dev, uint64_t bytes)
{
	fk_lock();
	struct fk_dev *d = &fk->dev[dev];
	if (d->total - d->used < bytes) {
		fk_reap();
		if (d->total - d->used < bytes) {
			fk_unlock();
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	d->used += bytes;
	if (d->used > fk->peak[dev])
		fk->peak[dev] = d->used;
	fk_me()->used[dev] += bytes;
	fk_unlock();
	return CUDA_SUCCESS;
}

/* Test hook: the most memory device dev has ever had in use, all processes
 * of the fake machine together (what a quota must never let pass its limit). */
EXPORT unsigned long long fakecuda_peak(int dev)
{
	fk_init();
	if (dev < 0 || dev >= FK_MAX_DEV)
		return 0;
	fk_lock();
	unsigned long long p = fk->peak[dev];
	fk_unlock();
	return p;
}

static void give(int dev, uint64_t bytes)
{
	fk_lock();
	struct fk_dev *d = &fk->dev[dev];
	struct fk_proc *p = fk_me();
	d->used = d->used > bytes ? d->used - bytes : 0;
	p->used[dev] = p->used[dev] > bytes ? p->used[dev] - bytes : 0;
	fk_unlock();
}

int fk_mem_take(int dev, uint64_t bytes)
{
	return take(dev, bytes);
}

void fk_mem_give(int dev, uint64_t bytes)
{
	give(dev, bytes);
}

static uint64_t record(int kind, uint64_t key, uint64_t size, int dev)
{
	pthread_mutex_lock(&amu);
	if (!key) {
		key = next_addr;
		next_addr += (size + 0xfff) / 0x1000 * 0x1000 + 0x1000;
	}
	if (nallocs == capallocs) {
		capallocs = capallocs ? capallocs * 2 : 256;
		allocs = realloc(allocs, capallocs * sizeof(*allocs));
	}
	/* Memory allocated in a green context is its primary context's. */
	allocs[nallocs++] = (struct alloc){key, size, dev, kind, NULL, current && current->owner ? current->owner : current};
	pthread_mutex_unlock(&amu);
	return key;
}

static int forget(int kind, uint64_t key, struct alloc *out)
{
	pthread_mutex_lock(&amu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].key == key && allocs[i].kind == kind) {
			*out = allocs[i];
			allocs[i] = allocs[--nallocs];
			pthread_mutex_unlock(&amu);
			return 0;
		}
	pthread_mutex_unlock(&amu);
	return -1;
}

static int cur_dev(void)
{
	return current ? current->dev : -1;
}

static CUresult alloc_common(const char *name, CUdeviceptr *dptr, uint64_t size, int dev)
{
	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (fk_fault(name))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = take(dev, size);
	if (rc == CUDA_SUCCESS)
		*dptr = record(K_PTR, 0, size, dev);
	return rc;
}

static CUresult free_common(int kind, uint64_t key)
{
	struct alloc a;
	if (forget(kind, key, &a) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	give(a.dev, a.size);
	return CUDA_SUCCESS;
}

/* ---- init, devices ---------------------------------------------------------- */

static int self_lookup = -1;
/* A hidden alias: its address is ours even when a preload interposes the name. */
__attribute__((visibility("hidden"))) CUresult own_cuMemAlloc_v2(CUdeviceptr *p, size_t n);

/*
 * CUDA state does not survive fork: the child's primary contexts are its own
 * to retain again. (The current-context pointer is kept, so a child that
 * allocates straight away still reaches this device, which the fork test of
 * the shim relies on.)
 */
static void fork_child(void)
{
	/* Single-threaded here: another thread may have held the allocation table's lock. */
	pthread_mutex_init(&amu, NULL);
	pthread_mutex_init(&pmu, NULL);
	for (int d = 0; d < FK_MAX_DEV; d++)
		primary_ctx[d].refs = 0;
	fg_after_fork();
}

static void register_fork(void)
{
	pthread_atfork(NULL, NULL, fork_child);
}

EXPORT CUresult cuInit(unsigned flags)
{
	static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
	(void)flags;
	fk_init();
	pthread_once(&fork_once, register_fork);
	/* The real driver looks up its own entry points too; an interposer must
	 * hand it its own functions, not wrappers that would count twice. */
	self_lookup = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") == (void *)own_cuMemAlloc_v2;
	initialized = 1;
	return CUDA_SUCCESS;
}

/* Test hook: 1 when cuInit's own dlsym of cuMemAlloc_v2 found this library's. */
EXPORT int fakecudaSelfLookup(void)
{
	return self_lookup;
}

#define NEED_INIT()                                  \
	do {                                         \
		if (!initialized)                    \
			return CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

EXPORT CUresult cuDriverGetVersion(int *v)
{
	const char *e = getenv("FAKECUDA_VERSION");
	*v = e ? atoi(e) : 12080;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
	NEED_INIT();
	*n = fk->ndev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	NEED_INIT();
	if (ordinal < 0 || ordinal >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

#define CHECK_DEV(d)                                        \
	do {                                                \
		NEED_INIT();                                \
		if ((d) < 0 || (d) >= fk->ndev)             \
			return CUDA_ERROR_INVALID_DEVICE;   \
	} while (0)

EXPORT CUresult cuDeviceGetName(char *buf, int len, CUdevice d)
{
	CHECK_DEV(d);
	snprintf(buf, (size_t)len, "%s", fk->dev[d].name);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
	CHECK_DEV(d);
	fk_uuid_bytes(fk->dev[d].uuid, (unsigned char *)u->bytes);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	return cuDeviceGetUuid(u, d);
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	CHECK_DEV(d);
	*v = attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT		? fk->dev[d].sms
	     : attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR ? FK_THREADS_PER_SM
	     : attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID			   ? FK_PCI_BUS(d)
									   : 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
	CHECK_DEV(d);
	*bytes = fk->dev[d].total;
	return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------------- */

static void ctx_free_all(CUcontext c);

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	CHECK_DEV(d);
	struct CUctx_st *p = &primary_ctx[d];
	if (p->refs++ == 0) {
		p->dev = d;
		p->primary = 1;
		if (ctx_bytes() && take(d, ctx_bytes()) != CUDA_SUCCESS) {
			p->refs--;
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		ctx_born(d);
		ctx_callback(p);
	}
	*c = p;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	CHECK_DEV(d);
	if (primary_ctx[d].refs <= 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (--primary_ctx[d].refs == 0) {
		if (ctx_bytes())
			give(d, ctx_bytes());
		ctx_died(d);
		ctx_free_all(&primary_ctx[d]);
	}
	return CUDA_SUCCESS;
}

/* The pre-11.0 ABI, same arguments: NVIDIA's cudart 11.8 and 12.4 ask for
 * it (cuGetProcAddress at 7000) and call it when the process exits. */
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
	return cuDevicePrimaryCtxRelease_v2(d);
}

/* Every allocation of the primary context goes; the context itself stays
 * retained here (its footprint with it). */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
	CHECK_DEV(d);
	ctx_free_all(&primary_ctx[d]);
	return CUDA_SUCCESS;
}

/* The pre-11.0 ABI, same argument: asked for at 7000 by cudart 11.8 and 12.4. */
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d)
{
	return cuDevicePrimaryCtxReset_v2(d);
}

static CUresult ctx_create(CUcontext *c, CUdevice d)
{
	CHECK_DEV(d);
	struct CUctx_st *x = calloc(1, sizeof(*x));
	x->dev = d;
	if (ctx_bytes() && take(d, ctx_bytes()) != CUDA_SUCCESS) {
		free(x);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	ctx_born(d);
	ctx_callback(x);
	*c = current = x;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
	(void)flags;
	return ctx_create(c, d);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *c, void *aff, int n, unsigned flags, CUdevice d)
{
	(void)aff, (void)n, (void)flags;
	return ctx_create(c, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *c, void *params, unsigned flags, CUdevice d)
{
	(void)params, (void)flags;
	return ctx_create(c, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
	if (!c || c->primary || c->owner)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_bytes())
		give(c->dev, ctx_bytes());
	ctx_died(c->dev);
	ctx_free_all(c);
	if (current == c)
		current = NULL;
	free(c);
	return CUDA_SUCCESS;
}

/*
 * Green contexts: a share of a device's SMs on its primary context. Creating
 * one retains the primary context (made, with its memory, if there is none),
 * inside the driver where no interposer sees it; destroying it releases that.
 * It shares the primary context's memory. The SM share is not modelled.
 */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice d, unsigned flags)
{
	(void)desc, (void)flags;
	NEED_INIT();
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	CUcontext p;
	CUresult rc = cuDevicePrimaryCtxRetain(&p, d);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct CUgreenCtx_st *x = calloc(1, sizeof(*x));
	x->view.dev = d;
	x->view.owner = p;
	*g = x;
	return CUDA_SUCCESS;
}

/* The device's SMs as one resource (CUdevResource: type at 0, the SM count at 96). */
EXPORT CUresult cuDeviceGetDevResource(CUdevice d, void *res, int type)
{
	CHECK_DEV(d);
	if (!res || type != 1)
		return CUDA_ERROR_INVALID_VALUE;
	memset(res, 0, 144);
	*(int *)res = type;
	*(unsigned *)((char *)res + 96) = (unsigned)(fk->dev[d].sms > 0 ? fk->dev[d].sms : 1);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, void *res, unsigned n)
{
	static char token;
	if (!desc || !res || n < 1 || *(int *)res != 1)
		return CUDA_ERROR_INVALID_VALUE;
	*desc = (CUdevResourceDesc)(void *)&token;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g)
{
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	if (current == &g->view)
		current = NULL;
	cuDevicePrimaryCtxRelease_v2(g->view.dev);
	free(g);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *c, CUgreenCtx g)
{
	if (!c || !g)
		return CUDA_ERROR_INVALID_VALUE;
	*c = &g->view;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
	current = c;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = current;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx_depth == (int)(sizeof(ctx_stack) / sizeof(ctx_stack[0])))
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = current;
	current = c;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c)
		*c = current;
	current = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = current->dev;
	return CUDA_SUCCESS;
}

/* ---- streams and memory pools --------------------------------------------------- */

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
	(void)flags;
	NEED_INIT();
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUstream_st *x = calloc(1, sizeof(*x));
	x->ctx = current;
	*s = x;
	return CUDA_SUCCESS;
}

static int special_stream(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	if (special_stream(s))
		return CUDA_ERROR_INVALID_HANDLE;
	free(s);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *c)
{
	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	if (special_stream(s)) {
		if (!current)
			return CUDA_ERROR_INVALID_CONTEXT;
		*c = current;
		return CUDA_SUCCESS;
	}
	*c = s->ctx;
	return CUDA_SUCCESS;
}

/* The device a stream's work runs on: its context's (the current one for NULL and the special handles). */
static int stream_dev(CUstream s)
{
	return special_stream(s) ? cur_dev() : s->ctx->dev;
}

/* Index of (location, allocation type) among the default pools; -1 when not a valid pair. */
static int pool_key(const CUmemLocation *l, int type)
{
	if (!l)
		return -1;
	int dev = l->type == CU_MEM_LOCATION_TYPE_DEVICE && l->id >= 0 && l->id < fk->ndev;
	if (type == CU_MEM_ALLOCATION_TYPE_PINNED) {
		if (dev)
			return l->id;
		if (l->type == CU_MEM_LOCATION_TYPE_HOST)
			return FK_MAX_DEV;
		if (l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
			return FK_MAX_DEV + 1;
	} else if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
		if (dev)
			return FK_MAX_DEV + 2 + l->id;
		if (l->type == CU_MEM_LOCATION_TYPE_NONE)
			return 2 * FK_MAX_DEV + 2;
		if (l->type == CU_MEM_LOCATION_TYPE_HOST)
			return 2 * FK_MAX_DEV + 3;
	}
	return -1;
}

static void pool_init(struct CUmemPoolHandle_st *p, const CUmemLocation *l, int type)
{
	p->loc_type = l->type;
	p->loc_id = l->id;
	p->alloc_type = type;
	p->dev = l->type == CU_MEM_LOCATION_TYPE_DEVICE ? l->id : -1;
}

/* The default pool of key k (made on first use). */
static CUmemoryPool default_for(int k, const CUmemLocation *l, int type)
{
	pthread_mutex_lock(&pmu);
	struct CUmemPoolHandle_st *p = &default_pool[k];
	if (!p->alloc_type) {
		pool_init(p, l, type);
		p->next = all_pools;
		all_pools = p;
	}
	pthread_mutex_unlock(&pmu);
	return p;
}

static int is_default(CUmemoryPool pool)
{
	return pool >= default_pool && pool < default_pool + FK_POOL_KEYS;
}

static uint64_t pool_grain(void)
{
	const char *e = getenv("FAKECUDA_POOL_GRAIN");
	return e && strtoull(e, NULL, 10) ? strtoull(e, NULL, 10) : 2ull << 20;
}

/* Gives back up to `most` bytes the pool holds unused, in whole grains. Caller holds pmu. */
static void pool_release_locked(CUmemoryPool p, uint64_t most)
{
	uint64_t unused = p->reserved - p->used, g = pool_grain();
	uint64_t rel = (unused < most ? unused : most) / g * g;
	if (!rel)
		return;
	p->reserved -= rel;
	if (p->dev >= 0)
		give(p->dev, rel);
}

/* A synchronisation: pools above their release threshold give back what they can. */
static void pools_sync(void)
{
	pthread_mutex_lock(&pmu);
	for (struct CUmemPoolHandle_st *p = all_pools; p; p = p->next)
		if (p->reserved > p->threshold)
			pool_release_locked(p, p->reserved - p->threshold);
	pthread_mutex_unlock(&pmu);
}

static CUresult pool_alloc(const char *name, CUdeviceptr *dptr, uint64_t n, CUmemoryPool p)
{
	if (!dptr || !p)
		return CUDA_ERROR_INVALID_VALUE;
	if (fk_fault(name))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pmu);
	if (p->reserved - p->used < n) {
		uint64_t g = pool_grain(), grow = (n + g - 1) / g * g;
		if (p->dev >= 0 && take(p->dev, grow) != CUDA_SUCCESS) {
			pthread_mutex_unlock(&pmu);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		p->reserved += grow;
		if (p->reserved > p->reserved_high)
			p->reserved_high = p->reserved;
	}
	p->used += n;
	if (p->used > p->used_high)
		p->used_high = p->used;
	pthread_mutex_unlock(&pmu);
	uint64_t key = record(K_POOL, 0, n, 0);
	pthread_mutex_lock(&amu);
	for (size_t i = nallocs; i-- > 0;)
		if (allocs[i].key == key && allocs[i].kind == K_POOL) {
			allocs[i].pool = p;
			break;
		}
	pthread_mutex_unlock(&amu);
	*dptr = key;
	return CUDA_SUCCESS;
}

/* Frees a device pointer: an ordinary allocation, or a block back to its pool. */
static CUresult free_ptr(CUdeviceptr ptr)
{
	struct alloc a;
	if (forget(K_PTR, ptr, &a) == 0) {
		give(a.dev, a.size);
		return CUDA_SUCCESS;
	}
	if (forget(K_IPC, ptr, &a) == 0)
		return CUDA_SUCCESS; /* an imported pool pointer: the exporter's memory */
	if (forget(K_POOL, ptr, &a) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pmu);
	a.pool->used -= a.size < a.pool->used ? a.size : a.pool->used;
	if (a.pool->destroyed)
		pool_release_locked(a.pool, a.pool->reserved);
	pthread_mutex_unlock(&pmu);
	return CUDA_SUCCESS;
}

/*
 * A context is destroyed (or a primary one released for the last time, or
 * reset): everything allocated while it was current goes with it. Blocks of
 * stream-ordered pools go back to their pools, and every pool gives back
 * what it holds unused, as at a trim (what the real driver does with a pool
 * whose context goes is not documented; this is the model the shim is tested
 * against).
 */
static void ctx_free_all(CUcontext c)
{
	pthread_mutex_lock(&pmu);
	pthread_mutex_lock(&amu);
	for (size_t i = 0; i < nallocs;) {
		struct alloc a = allocs[i];
		if (a.ctx != c) {
			i++;
			continue;
		}
		allocs[i] = allocs[--nallocs];
		if (a.kind == K_POOL)
			a.pool->used -= a.size < a.pool->used ? a.size : a.pool->used;
		else if (a.kind != K_IPC && a.kind != K_MC && a.size)
			give(a.dev, a.size);
	}
	pthread_mutex_unlock(&amu);
	for (struct CUmemPoolHandle_st *p = all_pools; p; p = p->next)
		pool_release_locked(p, p->reserved - p->used);
	pthread_mutex_unlock(&pmu);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	NEED_INIT();
	if (!pool || !props || pool_key(&props->location, props->allocType) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
	pool_init(p, &props->location, props->allocType);
	pthread_mutex_lock(&pmu);
	p->next = all_pools;
	all_pools = p;
	pthread_mutex_unlock(&pmu);
	*pool = p;
	return CUDA_SUCCESS;
}

/* The pool is kept (its memory with it) for the allocations still out; a
 * later pool never gets the same handle, which the shim must cope with either way. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	if (!pool || is_default(pool))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pmu);
	for (int k = 0; k < FK_POOL_KEYS; k++)
		if (current_pool[k] == pool)
			current_pool[k] = NULL;
	pool->threshold = 0;
	pool->destroyed = 1;
	pool_release_locked(pool, pool->reserved);
	pthread_mutex_unlock(&pmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
	CHECK_DEV(d);
	CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, d};
	*pool = default_for(d, &l, CU_MEM_ALLOCATION_TYPE_PINNED);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
	CHECK_DEV(d);
	if (!current_pool[d])
		return cuDeviceGetDefaultMemPool(pool, d);
	*pool = current_pool[d];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool)
{
	CHECK_DEV(d);
	if (!pool || pool->dev != d || pool->alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE; /* the pool must be local to the device */
	current_pool[d] = pool;
	return CUDA_SUCCESS;
}

/* CUDA 13: pools by location and allocation type. */
EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *l, int type)
{
	NEED_INIT();
	int k = pool_key(l, type);
	if (!pool || k < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*pool = default_for(k, l, type);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *l, int type)
{
	NEED_INIT();
	int k = pool_key(l, type);
	if (!pool || k < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*pool = current_pool[k] ? current_pool[k] : default_for(k, l, type);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetMemPool(CUmemLocation *l, int type, CUmemoryPool pool)
{
	NEED_INIT();
	int k = pool_key(l, type);
	if (k < 0 || !pool || pool->alloc_type != type || pool->loc_type != l->type ||
	    (l->type == CU_MEM_LOCATION_TYPE_DEVICE && pool->loc_id != l->id))
		return CUDA_ERROR_INVALID_VALUE; /* the pool must be of that location and type */
	current_pool[k] = pool;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&pmu);
	if (pool->reserved > keep)
		pool_release_locked(pool, pool->reserved - keep);
	pthread_mutex_unlock(&pmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
	if (!pool || !value)
		return CUDA_ERROR_INVALID_VALUE;
	cuuint64_t v = *(cuuint64_t *)value;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&pmu);
	if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
		pool->threshold = v;
	else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && v == 0)
		pool->reserved_high = pool->reserved;
	else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH && v == 0)
		pool->used_high = pool->used;
	else
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&pmu);
	return rc;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
	if (!pool || !value)
		return CUDA_ERROR_INVALID_VALUE;
	/* FAKECUDA_POOL_NOATTR: a driver before 11.3, without the reserved/used attributes. */
	if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && getenv("FAKECUDA_POOL_NOATTR"))
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&pmu);
	cuuint64_t *v = value;
	switch (attr) {
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = pool->threshold; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = pool->reserved; break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = pool->reserved_high; break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = pool->used; break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = pool->used_high; break;
	default: rc = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&pmu);
	return rc;
}

/* Waits until this process's kernels are done on the simulated timeline. */
EXPORT CUresult cuCtxSynchronize(void)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_sleep_ns(__atomic_load_n(&last_end_ns, __ATOMIC_RELAXED) - fk_now());
	pools_sync();
	return CUDA_SUCCESS;
}

/* CUDA 13: synchronises the named context (all of this process's work here). */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c)
{
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_sleep_ns(__atomic_load_n(&last_end_ns, __ATOMIC_RELAXED) - fk_now());
	pools_sync();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(void *e)
{
	(void)e;
	return cuCtxSynchronize();
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	(void)s;
	return cuCtxSynchronize();
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	return cuStreamSynchronize(s);
}

/* ---- memory ---------------------------------------------------------------------------- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_out, size_t *total)
{
	int d = cur_dev();
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!free_out || !total)
		return CUDA_ERROR_INVALID_VALUE; /* the shim must never pass NULL through */
	fk_lock();
	fk_reap(); /* like the real driver, memory of exited processes is free again */
	*total = fk->dev[d].total;
	*free_out = fk->dev[d].total - fk->dev[d].used;
	fk_unlock();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	return alloc_common("cuMemAlloc_v2", p, n, cur_dev());
}

CUresult own_cuMemAlloc_v2(CUdeviceptr *p, size_t n) __attribute__((alias("cuMemAlloc_v2")));

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags)
{
	(void)flags;
	return alloc_common("cuMemAllocManaged", p, n, cur_dev());
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned elem)
{
	(void)elem;
	size_t pt = (w + 511) / 512 * 512;
	CUresult rc = alloc_common("cuMemAllocPitch_v2", p, (uint64_t)pt * h, cur_dev());
	if (rc == CUDA_SUCCESS)
		*pitch = pt;
	return rc;
}

/* From the current pool of the stream's device, as the real driver does. */
static CUresult alloc_async(const char *name, CUdeviceptr *p, size_t n, CUstream s)
{
	CUmemoryPool pool;
	int d = stream_dev(s);
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	cuDeviceGetMemPool(&pool, d);
	return pool_alloc(name, p, n, pool);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
	CUresult rc;
	if (fg_capture_alloc(s, n, stream_dev(s), p, &rc))
		return rc; /* an allocation node of the capture's graph */
	return alloc_async("cuMemAllocAsync", p, n, s);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s)
{
	CUresult rc;
	if (fg_capture_alloc(s, n, stream_dev(s), p, &rc))
		return rc; /* an allocation node of the capture's graph */
	return alloc_async("cuMemAllocAsync_ptsz", p, n, s);
}

/* On the pool's location, whatever device the stream or the current context is on. */
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
	if (!pool || stream_dev(s) < 0)
		return !pool ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
	CUresult rc;
	if (fg_capture_alloc(s, n, pool->dev, p, &rc))
		return rc;
	return pool_alloc("cuMemAllocFromPoolAsync", p, n, pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
	if (!pool || stream_dev(s) < 0)
		return !pool ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
	CUresult rc;
	if (fg_capture_alloc(s, n, pool->dev, p, &rc))
		return rc;
	return pool_alloc("cuMemAllocFromPoolAsync_ptsz", p, n, pool);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	CUresult rc;
	if (fg_free(p, &rc))
		return rc; /* a graph allocation: back to its graph memory pool */
	return free_ptr(p);
}

static CUresult free_async(CUdeviceptr p, CUstream s)
{
	CUresult rc;
	if (fg_capture_free(s, p, &rc) || fg_free(p, &rc))
		return rc; /* a free node of the capture's graph, or a graph allocation */
	return free_ptr(p);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
	return free_async(p, s);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
	return free_async(p, s);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
			    unsigned long long flags)
{
	(void)flags;
	NEED_INIT();
	if (!h || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	int d = prop->location.id;
	if (d < 0 || d >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (fk_fault("cuMemCreate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = take(d, n);
	if (rc == CUDA_SUCCESS)
		*h = record(K_HANDLE, 0, n, d);
	return rc;
}

/*
 * Shareable handles of VMM allocations: a POSIX file descriptor (type 1) of
 * an unlinked file holding the allocation's size and device, so a process
 * that has it (the exporter, a fork child, or one it was passed to) can
 * import. The imported handle takes no device memory of its own: it is the
 * exporter's allocation (the fake frees that with the exporter's release).
 */
EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type,
					     unsigned long long flags)
{
	(void)flags;
	if (!out || type != 1)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t rec[2] = {0, 0};
	pthread_mutex_lock(&amu);
	int found = 0;
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].kind == K_HANDLE && allocs[i].key == h) {
			rec[0] = allocs[i].size;
			rec[1] = (uint64_t)allocs[i].dev;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&amu);
	if (!found)
		return CUDA_ERROR_INVALID_VALUE;
	char path[] = "/tmp/fakecuda-vmm.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY; /* no file for the handle */
	unlink(path);
	if (pwrite(fd, rec, sizeof(rec), 0) != (ssize_t)sizeof(rec)) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY; /* no file for the handle */
	}
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type)
{
	uint64_t rec[2];
	if (!h || type != 1 || pread((int)(intptr_t)os_handle, rec, sizeof(rec), 0) != (ssize_t)sizeof(rec))
		return CUDA_ERROR_INVALID_VALUE;
	*h = record(K_HANDLE, 0, 0, (int)rec[1]);
	return CUDA_SUCCESS;
}

/* Mappings (va -> handle) and the references cuMemRetainAllocationHandle adds. */
#define FK_MAPS 256
static struct {
	CUdeviceptr va;
	CUmemGenericAllocationHandle h;
	int retained;
} fmaps[FK_MAPS];
static pthread_mutex_t fmu = PTHREAD_MUTEX_INITIALIZER;

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	pthread_mutex_lock(&fmu);
	for (int i = 0; i < FK_MAPS; i++)
		if (fmaps[i].va && fmaps[i].h == h && fmaps[i].retained > 0) {
			fmaps[i].retained--;
			pthread_mutex_unlock(&fmu);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&fmu);
	return free_common(K_HANDLE, h);
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fmu);
	for (int i = 0; i < FK_MAPS; i++)
		if (h && fmaps[i].va && fmaps[i].va == (CUdeviceptr)(uintptr_t)addr) {
			fmaps[i].retained++;
			*h = fmaps[i].h;
			rc = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&fmu);
	return rc;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
				    unsigned long long flags)
{
	(void)align, (void)addr, (void)flags;
	pthread_mutex_lock(&amu);
	*p = next_addr;
	next_addr += size + 0x200000;
	pthread_mutex_unlock(&amu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	(void)p, (void)size;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
			 unsigned long long flags)
{
	(void)size, (void)off, (void)flags;
	pthread_mutex_lock(&fmu);
	for (int i = 0; i < FK_MAPS; i++)
		if (!fmaps[i].va) {
			fmaps[i].va = p;
			fmaps[i].h = h;
			fmaps[i].retained = 0;
			break;
		}
	pthread_mutex_unlock(&fmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	(void)size;
	pthread_mutex_lock(&fmu);
	for (int i = 0; i < FK_MAPS; i++)
		if (fmaps[i].va == p)
			fmaps[i].va = 0;
	pthread_mutex_unlock(&fmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count)
{
	(void)p, (void)size, (void)desc, (void)count;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
	(void)prop, (void)option;
	*g = 2 << 20;
	return CUDA_SUCCESS;
}

static uint64_t fmt_bytes(int f)
{
	switch (f) {
	case 0x01: case 0x08: return 1;
	case 0x02: case 0x09: case 0x10: return 2;
	default: return 4;
	}
}

static uint64_t m1(uint64_t v)
{
	return v ? v : 1;
}

static CUresult array_common(const char *name, uint64_t key_kind, uint64_t bytes, uint64_t *key)
{
	int d = cur_dev();
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (fk_fault(name))
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = take(d, bytes);
	if (rc == CUDA_SUCCESS)
		*key = record((int)key_kind, 0, bytes, d);
	return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc)
{
	uint64_t key;
	CUresult rc = array_common("cuArrayCreate_v2", K_ARRAY,
				   m1(desc->Width) * m1(desc->Height) * fmt_bytes(desc->Format) * m1(desc->NumChannels), &key);
	if (rc == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return rc;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
	uint64_t key;
	/* A sparse array takes no memory: tiles are mapped into it (cuMemMapArrayAsync). */
	CUresult rc = array_common("cuArray3DCreate_v2", K_ARRAY,
				   desc->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)
					   ? 0
					   : m1(desc->Width) * m1(desc->Height) * m1(desc->Depth) *
						     fmt_bytes(desc->Format) * m1(desc->NumChannels),
				   &key);
	if (rc == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return rc;
}

/* Maps or unmaps tiles of sparse arrays: checked, nothing else modelled (this
 * driver frees a released handle's memory at its release, mapped or not). */
static CUresult map_array(CUarrayMapInfo *list, unsigned n)
{
	if (!list || !n)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++)
		if ((list[i].resourceType != 0 && list[i].resourceType != 1) || !list[i].resource ||
		    (list[i].memOperationType != CU_MEM_OPERATION_TYPE_MAP &&
		     list[i].memOperationType != CU_MEM_OPERATION_TYPE_UNMAP))
			return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned n, CUstream s)
{
	(void)s;
	return map_array(list, n);
}

EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned n, CUstream s)
{
	(void)s;
	return map_array(list, n);
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
	return free_common(K_ARRAY, (uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels)
{
	uint64_t total = 0, w = m1(desc->Width), h = desc->Height, dd = desc->Depth;
	int layered = (desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
	for (unsigned l = 0; l < m1(levels); l++) {
		total += w * m1(h) * m1(dd) * fmt_bytes(desc->Format) * m1(desc->NumChannels);
		w = m1(w >> 1);
		h = h ? m1(h >> 1) : 0;
		if (!layered)
			dd = dd ? m1(dd >> 1) : 0;
	}
	uint64_t key;
	CUresult rc = array_common("cuMipmappedArrayCreate", K_MIPMAP, total, &key);
	if (rc == CUDA_SUCCESS)
		*m = (CUmipmappedArray)(uintptr_t)key;
	return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
	return free_common(K_MIPMAP, (uint64_t)(uintptr_t)m);
}

/* ---- external memory and multicast objects ------------------------------------------------------ */

/* Imported external memory is another API's allocation: taken on the current device while imported. */
EXPORT CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc)
{
	NEED_INIT();
	if (!ext || !desc || desc->type < 1 || desc->type > 8 || !desc->size)
		return CUDA_ERROR_INVALID_VALUE;
	int d = cur_dev();
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult rc = take(d, desc->size);
	if (rc == CUDA_SUCCESS)
		*ext = (CUexternalMemory)(uintptr_t)record(K_EXT, 0, desc->size, d);
	return rc;
}

EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory ext)
{
	return free_common(K_EXT, (uint64_t)(uintptr_t)ext);
}

/* A view of imported memory: freed with cuMemFree, holding nothing of its own. */
EXPORT CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *p, CUexternalMemory ext,
						const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc)
{
	if (!p || !ext || !desc)
		return CUDA_ERROR_INVALID_VALUE;
	*p = record(K_PTR, 0, 0, cur_dev() < 0 ? 0 : cur_dev());
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	if (fk_knob("FAKECUDA_NO_ALLOC_PROPS"))
		return CUDA_ERROR_NOT_SUPPORTED; /* a driver that cannot say where a handle's memory is */
	pthread_mutex_lock(&amu);
	for (size_t i = 0; prop && i < nallocs; i++)
		if (allocs[i].key == h && allocs[i].kind == K_HANDLE) {
			memset(prop, 0, sizeof(*prop));
			prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
			prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			prop->location.id = allocs[i].dev;
			rc = CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&amu);
	return rc;
}

/* Multicast objects own no memory; binds are checked for shape only. */
EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop)
{
	NEED_INIT();
	if (!mc || !prop || !prop->numDevices || !prop->size)
		return CUDA_ERROR_INVALID_VALUE;
	*mc = record(K_MC, 0, 0, 0);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice d)
{
	CHECK_DEV(d);
	return mc ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_off, CUmemGenericAllocationHandle mem,
				   size_t mem_off, size_t size, unsigned long long flags)
{
	(void)mc_off, (void)mem_off;
	return mc && mem && size && !flags ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mc, CUdevice d, size_t mc_off,
				      CUmemGenericAllocationHandle mem, size_t mem_off, size_t size, unsigned long long flags)
{
	CHECK_DEV(d);
	return cuMulticastBindMem(mc, mc_off, mem, mem_off, size, flags);
}

EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_off, CUdeviceptr va, size_t size,
				    unsigned long long flags)
{
	(void)mc_off;
	return mc && va && size && !flags ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mc, CUdevice d, size_t mc_off, CUdeviceptr va,
				       size_t size, unsigned long long flags)
{
	CHECK_DEV(d);
	return cuMulticastBindAddr(mc, mc_off, va, size, flags);
}

EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice d, size_t mc_off, size_t size)
{
	(void)mc_off;
	CHECK_DEV(d);
	return mc && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/*
 * IPC: a handle names the exporter's allocation; opening it maps that memory
 * into the importer (a new address). The device's memory stays the
 * exporter's here; a real driver also keeps it alive while an import is open
 * after the exporter frees it (what the shim charges the importer for).
 */
struct ipc_handle {
	uint64_t magic, ptr, size;
	int32_t pid, dev;
};
#define IPC_MAGIC 0x6670635f69706331ull

static CUresult ipc_export(void *out, CUdeviceptr p)
{
	struct ipc_handle h = {IPC_MAGIC, p, 0, getpid(), 0};
	int found = 0;
	pthread_mutex_lock(&amu);
	for (size_t i = 0; i < nallocs; i++)
		if (allocs[i].key == p && (allocs[i].kind == K_PTR || allocs[i].kind == K_POOL)) {
			h.size = allocs[i].size;
			h.dev = allocs[i].dev;
			found = 1;
		}
	pthread_mutex_unlock(&amu);
	if (!out || !found)
		return CUDA_ERROR_INVALID_VALUE;
	memset(out, 0, 64);
	memcpy(out, &h, sizeof(h));
	return CUDA_SUCCESS;
}

static CUresult ipc_import(CUdeviceptr *p, const void *in)
{
	struct ipc_handle h;
	memcpy(&h, in, sizeof(h));
	if (!p || h.magic != IPC_MAGIC || h.pid == getpid())
		return CUDA_ERROR_INVALID_VALUE; /* as the real driver: not in the exporting process */
	*p = record(K_IPC, 0, h.size, h.dev);
	return CUDA_SUCCESS;
}

/* The allocation holding p (any kind): its base, size and device; -1 if none. */
static int extent_of(CUdeviceptr p, uint64_t *base, uint64_t *size, int *dev)
{
	int rc = -1;
	pthread_mutex_lock(&amu);
	for (size_t i = 0; i < nallocs && rc; i++)
		if (p >= allocs[i].key && p - allocs[i].key < (allocs[i].size ? allocs[i].size : 1)) {
			*base = allocs[i].key;
			*size = allocs[i].size;
			*dev = allocs[i].dev;
			rc = 0;
		}
	pthread_mutex_unlock(&amu);
	return rc;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	uint64_t b, s;
	int dev;
	if (extent_of(p, &b, &s, &dev) != 0)
		return CUDA_ERROR_NOT_FOUND;
	if (base)
		*base = b;
	if (size)
		*size = s;
	return CUDA_SUCCESS;
}

/* Only CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9). */
EXPORT CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p)
{
	uint64_t b, s;
	int dev;
	if (attr != 9 || !out)
		return CUDA_ERROR_INVALID_VALUE;
	if (extent_of(p, &b, &s, &dev) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)out = dev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	return ipc_export(h, p);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	(void)flags;
	NEED_INIT();
	return ipc_import(p, &h);
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	return cuIpcOpenMemHandle_v2(p, h, flags);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	struct alloc a;
	return forget(K_IPC, p, &a) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *d, CUdeviceptr p)
{
	return ipc_export(d, p);
}

EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *d)
{
	NEED_INIT();
	return pool && d ? ipc_import(p, d) : CUDA_ERROR_INVALID_VALUE;
}

/* A pool shared with another process: a file descriptor (POSIX_FD, 1) that
 * names nothing here (imports only need a pool handle to import into). */
EXPORT CUresult cuMemPoolExportToShareableHandle(void *out, CUmemoryPool pool, int type, unsigned long long flags)
{
	NEED_INIT();
	if (!out || !pool || type != 1 || flags)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

/* The importer's handle of such a pool: its pointers come in by cuMemPoolImportPointer. */
EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, int type, unsigned long long flags)
{
	NEED_INIT();
	if (!pool || type != 1 || flags || (intptr_t)handle < 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
	pool_init(p, &l, CU_MEM_ALLOCATION_TYPE_PINNED);
	pthread_mutex_lock(&pmu);
	p->next = all_pools;
	all_pools = p;
	pthread_mutex_unlock(&pmu);
	*pool = p;
	return CUDA_SUCCESS;
}

/* ---- launches on the simulated SM timeline ---------------------------------------------------- */

/*
 * A launch appends the kernel to the device's queue (FK_QUEUE_LEN launches
 * deep) and returns; the kernel runs on the device's timeline after those
 * ahead of it, whether or not this thread is scheduled then, as on a GPU.
 * Only a full queue makes a launch wait, until the oldest kernel finishes.
 */
static CUresult run_kernel(uint64_t blocks)
{
	int d = cur_dev();
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	uint64_t sms = fk->dev[d].sms > 0 ? (uint64_t)fk->dev[d].sms : 1;
	int64_t dur = kernel_ns() * (int64_t)((m1(blocks) + sms - 1) / sms);
	struct fk_dev *dev = &fk->dev[d];
	int64_t now;
	for (;;) {
		fk_lock();
		now = fk_now();
		fk_retire(d, now);
		if (dev->qlen < FK_QUEUE_LEN)
			break;
		int64_t wait = dev->queue[dev->qhead].end_ns - now;
		fk_unlock();
		fk_sleep_ns(wait);
	}
	int64_t start = dev->busy_until_ns > now ? dev->busy_until_ns : now;
	dev->busy_until_ns = start + dur;
	struct fk_proc *me = fk_me();
	if (dur > 0) {
		dev->queue[(dev->qhead + dev->qlen) % FK_QUEUE_LEN] =
			(struct fk_kernel){.pid = me->pid, .start_ns = start, .end_ns = start + dur};
		dev->qlen++;
	}
	me->busy_ns[d] += dur;
	me->launches[d]++;
	fk_unlock();
	if (start + dur > __atomic_load_n(&last_end_ns, __ATOMIC_RELAXED))
		__atomic_store_n(&last_end_ns, start + dur, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

CUresult fk_run_kernel(uint64_t blocks)
{
	return run_kernel(blocks);
}

CUresult fk_free_ptr(CUdeviceptr p)
{
	return free_ptr(p);
}

#define GRID(x, y, z) ((uint64_t)(x) * (y) * (z))

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			       unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shm, (void)params, (void)extra;
	fk_function_launched(f); /* lazy loading and local memory (fakemodule.c) */
	CUresult rc;
	if (fg_capture_kernel(s, gx, gy, gz, &rc))
		return rc; /* a kernel node of the capture's graph */
	return run_kernel(GRID(gx, gy, gz));
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
	return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					  unsigned by, unsigned bz, unsigned shm, CUstream s, void **params)
{
	(void)f, (void)bx, (void)by, (void)bz, (void)shm, (void)params;
	CUresult rc;
	if (fg_capture_kernel(s, gx, gy, gz, &rc))
		return rc;
	return run_kernel(GRID(gx, gy, gz));
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params)
{
	return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

/* The launch ABIs before cuLaunchKernel, still exported by real drivers. */
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
	(void)f;
	if (w <= 0 || h <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc;
	if (fg_capture_kernel(s, (unsigned)w, (unsigned)h, 1, &rc))
		return rc;
	return run_kernel(GRID(w, h, 1));
}

EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
	return cuLaunchGridAsync(f, w, h, NULL);
}

EXPORT CUresult cuLaunch(CUfunction f)
{
	return cuLaunchGridAsync(f, 1, 1, NULL);
}

EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags)
{
	(void)flags;
	if (!list || !n)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++) {
		CUresult rc = cuLaunchCooperativeKernel(list[i].function, list[i].gridDimX, list[i].gridDimY,
							list[i].gridDimZ, list[i].blockDimX, list[i].blockDimY,
							list[i].blockDimZ, list[i].sharedMemBytes, list[i].hStream,
							list[i].kernelParams);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	(void)f, (void)params, (void)extra;
	CUresult rc;
	if (fg_capture_kernel(c->hStream, c->gridDimX, c->gridDimY, c->gridDimZ, &rc))
		return rc;
	return run_kernel(GRID(c->gridDimX, c->gridDimY, c->gridDimZ));
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	return cuLaunchKernelEx(c, f, params, extra);
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
	*s = e == CUDA_SUCCESS ? "no error" : e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "error";
	return CUDA_SUCCESS;
}

/* Test hooks: the GPU time a process's kernels have run so far (queued
 * kernels count once they run) and, in *at_ns unless NULL, the
 * CLOCK_MONOTONIC instant that holds for; device usage. */
EXPORT long long fakecudaBusyNs(int pid, int dev, long long *at_ns)
{
	fk_init();
	long long v = 0;
	fk_lock();
	int64_t now = fk_now();
	/* By pid as NVML numbers it too: processes of two pid namespaces can
	 * have one pid (the pid 1 of two containers). */
	for (int i = 0; i < FK_MAX_PROC; i++)
		if (fk->proc[i].pid == pid && fk->proc[i].nvpid == pid + fk_pidns_offset() &&
		    fk->proc[i].pidns == fk_own_pidns())
			v = fk_ran_ns(&fk->proc[i], dev, now);
	fk_unlock();
	if (at_ns)
		*at_ns = now;
	return v;
}

/* Test hook: the kernels this process launches from now on take us
 * microseconds a wave (0: FAKECUDA_KERNEL_US again). */
EXPORT void fakecudaSetKernelUs(long long us)
{
	__atomic_store_n(&kernel_ns_set, us > 0 ? us * 1000 : 0, __ATOMIC_RELAXED);
}

EXPORT unsigned long long fakecudaDeviceUsed(int dev)
{
	fk_init();
	return fk->dev[dev].used;
}

/* ---- legacy ABIs: reaching one of these means an ABI mix-up, fail loudly -------------------------- */

#define LEGACY(name)                                                                      \
	EXPORT CUresult name(void)                                                        \
	{                                                                                 \
		fprintf(stderr, "fakecuda: legacy ABI " #name " called (ABI mix-up)\n"); \
		abort();                                                                  \
	}
LEGACY(cuCtxAttach)

/* The pre-3.2 context calls: the same arguments as the _v2s (what differs in
 * the real driver is the API version the context reports). */
EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned flags, CUdevice d)
{
	(void)flags;
	return ctx_create(c, d);
}

EXPORT CUresult cuCtxDestroy(CUcontext c)
{
	return cuCtxDestroy_v2(c);
}

/* Interoperability contexts: no OpenGL or VDPAU here, the context alone. */
EXPORT CUresult cuGLCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d)
{
	(void)flags;
	return ctx_create(c, d);
}

EXPORT CUresult cuGLCtxCreate(CUcontext *c, unsigned flags, CUdevice d)
{
	return cuGLCtxCreate_v2(c, flags, d);
}

EXPORT CUresult cuVDPAUCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d, uint32_t vdp, void *get_proc)
{
	(void)flags, (void)vdp, (void)get_proc;
	return ctx_create(c, d);
}

EXPORT CUresult cuVDPAUCtxCreate(CUcontext *c, unsigned flags, CUdevice d, uint32_t vdp, void *get_proc)
{
	return cuVDPAUCtxCreate_v2(c, flags, d, vdp, get_proc);
}

/*
 * The pre-3.2 allocation ABIs work, with 32-bit sizes and addresses (below
 * 4 GiB, apart from the 64-bit ones), as the bare names do in the real
 * driver: a caller of the wrong ABI would see its pointer truncated.
 */
static uint32_t next_addr32 = 0x10000000u;

static CUresult alloc32(const char *name, CUdeviceptr_v1 *dptr, uint64_t size, int kind, uint64_t *key)
{
	int d = cur_dev();
	if (!dptr && kind == K_PTR)
		return CUDA_ERROR_INVALID_VALUE;
	if (d < 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (fk_fault(name))
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&amu);
	uint64_t a = next_addr32;
	if (a + size + 0x1000 > 0xffffffffull) {
		pthread_mutex_unlock(&amu);
		return CUDA_ERROR_OUT_OF_MEMORY; /* the 32-bit window is full */
	}
	next_addr32 += (uint32_t)((size + 0xfff) / 0x1000 * 0x1000 + 0x1000);
	pthread_mutex_unlock(&amu);
	CUresult rc = take(d, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	record(kind, a, size, d);
	if (dptr)
		*dptr = (CUdeviceptr_v1)a;
	if (key)
		*key = a;
	return CUDA_SUCCESS;
}

/* The pre-3.2 reports: 32-bit sizes, saturated (what the real driver does past
 * 4 GiB is not known; the shim is tested against this). */
static unsigned int sat32(uint64_t v)
{
	return v > 0xffffffffu ? 0xffffffffu : (unsigned int)v;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_out, unsigned int *total)
{
	size_t f, t;
	if (!free_out || !total)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = cuMemGetInfo_v2(&f, &t);
	if (rc == CUDA_SUCCESS) {
		*free_out = sat32(f);
		*total = sat32(t);
	}
	return rc;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d)
{
	size_t b;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = cuDeviceTotalMem_v2(&b, d);
	if (rc == CUDA_SUCCESS)
		*bytes = sat32(b);
	return rc;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n)
{
	return alloc32("cuMemAlloc", p, n, K_PTR, NULL);
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
				unsigned int elem)
{
	(void)elem;
	unsigned int pt = (w + 511) / 512 * 512;
	CUresult rc = alloc32("cuMemAllocPitch", p, (uint64_t)pt * h, K_PTR, NULL);
	if (rc == CUDA_SUCCESS)
		*pitch = pt;
	return rc;
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 p)
{
	return free_common(K_PTR, p);
}

EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
	uint64_t key;
	CUresult rc = alloc32("cuArrayCreate", NULL,
			      m1(desc->Width) * m1(desc->Height) * fmt_bytes(desc->Format) * m1(desc->NumChannels),
			      K_ARRAY, &key);
	if (rc == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return rc;
}

EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc)
{
	uint64_t key;
	CUresult rc = alloc32("cuArray3DCreate", NULL,
			      m1(desc->Width) * m1(desc->Height) * m1(desc->Depth) * fmt_bytes(desc->Format) *
				      m1(desc->NumChannels),
			      K_ARRAY, &key);
	if (rc == CUDA_SUCCESS)
		*a = (CUarray)(uintptr_t)key;
	return rc;
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------------- */

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
/* fakegraph.c, for the table (signatures there). */
#define FG(name) EXPORT CUresult name();
FG(cuGraphCreate) FG(cuGraphDestroy) FG(cuGraphAddKernelNode) FG(cuGraphAddKernelNode_v2)
FG(cuGraphKernelNodeGetParams) FG(cuGraphKernelNodeGetParams_v2) FG(cuGraphAddChildGraphNode)
FG(cuGraphChildGraphNodeGetGraph) FG(cuGraphAddEmptyNode) FG(cuGraphGetNodes) FG(cuGraphNodeGetType)
FG(cuGraphAddMemAllocNode) FG(cuGraphMemAllocNodeGetParams) FG(cuGraphAddMemFreeNode)
FG(cuGraphMemFreeNodeGetParams) FG(cuDeviceGraphMemTrim) FG(cuDeviceGetGraphMemAttribute)
FG(cuDeviceSetGraphMemAttribute) FG(cuGraphInstantiate) FG(cuGraphInstantiate_v2)
FG(cuGraphInstantiateWithFlags) FG(cuGraphInstantiateWithParams) FG(cuGraphInstantiateWithParams_ptsz)
FG(cuGraphExecDestroy) FG(cuGraphExecUpdate) FG(cuGraphExecUpdate_v2)
FG(cuGraphExecKernelNodeSetParams) FG(cuGraphExecKernelNodeSetParams_v2) FG(cuGraphExecNodeSetParams)
FG(cuGraphExecChildGraphNodeSetParams)
FG(cuGraphNodeSetEnabled) FG(cuGraphAddNode) FG(cuGraphUpload) FG(cuGraphUpload_ptsz) FG(cuGraphLaunch) FG(cuGraphLaunch_ptsz)
FG(cuStreamBeginCapture) FG(cuStreamBeginCapture_ptsz) FG(cuStreamBeginCapture_v2)
FG(cuStreamBeginCapture_v2_ptsz) FG(cuStreamEndCapture) FG(cuStreamEndCapture_ptsz) FG(cuStreamIsCapturing)
FG(cuStreamIsCapturing_ptsz) FG(cuStreamGetCaptureInfo) FG(cuStreamGetCaptureInfo_ptsz)
FG(cuStreamGetCaptureInfo_v2) FG(cuStreamGetCaptureInfo_v2_ptsz)
#undef FG
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
				    CUdriverProcAddressQueryResult *status);

struct entry {
	const char *base;
	int ver;     /* CUDA version the ABI appeared in */
	void *fn;
	void *ptsz;  /* per-thread-default-stream twin, if any */
};

/* fakemodule.c */
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleLoadDataEx(CUmodule *, const void *, unsigned, CUjit_option *, void **);
CUresult cuModuleLoadFatBinary(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLibraryLoadData(CUlibrary *, const void *, CUjit_option *, void **, unsigned, CUlibraryOption *, void **,
			   unsigned);
CUresult cuLibraryLoadFromFile(CUlibrary *, const char *, CUjit_option *, void **, unsigned, CUlibraryOption *,
			       void **, unsigned);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuLibraryGetModule(CUmodule *, CUlibrary);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);
CUresult cuCtxSetLimit(CUlimit, size_t);

#define E(base, ver, fn) {#base, ver, (void *)fn, NULL}
#define EP(base, ver, fn) {#base, ver, (void *)fn, (void *)fn##_ptsz}
static const struct entry table[] = {
	E(cuGetProcAddress, 11030, cuGetProcAddress),
	E(cuGetProcAddress, 12000, cuGetProcAddress_v2),
	E(cuInit, 2000, cuInit),
	E(cuDriverGetVersion, 2020, cuDriverGetVersion),
	E(cuDeviceGet, 2000, cuDeviceGet),
	E(cuDeviceGetCount, 2000, cuDeviceGetCount),
	E(cuDeviceGetName, 2000, cuDeviceGetName),
	E(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
	E(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
	E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
	E(cuDeviceTotalMem, 2000, cuDeviceTotalMem),
	E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
	E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
	E(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease),
	E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
	E(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset),
	E(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
	E(cuCtxCreate, 2000, cuCtxCreate),
	E(cuCtxCreate, 3020, cuCtxCreate_v2),
	E(cuCtxCreate, 11040, cuCtxCreate_v3),
	E(cuCtxCreate, 12050, cuCtxCreate_v4),
	E(cuCtxDestroy, 2000, cuCtxDestroy),
	E(cuCtxAttach, 2000, cuCtxAttach),
	E(cuGLCtxCreate, 2000, cuGLCtxCreate),
	E(cuGLCtxCreate, 3020, cuGLCtxCreate_v2),
	E(cuVDPAUCtxCreate, 3010, cuVDPAUCtxCreate),
	E(cuVDPAUCtxCreate, 3020, cuVDPAUCtxCreate_v2),
	E(cuCtxDestroy, 4000, cuCtxDestroy_v2),
	E(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
	E(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
	E(cuCtxGetDevice, 2000, cuCtxGetDevice),
	E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
	E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
	E(cuStreamCreate, 2000, cuStreamCreate),
	E(cuStreamDestroy, 4000, cuStreamDestroy_v2),
	E(cuStreamGetCtx, 9020, cuStreamGetCtx),
	E(cuMemPoolCreate, 11020, cuMemPoolCreate),
	E(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
	E(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
	E(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
	E(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),
	E(cuMemGetDefaultMemPool, 13000, cuMemGetDefaultMemPool),
	E(cuMemGetMemPool, 13000, cuMemGetMemPool),
	E(cuMemSetMemPool, 13000, cuMemSetMemPool),
	E(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
	E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
	E(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
	E(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle),
	E(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
	E(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
	E(cuMemPoolExportPointer, 11020, cuMemPoolExportPointer),
	E(cuMemPoolImportPointer, 11020, cuMemPoolImportPointer),
	E(cuGreenCtxCreate, 12040, cuGreenCtxCreate),
	E(cuGreenCtxDestroy, 12040, cuGreenCtxDestroy),
	E(cuCtxFromGreenCtx, 12040, cuCtxFromGreenCtx),
	E(cuDeviceGetDevResource, 12040, cuDeviceGetDevResource),
	E(cuDevResourceGenerateDesc, 12040, cuDevResourceGenerateDesc),
	E(cuMemPoolExportToShareableHandle, 11020, cuMemPoolExportToShareableHandle),
	E(cuMemPoolImportFromShareableHandle, 11020, cuMemPoolImportFromShareableHandle),
	E(cuImportExternalMemory, 10000, cuImportExternalMemory),
	E(cuDestroyExternalMemory, 10000, cuDestroyExternalMemory),
	E(cuExternalMemoryGetMappedBuffer, 10000, cuExternalMemoryGetMappedBuffer),
	E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),
	E(cuMulticastCreate, 12010, cuMulticastCreate),
	E(cuMulticastAddDevice, 12010, cuMulticastAddDevice),
	E(cuMulticastBindMem, 12010, cuMulticastBindMem),
	E(cuMulticastBindMem, 13010, cuMulticastBindMem_v2),
	E(cuMulticastBindAddr, 12010, cuMulticastBindAddr),
	E(cuMulticastBindAddr, 13010, cuMulticastBindAddr_v2),
	E(cuMulticastUnbind, 12010, cuMulticastUnbind),
	E(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo),
	E(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute),
	E(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute),
	E(cuEventSynchronize, 2000, cuEventSynchronize),
	E(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),
	E(cuCtxSynchronize, 2000, cuCtxSynchronize),
	EP(cuStreamSynchronize, 2000, cuStreamSynchronize),
	E(cuMemGetInfo, 2000, cuMemGetInfo),
	E(cuMemGetInfo, 3020, cuMemGetInfo_v2),
	E(cuMemAlloc, 2000, cuMemAlloc),
	E(cuMemAlloc, 3020, cuMemAlloc_v2),
	E(cuMemAllocPitch, 2000, cuMemAllocPitch),
	E(cuMemAllocPitch, 3020, cuMemAllocPitch_v2),
	E(cuMemAllocManaged, 6000, cuMemAllocManaged),
	EP(cuMemAllocAsync, 11020, cuMemAllocAsync),
	EP(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
	E(cuMemFree, 2000, cuMemFree),
	E(cuMemFree, 3020, cuMemFree_v2),
	EP(cuMemFreeAsync, 11020, cuMemFreeAsync),
	E(cuMemCreate, 10020, cuMemCreate),
	E(cuMemRelease, 10020, cuMemRelease),
	E(cuMemAddressReserve, 10020, cuMemAddressReserve),
	E(cuMemAddressFree, 10020, cuMemAddressFree),
	E(cuMemMap, 10020, cuMemMap),
	E(cuMemUnmap, 10020, cuMemUnmap),
	E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
	E(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
	E(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
	E(cuMemSetAccess, 10020, cuMemSetAccess),
	E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
	E(cuArrayCreate, 2000, cuArrayCreate),
	E(cuArrayCreate, 3020, cuArrayCreate_v2),
	E(cuArray3DCreate, 2000, cuArray3DCreate),
	E(cuArray3DCreate, 3020, cuArray3DCreate_v2),
	E(cuArrayDestroy, 2000, cuArrayDestroy),
	E(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate),
	E(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy),
	EP(cuMemMapArrayAsync, 11010, cuMemMapArrayAsync),
	{"cuLaunchKernel", 4000, (void *)cuLaunchKernel, NULL},
	{"cuLaunchKernel", 7000, (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
	EP(cuLaunchKernelEx, 11060, cuLaunchKernelEx),
	EP(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel),
	E(cuLaunch, 2000, cuLaunch),
	E(cuLaunchGrid, 2000, cuLaunchGrid),
	E(cuLaunchGridAsync, 2000, cuLaunchGridAsync),
	E(cuLaunchCooperativeKernelMultiDevice, 9000, cuLaunchCooperativeKernelMultiDevice),
	EP(cuGraphLaunch, 10000, cuGraphLaunch),
	E(cuGraphCreate, 10000, cuGraphCreate),
	E(cuGraphDestroy, 10000, cuGraphDestroy),
	E(cuGraphAddKernelNode, 10000, cuGraphAddKernelNode),
	E(cuGraphAddKernelNode, 12000, cuGraphAddKernelNode_v2),
	E(cuGraphKernelNodeGetParams, 10000, cuGraphKernelNodeGetParams),
	E(cuGraphKernelNodeGetParams, 12000, cuGraphKernelNodeGetParams_v2),
	E(cuGraphAddChildGraphNode, 10000, cuGraphAddChildGraphNode),
	E(cuGraphChildGraphNodeGetGraph, 10000, cuGraphChildGraphNodeGetGraph),
	E(cuGraphAddEmptyNode, 10000, cuGraphAddEmptyNode),
	E(cuGraphGetNodes, 10000, cuGraphGetNodes),
	E(cuGraphNodeGetType, 10000, cuGraphNodeGetType),
	E(cuGraphAddMemAllocNode, 11040, cuGraphAddMemAllocNode),
	E(cuGraphMemAllocNodeGetParams, 11040, cuGraphMemAllocNodeGetParams),
	E(cuGraphAddMemFreeNode, 11040, cuGraphAddMemFreeNode),
	E(cuGraphMemFreeNodeGetParams, 11040, cuGraphMemFreeNodeGetParams),
	E(cuDeviceGraphMemTrim, 11040, cuDeviceGraphMemTrim),
	E(cuDeviceGetGraphMemAttribute, 11040, cuDeviceGetGraphMemAttribute),
	E(cuDeviceSetGraphMemAttribute, 11040, cuDeviceSetGraphMemAttribute),
	E(cuGraphInstantiate, 10000, cuGraphInstantiate),
	E(cuGraphInstantiate, 11000, cuGraphInstantiate_v2),
	/* 12.x headers map cuGraphInstantiate to ...WithFlags; what the driver
	 * returns for the base name at >= 11040 is unverified (ABI notes). */
	E(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
	EP(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams),
	E(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
	E(cuGraphExecUpdate, 10020, cuGraphExecUpdate),
	E(cuGraphExecUpdate, 12000, cuGraphExecUpdate_v2),
	E(cuGraphExecKernelNodeSetParams, 10010, cuGraphExecKernelNodeSetParams),
	E(cuGraphExecKernelNodeSetParams, 12000, cuGraphExecKernelNodeSetParams_v2),
	E(cuGraphExecNodeSetParams, 12020, cuGraphExecNodeSetParams),
	E(cuGraphExecChildGraphNodeSetParams, 11010, cuGraphExecChildGraphNodeSetParams),
	E(cuGraphNodeSetEnabled, 11060, cuGraphNodeSetEnabled),
	E(cuGraphAddNode, 12020, cuGraphAddNode),
	EP(cuGraphUpload, 11010, cuGraphUpload),
	EP(cuStreamBeginCapture, 10000, cuStreamBeginCapture),
	EP(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2),
	EP(cuStreamEndCapture, 10000, cuStreamEndCapture),
	EP(cuStreamIsCapturing, 10000, cuStreamIsCapturing),
	EP(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo),
	EP(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2),
	E(cuGetErrorString, 6000, cuGetErrorString),
	E(cuModuleLoad, 2000, cuModuleLoad),
	E(cuModuleLoadData, 2000, cuModuleLoadData),
	E(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx),
	E(cuModuleLoadFatBinary, 2000, cuModuleLoadFatBinary),
	E(cuModuleUnload, 2000, cuModuleUnload),
	E(cuModuleGetFunction, 2000, cuModuleGetFunction),
	E(cuLibraryLoadData, 12000, cuLibraryLoadData),
	E(cuLibraryLoadFromFile, 12000, cuLibraryLoadFromFile),
	E(cuLibraryUnload, 12000, cuLibraryUnload),
	E(cuLibraryGetKernel, 12000, cuLibraryGetKernel),
	E(cuLibraryGetModule, 12000, cuLibraryGetModule),
	E(cuKernelGetFunction, 12000, cuKernelGetFunction),
	E(cuCtxSetLimit, 3010, cuCtxSetLimit),
};

/* 0 found, 1 unknown name, 2 only in a newer version. */
static int lookup(const char *sym, int ver, cuuint64_t flags, void **pfn)
{
	const struct entry *best = NULL;
	int known = 0;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		if (strcmp(table[i].base, sym) != 0)
			continue;
		known = 1;
		if (table[i].ver <= ver && (!best || table[i].ver > best->ver))
			best = &table[i];
	}
	if (!best)
		return fkx_lookup(sym, ver, pfn, known);
	*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz ? best->ptsz : best->fn;
	return 0;
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
	if (!sym || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	int r = lookup(sym, ver, flags, pfn);
	fkx_trace_proc(4, sym, ver, flags, r);
	return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
				    CUdriverProcAddressQueryResult *status)
{
	if (!sym || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	int r = lookup(sym, ver, flags, pfn);
	fkx_trace_proc(5, sym, ver, flags, r);
	if (status)
		*status = r;
	return CUDA_SUCCESS;
}

void *fk_primary_ctx(int d)
{
	if (!fk || d < 0 || d >= fk->ndev)
		return NULL;
	primary_ctx[d].dev = d;
	primary_ctx[d].primary = 1;
	return &primary_ctx[d];
}
