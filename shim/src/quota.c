/*
 * This process's share of the container's memory quota: its leases, taken
 * from and given back to the ledger's pool (ledger.c), the lock-free path
 * inside them, the keeper thread, and the readings every quota decision
 * takes (this process's own count plus what the ledger shows of the
 * others). The limit comes from the limits file; nothing is read back from
 * the usage region (region.c), which only reports what is decided here.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "ledger.h"
#include "lifecycle.h"
#include "log.h"
#include "quota.h"
#include "region.h"

/*
 * Leases. Taking the region lock and publishing in the ledger costs a few
 * system calls, several times what a driver's allocation costs, and
 * PyTorch's stream-ordered backend allocates per tensor. So a process takes
 * from the container's quota in chunks (its lease, published in the ledger,
 * where every quota decision counts it whole) and allocates inside it with
 * one atomic operation on avail[], the part of the lease it does not hold.
 * A free puts its bytes back into avail[]. What the process holds is
 * lease - avail. The sum over processes of what they lease never passes the
 * limit, so neither does what they hold.
 *
 * The first grant takes no chunk (a process that allocates once needs
 * none, nor the keeper to give it back). Then a chunk starts at LEASE_START
 * and doubles with each grant (halves with each quiet keeper period), so one
 * that allocates all the time asks rarely; it is never more than a
 * sixteenth of the limit, nor LEASE_MAX, and is taken only where the pool
 * has room right after the stretch (ledger.c): near the limit it shrinks to
 * nothing and every allocation reserves exactly its own size, as without
 * leases. Unused
 * lease goes back to the container (the keeper thread, below) when the
 * process allocates nothing for a keeper period, and beyond twice its last
 * chunk otherwise; at a refusal; at exit; and with the process, when it dies.
 *
 * What the process holds is published too (the ledger's held part, and the
 * process's slot in the region): exactly at every grant or return, and
 * otherwise by the keeper within KEEP_NS. Reports (Contract 7) use that, not
 * the leases.
 */
#define LEASE_MAX (256ull << 20)
#define LEASE_START (1ull << 20) /* the first chunk; each next one is twice the last */
#define LEASE_MIN (64ull << 10)  /* below this, a chunk is not worth a lock in the ledger */
#define LEASE_FRACTION 16
#define KEEP_NS 100000000ll  /* the keeper's period */
#define WAIT_NS 300000000ll /* a refusal others' unused leases could cover waits this long for them */

/* lease, grant and unled change under the process's mutex (ledger.c); lease
 * is read without it, atomically; avail also changes without it. */
static uint64_t lease[VGPU_MAX_DEVICES];  /* what this process leases */
static int64_t avail[VGPU_MAX_DEVICES];   /* the unused part: the lock-free path takes from it */
static uint64_t grant[VGPU_MAX_DEVICES];  /* the last chunk granted */
static uint64_t unled[VGPU_MAX_DEVICES];  /* counted in lease[] but not in the ledger: forced while it failed */
/* Bumped at each grant, return and refusal of lease: a view (below) taken
 * before it is measured again. */
static uint64_t changes[VGPU_MAX_DEVICES];

static void changed(int idx)
{
	__atomic_add_fetch(&changes[idx], 1, __ATOMIC_SEQ_CST);
}

static uint64_t own_of(int idx)
{
	uint64_t l = __atomic_load_n(&lease[idx], __ATOMIC_ACQUIRE);
	int64_t a = __atomic_load_n(&avail[idx], __ATOMIC_ACQUIRE);
	return a <= 0 ? l : l > (uint64_t)a ? l - (uint64_t)a : 0;
}

static void unrecorded(int e)
{
	static int warned_unrecorded;
	if (warned_unrecorded++) {
		LOGD("GPU memory refused: still cannot record it in the ledger: %s", strerror(e));
		return;
	}
	if (e == EBUSY)
		LOGE("GPU memory refused: no free slot in the container's ledger (locks on the limits file hold "
		     "every one tried); allocations are refused while there is none");
	else if (e == EEXIST)
		LOGE("GPU memory refused: another process publishes GPU memory in this process's ledger slot "
		     "(a lock forged in it, pid %d); allocations are refused while it does",
		     (int)getpid());
	else
		LOGE("cannot record GPU memory use in the container's ledger (a lock on the limits file): %s; "
		     "GPU memory allocations are refused while it cannot",
		     strerror(e));
}

