/*
 * SM-time quota (issue item 4) for GPUs with cores < 100.
 *
 * Each launch entry point takes tokens, one per thread block of the grid,
 * from a per-device bucket; with the bucket empty the launching thread waits.
 * A watcher thread refills the bucket every period with `rate` tokens per
 * period of time actually elapsed (a watcher that ran late, on a loaded
 * host, still grants what the elapsed time is owed) and steers the rate from
 * NVML's per-process utilisation of the container's
 * processes (their host pids, from the ledger): the rate is scaled by the gap
 * between target and measured share, damped, so the step is proportional
 * to the gap and independent of the SM count. `hard` holds the container to
 * its share; `burst` lets it use what the rest of the GPU leaves idle.
 *
 * With every GPU at cores = 100 no thread is started and the launch hooks
 * only test one flag before forwarding.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph.h"
#include "shim.h"

#define PERIOD_NS 20000000ll /* 20 ms between refills */
/* A refill later than this was not delayed but stopped (SIGSTOP, a frozen
 * cgroup): the time beyond it is not owed, or a resumed process would launch
 * seconds of banked work at once. */
#define MAX_LATE_NS 250000000ll
#define WAIT_NS 200000ll     /* a throttled launch re-checks every 0.2 ms */
#define MAX_SAMPLES 1024
#define FLUSH_PERIODS 5      /* launch counts reach the region every 100 ms */

struct bucket {
	int64_t tokens;  /* may go negative: a huge grid still launches, then pays */
	int64_t rate;    /* tokens added per PERIOD_NS of elapsed time */
	int64_t waiting; /* launches blocked right now */
	int active;      /* the watcher steers this bucket */
	nvmlDevice_t nvml;
	unsigned long long last_seen;
	int64_t refilled_ns; /* CLOCK_MONOTONIC of the last refill */
};

static struct bucket buckets[VGPU_MAX_DEVICES];
static int watcher_started;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;


static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ll), (long)(ns % 1000000000ll)};
	while (nanosleep(&ts, &ts) != 0)
		;
}

/*
 * Percent of the device's SM time used by the container (mine) and by every
 * process (all), from the samples NVML took since the previous call.
 * Returns 0 with fresh samples, 1 when there are none (NVML samples every
 * ~1/6 s on real GPUs, more slowly than we ask: no news is not "idle"), -1 on
 * error. A process with several samples in the window counts with their mean.
 */
static int measure(struct bucket *b, unsigned *mine, unsigned *all)
{
	static nvmlProcessUtilizationSample_t s[MAX_SAMPLES];
	static struct {
		unsigned pid, sum, count;
	} per[MAX_SAMPLES];
	unsigned n = MAX_SAMPLES;
	nvmlReturn_t rc = vgpu_nvml_process_utilization(b->nvml, s, &n, b->last_seen);
	*mine = *all = 0;
	if (rc == NVML_ERROR_NOT_FOUND || rc == NVML_ERROR_NO_DATA)
		return 1;
	if (rc != NVML_SUCCESS)
		return -1;
	unsigned np = 0, fresh = 0;
	for (unsigned i = 0; i < n && i < MAX_SAMPLES; i++) {
		if (s[i].timeStamp <= b->last_seen)
			continue; /* already counted in an earlier window */
		fresh++;
		unsigned k = 0;
		while (k < np && per[k].pid != s[i].pid)
			k++;
		if (k == np)
			per[np++] = (__typeof__(per[0])){s[i].pid, 0, 0};
		per[k].sum += s[i].smUtil;
		per[k].count++;
	}
	for (unsigned i = 0; i < n && i < MAX_SAMPLES; i++)
		if (s[i].timeStamp > b->last_seen)
			b->last_seen = s[i].timeStamp;
	if (!fresh)
		return 1;
	/* NVML speaks in host pids: the container's processes are ours and
	 * those the others claim in the ledger (hostpid.c finds them, ledger.c
	 * keeps them where the tenant can add claims but not remove one, so the
	 * container can look busier than it is, never idler). A process whose
	 * host pid is unknown is left out rather than matched by its namespace
	 * pid, which may be another container's process in NVML's numbering. */
	static struct vgpu_hp_set claimed;
	int32_t self = vgpu_host_pid();
	if (vgpu_ledger_host_pids(&claimed) != 0) {
		claimed.n = 0;
		claimed.all = 1; /* cannot tell: count everything as ours, throttle rather than not */
	}
	for (unsigned k = 0; k < np; k++) {
		unsigned util = per[k].sum / per[k].count;
		*all += util;
		if ((self && per[k].pid == (unsigned)self) || vgpu_hp_set_has(&claimed, per[k].pid))
			*mine += util;
	}
	return 0;
}

