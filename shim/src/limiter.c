/*
 * SM-time quota for GPUs with cores < 100.
 *
 * A launch is charged what it will occupy the GPU with, in waves: its grid
 * over the device's SM count, rounded up (a 1-block kernel holds the GPU as
 * long as a full wave of the same kernel; charging blocks would let many
 * small kernels through for the price of one). A graph is charged the sum of
 * its kernel nodes' waves, a launch recorded by stream capture nothing (it
 * runs, and is charged, when its graph is launched). Tokens come from a
 * per-device bucket; with the bucket empty the launching thread waits.
 *
 * A watcher thread refills the bucket every tick (20 ms) with `rate` tokens
 * per control period (50 ms) of time actually elapsed (a watcher delayed on a
 * loaded host still grants what it owes; a waiting launch counts the time
 * since the last refill too, so it goes as soon as its debt is paid) and
 * steers the rate from NVML's per-process utilisation of the container's
 * processes (their host pids, from the ledger): scaled by the gap between
 * target and measured share, damped.
 *
 * What keeps it from stalling or overshooting:
 *  - bounded debt: a launch may take the bucket at most one period's
 *    allowance below zero, so the next launch waits one period at most,
 *    however large the kernel. What the kernel cost beyond that is owed and
 *    paid back from a quarter of the refills (up to OWED_PERIODS periods'
 *    worth), so a big kernel among small ones still counts in full. Kernels
 *    longer than a period's allowance on their own run at about one a period:
 *    more than the share, which no rate can prevent without longer waits, so
 *    the rate is not cut for it (it would starve the small kernels after);
 *  - bounded waits with several launching threads: a launch in line behind
 *    another waits for that one's debt as well as for the debt it found, up
 *    to a period each. After one period in line a launch goes at its turn and
 *    the debt still ahead of it is carried as owed (see carry()), as long as
 *    the owed has room; with no room the launch waits for the debt itself,
 *    so the share holds over any window longer than OWED_PERIODS periods
 *    (except behind a kernel longer than the allowance, whose share is not
 *    held anyway: see carry());
 *  - the bucket refills whatever NVML does: an error leaves the rate where it
 *    is (one warning), never stops the tokens;
 *  - a fresh window that shows the container idle although it waited for
 *    tokens ("zero samples") doubles the rate;
 *  - NVML silent for STALE_NS ("no samples") while the container waits for
 *    tokens means what it ran stayed below NVML's 1 %: the rate doubles too,
 *    once per STALE_NS, up to nominal * SILENT_MAX (silence alone is not
 *    trusted further: an NVML that never samples would otherwise lift the
 *    limit);
 *  - without a usable NVML (none beside the driver's libcuda, nvmlInit failed,
 *    the GPU unknown to it) the rate stays at its first guess, nominal: the
 *    share for kernels of a millisecond a wave, not off.
 * `hard` holds the container to its share; `burst` lets it use what the rest
 * of the GPU leaves idle.
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

#include "common.h"
#include "core.h"
#include "footprint.h"
#include "graph.h"
#include "hostpid.h"
#include "ledger.h"
#include "lifecycle.h"
#include "limiter.h"
#include "limits.h"
#include "log.h"
#include "pool.h"
#include "real.h"
#include "region.h"

/* The control period: a launch may leave the container one period's allowance
 * in debt, so no launch waits much longer than this. Long enough that a kernel
 * of 15 ms at a 30 % share is charged in full. */
#define PERIOD_NS 50000000ll
#define TICK_NS 20000000ll /* the watcher's cadence: NVML, the rate, the refill */
#define HOSTPIDS_NS 1000000000ll    /* the container's host pids are enumerated again after this long, */
#define HOSTPIDS_MIN_NS 100000000ll /* and at most this often */
#define FOREIGN_MAX 64              /* other containers' processes remembered from the last enumeration */
/* A refill later than this was not delayed but stopped (SIGSTOP, a frozen
 * cgroup): the time beyond it is not owed, or a resumed process would launch
 * seconds of banked work at once. */
#define MAX_LATE_NS 250000000ll
/* The longest a launch waits in line while the debt ahead of it can be
 * carried as owed instead: one period, as long as a single launching thread
 * waits for its own debt at most, so a second thread behind it does not
 * double that. */
#define WAIT_CAP_NS PERIOD_NS
#define WAIT_NS 200000ll     /* a throttled launch re-checks every 0.2 ms at least, */
#define WAIT_MAX_NS 5000000ll /* and at most every 5 ms (the rate may have moved) */
/* NVML takes a per-process sample about every 1/6 s on hardware: silence for
 * three of those is news, not just a query between two samples. */
#define STALE_NS 500000000ll
#define MAX_SAMPLES 1024
#define FLUSH_TICKS 5 /* launch counts reach the region every 100 ms */
/* Tokens per wave (fixed point): a rate under one wave a period must exist for
 * long kernels at small shares. */