void vgpu_quota_publish_held(int idx, uint64_t now)
{
	if (vgpu_ledger_publish_held(idx, now) != 0)
		LOGD("ledger: cannot publish %llu bytes held on GPU %d: %s", (unsigned long long)now, idx,
		     strerror(errno));
}

/* Gives bytes of idx's lease back: first what the ledger never had, then its
 * stretches. Caller holds the process's mutex. */
static void give_back_locked(int idx, uint64_t bytes)
{
	uint64_t u = bytes < unled[idx] ? bytes : unled[idx];
	unled[idx] -= u;
	vgpu_ledger_shrink(idx, bytes - u);
}

/* Gives back up to keep_at_most of idx's unused lease. Caller holds the process's mutex. */
static void trim_locked(int idx, uint64_t keep_at_most)
{
	int64_t a = __atomic_load_n(&avail[idx], __ATOMIC_RELAXED);
	do {
		if (a <= (int64_t)keep_at_most)
			return;
	} while (!__atomic_compare_exchange_n(&avail[idx], &a, (int64_t)keep_at_most, 1, __ATOMIC_SEQ_CST,
					      __ATOMIC_RELAXED));
	uint64_t give = (uint64_t)a - keep_at_most;
	give_back_locked(idx, give);
	changed(idx);
	__atomic_store_n(&lease[idx], lease[idx] - give, __ATOMIC_RELEASE);
}

/* The lock-free path: bytes from the unused lease, if it has them. */
static int take_avail(int idx, uint64_t bytes)
{
	int64_t a = __atomic_load_n(&avail[idx], __ATOMIC_RELAXED);
	do {
		if (a < 0 || (uint64_t)a < bytes)
			return 0;
	} while (!__atomic_compare_exchange_n(&avail[idx], &a, a - (int64_t)bytes, 1, __ATOMIC_SEQ_CST,
					      __ATOMIC_RELAXED));
	return 1;
}

/*
 * The chunk to ask for on idx beyond need: none at a process's first grant
 * (most processes that allocate once allocate little more, and a chunk
 * would need the keeper to give it back), then twice the last, at most a
 * sixteenth of the limit. It is taken only where the pool has room right
 * after what the grant needs.
 */
static uint64_t chunk(int idx, uint64_t limit)
{
	if (!__atomic_load_n(&lease[idx], __ATOMIC_RELAXED))
		return 0;
	uint64_t c = 2 * grant[idx];
	if (c < LEASE_START)
		c = LEASE_START;
	if (c > LEASE_MAX)
		c = LEASE_MAX;
	if (limit && c > limit / LEASE_FRACTION)
		c = limit / LEASE_FRACTION;
	return c < LEASE_MIN ? 0 : c;
}

/* The most a chunk on idx may be (0: none). */
static uint64_t chunk_cap(int idx)
{
	uint64_t limit = vgpu.limits.gpu[idx].memory, c = LEASE_MAX;
	if (limit && c > limit / LEASE_FRACTION)
		c = limit / LEASE_FRACTION;
	return c < LEASE_MIN ? 0 : c;
}

/*
 * More lease for bytes on idx, under the thread mutex: the ledger takes it
 * from the container's pool (ledger.c), where two processes can never both
 * hold one byte, so nothing else needs measuring and the region's lock is
 * not needed: hundreds of processes starting at once do not wait for each
 * other. *short_by: on a refusal, what the others' unused leases would have
 * to give back. *granted: set when lease was taken, for the report
 * (show_locked).
 */
