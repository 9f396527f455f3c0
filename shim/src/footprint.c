/*
 * A process's device memory beyond its counted allocations: the "context
 * footprint". The context itself, loaded modules and kernels (with lazy
 * loading, the default since CUDA 12.2, each kernel at its first use), local
 * memory for thread stacks (cuCtxSetLimit, and grown at launch by a kernel
 * that needs more), the device malloc heap, the printf FIFO. The driver
 * reports it only as NVML's per-process used memory, under the host pid; the
 * footprint is that minus what the shim counts for the process.
 *
 * When it is measured:
 *  - after a context is created (its first footprint);
 *  - after module and library loads and unloads and cuCtxSetLimit;
 *  - at the next counted allocation after a function lookup (where lazy
 *    loading loads code) or a measure that found less than is counted;
 *  - at most once a second from the allocation path, and twice a second from
 *    the SM limiter's watcher where one runs, for what grows at launch.
 * Never on the launch path.
 *
 * Growth is counted at once, even past the quota: the driver has already
 * reserved the memory and nothing can refuse it after the fact. Later
 * allocations then fail, and the growth past the quota is said once. A lower
 * measure is believed only when the next one agrees: an allocation that is
 * reserved but not yet made (or freed but not yet given back) makes a
 * measure low, never high.
 *
 * What NVML cannot tell leaves the footprint as it was: no host pid, an error,
 * the process missing from the list, or NVML_VALUE_NOT_AVAILABLE (always so
 * under WSL2 / WDDM). Unknown is neither zero nor 2^64-1 bytes.
 *
 * Without the host pid nothing can be measured, and a tenant can make the
 * host pid ambiguous on purpose (hostpid.c then leaves it unknown). The
 * limits that reserve memory are still charged then, from what is asked:
 * the heap and the printf FIFO their size, the stack its size for every
 * thread the device can hold (SMs x threads per SM, from the device's
 * attributes), the growth over the value in force reserved before the call
 * like any allocation (refused past the quota), a decrease giving back at
 * most what was charged so. Module code and what grows at launch stay
 * uncounted until the host pid is known (a measure then replaces it all).
 *
 * Without a usable NVML (none beside the driver's libcuda, nvmlInit failed,
 * no handle for the GPU) nothing is ever measured: each new context is
 * charged a fixed bound (VGPU_FP_BOUND, below) instead, refused past the
 * quota, and the limits are charged from the value asked as above.
 *
 * NVML is asked with no lock held; the answer is applied under a mutex of
 * this process only (taken before the region's, never the other way round).
 * Each context's share is remembered, so destroying it gives that back.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "core.h"
#include "footprint.h"
#include "hostpid.h"
#include "lifecycle.h"
#include "log.h"
#include "mem.h"
#include "quota.h"
#include "real.h"
#include "track.h"

#define MAX_ENTS 64              /* contexts with a footprint; more share one entry */
#define POLL_NS 1000000000ll     /* the allocation path measures at most this often */
#define WATCH_EVERY 25           /* watcher periods (20 ms) between its measures */

/* The footprint attributed to a context on a limits index. ctx NULL: none
 * known (the host pid was found later, or too many contexts). */
