/*
 * This process's pid as NVML reports it (the "host pid").
 *
 * NVML names processes by their pid in the host's namespace; a container
 * with its own pid namespace knows only getpid() in its own. The SM limiter
 * (NVML's per-process utilisation) matches NVML's pids against the host pids
 * the container's processes claim in the ledger, the context footprint
 * (NVML's per-process memory) against this process's, so each process must
 * find its own:
 *
 *  1. Cheap route: /proc/self/stat gives our pid as the namespace /proc
 *     was mounted in numbers it (the first entry of NSpid in
 *     /proc/self/status). When that is not getpid(), /proc comes from an
 *     ancestor namespace and the number is the outermost pid visible; it is
 *     recorded when the slot is registered (read once, with the start
 *     time the region needs: region.c).
 *  2. Discovery, once per process, around its first context on a device:
 *     NVML's compute-process list before and after. A pid that is new is
 *     ours if it is the only one; preferred: the pid known without NVML
 *     (route 1's, or getpid() in the initial pid namespace) when it is
 *     among them. Otherwise several new pids mean other processes (of this
 *     container or another) started contexts at the same moment: a short probe
 *     allocation (a size drawn at random) shows which of them grew by
 *     exactly that much, retried a few times with backoff.
 *     No lock is held across any of it (the context creation, NVML, the
 *     probe): a process stopped or slow mid-way must not hold up the
 *     container's other processes, and a callback that allocates from inside
 *     the driver's context creation must not wait on its own thread. Two of
 *     the container's processes starting at once are told apart like
 *     processes of two containers.
 *     What other processes claim is not consulted: the tenant could claim
 *     the new pid first and leave this process's context uncounted. No new
 *     pid: a context we did not see created already existed, and in the
 *     initial pid namespace getpid() is NVML's pid if NVML lists it.
 *  What stays ambiguous stays unknown (0, logged once at debug level): a
 *  wrong host pid would throttle or charge the container for another's work.
 *
 * NVML is the judge of its own numbering: a driver that reports pids in the
 * caller's namespace simply lists getpid() as the new pid. A fork child starts
 * over (its contexts are its own).
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "hostpid.h"
#include "lifecycle.h"
#include "log.h"
#include "real.h"
#include "region.h"

#define MAX_DEV 64          /* CUDA ordinals tracked for "first context here" */
#define PROBE_TRIES 4
#define PROBE_UNIT (2u << 20) /* GPU allocation granularity: 2 MiB */
#define PROBE_MAX_UNITS 8
#define INIT_PID_NS "pid:[4026531836]" /* PROC_PID_INIT_INO: the initial pid namespace */

static int32_t host_pid;  /* 0 = unknown */
static int nspid_read;    /* host_pid holds the cheap route's result (or 0) */
static int confirmed;     /* discovery found host_pid; nothing left to do */
static int gave_up_logged;
static unsigned char ctx_seen[MAX_DEV]; /* this process has had a context on the device */