static int grow_locked(int idx, uint64_t bytes, int force, uint64_t *short_by, int *granted)
{
	if (take_avail(idx, bytes))
		return 0; /* another thread grew it meanwhile */
	uint64_t limit = vgpu.limits.gpu[idx].memory; /* the limits file's, never the region's */
	uint64_t l = lease[idx];
	int64_t a = __atomic_exchange_n(&avail[idx], 0, __ATOMIC_SEQ_CST);
	uint64_t mine = a > 0 ? (uint64_t)a : 0, need = bytes > mine ? bytes - mine : 0;
	if (!need) {
		__atomic_add_fetch(&avail[idx], (int64_t)(mine - bytes), __ATOMIC_SEQ_CST);
		return 0;
	}
	uint64_t extra = force ? 0 : chunk(idx, limit), got = 0;
	int rc = 0, unrec = 0;
	if (vgpu_ledger_grow(idx, need, vgpu_sat_add(need, extra), force, &got, short_by) != 0) {
		if (errno == EDQUOT && !force) {
			rc = VGPU_OVER_QUOTA;
		} else if (!force) {
			unrecorded(errno);
			rc = VGPU_UNRECORDED;
		} else {
			/* Memory the driver already handed out: counted whatever the
			 * ledger says; what it did not take is remembered apart, so
			 * that giving it back later gives back none of the ledger's. */
			unrecorded(errno);
			unled[idx] += need - got;
			got = need;
			unrec = 1;
		}
	}
	if (force && vgpu_ledger_owed(idx)) {
		/* Counted, but as a debt: the keeper places it as soon as there is room. */
		static int warned_owed;
		if (!warned_owed++)
			LOGW("GPU memory on %s: locks on the limits file hold the container's whole pool and "
			     "overflow; memory the driver already handed out is counted as this process's debt "
			     "until there is room for it, and allocations fail meanwhile",
			     vgpu.limits.gpu[idx].uuid);
		vgpu_quota_keeper_start();
	}
	if (rc) {
		/* Refused: what this process leased but did not use goes back too. */
		give_back_locked(idx, mine);
		__atomic_store_n(&lease[idx], l - mine, __ATOMIC_RELEASE);
		return rc;
	}
	extra = got - need;
	/* The order keeps lease - avail from ever reading less than is held. */
	__atomic_store_n(&lease[idx], l + got, __ATOMIC_RELEASE);
	__atomic_add_fetch(&avail[idx], (int64_t)extra, __ATOMIC_SEQ_CST);
	__atomic_store_n(&grant[idx], extra, __ATOMIC_RELAXED);
	*granted = 1;
	if (extra)
		vgpu_quota_keeper_start();
	return unrec ? VGPU_UNRECORDED : 0; /* counted all the same: by this process alone */
}

static int reserve(int idx, uint64_t bytes, int force)
{
	if (bytes == 0 || idx < 0 || idx >= VGPU_MAX_DEVICES)
		return 0;
	if (likely(!force) && take_avail(idx, bytes))
		return 0;
	uint64_t short_by = 0;
	int64_t waited = 0;
	for (;;) {
		int granted = 0;
		vgpu_ledger_lock();
		int rc = grow_locked(idx, bytes, force, &short_by, &granted);
		changed(idx); /* a grant, or a refusal: the next view measures again */
		/* The report: what we hold, in the ledger (our slot is taken
		 * there the first time) without the region's lock, so that the
		 * container's processes do not queue behind each other's system
		 * calls on the limits file; then in the region, under its lock. */
		if (granted)
			vgpu_quota_publish_held(idx, own_of(idx));
		vgpu_ledger_unlock();
		if (granted)
			vgpu_region_report(idx);
		if (rc != VGPU_OVER_QUOTA || waited >= WAIT_NS)
			return rc;
		/* Others' unused leases could cover it: they go back within a
		 * keeper period or two of their holders going quiet. */
		uint64_t others = 0, held = 0;
		if (vgpu_ledger_others(idx, &others) != 0 || vgpu_ledger_others_held(idx, &held) != 0 ||
		    others - (held < others ? held : others) < short_by)
			return rc;
		struct timespec ts = {0, KEEP_NS / 4};
		nanosleep(&ts, NULL);
		waited += KEEP_NS / 4;
	}
}