struct ent {
	CUcontext ctx;
	int idx;
	uint64_t bytes;
	uint64_t est[3]; /* of bytes: charged by vgpu_fp_limit_* per CUlimit (0..2) */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ent ents[MAX_ENTS];
static uint64_t total[VGPU_MAX_DEVICES];  /* sum of the entries per index: what is counted */
static uint64_t prev[VGPU_MAX_DEVICES];   /* the last measure, to confirm a lower one */
static unsigned char have_prev[VGPU_MAX_DEVICES];
static unsigned char active[VGPU_MAX_DEVICES]; /* this process has had a context there */
static nvmlDevice_t handles[VGPU_MAX_DEVICES];
static int any;          /* some index is active: the allocation path has something to do */
static int dirty;        /* measure at the next allocation */
static int64_t due_ns;   /* CLOCK_MONOTONIC_COARSE: the next periodic measure */
static int busy;         /* a thread is measuring: others need not */
static int warned_na, warned_list, warned_over;

/*
 * A new context's own memory when NVML cannot measure it at all (no NVML
 * beside the driver's libcuda, nvmlInit failed, no handle for the GPU:
 * VGPU_FP_BOUND, footprint.h). On an H200 the primary context held 518 MiB at
 * creation and 804 MiB once cuBLAS and cuDNN kernels had loaded
 * (docs/validation.md, "When a context's memory shows"); without NVML that
 * later growth cannot be seen either, so the bound covers it, rounded up to
 * 1 GiB. Charged like an allocation, before anything else of the context's,
 * and refused past the quota (the context is then undone): nothing, as
 * before, let a tenant that breaks NVML hold a context a process for free.
 */
_Static_assert(VGPU_FP_BOUND >= (804ull << 20), "the bound covers what an H200 context measured");

/* NVML's handle for limits index idx, or NULL (NVML unusable: said once by real.c). */
static nvmlDevice_t handle(int idx)
{
	nvmlDevice_t h = __atomic_load_n(&handles[idx], __ATOMIC_ACQUIRE);
	if (h)
		return h;
	if (!vgpu_nvml_usable())
		return NULL;
	if (vgpu_nvml_handle_by_uuid(vgpu.limits.gpu[idx].uuid, &h) != NVML_SUCCESS) {
		vgpu_nvml_unknown_gpu(vgpu.limits.gpu[idx].uuid);
		return NULL;
	}
	__atomic_store_n(&handles[idx], h, __ATOMIC_RELEASE);
	return h;
}

/* What NVML says this process holds on idx: 0 and *out, or -1 when it cannot
 * tell. created: the context whose creation is being measured, or NULL. */
static int nvml_mine(int idx, CUcontext created, uint64_t *out)
{
	int32_t hp = vgpu_host_pid();
	nvmlDevice_t h;
	if (!hp || !(h = handle(idx)))
		return -1;
	nvmlProcessInfo_v1_t *v;
	unsigned n;
	if (vgpu_nvml_list_procs_at(h, created, &v, &n) != 0) {
		if (!__atomic_exchange_n(&warned_list, 1, __ATOMIC_RELAXED))
			LOGD("NVML's process list is unavailable: the context footprint is left as last measured");
		return -1;
	}
	int rc = -1;
	for (unsigned i = 0; i < n; i++)
		if (v[i].pid == (unsigned)hp) {
			*out = v[i].usedGpuMemory;
			rc = 0;
		}
	free(v);
	if (rc == 0 && *out == NVML_VALUE_NOT_AVAILABLE) {
		if (!__atomic_exchange_n(&warned_na, 1, __ATOMIC_RELAXED))
			LOGI("NVML does not report per-process GPU memory here (as under WSL2): the context "
			     "footprint is not counted");
		return -1;
	}
	return rc;
}

/* The entry of (ctx, idx), made if asked and possible; the NULL-context one otherwise. */
static struct ent *entry(CUcontext ctx, int idx, int make)
{
	struct ent *spare = NULL, *none = NULL;
	for (int i = 0; i < MAX_ENTS; i++) {
		struct ent *e = &ents[i];
		if (e->bytes || e->ctx) {
			if (e->idx == idx && e->ctx == ctx)
				return e;
			if (e->idx == idx && !e->ctx)
				none = e;
		} else if (!spare) {
			spare = e;
		}
	}
	if (!make)
		return NULL;
	if (spare && (ctx || !none)) {
		spare->ctx = ctx;
		spare->idx = idx;
		return spare;
	}
	return none; /* NULL only when the table is full and has no NULL-context entry */
}

/* Growth goes to ctx (a new context), else to the calling thread's current
 * context, else to the first entry of idx. Caller holds mu. */
static struct ent *grow_to(CUcontext ctx, int idx)
{
	struct ent *e;
	if (ctx)
		return entry(ctx, idx, 1);
	vgpu_cu_ctx_get_current(&ctx);
	ctx = vgpu_ctx_owner(ctx);
	if (ctx && (e = entry(ctx, idx, 0)))
		return e;
	for (int i = 0; i < MAX_ENTS; i++)
		if (ents[i].idx == idx && (ents[i].bytes || ents[i].ctx))
			return &ents[i];
	return entry(ctx, idx, 1);
}

/* Takes bytes off idx's entries, the calling thread's context first. Caller holds mu. */
static void shrink(int idx, uint64_t bytes)
{
	CUcontext cur = NULL;
	vgpu_cu_ctx_get_current(&cur);
	cur = vgpu_ctx_owner(cur);
	for (int pass = 0; pass < 2 && bytes; pass++)
		for (int i = 0; i < MAX_ENTS && bytes; i++) {
			struct ent *e = &ents[i];
			if (e->idx != idx || (pass == 0 && e->ctx != cur))
				continue;
			uint64_t t = e->bytes < bytes ? e->bytes : bytes;
			e->bytes -= t;
			bytes -= t;
		}
}

/* Measures idx and counts the difference; growth is attributed to ctx if
 * given. Returns 1 when the count grew, else 0. */
static int measure(int idx, CUcontext ctx, int *over_out)
{
	uint64_t mine;
	if (nvml_mine(idx, ctx, &mine) != 0)
		return 0;
	int over = 0, grew = 0;
	pthread_mutex_lock(&mu);
	/* IPC imports are counted for this process but, as far as is known, are
	 * in the exporter's figure, not ours: left out of what NVML's is compared
	 * with (were they in ours, they would count twice: over, never under). */
	uint64_t fp = total[idx], own = vgpu_quota_held(idx), ipc = vgpu_track_ipc_bytes(idx);
	uint64_t allocs = own > fp ? own - fp : 0;
	allocs = allocs > ipc ? allocs - ipc : 0;
	uint64_t m = mine > allocs ? mine - allocs : 0, target = m;
	if (m < fp) {
		/* Lower: only as low as the previous measure, and only if that was lower too. */
		target = have_prev[idx] && prev[idx] < fp ? (prev[idx] > m ? prev[idx] : m) : fp;
		if (target == fp)
			__atomic_store_n(&dirty, 1, __ATOMIC_RELAXED); /* confirm at the next allocation */
	}
	prev[idx] = m;
	have_prev[idx] = 1;
	if (target > fp) {
		struct ent *e = grow_to(ctx, idx);
		if (e) {
			e->bytes += target - fp;
			total[idx] = target;
			/* Not in the ledger (no slot to publish it in): the others cannot
			 * see it, so a new context is undone as if past the limit. */
			int unrecorded = vgpu_quota_charge_force(idx, target - fp) != 0;
			uint64_t limit = vgpu.limits.gpu[idx].memory;
			over = (limit && vgpu_quota_used(idx) > limit) || (unrecorded && ctx);
			grew = 1;
		}
	} else if (target < fp) {
		shrink(idx, fp - target);
		total[idx] = target;
		vgpu_quota_uncharge(idx, fp - target);
	}
	pthread_mutex_unlock(&mu);
	if (over_out)
		*over_out = over;
	/* A new context past the limit is undone by its creator (mem.c), which says so. */
	if (over && !ctx && !__atomic_exchange_n(&warned_over, 1, __ATOMIC_RELAXED))
		LOGW("GPU memory on %s: the driver's own memory for this process (context footprint: modules, "
		     "stacks, heap) grew to %llu bytes and the container now holds %llu of %llu; it cannot be "
		     "refused after the fact, further allocations fail until memory is freed",
		     vgpu.limits.gpu[idx].uuid, (unsigned long long)target, (unsigned long long)vgpu_quota_used(idx),
		     (unsigned long long)vgpu.limits.gpu[idx].memory);
	return grew;
}

/* Measures every index this process has a context on (one thread at a time). */
static void measure_all(void)
{
	if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&dirty, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&due_ns, vgpu_coarse_ns() + POLL_NS, __ATOMIC_RELAXED);
	for (int i = 0; i < vgpu.limits.ngpu && i < VGPU_MAX_DEVICES; i++)
		if (__atomic_load_n(&active[i], __ATOMIC_RELAXED))
			measure(i, NULL, NULL);
	__atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
}