#define TOKEN 1024ll
/* The first guess, and the yardstick of the bounds below: a wave takes 1 ms. */
#define NOMINAL_WAVE_NS 1000000ll
/* What one launch may leave owed beyond the bucket's bounded debt. */
#define OWED_PERIODS 8
/* The rate stays within [nominal / 64, nominal * 4096]: waves of 64 ms down to
 * about 0.25 us. Silence alone (no NVML samples) never raises it past
 * nominal * SILENT_MAX, waves of about 4 us. */
#define RATE_MIN_DIV 64
#define RATE_MAX_MUL 4096
#define SILENT_MAX 256

struct bucket {
	int64_t tokens;  /* goes below zero by half a period's rate at most (bounded debt) */
	int64_t rate;    /* tokens added per PERIOD_NS of elapsed time */
	int64_t owed;    /* cost beyond the bounded debt, paid back from refills */
	int64_t waiting; /* launches blocked right now */
	/* Throttled launches go in arrival order (a ticket each, served in turn):
	 * otherwise a thread that just came back from a synchronisation finds
	 * the tokens of a refill first, again and again, while another waits
	 * for many periods. */
	uint64_t tickets, serving;
	int starved;     /* a launch found the bucket empty since the rate last moved */
	int clipped;     /* a launch hit the bounded debt since the rate last moved */
	int debt_clipped; /* the last charge hit the bounded debt: the debt is a kernel's beyond its share */
	int climbing;    /* from the first guess until a measure first reaches half the target */
	uint64_t carries; /* launches let go after WAIT_CAP_NS with debt carried (debug log) */
	int launched;    /* a launch was charged since the rate last moved */
	int sms;         /* the device's SM count: blocks per wave */
	int active;      /* the watcher steers this bucket */
	int nvml_failed; /* said once that NVML gives no utilisation */
	nvmlDevice_t nvml;
	unsigned long long last_seen;
	int64_t refilled_ns; /* CLOCK_MONOTONIC of the last refill (written before the tokens) */
	int64_t heard_ns;    /* of the last fresh samples (or of the last step taken on silence) */
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
 * Throttled time (the region's throttled_ns, Contract 5): per GPU, the wall
 * time during which at least one launch of this process waited in
 * wait_turn. Overlapping waits of several threads count once, so one
 * process adds at most the wall time to a GPU's counter however many
 * threads launch; the container's counter is the sum over its processes.
 * A wait that ends is counted then, one in progress at each watcher flush
 * and at exit (vgpu_limiter_count_waits); the region gets it with the
 * launch counts (vgpu_count_throttled, FLUSH_TICKS). Only the slow path, a
 * launch about to sleep for tokens, takes wait_mu.
 */
static pthread_mutex_t wait_mu = PTHREAD_MUTEX_INITIALIZER;
static int in_wait[VGPU_MAX_DEVICES];       /* launches in wait_turn now (under wait_mu) */
static int64_t wait_from[VGPU_MAX_DEVICES]; /* CLOCK_MONOTONIC ns counted up to, while in_wait > 0 */

/* Counts idx's wait from wait_from up to now. Caller holds wait_mu. */
static void count_wait_locked(int idx, int64_t now)
{
	if (now > wait_from[idx])
		vgpu_count_throttled(idx, (uint64_t)(now - wait_from[idx]));
	wait_from[idx] = now;
}

static void wait_begin(int idx, int64_t now)
{
	pthread_mutex_lock(&wait_mu);
	if (in_wait[idx]++ == 0)
		wait_from[idx] = now;
	pthread_mutex_unlock(&wait_mu);
}

static void wait_end(int idx, int64_t now)
{
	pthread_mutex_lock(&wait_mu);
	if (--in_wait[idx] == 0)
		count_wait_locked(idx, now);
	pthread_mutex_unlock(&wait_mu);
}

void vgpu_limiter_count_waits(void)
{
	int64_t now = now_ns();
	pthread_mutex_lock(&wait_mu);
	for (int i = 0; i < vgpu.limits.ngpu; i++)
		if (in_wait[i] > 0)
			count_wait_locked(i, now);
	pthread_mutex_unlock(&wait_mu);
}

/* The rate that gives the share if a wave takes NOMINAL_WAVE_NS. */
static int64_t nominal_rate(int idx)
{
	return TOKEN * (PERIOD_NS / NOMINAL_WAVE_NS) * vgpu.limits.gpu[idx].cores / 100;
}

static int64_t clamp_rate(int idx, int64_t rate)
{
	int64_t lo = nominal_rate(idx) / RATE_MIN_DIV, hi = nominal_rate(idx) * RATE_MAX_MUL;
	if (lo < 1)
		lo = 1;
	return rate < lo ? lo : rate > hi ? hi : rate;
}

/*
 * Percent of the device's SM time used by the container (mine) and by every
 * process (all), from the samples NVML took since the previous call.
 * Returns 0 with fresh samples, 1 when there are none (NVML samples every
 * ~1/6 s on real GPUs, more slowly than we ask: no news is not "idle"), -1 on
 * error. A process with several samples in the window counts with their mean.
 */
static int measure(int idx, struct bucket *b, unsigned *mine, unsigned *all)
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
	/* Enumerating the claims is a query per claim, each a walk of the lock
	 * list: it grows with the number of processes in the container, and the
	 * watcher ticks every TICK_NS. The claims change only as processes start
	 * and exit, so a GPU's enumeration is kept while every process the
	 * samples name was known at it (ours, or another container's), up to
	 * HOSTPIDS_NS: a process that has started since is seen at the first
	 * sample naming it (HOSTPIDS_MIN_NS after the last enumeration at the
	 * latest). Kept for HOSTPIDS_MIN_NS at least (a GPU where new
	 * processes keep appearing), and no longer than that while processes of
	 * other pid namespaces publish their SM use (a figure of every period). A
	 * failed enumeration is not kept. */
	static struct {
		struct vgpu_hp_set claimed, hidden;
		unsigned util, nforeign;
		unsigned foreign[FOREIGN_MAX]; /* sampled at the enumeration, not the container's */
		int64_t at; /* CLOCK_MONOTONIC_COARSE of the enumeration; 0: none */
	} hp[VGPU_MAX_DEVICES];
	struct vgpu_hp_set *claimed = &hp[idx].claimed, *hidden = &hp[idx].hidden;
	unsigned hidden_util = 0, own = 0;
	int32_t self = vgpu_host_pid();
	int64_t t = vgpu_coarse_ns(), age = hp[idx].at ? t - hp[idx].at : INT64_MAX;
	int known = age < HOSTPIDS_NS && !hidden->n && !hidden->all;
	for (unsigned k = 0; known && k < np; k++) {
		unsigned p = per[k].pid, f = 0;
		if ((self && p == (unsigned)self) || vgpu_hp_set_has(claimed, p))
			continue;
		while (f < hp[idx].nforeign && hp[idx].foreign[f] != p)
			f++;
		known = f < hp[idx].nforeign;
	}
	if (age < HOSTPIDS_MIN_NS || known) {
		hidden_util = hp[idx].util;
	} else if (vgpu_ledger_reader() != 0 || vgpu_ledger_host_pids(idx, claimed, hidden, &hidden_util) != 0) {
		claimed->n = hidden->n = hidden->all = 0;
		claimed->all = 1; /* cannot tell: count everything as ours, throttle rather than not */
		hidden_util = 0;
		hp[idx].at = 0;
	} else {
		hp[idx].util = hidden_util;
		hp[idx].at = t;
		hp[idx].nforeign = 0;
		for (unsigned k = 0; k < np && hp[idx].nforeign < FOREIGN_MAX; k++)
			if (!(self && per[k].pid == (unsigned)self) && !vgpu_hp_set_has(claimed, per[k].pid) &&
			    !vgpu_hp_set_has(hidden, per[k].pid))
				hp[idx].foreign[hp[idx].nforeign++] = per[k].pid;
	}
	/* The container's processes in other pid namespaces (the containers of a
	 * pod sharing a claim) count with what they publish, not with samples:
	 * a driver that lists only the caller's namespace shows none of theirs,
	 * and one that shows them must not count them twice. */
	for (unsigned k = 0; k < np; k++) {
		unsigned util = per[k].sum / per[k].count;
		int is_self = self && per[k].pid == (unsigned)self;
		if (is_self)
			own = util;
		else if (!hidden->all && vgpu_hp_set_has(hidden, per[k].pid))
			continue; /* (too many to keep: counted from samples too, twice rather than not) */
		*all += util;
		if (is_self || vgpu_hp_set_has(claimed, per[k].pid))
			*mine += util;
	}
	*mine += hidden_util;
	*all += hidden_util;
	vgpu_ledger_publish_util(idx, self ? own : 0);
	return 0;
}

/* The next refill rate, from fresh measurements of the container's share. */
static int64_t adjust(int idx, struct bucket *b, int64_t rate, int starved, int clipped, int launched,
		      unsigned mine, unsigned all)
{
	int target = vgpu.limits.gpu[idx].cores;
	if (vgpu.limits.policy == VGPU_POLICY_BURST) {
		/* Idle capacity others leave is ours to use in burst mode. */
		int others = (int)all - (int)mine;
		int idle_share = 100 - (others > 0 ? others : 0) - 5;
		if (idle_share > target)
			target = idle_share;
	}
	if (mine == 0) {
		/* Zero samples: NVML saw nothing of the container (or less than
		 * 1 %) while it waited for tokens: its rate is far too low. */
		if (starved)
			rate *= 2;
	} else {
		/* Multiplicative step, half the gap per period: converges geometrically
		 * whatever the SM count or kernel size. */
		double ratio = (double)target / (double)mine;
		/* Climbing from the first guess (a wave a millisecond) while launches
		 * wait for tokens, far below the target: the guess is that far off
		 * for short waves, and half-steps of at most 1.5x took 2-3 s to close
		 * the gap (1-element kernels on an H200). Go most of the way at once,
		 * up to 6x a step. Only while climbing: later, a launcher descheduled
		 * on a loaded host also looks far below, and a large step then
		 * overshoots. */
		if (b->climbing && ratio < 2.0)
			b->climbing = 0;
		if (b->climbing && starved) {
			if (ratio > 8.0)
				ratio = 8.0;
			return clamp_rate(idx, (int64_t)((double)rate * 0.75 * ratio));
		}
		if (ratio > 2.0)
			ratio = 2.0;
		if (ratio < 0.5)
			ratio = 0.5;
		if (!starved && ratio > 1.0)
			ratio = 1.0; /* below target only because it is idle: do not grow */
		/* Over target because kernels longer than a period's allowance hit
		 * the bounded debt: a lower rate would not hold them back, only
		 * starve the small kernels that follow. */
		if (clipped && ratio < 1.0)
			ratio = 1.0;
		/* Over target with nothing launched since the last step: what
		 * NVML saw was queued earlier (a GPU queues about a thousand
		 * launches); the rate did not cause it and cutting it would
		 * starve what comes next. */
		if (!launched && ratio < 1.0)
			ratio = 1.0;
		rate = (int64_t)((double)rate * (1.0 + 0.5 * (ratio - 1.0)));
	}
	return clamp_rate(idx, rate);
}

/* Adds what the elapsed time is owed: first towards what big launches owe
 * (a quarter of it at most, so launches keep flowing), then to the bucket,
 * which holds one period's allowance at most: idle time is not banked, and a
 * container that was idle starts with no more than a period of work queued
 * ahead of the others'. */
static void refill(struct bucket *b, int64_t rate)
{
	int64_t now = now_ns(), elapsed = now - __atomic_load_n(&b->refilled_ns, __ATOMIC_RELAXED);
	/* Before the tokens: a waiter that reads the new time with the old tokens
	 * sees too few for a moment, never too many (see available()). */
	__atomic_store_n(&b->refilled_ns, now, __ATOMIC_SEQ_CST);
	if (elapsed < 0)
		elapsed = 0;
	if (elapsed > MAX_LATE_NS)
		elapsed = MAX_LATE_NS;
	/* Tokens for the time that really elapsed since the last refill, not
	 * for one period: the watcher's sleeps overrun on a busy host, and a
	 * per-tick refill would then hand out less than the rate. */
	int64_t add = (int64_t)((double)rate * (double)elapsed / (double)PERIOD_NS);
	int64_t owed = __atomic_load_n(&b->owed, __ATOMIC_RELAXED);
	if (owed > 0) {
		int64_t pay = add / 4 < owed ? add / 4 : owed;
		__atomic_sub_fetch(&b->owed, pay, __ATOMIC_RELAXED);
		add -= pay;
	}
	int64_t t = __atomic_load_n(&b->tokens, __ATOMIC_RELAXED), nt;
	do {
		nt = t + add;
		if (nt > rate)
			nt = t > rate ? t : rate;
	} while (!__atomic_compare_exchange_n(&b->tokens, &t, nt, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* One control step for bucket idx: steer the rate, then refill, whatever NVML said. */
static void steer(int idx, struct bucket *b)
{
	unsigned mine, all;
	/* No NVML: the rate stays nominal (said once when the watcher started). */
	int m = b->nvml ? measure(idx, b, &mine, &all) : -2;
	int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED), now = now_ns();
	if (m == 0) {
		int starved = __atomic_exchange_n(&b->starved, 0, __ATOMIC_RELAXED) ||
			      __atomic_load_n(&b->waiting, __ATOMIC_RELAXED) > 0;
		int clipped = __atomic_exchange_n(&b->clipped, 0, __ATOMIC_RELAXED);
		int launched = __atomic_exchange_n(&b->launched, 0, __ATOMIC_RELAXED);
		rate = adjust(idx, b, rate, starved, clipped, launched, mine, all);
		b->heard_ns = now;
	} else if (m > 0 && now - b->heard_ns >= STALE_NS) {
		/* No samples for a while: nothing the container ran reached 1 % of
		 * NVML's window. If it waited for tokens all the same, its rate is too
		 * low for its kernels (a first guess far off, or a rate cut by an
		 * earlier burst): double it, one step per STALE_NS. Silence alone
		 * never raises it past nominal * SILENT_MAX. */
		int starved = __atomic_exchange_n(&b->starved, 0, __ATOMIC_RELAXED) ||
			      __atomic_load_n(&b->waiting, __ATOMIC_RELAXED) > 0;
		int64_t cap = nominal_rate(idx) * SILENT_MAX;
		if (starved && rate < cap)
			rate = clamp_rate(idx, rate * 2 < cap ? rate * 2 : cap);
		b->heard_ns = now;
		vgpu_ledger_publish_util(idx, 0); /* below NVML's 1 % */
	} else if (m == -1 && !b->nvml_failed) {
		/* The rate stays where it is: the share holds as long as the kernels
		 * keep the length they had when NVML last answered. */
		b->nvml_failed = 1;
		LOGW("SM limit on %s: NVML gives no per-process utilisation; the rate is no longer steered",
		     vgpu.limits.gpu[idx].uuid);
	}
	__atomic_store_n(&b->rate, rate, __ATOMIC_RELAXED);
	refill(b, rate);
}

static void *watcher(void *arg)
{
	(void)arg;
	for (unsigned n = 0;; n++) {
		for (int i = 0; i < vgpu.limits.ngpu; i++)
			if (buckets[i].active)
				steer(i, &buckets[i]);
		/* Launch counts and throttled time to the region for the host (never
		 * waits for its lock). */
		if (n % FLUSH_TICKS == 0) {
			vgpu_limiter_count_waits();
			vgpu_region_flush();
		}
		vgpu_fp_watch(n); /* footprint growth at launch (lazily loaded kernels, local memory) */
		sleep_ns(TICK_NS);
	}
	return NULL;
}

/* Starts the watcher; buckets whose GPU NVML cannot see refill at the nominal rate. */
static void start_watcher(void)
{
	pthread_mutex_lock(&start_mu);
	if (watcher_started) {
		pthread_mutex_unlock(&start_mu);
		return;
	}
	int any = 0, nvml = vgpu_nvml_usable();
	for (int i = 0; i < vgpu.limits.ngpu; i++) {
		struct bucket *b = &buckets[i];
		if (vgpu.limits.gpu[i].cores >= 100)
			continue;
		/* Without NVML's samples (none beside the driver, nvmlInit failed,
		 * the GPU unknown to it) the bucket still refills, at the nominal
		 * rate: as if the container's launches kept the GPU busy, a wave a
		 * millisecond. Never off: an NVML the tenant can break must not
		 * lift the limit (vgpu_nvml_usable() says so once). */
		b->nvml = NULL;
		if (nvml && vgpu_nvml_handle_by_uuid(vgpu.limits.gpu[i].uuid, &b->nvml) != NVML_SUCCESS) {
			b->nvml = NULL;
			vgpu_nvml_unknown_gpu(vgpu.limits.gpu[i].uuid);
		}
		b->rate = clamp_rate(i, nominal_rate(i));
		b->climbing = 1;
		b->tokens = b->rate;
		b->refilled_ns = b->heard_ns = now_ns();
		b->active = 1;
		any = 1;
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

static void after_fork(void)
{
	/* The watcher did not survive the fork; the child starts its own on demand. */
	pthread_mutex_init(&start_mu, NULL);
	watcher_started = 0;
	memset(buckets, 0, sizeof(buckets));
	/* The parent's waiting threads are not the child's. */
	pthread_mutex_init(&wait_mu, NULL);
	memset(in_wait, 0, sizeof(in_wait));
}
/* At exit: the waits still in progress reach the region with the last report. */
VGPU_LIFECYCLE(limiter, .order = VGPU_ORDER_LIMITER, .after_fork = after_fork, .at_exit = vgpu_limiter_count_waits);

/* Blocks per wave on dev, asked once per bucket; 1 when the driver cannot say
 * (every block a wave: an overcharge the rate steering absorbs). */
static int sm_count(struct bucket *b, CUdevice dev)
{
	int sms = __atomic_load_n(&b->sms, __ATOMIC_RELAXED);
	if (unlikely(sms <= 0)) {
		if (vgpu_cu_device_attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
		    sms <= 0)
			sms = 1;
		__atomic_store_n(&b->sms, sms, __ATOMIC_RELAXED);
	}
	return sms;
}

/* Tokens the bucket holds now: those of the last refill plus what the time
 * since has earned (the watcher adds it at its next tick), so a waiting
 * launch goes as soon as the debt is paid, not at the next tick. */
static int64_t available(struct bucket *b, int64_t now)
{
	int64_t since = now - __atomic_load_n(&b->refilled_ns, __ATOMIC_SEQ_CST);
	int64_t t = __atomic_load_n(&b->tokens, __ATOMIC_RELAXED);
	int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED);
	if (__atomic_load_n(&b->owed, __ATOMIC_RELAXED) > 0)
		rate -= rate / 4; /* a quarter of the refill pays what is owed */
	if (since < 0)
		since = 0;
	if (since > MAX_LATE_NS)
		since = MAX_LATE_NS;
	return t + (int64_t)((double)rate * (double)since / (double)PERIOD_NS);
}

/*
 * A launch that has waited WAIT_CAP_NS in line and whose turn it is goes now:
 * the debt still ahead of it (1 - avail tokens) moves from the bucket to what
 * is owed, which later refills pay back, so the launch is charged in full and
 * its wait stays within a period. Owed has a bound (OWED_PERIODS periods'
 * worth): while carrying would pass it, the launch waits for the debt itself,
 * else several threads could each launch once a period and together run over
 * the share for good.
 *
 * One case goes past the bound, the excess dropped as a clipped launch's is:
 * the debt ahead was left by a kernel longer than a period's allowance
 * (debt_clipped). The owed is then full of such kernels' excess and their
 * share is not held anyway (see the header); making the next thread wait for
 * the debt would only double its wait. The price: such kernels, launched from
 * n threads, run at up to n a period instead of one. Until the rate is
 * steered (its first guess of 1 ms a wave is far too low for kernels of
 * microseconds a wave) every large launch looks like one.
 * Returns 1 when the launch may go.
 */
static int carry(struct bucket *b, int64_t avail, int idx)
{
	int64_t need = 1 - avail;
	int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED), bound = rate * OWED_PERIODS;
	int64_t owed = __atomic_load_n(&b->owed, __ATOMIC_RELAXED);
	int dropped = __atomic_load_n(&b->debt_clipped, __ATOMIC_RELAXED);
	int past = owed + need > bound;
	if (past && !dropped)
		return 0;
	__atomic_add_fetch(&b->tokens, need, __ATOMIC_RELAXED);
	owed = __atomic_add_fetch(&b->owed, need, __ATOMIC_RELAXED);
	if (owed > bound)
		__atomic_store_n(&b->owed, bound, __ATOMIC_RELAXED);
	uint64_t n = __atomic_add_fetch(&b->carries, 1, __ATOMIC_RELAXED);
	LOGD("SM limit on %s: launch %llu let go after a period in line; %.2f periods' allowance of debt "
	     "carried (%s), owed %.2f",
	     vgpu.limits.gpu[idx].uuid, (unsigned long long)n, (double)need / (double)rate,
	     past ? "past the owed bound, after a kernel longer than the allowance" : "to be paid back",
	     (double)__atomic_load_n(&b->owed, __ATOMIC_RELAXED) / (double)rate);
	return 1;
}

/*
 * Waits for this launch's turn and for tokens (or for a period in line, see
 * carry()); returns the tokens available then. Turns go by ticket; a launch
 * whose turn it is not sleeps briefly. A turn that does not move for two
 * periods while tokens are there belongs to a thread that is not coming
 * (stopped, or gone by a signal handler's longjmp): any waiter then skips it,
 * and the owner, should it return, goes at once.
 */
static int64_t wait_turn(struct bucket *b, int idx, uint64_t *ticket)
{
	int oldstate;
	/* nanosleep is a cancellation point: a thread cancelled in line would
	 * hold up the others until skipped. */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &oldstate);
	uint64_t mine = __atomic_fetch_add(&b->tickets, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&b->starved, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&b->waiting, 1, __ATOMIC_RELAXED);
	uint64_t seen = __atomic_load_n(&b->serving, __ATOMIC_ACQUIRE);
	int64_t seen_ns = now_ns(), deadline = seen_ns + WAIT_CAP_NS, avail;
	wait_begin(idx, seen_ns);
	for (;;) {
		int64_t now = now_ns();
		avail = available(b, now);
		uint64_t srv = __atomic_load_n(&b->serving, __ATOMIC_ACQUIRE);
		int turn = (int64_t)(mine - srv) <= 0;
		if (avail > 0 && turn)
			break;
		if (turn && now >= deadline && carry(b, avail, idx)) {
			avail = 1;
			break;
		}
		if (srv != seen) {
			seen = srv;
			seen_ns = now;
		} else if (avail > 0 && now - seen_ns > 2 * PERIOD_NS) {
			__atomic_compare_exchange_n(&b->serving, &srv, srv + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
			seen_ns = now;
			continue;
		}
		/* In debt: sleep about until it is paid at the current rate. */
		int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED);
		int64_t ns = avail <= 0 && rate > 0 ? (int64_t)((double)(1 - avail) * (double)PERIOD_NS / (double)rate) : 0;
		if (turn && now < deadline && ns > deadline - now)
			ns = deadline - now; /* wake at the deadline, not a sleep past it */
		sleep_ns(ns < WAIT_NS ? WAIT_NS : ns > WAIT_MAX_NS ? WAIT_MAX_NS : ns);
	}
	wait_end(idx, now_ns());
	__atomic_sub_fetch(&b->waiting, 1, __ATOMIC_RELAXED);
	pthread_setcancelstate(oldstate, NULL);
	*ticket = mine;
	return avail;
}

/* The bucket of limits index idx when its launches are throttled, else NULL. */
static struct bucket *throttled_bucket(int idx)
{
	if (idx < 0 || vgpu.limits.gpu[idx].cores >= 100)
		return NULL;
	if (unlikely(!__atomic_load_n(&watcher_started, __ATOMIC_ACQUIRE)))
		start_watcher();
	return buckets[idx].active ? &buckets[idx] : NULL;
}

/* Blocks until a launch that holds the GPU for `waves` waves may go, then charges it. */
static void charge_waves(struct bucket *b, int idx, uint64_t waves)
{
	if (!waves)
		waves = 1; /* unknown work: one wave, as the smallest kernel */
	int64_t cost = waves > (uint64_t)INT32_MAX ? (int64_t)INT32_MAX * TOKEN : (int64_t)waves * TOKEN;
	if (!__atomic_load_n(&b->launched, __ATOMIC_RELAXED))
		__atomic_store_n(&b->launched, 1, __ATOMIC_RELAXED);
	int64_t avail = available(b, now_ns());
	int queued = avail <= 0 || __atomic_load_n(&b->waiting, __ATOMIC_RELAXED) > 0;
	uint64_t ticket = 0;
	if (queued)
		avail = wait_turn(b, idx, &ticket);
	/* Bounded debt: at most about one period's allowance below zero (counting
	 * what the time since the last refill has earned), so the next launch
	 * waits a period at most; the rest is owed, up to OWED_PERIODS periods'
	 * worth. */
	int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED);
	__atomic_sub_fetch(&b->tokens, cost, __ATOMIC_RELAXED);
	int64_t floor = rate - rate / 4; /* three quarters: paid within a period even while owing */
	int64_t excess = cost - avail - floor; /* how far below -floor the launch takes it */
	if (excess > 0) {
		if (excess > cost)
			excess = cost;
		__atomic_add_fetch(&b->tokens, excess, __ATOMIC_RELAXED);
		__atomic_store_n(&b->clipped, 1, __ATOMIC_RELAXED);
		int64_t owed = __atomic_add_fetch(&b->owed, excess, __ATOMIC_RELAXED);
		if (owed > rate * OWED_PERIODS)
			__atomic_store_n(&b->owed, rate * OWED_PERIODS, __ATOMIC_RELAXED);
	}
	if (__atomic_load_n(&b->debt_clipped, __ATOMIC_RELAXED) != (excess > 0))
		__atomic_store_n(&b->debt_clipped, excess > 0, __ATOMIC_RELAXED);
	if (queued) {
		/* After the charge: the next in line sees what this launch took. */
		uint64_t srv = __atomic_load_n(&b->serving, __ATOMIC_RELAXED);
		while ((int64_t)(srv - (ticket + 1)) < 0 &&
		       !__atomic_compare_exchange_n(&b->serving, &srv, ticket + 1, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			;
	}
}

void vgpu_limiter_charge(int idx, CUdevice dev, uint64_t blocks)
{
	struct bucket *b = throttled_bucket(idx);
	if (!b)
		return;
	uint64_t sms = (uint64_t)sm_count(b, dev);
	charge_waves(b, idx, blocks ? (blocks - 1) / sms + 1 : 1);
}

/* ---- launch entry points ------------------------------------------------------------ */

/* Whether a launch into s is recorded by stream capture instead of run: it
 * runs, and is charged, each time its graph is launched. ptsz: the call was
 * a per-thread-default-stream twin, where NULL names that stream. */
static int capturing(CUstream s, int ptsz)
{
	static void *fn;
	static int absent;
	if (s == CU_STREAM_LEGACY || (!s && !ptsz))
		return 0; /* the legacy stream is never captured */
	if (!s)
		s = CU_STREAM_PER_THREAD;
	CUresult (*f)(CUstream, int *) = (CUresult(*)(CUstream, int *))__atomic_load_n(&fn, __ATOMIC_ACQUIRE);
	if (unlikely(!f)) {
		if (__atomic_load_n(&absent, __ATOMIC_RELAXED))
			return 0;
		void *h = vgpu_lib_handle(LIB_CUDA);
		f = (CUresult(*)(CUstream, int *))(h ? vgpu_real_dlsym(h, "cuStreamIsCapturing") : NULL);
		if (!f) {
			__atomic_store_n(&absent, 1, __ATOMIC_RELAXED); /* a driver before 10.0 */
			return 0;
		}
		__atomic_store_n(&fn, (void *)f, __ATOMIC_RELEASE);
	}
	int status = CU_STREAM_CAPTURE_STATUS_NONE;
	return f(s, &status) == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The throttled path: account the launch, wait for tokens. g: a graph
 * launch, charged the waves of its kernel nodes (graph.c counted them at
 * instantiation; one wave when unknown: not instantiated through the shim). */
static __attribute__((noinline)) void gate_on(int idx, CUdevice dev, uint64_t blocks, CUgraphExec g, CUstream s,
					       int ptsz)
{
	if (idx < 0 || vgpu.limits.gpu[idx].cores >= 100)
		return;
	if (capturing(s, ptsz))
		return;
	vgpu_count_launch(idx);
	if (!g) {
		vgpu_limiter_charge(idx, dev, blocks);
		return;
	}
	struct bucket *b = throttled_bucket(idx);
	if (b)
		charge_waves(b, idx, vgpu_graph_exec_waves(g));
}

/* The same, on the current context's device. */
static void gate(uint64_t blocks, CUgraphExec g, CUstream s, int ptsz)
{
	CUdevice dev;
	int idx = vgpu_current_index(&dev);
	gate_on(idx, dev, blocks, g, s, ptsz);
}

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))
#define THROTTLED() (vgpu_init(), unlikely(vgpu.throttled && vgpu.mode == VGPU_ENFORCE))

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
				    void **extra)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz), NULL, s, 0);
	return NEXT(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					 unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
					 void **extra)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz), NULL, s, 1);
	return NEXT(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

/* A cooperative grid is resident all at once: charged its grid like any other. */
VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
					       unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
					       void **params)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz), NULL, s, 0);
	return NEXT(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
						    unsigned bx, unsigned by, unsigned bz, unsigned shm,
						    CUstream s, void **params)
{
	if (THROTTLED())
		gate(GRID(gx, gy, gz), NULL, s, 1);
	return NEXT(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (THROTTLED())
		gate(c ? GRID(c->gridDimX, c->gridDimY, c->gridDimZ) : 1, NULL, c ? c->hStream : NULL, 0);
	return NEXT(cuLaunchKernelEx)(c, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
	if (THROTTLED())
		gate(c ? GRID(c->gridDimX, c->gridDimY, c->gridDimZ) : 1, NULL, c ? c->hStream : NULL, 1);
	return NEXT(cuLaunchKernelEx_ptsz)(c, f, params, extra);
}

/*
 * The launch ABIs from before cuLaunchKernel (4.0): the grid comes from the
 * arguments (cuLaunch: one block), the block shape from cuFuncSetBlockShape.
 * Deprecated, still exported by current drivers: without these a kernel
 * would run outside the SM limit. A negative dimension is the driver's error
 * to return; it is charged one block.
 */
static uint64_t grid2(int w, int h)
{
	return w > 0 && h > 0 ? GRID(w, h, 1) : 1;
}

VGPU_EXPORT CUresult cuLaunch(CUfunction f)
{
	if (THROTTLED())
		gate(1, NULL, NULL, 0);
	return NEXT(cuLaunch)(f);
}

VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_w, int grid_h)
{
	if (THROTTLED())
		gate(grid2(grid_w, grid_h), NULL, NULL, 0);
	return NEXT(cuLaunchGrid)(f, grid_w, grid_h);
}

VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_w, int grid_h, CUstream s)
{
	if (THROTTLED())
		gate(grid2(grid_w, grid_h), NULL, s, 0);
	return NEXT(cuLaunchGridAsync)(f, grid_w, grid_h, s);
}

/* One cooperative grid per entry, each on the device of its stream. */
VGPU_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags)
{
	if (THROTTLED() && list) {
		for (unsigned i = 0; i < n; i++) {
			CUdevice dev;
			int idx = vgpu_stream_index(list[i].hStream, &dev);
			gate_on(idx, dev, GRID(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ), NULL,
				list[i].hStream, 0);
		}
	}
	return NEXT(cuLaunchCooperativeKernelMultiDevice)(list, n, flags);
}

/* A graph is charged the waves of its kernel nodes (see gate). */
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
	/* A launch may back the graph's memory nodes (graph.c). */
	struct vgpu_graph_backing b;
	if (vgpu_graph_back_begin(g, 1, &b) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (THROTTLED())
		gate(0, g, s, 0);
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
		gate(0, g, s, 1);
	CUresult rc = NEXT(cuGraphLaunch_ptsz)(g, s);
	vgpu_graph_back_end(&b, rc);
	return rc;
}