/* The next refill rate, from fresh measurements of the container's share. */
static int64_t adjust(int idx, struct bucket *b, int64_t rate, unsigned mine, unsigned all)
{
	int target = vgpu.limits.gpu[idx].cores;
	if (vgpu.limits.policy == VGPU_POLICY_BURST) {
		/* Idle capacity others leave is ours to use in burst mode. */
		int others = (int)all - (int)mine;
		int idle_share = 100 - (others > 0 ? others : 0) - 5;
		if (idle_share > target)
			target = idle_share;
	}
	int starved = __atomic_load_n(&b->waiting, __ATOMIC_RELAXED) > 0 ||
		      __atomic_load_n(&b->tokens, __ATOMIC_RELAXED) <= 0;
	if (mine == 0) {
		if (starved)
			rate *= 2; /* wanted to run and could not: open up */
	} else {
		/* Multiplicative step, half the gap per period: converges geometrically
		 * whatever the SM count or kernel size. */
		double ratio = (double)target / (double)mine;
		if (ratio > 2.0)
			ratio = 2.0;
		if (ratio < 0.5)
			ratio = 0.5;
		if (!starved && ratio > 1.0)
			ratio = 1.0; /* below target only because it is idle: do not grow */
		rate = (int64_t)((double)rate * (1.0 + 0.5 * (ratio - 1.0)));
	}
	if (rate < 1)
		rate = 1;
	if (rate > ((int64_t)1 << 40))
		rate = (int64_t)1 << 40;
	return rate;
}

/* One control step for bucket idx: steer the rate on fresh samples, then refill. */
static void steer(int idx, struct bucket *b)
{
	unsigned mine, all;
	int m = measure(b, &mine, &all);
	if (m < 0)
		return;
	int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED);
	if (m == 0) { /* fresh samples; without them, keep the rate */
		rate = adjust(idx, b, rate, mine, all);
		__atomic_store_n(&b->rate, rate, __ATOMIC_RELAXED);
	}
	/* Tokens for the time that really elapsed since the last refill, not
	 * for one period: the watcher's sleeps overrun on a busy host, and a
	 * per-tick refill would then hand out less than the rate. */
	int64_t now = now_ns(), elapsed = now - b->refilled_ns;
	b->refilled_ns = now;
	if (elapsed < 0)
		elapsed = 0;
	if (elapsed > MAX_LATE_NS)
		elapsed = MAX_LATE_NS;
	int64_t add = (int64_t)((double)rate * (double)elapsed / (double)PERIOD_NS);
	/* Keep at most one period's worth from before, so idle time is not banked. */
	int64_t t = __atomic_add_fetch(&b->tokens, add, __ATOMIC_RELAXED);
	if (t > add + rate)
		__atomic_store_n(&b->tokens, add + rate, __ATOMIC_RELAXED);
}

static void *watcher(void *arg)
{
	(void)arg;
	for (unsigned n = 0;; n++) {
		for (int i = 0; i < vgpu.limits.ngpu; i++)
			if (buckets[i].active)
				steer(i, &buckets[i]);
		/* Launch counts to the region for the host (never waits for its lock). */
		if (n % FLUSH_PERIODS == 0)
			vgpu_region_flush();
		vgpu_fp_watch(n); /* footprint growth at launch (lazily loaded kernels, local memory) */
		sleep_ns(PERIOD_NS);
	}
	return NULL;
}