int32_t vgpu_host_pid(void)
{
	if (unlikely(!__atomic_load_n(&nspid_read, __ATOMIC_ACQUIRE))) {
		int32_t outer = vgpu_outer_pid();
		int32_t none = 0;
		/* Discovery may have stored a value meanwhile: it wins. */
		__atomic_compare_exchange_n(&host_pid, &none, outer, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
		__atomic_store_n(&nspid_read, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&host_pid, __ATOMIC_RELAXED);
}

static int in_init_pid_ns(void)
{
	char link[64];
	ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
	if (n <= 0)
		return 0;
	link[n] = '\0';
	return strcmp(link, INIT_PID_NS) == 0;
}

#define MAX_PROCS_LISTED (1u << 20) /* a count beyond this is not believed */

static unsigned listed_last; /* how many the last list held: the next is sized for it */

/* The list discovery took right after a context was created, kept for the
 * footprint's first measure of that context, which the same thread makes
 * next (mem.c): one query of the driver fewer at every process's start. */
static __thread nvmlProcessInfo_v1_t *snap;
static __thread unsigned snap_n;
static __thread nvmlDevice_t snap_dev;
static __thread CUcontext snap_ctx;

static void snap_put(nvmlDevice_t dev, CUcontext ctx, nvmlProcessInfo_v1_t *v, unsigned n)
{
	free(snap);
	snap = v;
	snap_n = n;
	snap_dev = dev;
	snap_ctx = ctx;
}

int vgpu_nvml_list_procs_at(nvmlDevice_t dev, CUcontext created, nvmlProcessInfo_v1_t **out, unsigned *n)
{
	if (created && snap && snap_dev == dev && snap_ctx == created) {
		*out = snap;
		*n = snap_n;
		snap = NULL;
		return 0;
	}
	return vgpu_nvml_list_procs(dev, out, n);
}

/* NVML's compute processes on dev, in a malloc'ed array; -1 on error. The
 * array is sized for the last answer and some more (each query is a driver
 * call that hundreds of processes starting at once make in turn), and again
 * from the count NVML answers with INSUFFICIENT_SIZE if that was short. */
int vgpu_nvml_list_procs(nvmlDevice_t dev, nvmlProcessInfo_v1_t **out, unsigned *n)
{
	unsigned cap = __atomic_load_n(&listed_last, __ATOMIC_RELAXED);
	cap = cap ? cap + cap / 4 + 16 : 1024; /* 16 KiB: one query for the first list too */
	*out = NULL;
	for (int tries = 0; tries < 4; tries++) {
		nvmlProcessInfo_v1_t *v = realloc(*out, cap * sizeof(*v));
		if (!v)
			break;
		*out = v;
		unsigned count = cap;
		nvmlReturn_t rc = vgpu_nvml_compute_procs(dev, &count, v);
		if (rc == NVML_SUCCESS) {
			*n = count < cap ? count : cap;
			__atomic_store_n(&listed_last, *n, __ATOMIC_RELAXED);
			return 0;
		}
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE || count > MAX_PROCS_LISTED)
			break;
		cap = count + 16; /* processes may start in between */
	}
	free(*out);
	*out = NULL;
	return -1;
}
#define list_procs vgpu_nvml_list_procs

static const nvmlProcessInfo_v1_t *find(const nvmlProcessInfo_v1_t *v, unsigned n, unsigned pid)
{
	for (unsigned i = 0; i < n; i++)
		if (v[i].pid == pid)
			return &v[i];
	return NULL;
}

static int cmp_pid(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	return x < y ? -1 : x > y;
}

/* The pids of v, sorted, in a malloc'ed array (NULL when out of memory): a
 * node's lists hold hundreds of processes, and matching two of them entry by
 * entry cost each starting process a quarter of a million comparisons. */
static unsigned *sorted_pids(const nvmlProcessInfo_v1_t *v, unsigned n)
{
	unsigned *p = malloc((n ? n : 1) * sizeof(*p));
	for (unsigned i = 0; p && i < n; i++)
		p[i] = v[i].pid;
	if (p)
		qsort(p, n, sizeof(*p), cmp_pid);
	return p;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000l};
	while (nanosleep(&ts, &ts) != 0)
		;
}

/*
 * Which candidate is this process: allocate a random multiple of the
 * allocation granularity in ctx (straight from the driver: not counted, and
 * freed at once) and see whose NVML memory grew by exactly that. Returns the
 * pid, or 0 when no try singles one out.
 */
static int32_t probe(nvmlDevice_t nd, CUcontext ctx, const unsigned *cand, unsigned ncand)
{
	CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))vgpu_lib_sym(HOOK_cuMemAlloc_v2);
	CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))vgpu_lib_sym(HOOK_cuMemFree_v2);
	CUcontext prev = NULL;
	if (!alloc || !release || vgpu_cu_ctx_get_current(&prev) != CUDA_SUCCESS)
		return 0;
	if (prev != ctx && vgpu_cu_ctx_set_current(ctx) != CUDA_SUCCESS)
		return 0;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)now.tv_nsec;
	int32_t found = 0;
	for (int t = 0; t < PROBE_TRIES && !found; t++) {
		if (t)
			sleep_ms(2u + (unsigned)rand_r(&seed) % (5u * (unsigned)t)); /* desynchronise from other probers */
		uint64_t bytes = (uint64_t)PROBE_UNIT * (1u + (unsigned)rand_r(&seed) % PROBE_MAX_UNITS);
		nvmlProcessInfo_v1_t *s1 = NULL, *s2 = NULL;
		unsigned n1 = 0, n2 = 0;
		CUdeviceptr p = 0;
		if (list_procs(nd, &s1, &n1) == 0 && alloc(&p, (size_t)bytes) == CUDA_SUCCESS) {
			int ok = list_procs(nd, &s2, &n2) == 0;
			release(p);
			unsigned hits = 0;
			for (unsigned i = 0; ok && i < ncand; i++) {
				const nvmlProcessInfo_v1_t *a = find(s1, n1, cand[i]), *b = find(s2, n2, cand[i]);
				if (a && b && b->usedGpuMemory - a->usedGpuMemory == bytes) {
					hits++;
					found = (int32_t)cand[i];
				}
			}
			if (hits != 1)
				found = 0;
		}
		free(s1);
		free(s2);
	}
	if (prev != ctx)
		vgpu_cu_ctx_set_current(prev);
	return found;
}