int vgpu_fp_ctx_created(CUcontext ctx, CUdevice dev)
{
	if (vgpu.mode != VGPU_ENFORCE || !ctx)
		return 0;
	int idx = vgpu_device_index(dev);
	if (idx < 0 || idx >= VGPU_MAX_DEVICES)
		return 0;
	if (!handle(idx)) {
		/* Nothing can measure it: the bound, charged like an allocation. */
		if (vgpu_quota_charge(idx, VGPU_FP_BOUND) != 0)
			return 1;
		pthread_mutex_lock(&mu);
		struct ent *e = entry(ctx, idx, 1);
		if (e)
			e->bytes += VGPU_FP_BOUND, total[idx] += VGPU_FP_BOUND;
		/* else: the table is full; stays reserved, counted for the process until it exits */
		pthread_mutex_unlock(&mu);
		return 0;
	}
	__atomic_store_n(&active[idx], 1, __ATOMIC_RELAXED);
	__atomic_store_n(&any, 1, __ATOMIC_RELEASE);
	int over_after = 0;
	int grew = measure(idx, ctx, &over_after);
	__atomic_store_n(&due_ns, vgpu_coarse_ns() + POLL_NS, __ATOMIC_RELAXED);
	return grew && over_after;
}

void vgpu_fp_ctx_gone(CUcontext ctx)
{
	if (!ctx)
		return;
	uint64_t back[VGPU_MAX_DEVICES] = {0};
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_ENTS; i++) {
		struct ent *e = &ents[i];
		if (e->ctx != ctx)
			continue;
		back[e->idx] += e->bytes;
		total[e->idx] -= e->bytes;
		have_prev[e->idx] = 0; /* measured with the context alive */
		memset(e, 0, sizeof(*e));
	}
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		vgpu_quota_uncharge(d, back[d]);
	pthread_mutex_unlock(&mu);
}