/* Starts the watcher; buckets whose GPU NVML cannot see are left unthrottled. */
static void start_watcher(void)
{
	pthread_mutex_lock(&start_mu);
	if (watcher_started) {
		pthread_mutex_unlock(&start_mu);
		return;
	}
	int any = 0;
	if (vgpu_nvml_init() == NVML_SUCCESS) {
		for (int i = 0; i < vgpu.limits.ngpu; i++) {
			struct bucket *b = &buckets[i];
			if (vgpu.limits.gpu[i].cores >= 100)
				continue;
			if (vgpu_nvml_handle_by_uuid(vgpu.limits.gpu[i].uuid, &b->nvml) != NVML_SUCCESS) {
				LOGW("SM limit on %s not enforced: NVML does not know the GPU", vgpu.limits.gpu[i].uuid);
				continue;
			}
			CUdevice dev;
			int sms = 0;
			if (vgpu_cu_ctx_get_device(&dev) == CUDA_SUCCESS)
				vgpu_cu_device_attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
			/* A first guess of one wave per millisecond; the loop corrects it. */
			b->rate = (int64_t)(sms > 0 ? sms : 100) * (PERIOD_NS / 1000000) * vgpu.limits.gpu[i].cores / 100;
			b->tokens = b->rate;
			b->refilled_ns = now_ns();
			b->active = 1;
			any = 1;
		}
	} else {
		LOGW("SM limits not enforced: NVML is not available");
	}
	if (any) {
		pthread_t t;
		pthread_attr_t attr;
		sigset_t all, old;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		/* The application's signals are not ours to receive. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		if (pthread_create(&t, &attr, watcher, NULL) != 0) {
			LOGW("SM limits not enforced: cannot start the watcher thread");
			for (int i = 0; i < VGPU_MAX_DEVICES; i++)
				buckets[i].active = 0;
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&attr);
	}
	__atomic_store_n(&watcher_started, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&start_mu);
}

void vgpu_limiter_after_fork(void)
{
	/* The watcher did not survive the fork; the child starts its own on demand. */
	pthread_mutex_init(&start_mu, NULL);
	watcher_started = 0;
	memset(buckets, 0, sizeof(buckets));
}

void vgpu_limiter_charge(int idx, uint64_t blocks)
{
	if (idx < 0 || vgpu.limits.gpu[idx].cores >= 100)
		return;
	if (unlikely(!__atomic_load_n(&watcher_started, __ATOMIC_ACQUIRE)))
		start_watcher();
	struct bucket *b = &buckets[idx];
	if (!b->active)
		return;
	if (__atomic_load_n(&b->tokens, __ATOMIC_RELAXED) <= 0) {
		__atomic_add_fetch(&b->waiting, 1, __ATOMIC_RELAXED);
		while (__atomic_load_n(&b->tokens, __ATOMIC_RELAXED) <= 0)
			sleep_ns(WAIT_NS);
		__atomic_sub_fetch(&b->waiting, 1, __ATOMIC_RELAXED);
	}
	__atomic_sub_fetch(&b->tokens, (int64_t)blocks, __ATOMIC_RELAXED);
}

/* ---- launch entry points ------------------------------------------------------------ */

/* The throttled path: account the launch, wait for tokens. */
static __attribute__((noinline)) void gate(uint64_t blocks)
{
	int idx = vgpu_current_index(NULL);
	if (idx < 0)
		return;
	vgpu_count_launch(idx);
	vgpu_limiter_charge(idx, blocks ? blocks : 1);
}

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))
#define THROTTLED() (vgpu_init(), unlikely(vgpu.throttled && vgpu.mode == VGPU_ENFORCE))

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
				    void **extra)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz));
	return NEXT(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					 unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
					 void **extra)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz));
	return NEXT(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
					       unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
					       void **params)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz));
	return NEXT(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
						    unsigned bx, unsigned by, unsigned bz, unsigned shm,
						    CUstream s, void **params)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz));
	return NEXT(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (THROTTLED())
		gate(c ? GRID(c->gridDimX, c->gridDimY, c->gridDimZ) : 1);
	return NEXT(cuLaunchKernelEx)(c, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (THROTTLED())
		gate(c ? GRID(c->gridDimX, c->gridDimY, c->gridDimZ) : 1);
	return NEXT(cuLaunchKernelEx_ptsz)(c, f, params, extra);
}

/* A graph's kernels are not visible here: one token per launch. Tokens are
 * only a unit the feedback loop scales, so the share still converges. */
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	/* A launch may back the graph's memory nodes (graph.c). */
	struct vgpu_graph_backing b;
	if (vgpu_graph_back_begin(g, 1, &b) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (THROTTLED())
		gate(0);
	CUresult rc = NEXT(cuGraphLaunch)(g, s);
	vgpu_graph_back_end(&b, rc);
	return rc;
}

VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
	struct vgpu_graph_backing b;
	if (vgpu_graph_back_begin(g, 1, &b) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (THROTTLED())
		gate(0);
	CUresult rc = NEXT(cuGraphLaunch_ptsz)(g, s);
	vgpu_graph_back_end(&b, rc);
	return rc;
}