int vgpu_hostpid_before(CUdevice dev, struct vgpu_hostpid_scan *s)
{
	s->active = 0;
	if (vgpu.mode != VGPU_ENFORCE || dev < 0 || dev >= MAX_DEV)
		return 0;
	if (__atomic_load_n(&confirmed, __ATOMIC_ACQUIRE) || __atomic_load_n(&ctx_seen[dev], __ATOMIC_RELAXED))
		return 0;
	int idx = vgpu_device_index(dev);
	if (idx < 0 || vgpu_nvml_init() != NVML_SUCCESS ||
	    vgpu_nvml_handle_by_uuid(vgpu.limits.gpu[idx].uuid, &s->nvml) != NVML_SUCCESS)
		return 0;
	vgpu_host_pid(); /* the cheap answer first, so discovery's result replaces it */
	/* Two threads of this process may both get here: each decides on its own
	 * lists, and a pid both find is the same answer. */
	if (list_procs(s->nvml, &s->before, &s->nbefore) != 0)
		return 0;
	s->dev = dev;
	s->active = 1;
	return 1;
}

/*
 * Our pid in NVML's numbering as far as it is known without NVML: the pid
 * /proc shows where /proc is an ancestor namespace's (route 1), getpid() in
 * the initial pid namespace (where a driver numbering pids globally and one
 * numbering them in the caller's namespace agree), else 0. Preferred among
 * new pids: it spares the probe when many processes start contexts at once.
 */
static int32_t known_pid(void)
{
	int32_t outer = vgpu_outer_pid();
	if (outer)
		return outer;
	return in_init_pid_ns() ? (int32_t)getpid() : 0;
}

/* Picks our pid out of NVML's lists (see the top of the file); 0 when unsure. */
static int32_t decide(struct vgpu_hostpid_scan *s, CUcontext ctx, const char **why, const char **how)
{
	nvmlProcessInfo_v1_t *after = NULL;
	unsigned nafter = 0;
	if (list_procs(s->nvml, &after, &nafter) != 0) {
		*why = "NVML's process list is unavailable";
		return 0;
	}
	unsigned *cand = malloc((nafter ? nafter : 1) * sizeof(*cand)), ncand = 0;
	unsigned *before = sorted_pids(s->before, s->nbefore);
	int32_t pick = 0;
	for (unsigned i = 0; cand && before && i < nafter; i++) {
		unsigned pid = after[i].pid;
		if (pid && pid <= INT32_MAX && !bsearch(&pid, before, s->nbefore, sizeof(*before), cmp_pid))
			cand[ncand++] = pid;
	}
	free(before);
	if (ncand == 1) {
		/* Ours, whatever /proc would say: the usual start asks it nothing
		 * (the pid namespace's link is a lookup in /proc at every start). */
		pick = (int32_t)cand[0];
		*how = "the one new process";
	}
	int32_t known = ncand > 1 ? known_pid() : 0;
	for (unsigned i = 0; known && i < ncand; i++)
		if (cand[i] == (unsigned)known) {
			pick = known;
			*how = "the pid /proc shows";
		}
	if (!pick && ncand > 1) {
		pick = probe(s->nvml, ctx, cand, ncand);
		*how = "probe allocation";
		if (!pick)
			*why = "several processes started a context at the same moment and no probe told them apart";
	}
	if (!pick && ncand == 0) {
		*how = "initial pid namespace";
		if (find(after, nafter, (unsigned)getpid()) && in_init_pid_ns())
			pick = (int32_t)getpid();
		else
			*why = "no new process appeared in NVML's list with this process's context";
	}
	free(cand);
	snap_put(s->nvml, ctx, after, nafter);
	return pick;
}

void vgpu_hostpid_after(struct vgpu_hostpid_scan *s, CUcontext ctx)
{
	if (!s->active)
		return;
	if (ctx) {
		__atomic_store_n(&ctx_seen[s->dev], 1, __ATOMIC_RELAXED);
		const char *why = "", *how = "";
		int32_t pick = decide(s, ctx, &why, &how);
		if (pick) {
			__atomic_store_n(&host_pid, pick, __ATOMIC_RELAXED);
			__atomic_store_n(&confirmed, 1, __ATOMIC_RELEASE);
			/* Claimed in the ledger at once; the slot when the region's lock can be had. */
			vgpu_region_set_host_pid(pick);
			LOGD("pid %d is %d in NVML's process list (%s)", (int)getpid(), (int)pick, how);
		} else if (!gave_up_logged) {
			gave_up_logged = 1;
			LOGD("host pid of %d not found on CUDA device %d (%s); SM limit and context footprint "
			     "rely on %s",
			     (int)getpid(), (int)s->dev, why, host_pid ? "the pid /proc shows" : "nothing: left unknown");
		}
	}
	free(s->before);
	s->before = NULL;
	s->active = 0;
}

static void after_fork(void)
{
	/* The child is a new process with contexts of its own to come. */
	host_pid = 0;
	nspid_read = 0;
	confirmed = 0;
	gave_up_logged = 0;
	memset(ctx_seen, 0, sizeof(ctx_seen));
	snap_put(NULL, NULL, NULL, 0); /* the parent's, taken for its context */
}

VGPU_LIFECYCLE(hostpid, .order = VGPU_ORDER_HOSTPID, .after_fork = after_fork);