void vgpu_fp_changed(void)
{
	if (!__atomic_load_n(&any, __ATOMIC_ACQUIRE))
		return;
	/* Marked first: if another thread is measuring, the next allocation does. */
	__atomic_store_n(&dirty, 1, __ATOMIC_RELAXED);
	measure_all();
}

void vgpu_fp_mark(void)
{
	if (__atomic_load_n(&any, __ATOMIC_RELAXED))
		__atomic_store_n(&dirty, 1, __ATOMIC_RELAXED);
}

void vgpu_fp_poll(void)
{
	if (likely(!__atomic_load_n(&any, __ATOMIC_RELAXED)))
		return;
	if (__atomic_load_n(&dirty, __ATOMIC_RELAXED) || vgpu_coarse_ns() >= __atomic_load_n(&due_ns, __ATOMIC_RELAXED))
		measure_all();
}

void vgpu_fp_watch(unsigned period)
{
	if (period % WATCH_EVERY == 0 && __atomic_load_n(&any, __ATOMIC_ACQUIRE))
		measure_all();
}

static void after_fork(void)
{
	/* The child holds none of the parent's contexts; NVML is initialised anew. */
	pthread_mutex_init(&mu, NULL);
	memset(ents, 0, sizeof(ents));
	memset(total, 0, sizeof(total));
	memset(have_prev, 0, sizeof(have_prev));
	memset(active, 0, sizeof(active));
	memset(handles, 0, sizeof(handles));
	any = dirty = busy = 0;
	due_ns = 0;
	warned_na = warned_list = warned_over = 0;
}
VGPU_LIFECYCLE(footprint, .order = VGPU_ORDER_FOOTPRINT, .after_fork = after_fork);

/* ---- limits while the host pid is unknown ---------------------------------------------- */