int vgpu_quota_charge(int idx, uint64_t bytes)
{
	return reserve(idx, bytes, 0);
}

int vgpu_quota_charge_force(int idx, uint64_t bytes)
{
	return reserve(idx, bytes, 1);
}

/* ---- the keeper: lease back to the container, held bytes to the report ----------------- */

static int keeper_state;      /* 0 none, 1 running, 2 running and parked */
static uint64_t kept[VGPU_MAX_DEVICES]; /* own_of() at the keeper's last pass */

static long futex(int *addr, int op, int val)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

static void keeper_kick(void)
{
	int parked = 2;
	if (__atomic_compare_exchange_n(&keeper_state, &parked, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
		futex(&keeper_state, FUTEX_WAKE_PRIVATE, 1);
}

void vgpu_quota_uncharge(int idx, uint64_t bytes)
{
	if (bytes == 0 || idx < 0 || idx >= VGPU_MAX_DEVICES)
		return;
	int64_t a = __atomic_add_fetch(&avail[idx], (int64_t)bytes, __ATOMIC_SEQ_CST);
	/* What was just freed stays leased, up to what a chunk may be: a process
	 * that frees and allocates the same size again (a buffer per step) then
	 * allocates inside its lease, and the keeper gives it back within a
	 * period of quiet. Beyond that and twice the last chunk (a large free),
	 * the rest goes back to the container now, where another process may be
	 * waiting. */
	uint64_t g = __atomic_load_n(&grant[idx], __ATOMIC_RELAXED), cap = chunk_cap(idx);
	uint64_t keep = bytes < cap ? bytes : cap;
	if (keep < g)
		keep = g;
	if (unlikely((uint64_t)a > (keep > 2 * g + LEASE_MIN ? keep : 2 * g + LEASE_MIN))) {
		vgpu_ledger_lock();
		trim_locked(idx, keep);
		vgpu_quota_publish_held(idx, own_of(idx));
		if (!keeper_state && __atomic_load_n(&avail[idx], __ATOMIC_SEQ_CST) > 0)
			vgpu_quota_keeper_start(); /* kept some: the keeper gives it back */
		vgpu_ledger_unlock();
		vgpu_region_report(idx);
	} else if (unlikely(!__atomic_load_n(&keeper_state, __ATOMIC_SEQ_CST))) {
		/* Kept, with no keeper yet to give it back (the first grant takes no chunk). */
		vgpu_ledger_lock();
		if (__atomic_load_n(&avail[idx], __ATOMIC_SEQ_CST) > 0)
			vgpu_quota_keeper_start();
		vgpu_ledger_unlock();
	}
	if (unlikely(__atomic_load_n(&keeper_state, __ATOMIC_SEQ_CST) == 2))
		keeper_kick();
}

/*
 * One pass: publishes what changed; gives back all unused lease of a GPU on
 * which nothing was allocated or freed since the last pass, and what is
 * beyond twice the last chunk on the others. Returns whether anything is
 * left to watch (unused lease, or held bytes not yet published).
 */
static int keep_pass(void)
{
	int busy, stale;
	/* The thread mutex alone: giving lease back touches only the ledger. The
	 * region (its lock, its checks, making it anew) only when there is
	 * something to report, as for an allocation. */
	vgpu_ledger_lock();
	/* A program that closed our descriptor dropped our leases with it: publish them again. */
	if (vgpu_ledger_check() != 0)
		LOGD("ledger: cannot publish again: %s", strerror(errno));
	for (int d = 0; d < vgpu.limits.ngpu; d++) {
		uint64_t now = own_of(d);
		if (unlikely(vgpu_ledger_owed(d)))
			vgpu_ledger_settle(d); /* a debt: placed as soon as the pool or the overflow has room */
		if (now == kept[d] && __atomic_load_n(&avail[d], __ATOMIC_RELAXED)) {
			trim_locked(d, 0); /* quiet: all of it, and a smaller chunk next time */
			__atomic_store_n(&grant[d], grant[d] / 2, __ATOMIC_RELAXED);
		} else {
			trim_locked(d, 2 * grant[d]);
		}
		kept[d] = now;
		vgpu_quota_publish_held(d, own_of(d));
	}
	stale = vgpu_region_behind();
	vgpu_ledger_unlock();
	/* Not waiting long: a busy region is written next period. */
	if (stale)
		vgpu_region_catch_up(KEEP_NS / 10);
	busy = vgpu_region_behind();
	for (int d = 0; d < vgpu.limits.ngpu; d++)
		busy |= __atomic_load_n(&avail[d], __ATOMIC_RELAXED) != 0 || vgpu_ledger_owed(d) != 0;
	return busy;
}

static void *keeper(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* the program's signals are for its own threads */
	for (;;) {
		struct timespec ts = {0, KEEP_NS};
		nanosleep(&ts, NULL);
		if (keep_pass())
			continue;
		/* Nothing to watch: park until a free (or a grant) gives something. Parked
		 * first, then looked again, so a free in between is not missed. */
		__atomic_store_n(&keeper_state, 2, __ATOMIC_SEQ_CST);
		int idle = 1;
		for (int d = 0; d < vgpu.limits.ngpu; d++)
			idle &= __atomic_load_n(&avail[d], __ATOMIC_SEQ_CST) == 0;
		if (!idle) {
			keeper_kick();
			continue;
		}
		while (__atomic_load_n(&keeper_state, __ATOMIC_SEQ_CST) == 2)
			futex(&keeper_state, FUTEX_WAIT_PRIVATE, 2);
	}
	return NULL;
}

/* Caller holds the lock. */
void vgpu_quota_keeper_start(void)
{
	if (keeper_state) {
		keeper_kick();
		return;
	}
	pthread_t t;
	if (pthread_create(&t, NULL, keeper, NULL) == 0) {
		pthread_detach(t);
		keeper_state = 1;
	} else {
		LOGD("cannot start the lease keeper thread: unused leases go back only at large frees, refusals and exit");
	}
}

uint64_t vgpu_quota_held(int idx)
{
	return own_of(idx);
}

uint64_t vgpu_quota_leased(int idx)
{
	return __atomic_load_n(&lease[idx], __ATOMIC_RELAXED);
}

/*
 * Views. Measuring the others enumerates their locks, one query a lock
 * found (two queries a process at least, each a walk of the kernel's lock
 * list): it grows with the number of processes. A quota decision outside a
 * grant (a new context's footprint, a pool's reclaim: vgpu_quota_usage)
 * measures every time. A report (cuMemGetInfo, NVML's memory figures,
 * Contract 7) answers from the last measurement this process took, when it
 * is less than VIEW_NS old and this process has taken, returned or been
 * refused no lease since (each such change bumps changes[idx]): the others'
 * held reports are up to a keeper period old themselves, so a view of that
 * age says nothing older than they do, a program that asks in a loop makes
 * no system call, and the enumeration costs a process at most one per
 * VIEW_NS. The process's own part is always exact (own_of). The snapshot
 * lives in this process's memory and is filled only from the ledger's
 * locks, never from the usage region.
 */
#define VIEW_NS (KEEP_NS - 10000000ll) /* so that with the coarse clock's tick (at most 10 ms) it is a keeper period */

static struct view {
	unsigned seq;       /* odd while written: a reader that sees it measures itself */
	uint64_t leased, held; /* the others', as measured */
	uint64_t changes;   /* changes[idx] before the measurement */
	int64_t at;         /* CLOCK_MONOTONIC_COARSE before the measurement; 0: none */
} views[VGPU_MAX_DEVICES];
static pthread_mutex_t view_mu = PTHREAD_MUTEX_INITIALIZER; /* one writer at a time */

/* The snapshot of idx when it is fresh enough to answer a report: 1, else 0. */
static int view_get(int idx, uint64_t *leased, uint64_t *held)
{
	struct view *v = &views[idx];
	unsigned s = __atomic_load_n(&v->seq, __ATOMIC_ACQUIRE);
	if (s & 1)
		return 0;
	uint64_t l = __atomic_load_n(&v->leased, __ATOMIC_RELAXED), h = __atomic_load_n(&v->held, __ATOMIC_RELAXED);
	uint64_t c = __atomic_load_n(&v->changes, __ATOMIC_RELAXED);
	int64_t at = __atomic_load_n(&v->at, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&v->seq, __ATOMIC_RELAXED) != s || !at ||
	    c != __atomic_load_n(&changes[idx], __ATOMIC_SEQ_CST) || vgpu_coarse_ns() - at >= VIEW_NS)
		return 0;
	*leased = l;
	*held = h;
	return 1;
}

static void view_put(int idx, uint64_t c, int64_t at, uint64_t leased, uint64_t held)
{
	if (pthread_mutex_trylock(&view_mu) != 0)
		return; /* another thread is writing one, no older than ours */
	struct view *v = &views[idx];
	__atomic_store_n(&v->seq, v->seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&v->leased, leased, __ATOMIC_RELAXED);
	__atomic_store_n(&v->held, held, __ATOMIC_RELAXED);
	__atomic_store_n(&v->changes, c, __ATOMIC_RELAXED);
	__atomic_store_n(&v->at, at, __ATOMIC_RELAXED);
	__atomic_store_n(&v->seq, v->seq + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&view_mu);
}

/* The others' leases and held reports on idx, measured now (and kept as the
 * view): 0, or -1 with errno. */
static int others_of(int idx, uint64_t *leased, uint64_t *held)
{
	uint64_t c = __atomic_load_n(&changes[idx], __ATOMIC_SEQ_CST);
	int64_t at = vgpu_coarse_ns();
	if (vgpu_ledger_reader() != 0 || vgpu_ledger_others(idx, leased) != 0 ||
	    vgpu_ledger_others_held(idx, held) != 0)
		return -1;
	view_put(idx, c, at, *leased, *held);
	return 0;
}

static int usage(int idx, int view, uint64_t *used, uint64_t *committed)
{
	uint64_t mine = own_of(idx), held = 0, leased = 0;
	if (!(view && view_get(idx, &leased, &held)) && others_of(idx, &leased, &held) != 0) {
		/* Unknown: report the slice as full rather than invite allocations. */
		uint64_t limit = vgpu.limits.gpu[idx].memory;
		*used = *committed = limit > mine ? limit : mine;
		return -1;
	}
	*used = vgpu_sat_add(mine, held);
	*committed = vgpu_sat_add(mine, leased);
	return 0;
}

int vgpu_quota_usage(int idx, uint64_t *used, uint64_t *committed)
{
	return usage(idx, 0, used, committed);
}

int vgpu_quota_view(int idx, uint64_t *used, uint64_t *committed)
{
	return usage(idx, 1, used, committed);
}

uint64_t vgpu_quota_used(int idx)
{
	uint64_t used, committed;
	vgpu_quota_usage(idx, &used, &committed);
	return used;
}

/* Unused leases back to the container at exit: the kernel drops the locks
 * only once the process is gone, and an exit can take a while. */
static void at_exit(void)
{
	vgpu_ledger_lock();
	for (int d = 0; d < vgpu.limits.ngpu && vgpu.mode == VGPU_ENFORCE; d++)
		trim_locked(d, 0);
	vgpu_ledger_unlock();
}

static void after_fork(void)
{
	/* The child holds none of the parent's device memory (CUDA state does not survive fork). */
	memset(lease, 0, sizeof(lease));
	memset(avail, 0, sizeof(avail));
	memset(grant, 0, sizeof(grant));
	memset(unled, 0, sizeof(unled));
	memset(kept, 0, sizeof(kept));
	/* The parent is one of the others now: the child's views measure afresh. */
	memset(changes, 0, sizeof(changes));
	memset(views, 0, sizeof(views));
	pthread_mutex_init(&view_mu, NULL);
	keeper_state = 0; /* the parent's keeper thread is not the child's */
}
VGPU_LIFECYCLE(quota, .order = VGPU_ORDER_QUOTA, .after_fork = after_fork, .at_exit = at_exit);