/* Bytes a limit of value holds on dev (saturating); 0 when the device cannot say. */
static uint64_t limit_bytes(int which, size_t value, CUdevice dev)
{
	if (which != CU_LIMIT_STACK_SIZE)
		return value;
	int sms = 0, per = 0;
	if (vgpu_cu_device_attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
	    vgpu_cu_device_attr(&per, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
	    sms <= 0 || per <= 0)
		per = sms = 0;
	if (!sms) {
		/* Unknown: the most any GPU holds so far (2048 threads x 256 SMs), not nothing. */
		sms = 256;
		per = 2048;
	}
	uint64_t threads = (uint64_t)sms * (uint64_t)per;
	return value > UINT64_MAX / threads ? UINT64_MAX : (uint64_t)value * threads;
}

int vgpu_fp_limit_charge(CUlimit limit, size_t value, struct vgpu_fp_limit *l)
{
	static CUresult (*get)(size_t *, CUlimit);
	memset(l, 0, sizeof(*l));
	l->idx = -1;
	if (vgpu.mode != VGPU_ENFORCE || limit < CU_LIMIT_STACK_SIZE || limit > CU_LIMIT_MALLOC_HEAP_SIZE)
		return 0; /* holds no memory */
	CUcontext ctx = NULL;
	CUdevice dev;
	int idx;
	if (vgpu_cu_ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx || (idx = vgpu_current_index(&dev)) < 0 ||
	    idx >= VGPU_MAX_DEVICES)
		return 0; /* no context or not a GPU of ours: the driver answers */
	if (vgpu_host_pid() != 0 && handle(idx))
		return 0; /* measured after the call (modules.c) */
	ctx = vgpu_ctx_owner(ctx);
	if (!get) {
		void *lib = vgpu_lib_handle(LIB_CUDA);
		get = lib ? (CUresult(*)(size_t *, CUlimit))vgpu_real_dlsym(lib, "cuCtxGetLimit") : NULL;
	}
	size_t cur = 0; /* unknown: everything asked is growth */
	if (get && get(&cur, limit) != CUDA_SUCCESS)
		cur = 0;
	uint64_t now = limit_bytes(limit, cur, dev), want = limit_bytes(limit, value, dev);
	pthread_mutex_lock(&mu);
	struct ent *e = entry(ctx, idx, 1);
	uint64_t charged = e ? e->est[limit] : 0;
	pthread_mutex_unlock(&mu);
	int64_t delta;
	if (want > now)
		delta = want - now > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)(want - now);
	else
		delta = -(int64_t)(now - want < charged ? now - want : charged);
	if (delta > 0 && vgpu_mem_charge_index(idx, (uint64_t)delta) != GO_COUNTED) {
		LOGI("cuCtxSetLimit(%d, %zu) refused: %lld bytes more than the value in force, counted from the "
		     "value asked as the driver's own memory cannot be measured (host pid unknown, or NVML unusable)",
		     (int)limit, value, (long long)delta);
		return -1;
	}
	*l = (struct vgpu_fp_limit){ctx, idx, limit, delta};
	return 0;
}

void vgpu_fp_limit_settle(CUresult rc, const struct vgpu_fp_limit *l)
{
	if (l->idx < 0 || !l->delta)
		return;
	if (rc != CUDA_SUCCESS) {
		if (l->delta > 0)
			vgpu_quota_uncharge(l->idx, (uint64_t)l->delta);
		return;
	}
	uint64_t back = 0;
	pthread_mutex_lock(&mu);
	/* Kept with the context's footprint: its destruction gives it back, a
	 * measure (once the host pid is known) replaces it. */
	struct ent *e = entry(l->ctx, l->idx, 1);
	if (l->delta > 0) {
		if (e) {
			e->bytes += (uint64_t)l->delta;
			e->est[l->which] += (uint64_t)l->delta;
			total[l->idx] += (uint64_t)l->delta;
		} /* else: stays reserved, counted for the process until it exits */
	} else if (e) {
		back = (uint64_t)-l->delta;
		back = back < e->est[l->which] ? back : e->est[l->which];
		back = back < e->bytes ? back : e->bytes;
		e->est[l->which] -= back;
		e->bytes -= back;
		total[l->idx] -= back;
	}
	pthread_mutex_unlock(&mu);
	vgpu_quota_uncharge(l->idx, back);
}
