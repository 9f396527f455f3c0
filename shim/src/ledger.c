/*
 * The ledger: what each process of the container holds, published where the
 * tenant cannot write it.
 *
 * The usage region is writable from inside the container, by any process and
 * without capabilities, so no quota decision may rest on it. The limits file
 * is mounted read-only, but a read-only file can still carry fcntl read locks,
 * and locks have the three properties the accounting needs:
 *
 *  - only the open file description that took a lock can change or drop it
 *    (no other process, whatever it writes, can lower what a process holds);
 *  - the kernel drops them when the process dies, or execs (O_CLOEXEC), at the
 *    moment the driver frees its memory: no reaping, no stale entries;
 *  - any process that can open the file can see all of them (F_OFD_GETLK).
 *
 * Per GPU, the container's quota is an interval of the lock space exactly as
 * long as the memory limit: the pool (with shards, cut into sub-pools: below). A process's lease (the bytes it has
 * taken from the quota: what it holds plus what it may still allocate
 * without asking again, quota.c) is a set of stretches of the pool that it
 * holds read locks on, and no other process holds any lock on. Stretches of
 * different processes are disjoint and lie inside an interval of `limit`
 * bytes, so the leases of all processes together can never pass the limit:
 * the kernel's lock list is the proof, whatever the others are doing.
 *
 * A stretch is taken by set-then-test: lock it, then ask whether any other
 * description holds a lock in it (F_OFD_GETLK ignores only the asker's own
 * description). If none does it is ours; if one does, it is given back and
 * the search moves past that lock. Of two processes racing for overlapping
 * stretches both may retreat, but never both stay: the one that tests second
 * sees the first's lock. (A search left short by such retreats while the
 * pool has room searches again: take_pool_settled.) A grant therefore costs
 * two lock operations (and one query of the overflow, below) whatever the
 * number of processes, where the pool has room where the process looks: it
 * first extends its last stretch, a new process starts at a random place.
 * Only a nearly full pool makes it walk from lock to lock.
 *
 * Memory the driver has already handed out (vgpu_quota_charge_force) is counted
 * whether or not it fits: from the whole pool first, and what the pool
 * cannot take goes to the GPU's overflow interval, taken the same way. While
 * any process holds overflow the pool has room past the limit, so a grant is
 * checked against the union of every other lease (pool and overflow, one
 * query per lock found) rather than by the pool alone, and its chunk gives
 * way to what it asked.
 *
 * What neither can take (locks forged over the pool and the whole overflow)
 * is the process's debt: never dropped, published as the length of locks in
 * ranges of its slot's own (where nobody else's lock can make it shorter),
 * with a flag byte just past the overflow that makes every grant of the
 * container check itself against the union of the leases plus every debt,
 * as overflow does. The debtor moves its debt into the pool or the overflow
 * as soon as either has room: at its next grant, and from its keeper thread
 * (quota.c) within a tenth of a second. So a forged lock can only make the
 * container look fuller: once the forger lets go, what the driver handed out
 * meanwhile still counts, and no grant passes the limit by it.
 *
 * What each process holds (cuMemGetInfo, NVML, the usage region) is a report
 * beside the lease, published as the length of a read lock in ranges of the
 * process's own: brought up to date whenever it takes or returns lease and
 * otherwise within a tenth of a second. Never more than its lease.
 *
 * A process can only add to what others measure (self-harm: its container
 * gets less, or looks fuller), never take away from it.
 *
 * Slots. One limits file can be shared by processes of several pid
 * namespaces (the containers of a pod that share a DRA claim), so a pid does
 * not name one live process among those that publish here: two processes
 * with pid 7 would publish in the same ranges, and neither could measure the
 * other. Each process therefore first takes a slot, a number in
 * [1, 2^22) that no other live process sharing the file has, and keys its
 * ranges by it. The file is read-only, so only read locks exist and no lock
 * can exclude another: a slot is taken by set-then-test. The process takes
 * an open-file-description read lock on the slot's ownership byte, then asks
 * whether any other description holds a lock there (F_OFD_GETLK ignores only
 * the asker's own description); if one does, it drops its own and tries
 * another slot. Of two processes racing for one slot both may retreat, but
 * never both stay: the one that tests second sees the first's lock. A slot is
 * also taken while any lock lies in its ranges (held, host pid claims,
 * identity): a forged lock, or one whose description somehow lost its
 * ownership byte, costs that slot and is never joined. The first slot
 * tried is the process's pid (unique within one namespace: in the common
 * case slot = pid, and the lock space reads as before), then random ones,
 * 64 tries in all; a process that finds none (a tenant holding every
 * ownership byte: its own claim only) fails closed. A fork child takes a
 * slot of its own; the kernel frees a slot when its process execs or dies.
 * The ownership byte is an open-file-description lock: a program that closes
 * some other descriptor of the file does not drop it.
 *
 * Readers need the process behind a slot (the NVML process lists rename
 * host pids to container pids, the region lists processes): the slot's
 * identity byte carries a process-associated lock (F_SETLK) of its owner,
 * and the kernel reports such a lock's holder as its pid in the reader's
 * pid namespace, 0 when the holder is not visible there. A process of
 * another pid namespace is therefore counted in every measurement but named
 * by none: its held bytes go where bytes no process can be named for go
 * (Contract 7).
 *
 * Shards. Every lock operation walks the kernel's one list of the locks of
 * the file it is made on, so with every process's locks on one file a grant
 * costs time in proportion to the number of processes. A limits file with
 * `ledger.shards=K` spreads the ledger over K more read-only files, the
 * shards 0..K-1 of the ledger directory, each with the lock space below:
 *  - slot k's ranges (ownership, identity, held, SM use, debt, host pid
 *    claims) lie on shard k mod K, its home shard, at the offsets below;
 *  - GPU d's pool is cut into K sub-pools: sub-pool j is [0, limit / K) of
 *    GPU d's block on shard j (sub-pool 0 also has the remainder), so the
 *    sub-pools sum to the limit and the leases still never pass it. A grant
 *    takes from its home sub-pool first (extending its last stretch there)
 *    and from the next ones in order only for what it lacks: a refusal has
 *    looked at every sub-pool, and a grant that fits at home makes its two
 *    lock operations on a file whose list holds about N / K processes' locks;
 *  - the overflow and the debt flags stay on the limits file, which then
 *    carries no other lock of the shim's: a grant's query of them stays short;
 *  - readers that enumerate (others' leases, held reports, host pid claims)
 *    walk every shard.
 * A shard is opened at its first use (one open per shard and process, ever:
 * closing a second descriptor of it would drop the process's own locks
 * there) and kept. It must be a regular file on the limits file's file
 * system, the one first opened; anything else and every allocation fails.
 * Without the key the ledger is the limits file alone, with the one pool: a
 * record of the previous release, whose processes and these then agree.
 *
 * Lock space (64-bit offsets; with shards, of each shard, but for the
 * overflow and the debt flags, which stay on the limits file):
 *   GPU d, pool:           d * 2^58 + [0, limit), stretches (open file description)
 *   GPU d, overflow:       d * 2^58 + 2^48 + [0, 2^47), stretches (open file description)
 *   GPU d, some debt:      d * 2^58 + 2^48 + 2^47, length 1, held by each debtor (open file description)
 *   GPU d, debt / 65536:   d * 2^58 + 2^57 + slot * 2^31, length = debt >> 16
 *   GPU d, debt % 65536:   d * 2^58 + 2^57 + 2^53 + slot * 2^16, length = debt & 65535
 *   GPU d, held / 65536:   d * 2^58 + 2^57 + 2^56 + slot * 2^31, length = held >> 16
 *   GPU d, held % 65536:   d * 2^58 + 2^57 + 2^56 + 2^53 + slot * 2^16, length = held & 65535
 *   GPU d, SM use:         d * 2^58 + 2^56 + 2^53 + slot * 2^16, length = percent (0..100)
 *   host pid claims:       2^62 + slot * 2^32 + host pid, length 1
 *   slot ownership:        2^62 + 2^54 + slot, length 1 (open file description)
 *   slot identity:         2^62 + 2^54 + 2^22 + slot, length 1 (process)
 * slot < 2^22 (PID_MAX_LIMIT on 64-bit kernels, so any pid is a slot); a
 * pool holds at most 2^47 bytes (128 TiB; a larger limit is that), and so
 * does a process's held report per GPU. The exact held count needs two
 * ranges: one of 2^47 bytes per (GPU, slot) does not fit 2^26 times in 2^63.
 *
 * The host pid claims give the SM limiter the container's processes in NVML's
 * numbering, on the same terms. They are process-associated locks (F_SETLK),
 * not open-file-description ones: the kernel reports the pid that holds such
 * a lock (in the reader's pid namespace), so a reader can tell a claim in
 * slot k's range that k's owner itself holds (its holder is the identity
 * byte's holder) from one another process put there. The NVML process lists
 * show only such claims (another container's host pid named in a forged
 * claim stays hidden); the limiter counts every claim, where a forgery can
 * only make the container look busier. A process drops its
 * process-associated locks (claim and identity alike) when it closes any
 * descriptor of the file: still_ours() takes them again when the program
 * closed the shim's descriptor, claim_stands() when it closed one of its own.
 *
 * A process takes its slot before its first lease (vgpu_ledger_grow), so
 * that no memory it holds goes unreported; memory the driver already handed
 * out is counted without one.
 *
 * Publishing is serialised by the process's mutex (vgpu_ledger_lock), which
 * callers take: the leases (quota.c) and the report (region.c) change under
 * it too, so a grant publishes and reports in one hold. Nothing here takes
 * it itself but the two calls made without it (vgpu_ledger_reader,
 * vgpu_ledger_publish_util); measuring is a series of atomic kernel queries.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "ledger.h"
#include "lifecycle.h"
#include "log.h"

_Static_assert(sizeof(off_t) == 8, "the ledger needs 64-bit file offsets");

#define PID_BITS 22
#define DEV_SHIFT 58
#define HP_AT ((off_t)VGPU_MAX_DEVICES << DEV_SHIFT)
#define HP_END (HP_AT + ((off_t)1 << (PID_BITS + 32)))
#define SLOTS ((int32_t)1 << PID_BITS)
#define OWN_AT HP_END
#define ID_AT (OWN_AT + SLOTS)
#define SLOT_TRIES 64
#define MAX_BYTES (((uint64_t)1 << 47) - 1)
/* Queries one measurement may take: two per lock found, plus one. A tenant
 * who sprays more locks than this only makes its own allocations fail. */
#define MAX_QUERIES 65536
/* A host pid claim made or seen standing this recently is not queried again. */
#define CLAIM_FRESH_NS 50000000ll

/*
 * The held report per (GPU, slot): bytes >> unit in a "high" range of 2^span
 * units per slot at hi, bytes & (2^unit - 1) in a "low" range of 2^unit per
 * slot at lo (offsets within the GPU's block of 2^58).
 */
struct family {
	off_t hi, lo;
	int unit, span;
};
static const struct family HELD = {((off_t)1 << 57) + ((off_t)1 << 56),
				   ((off_t)1 << 57) + ((off_t)1 << 56) + ((off_t)1 << 53), 16, 31};
/* The SM time a process last saw itself use, in percent: the low range alone
 * (the high one stays empty). Read for the container's processes of other pid
 * namespaces, whose NVML samples the driver may not show here. */
static const struct family UTIL = {(off_t)1 << 56, ((off_t)1 << 56) + ((off_t)1 << 53), 16, 31};
/* Memory counted by force that neither the pool nor the overflow had room for
 * (locks forged over both): the process's debt, until it is placed there. */
static const struct family DEBT = {(off_t)1 << 57, ((off_t)1 << 57) + ((off_t)1 << 53), 16, 31};

/* End of a family's part of a GPU's block (relative to the block). */
#define FAMILY_END(f) ((f).lo + ((off_t)1 << (PID_BITS + (f).unit)))

/* The pool and the overflow interval, relative to a GPU's block. */
#define POOL_MAX ((off_t)1 << 47)
#define OVER_AT ((off_t)1 << 48)
#define OVER_END (OVER_AT + POOL_MAX)
/* Stretches one process keeps per GPU: a lease taken from a fragmented pool
 * needs several; beyond this many it takes no more (its grants fail). */
#define MAX_STRETCHES 256

_Static_assert(16 + 31 == 47, "the held report holds 2^47 bytes per slot");
/* A debtor's flag, just past the overflow: a grant's query of the overflow sees it too. */
#define DEBT_FLAG OVER_END
_Static_assert(OVER_END + 1 <= ((off_t)1 << 56), "pool, overflow and debt flag end before the SM use part");
_Static_assert(((off_t)1 << 56) + ((off_t)1 << 53) + ((off_t)1 << (PID_BITS + 16)) <= ((off_t)1 << 57),
	       "the SM use part ends before the debt part");
_Static_assert(((off_t)1 << 57) + ((off_t)1 << 53) + ((off_t)1 << (PID_BITS + 16)) <= ((off_t)1 << 57) + ((off_t)1 << 56),
	       "the debt part ends before the held part");
_Static_assert(((off_t)1 << 56) + ((off_t)1 << 53) + ((off_t)1 << (PID_BITS + 16)) <= ((off_t)1 << 57) + ((off_t)1 << 56),
	       "the SM use part ends before the held part");
_Static_assert(((off_t)1 << (PID_BITS + 31)) <= ((off_t)1 << 53), "held highs fit below the held lows");
_Static_assert(((off_t)1 << 57) + ((off_t)1 << 56) + ((off_t)1 << 53) + ((off_t)1 << (PID_BITS + 16)) <=
		       ((off_t)1 << DEV_SHIFT),
	       "a GPU's block");
_Static_assert((uint64_t)HP_END < ((uint64_t)1 << 63), "host pid claims fit in off_t");
_Static_assert((uint64_t)ID_AT + (uint64_t)SLOTS < ((uint64_t)1 << 63), "slot bytes fit in off_t");

static int fd = -1;
static struct stat ident;                   /* what fd was opened on */
/* Ledger shards (see the top): nsh files <ldir>/0..nsh-1; 0 = the ledger on
 * the limits file alone. A shard's descriptor, plus one (0: not open yet),
 * opened at its first use and kept; the inode it was opened on. */
static int nsh;
static char *ldir; /* on the heap, as region.c's paths; NULL: none to be had (fails closed) */
static int shfd1[VGPU_LEDGER_MAX_SHARDS];
static ino_t shino[VGPU_LEDGER_MAX_SHARDS];
static pthread_mutex_t shmu = PTHREAD_MUTEX_INITIALIZER; /* opening shards: never two opens of one */
static int32_t me;                          /* our pid, as getpid() says */
static int32_t slot = -1;                   /* the slot our ranges belong to; -1 = none yet */
static char *path;                          /* to reopen in a fork child; NULL as ldir */
static uint64_t leased[VGPU_MAX_DEVICES];   /* lease our locks say, per GPU: the sum of the stretches */
static uint64_t held[VGPU_MAX_DEVICES];     /* held bytes our locks say, per GPU */
/* The least and the most held[] said since vgpu_ledger_held_mark (see there). */
static uint64_t held_least[VGPU_MAX_DEVICES], held_most[VGPU_MAX_DEVICES];
static uint64_t util[VGPU_MAX_DEVICES];     /* SM use our locks say, per GPU, percent */
static uint64_t owed[VGPU_MAX_DEVICES];     /* our debt per GPU: counted by force, in no stretch */
static uint64_t owed_pub[VGPU_MAX_DEVICES]; /* the debt our locks say (flag included when > 0) */
static int32_t claimed_hp;                  /* host pid our claim says; 0 = none */
static int64_t claim_seen_ns;               /* CLOCK_MONOTONIC_COARSE when the claim was last made or seen */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* the process's mutex (see the top) */
/* A grant's check of the descriptor (still_ours()) stood, in this hold of mu:
 * the report published next under it needs no second one. A close by another
 * thread between the two is no different from one just after the second:
 * the next operation's check finds either. Cleared whenever mu is released. */
static int stood;

/* Our lease on one GPU: disjoint stretches [s, e) of its pool and overflow
 * (block-relative), sorted, none adjacent to another (the kernel merges
 * adjacent locks of one description, and so do we). */
struct stretch {
	off_t s, e;
};
struct lease {
	int n, placed;
	off_t cursor; /* where the next grant looks first, once placed: the end of the last stretch taken */
	struct stretch st[MAX_STRETCHES];
};
static struct lease lz[VGPU_MAX_DEVICES];

static off_t hi_at(const struct family *f, int d, int32_t k)
{
	return ((off_t)d << DEV_SHIFT) + f->hi + ((off_t)k << f->span);
}

static off_t lo_at(const struct family *f, int d, int32_t k)
{
	return ((off_t)d << DEV_SHIFT) + f->lo + ((off_t)k << f->unit);
}

static off_t hp_at(int32_t k, int32_t hp)
{
	return HP_AT + ((off_t)k << 32) + (off_t)(uint32_t)hp;
}

/* fcntl through syscall(2): the libc wrapper is fcntl64@GLIBC_2.28 when built here. */
static int setlk_cmd(int f, int cmd, short type, off_t start, off_t len)
{
	if (len <= 0)
		return 0;
	if (f < 0) {
		errno = EBADF;
		return -1;
	}
	struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
	for (;;) {
		if (syscall(SYS_fcntl, f, cmd, &fl) == 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

static int setlk(int f, short type, off_t start, off_t len)
{
	return setlk_cmd(f, F_OFD_SETLK, type, start, len);
}

/* A host pid claim: held by this process, so readers see who holds it. */
static int claim_lk(int f, short type, off_t start)
{
	return setlk_cmd(f, F_SETLK, type, start, 1);
}

static int same_file(int a, const struct stat *b)
{
	struct stat s;
	return syscall(SYS_fstat, a, &s) == 0 && s.st_ino == b->st_ino && s.st_dev == b->st_dev;
}

/* The limits file's descriptor: one atomic read (still_ours() may replace it). */
static int lfd(void)
{
	return __atomic_load_n(&fd, __ATOMIC_ACQUIRE);
}

/* Shards in use: 1 on the limits file alone (shard 0 is the limits file then). */
static int shards(void)
{
	return nsh ? nsh : 1;
}

/*
 * Opens shard j: a regular file on the limits file's device (a FIFO, a
 * directory, a symbolic link, a file of another file system or one that
 * replaced the shard first opened is refused, and the ledger with it: every
 * allocation fails closed). The caller holds shmu.
 */
static int open_shard(int j)
{
	char p[4200];
	int f = -1;
	if (!ldir)
		errno = ENOMEM;
	else if (snprintf(p, sizeof(p), "%s/%d", ldir, j) >= (int)sizeof(p))
		errno = ENAMETOOLONG;
	else
		f = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	struct stat st;
	const char *why = NULL;
	if (f < 0)
		why = strerror(errno);
	else if (syscall(SYS_fstat, f, &st) != 0)
		why = strerror(errno);
	else if (!S_ISREG(st.st_mode))
		why = "not a regular file";
	else if (st.st_dev != ident.st_dev)
		why = "not on the limits file's file system";
	else if (shino[j] && st.st_ino != shino[j])
		why = "replaced since it was first opened";
	if (why) {
		static int said;
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			LOGE("ledger shard %s: %s; GPU memory allocations will fail", p, why);
		if (f >= 0)
			close(f);
		errno = EBADF;
		return -1;
	}
	shino[j] = st.st_ino;
	return vgpu_high_fd(f);
}

/* The descriptor of shard j (the limits file without shards), opened at its
 * first use; -1 with errno when it cannot be. Callable without the process's
 * mutex: readers run without it. */
static int shard(int j)
{
	if (!nsh)
		return lfd();
	int f1 = __atomic_load_n(&shfd1[j], __ATOMIC_ACQUIRE);
	if (f1)
		return f1 - 1;
	/* One open per shard, ever: a second descriptor of it closed again
	 * would drop this process's own locks there (the slot's identity). */
	pthread_mutex_lock(&shmu);
	f1 = shfd1[j];
	if (!f1) {
		int f = open_shard(j);
		f1 = f >= 0 ? f + 1 : 0;
		__atomic_store_n(&shfd1[j], f1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&shmu);
	if (!f1)
		errno = EBADF;
	return f1 - 1;
}

/* Shard j's descriptor for a reading a quota decision rests on: checked to
 * still be the shard (a program may have closed it and opened another file
 * under its number, whose locks would read as nobody's), else opened again. */
static int shard_checked(int j)
{
	int f = shard(j);
	struct stat st;
	if (!nsh || f < 0 || (syscall(SYS_fstat, f, &st) == 0 && st.st_ino == shino[j] && st.st_dev == ident.st_dev))
		return f;
	pthread_mutex_lock(&shmu);
	if (shfd1[j] == f + 1)
		__atomic_store_n(&shfd1[j], 0, __ATOMIC_RELEASE); /* the number is the program's now */
	pthread_mutex_unlock(&shmu);
	return shard(j);
}

/* Forgets every shard descriptor; those still on their shard are closed
 * (the locks of ours there go with them), any other number is left to the
 * program that now owns it. */
static void drop_shards(void)
{
	pthread_mutex_lock(&shmu);
	for (int j = 0; j < VGPU_LEDGER_MAX_SHARDS; j++) {
		int f = shfd1[j] - 1;
		if (f < 0)
			continue;
		struct stat st;
		if (syscall(SYS_fstat, f, &st) == 0 && st.st_ino == shino[j] && st.st_dev == ident.st_dev)
			close(f);
		__atomic_store_n(&shfd1[j], 0, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&shmu);
}

/* Slot k's home shard: where all of its ranges lie. */
static int home_of(int32_t k)
{
	return (int)((uint32_t)k % (uint32_t)shards());
}

#define HIGH_FD 300

int vgpu_high_fd(int fd)
{
	if (fd < 0 || fd >= HIGH_FD)
		return fd;
	int nfd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, HIGH_FD);
	if (nfd < 0)
		return fd; /* RLIMIT_NOFILE below it: keep the number we have */
	close(fd);
	return nfd;
}

void vgpu_ledger_init(int limits_fd, const char *limits_path, const char *ledger_dir, int nshards)
{
	if (fd >= 0 && fd != limits_fd)
		close(fd); /* a re-run of the initialisation in a fork child */
	drop_shards();
	memset(shino, 0, sizeof(shino));
	nsh = ledger_dir && nshards > 0 && nshards <= VGPU_LEDGER_MAX_SHARDS ? nshards : 0;
	free(ldir);
	ldir = strdup(nsh ? ledger_dir : "");
	memset(&ident, 0, sizeof(ident));
	fd = vgpu_high_fd(limits_fd);
	if (fd >= 0 && syscall(SYS_fstat, fd, &ident) != 0) {
		close(fd);
		fd = -1;
		memset(&ident, 0, sizeof(ident));
	}
	me = (int32_t)getpid();
	slot = -1;
	free(path);
	path = strdup(limits_path);
	/* lz[] (64 KiB) is not cleared here: zero in a new process, and a fork
	 * child's are cleared by its fork handler (after_fork) before it can re-run
	 * this; writing it would fault in 16 pages for nothing. */
	memset(leased, 0, sizeof(leased));
	memset(held, 0, sizeof(held));
	memset(held_least, 0, sizeof(held_least));
	memset(held_most, 0, sizeof(held_most));
	claimed_hp = 0;
	claim_seen_ns = 0;
}

void vgpu_ledger_lock(void)
{
	pthread_mutex_lock(&mu);
}

void vgpu_ledger_unlock(void)
{
	stood = 0;
	pthread_mutex_unlock(&mu);
}

int vgpu_ledger_trylock(void)
{
	return pthread_mutex_trylock(&mu);
}

static void after_fork(void)
{
	/* Single-threaded here (fork child). A parent thread may have held the mutex. */
	pthread_mutex_init(&mu, NULL);
	pthread_mutex_init(&shmu, NULL);
	stood = 0;
	/* The shards' descriptors share the parent's descriptions, and its
	 * locks: closed (that drops nothing of the parent's), opened again at
	 * the child's first use. */
	for (int j = 0; j < VGPU_LEDGER_MAX_SHARDS; j++)
		if (shfd1[j]) {
			close(shfd1[j] - 1);
			shfd1[j] = 0;
		}
	/* The inherited descriptor shares the parent's open file description,
	 * and with it the parent's locks: the child must neither change them nor
	 * publish into them. Closing it drops nothing (the parent still holds
	 * the description). The child gets a description of its own on the same
	 * file, through /proc (the path may name another file by now). */
	memset(leased, 0, sizeof(leased));
	memset(held, 0, sizeof(held));
	memset(held_least, 0, sizeof(held_least));
	memset(held_most, 0, sizeof(held_most));
	memset(util, 0, sizeof(util));
	memset(owed, 0, sizeof(owed));
	memset(owed_pub, 0, sizeof(owed_pub));
	memset(lz, 0, sizeof(lz));
	claimed_hp = 0;
	claim_seen_ns = 0;
	me = (int32_t)getpid();
	slot = -1; /* the parent's stays the parent's: ours is taken at our first publication */
	if (fd < 0)
		return;
	struct stat was;
	int ok = syscall(SYS_fstat, fd, &was) == 0;
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	int nfd = ok ? open(self, O_RDONLY | O_CLOEXEC) : -1;
	if (nfd < 0 && ok)
		nfd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (nfd >= 0 && !same_file(nfd, &was)) {
		close(nfd);
		nfd = -1;
	}
	close(fd);
	fd = vgpu_high_fd(nfd); /* -1: allocations fail closed, with a line saying why */
}
VGPU_LIFECYCLE(ledger, .order = VGPU_ORDER_LEDGER, .after_fork = after_fork);

/* What our locks publish: held bytes on GPU d, the host pid claimed (0: none). */
uint64_t vgpu_ledger_held(int d)
{
	return d >= 0 && d < VGPU_MAX_DEVICES ? held[d] : 0;
}

int32_t vgpu_ledger_claimed(void)
{
	return claimed_hp;
}

/*
 * Whether another process reading our held report on GPU d since the last
 * vgpu_ledger_held_mark(d) may have read bytes. A reader sees the values it
 * went through, and more: a change moves the high range and the low range
 * one after the other, and a reader's scan queries them one after the other,
 * so it may pair the high part of one value with the low part of another.
 * Whatever it read lies between the least value's high part and the most
 * value's high part plus a whole low range.
 */
int vgpu_ledger_held_seen(int d, uint64_t bytes)
{
	uint64_t low = ((uint64_t)1 << HELD.unit) - 1;
	if (d < 0 || d >= VGPU_MAX_DEVICES)
		return 0;
	return bytes >= (held_least[d] & ~low) && bytes <= (held_most[d] | low);
}

/* Starts what vgpu_ledger_held_seen(d) answers for afresh: from what our
 * locks say now and also (what this process last wrote elsewhere). */
void vgpu_ledger_held_mark(int d, uint64_t also)
{
	if (d < 0 || d >= VGPU_MAX_DEVICES)
		return;
	held_least[d] = held[d] < also ? held[d] : also;
	held_most[d] = held[d] > also ? held[d] : also;
}

/* ---- slots ----------------------------------------------------------------------------- */

/* The first lock another description or process holds in [start, start +
 * len), in *fl (l_type F_UNLCK: none): one query. 0, or -1 with errno. */
static int query(int f, off_t start, off_t len, struct flock *fl)
{
	*fl = (struct flock){.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
	if (f < 0) {
		errno = EBADF;
		return -1;
	}
	while (syscall(SYS_fcntl, f, F_OFD_GETLK, fl) != 0)
		if (errno != EINTR)
			return -1;
	return 0;
}

/* Whether another description or process holds a lock in [start, start + len): one query. */
static int locked_by_other(int f, off_t start, off_t len, int32_t *holder)
{
	struct flock fl;
	if (query(f, start, len, &fl) != 0)
		return -1;
	if (holder)
		*holder = fl.l_type == F_UNLCK ? 0 : fl.l_pid;
	return fl.l_type != F_UNLCK;
}

/*
 * Whether slot k is someone else's: a lock on its ownership byte other than
 * ours, or any lock in its ranges (of the GPUs the limits file lists: nobody
 * measures the others). 1, 0, or -1 with errno.
 */
static int slot_taken(int f, int32_t k)
{
	int r = locked_by_other(f, OWN_AT + k, 1, NULL);
	if (!r)
		r = locked_by_other(f, ID_AT + k, 1, NULL);
	if (!r)
		r = locked_by_other(f, hp_at(k, 0), (off_t)1 << 32, NULL);
	for (int d = 0; !r && d < vgpu.limits.ngpu && d < VGPU_MAX_DEVICES; d++) {
		r = locked_by_other(f, hi_at(&HELD, d, k), (off_t)1 << HELD.span, NULL);
		if (!r)
			r = locked_by_other(f, lo_at(&HELD, d, k), (off_t)1 << HELD.unit, NULL);
	}
	return r;
}

/* Set-then-test on slot k: 0 (ours now), or -1 with errno (EBUSY: someone else's). */
static int try_slot(int32_t k)
{
	int f = shard(home_of(k));
	if (setlk(f, F_RDLCK, OWN_AT + k, 1) != 0)
		return -1;
	int r = slot_taken(f, k);
	if (r == 0 && claim_lk(f, F_RDLCK, ID_AT + k) == 0)
		return 0;
	int e = r > 0 ? EBUSY : errno;
	setlk(f, F_UNLCK, OWN_AT + k, 1);
	errno = e;
	return -1;
}

/* A number for picking slots: distinct enough between processes that start together. */
static uint64_t next_random(void)
{
	static __thread uint64_t x;
	if (!x) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		x = ((uint64_t)ts.tv_nsec << 22) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)(uint32_t)me << 32) ^
		    (uint64_t)syscall(SYS_gettid) ^ 0x9e3779b97f4a7c15ull;
	}
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

/*
 * Takes a slot if we have none: our pid first, then random ones; between
 * tries that lost a race, a pause of a few microseconds so that two
 * claimants do not keep meeting. 0, or -1 with errno.
 */
static int take_slot(void)
{
	if (slot >= 0)
		return 0;
	if (fd < 0) {
		errno = EBADF;
		return -1;
	}
	int32_t k = me > 0 && me < SLOTS ? me : 0;
	for (int i = 0; i < SLOT_TRIES; i++) {
		if (k <= 0)
			k = (int32_t)(next_random() % (uint64_t)(SLOTS - 1)) + 1;
		if (try_slot(k) == 0) {
			slot = k;
			if (k != me)
				LOGD("ledger slot %d (slot %d is another process's)", (int)k, (int)me);
			return 0;
		}
		if (errno != EBUSY)
			return -1;
		k = 0;
		if (i >= 8) {
			struct timespec ts = {0, (long)(next_random() % 20000)};
			nanosleep(&ts, NULL);
		}
	}
	LOGD("ledger: no free slot after %d tries", SLOT_TRIES);
	errno = EBUSY; /* the caller says so, once */
	return -1;
}

/*
 * Moves what family f publishes for us on GPU d from was to bytes. Grows by
 * locking the new tail (it merges with the lock we have), shrinks by
 * unlocking the old tail; growing can fail (nothing changed then), shrinking
 * cannot.
 */
static int put(const struct family *f, int d, uint64_t was, uint64_t bytes)
{
	uint64_t mask = ((uint64_t)1 << f->unit) - 1;
	off_t hi = (off_t)(bytes >> f->unit), old_hi = (off_t)(was >> f->unit);
	off_t lo = (off_t)(bytes & mask), old_lo = (off_t)(was & mask);
	off_t h = hi_at(f, d, slot), l = lo_at(f, d, slot);
	int sf = shard(home_of(slot));
	if (hi > old_hi && setlk(sf, F_RDLCK, h + old_hi, hi - old_hi) != 0)
		return -1;
	if (lo > old_lo && setlk(sf, F_RDLCK, l + old_lo, lo - old_lo) != 0) {
		int e = errno;
		if (hi > old_hi)
			setlk(sf, F_UNLCK, h + old_hi, hi - old_hi);
		errno = e;
		return -1;
	}
	if (hi < old_hi)
		setlk(sf, F_UNLCK, h + hi, old_hi - hi);
	if (lo < old_lo)
		setlk(sf, F_UNLCK, l + lo, old_lo - lo);
	return 0;
}

/* ---- leases: stretches of the pool ----------------------------------------------------- */

static off_t block_of(int d)
{
	return (off_t)d << DEV_SHIFT;
}

/* The pool's length on GPU d: its memory limit; without one, as long as a pool can be. */
static off_t pool_len(int d)
{
	uint64_t limit = vgpu.limits.gpu[d].memory;
	return limit && limit < (uint64_t)POOL_MAX ? (off_t)limit : POOL_MAX;
}

/*
 * A lease's stretches are kept in one space per GPU, sorted: sub-pool j at
 * [j * POOL_MAX, j * POOL_MAX + its length) (offset 0 of the GPU's block on
 * shard j), the overflow from OVER_V (OVER_AT on the limits file). Without
 * shards, sub-pool 0 is the whole pool on the limits file: the space is the
 * lock space of the previous release.
 */
#define OVER_V ((off_t)1 << 56)
_Static_assert((off_t)VGPU_LEDGER_MAX_SHARDS * POOL_MAX <= OVER_V, "the sub-pools end before the overflow");

static off_t sub_lo(int j)
{
	return (off_t)j * POOL_MAX;
}

/* Sub-pool j's length: the pool's share, the remainder to sub-pool 0. The
 * sub-pools sum to the pool. */
static off_t sub_len(int d, int j)
{
	off_t p = pool_len(d), k = shards();
	return p / k + (j == 0 ? p % k : 0);
}

/* The descriptor and the offset there of point v of GPU d's stretch space. */
static int where(int d, off_t v, off_t *real)
{
	if (v >= OVER_V) {
		*real = block_of(d) + OVER_AT + (v - OVER_V);
		return lfd();
	}
	*real = block_of(d) + v % POOL_MAX;
	return shard((int)(v / POOL_MAX));
}

/* A lock on a stretch [v, v + len), which never crosses a sub-pool's end. */
static int slk(int d, short type, off_t v, off_t len)
{
	off_t r;
	int f = where(d, v, &r);
	return setlk(f, type, r, len);
}

/*
 * Our stretch containing c (its index), or -1; *next: the start of our first
 * stretch beyond c (INT64_MAX when none).
 */
static int own_at(const struct lease *l, off_t c, off_t *next)
{
	*next = INT64_MAX;
	for (int i = 0; i < l->n; i++) {
		if (c >= l->st[i].s && c < l->st[i].e)
			return i;
		if (l->st[i].s > c) {
			*next = l->st[i].s;
			break;
		}
	}
	return -1;
}

/* Records [s, e) as ours, merged with a stretch it touches. 0, or -1 when there is no room. */
static int add_stretch(struct lease *l, off_t s, off_t e)
{
	int i = 0;
	while (i < l->n && l->st[i].e < s)
		i++;
	if (i < l->n && l->st[i].e == s) { /* extends stretch i, perhaps up to the next */
		l->st[i].e = e;
		if (i + 1 < l->n && l->st[i + 1].s == e) {
			l->st[i].e = l->st[i + 1].e;
			memmove(&l->st[i + 1], &l->st[i + 2], (size_t)(l->n - i - 2) * sizeof(l->st[0]));
			l->n--;
		}
		return 0;
	}
	if (i < l->n && l->st[i].s == e) { /* extends stretch i downwards */
		l->st[i].s = s;
		return 0;
	}
	if (l->n >= MAX_STRETCHES)
		return -1;
	memmove(&l->st[i + 1], &l->st[i], (size_t)(l->n - i) * sizeof(l->st[0]));
	l->st[i] = (struct stretch){s, e};
	l->n++;
	return 0;
}

/*
 * Gives back [s, e), which lies inside one stretch of ours: the bytes given
 * back (0 when it would split a stretch and the table has no room for the
 * second half: then it stays ours, locked and counted).
 */
static uint64_t drop_stretch(int d, struct lease *l, off_t s, off_t e)
{
	for (int i = 0; i < l->n; i++) {
		struct stretch *t = &l->st[i];
		if (e <= t->s || s >= t->e)
			continue;
		if (s > t->s && e < t->e) { /* a hole in the middle */
			if (l->n >= MAX_STRETCHES)
				return 0;
			memmove(t + 2, t + 1, (size_t)(l->n - i - 1) * sizeof(*t));
			t[1] = (struct stretch){e, t->e};
			t->e = s;
			l->n++;
		} else if (s <= t->s && e >= t->e) {
			memmove(t, t + 1, (size_t)(l->n - i - 1) * sizeof(*t));
			l->n--;
		} else if (s <= t->s) {
			t->s = e;
		} else {
			t->e = s;
		}
		slk(d, F_UNLCK, s, e - s);
		return (uint64_t)(e - s);
	}
	return 0;
}

/*
 * Another description's lock in [s, e) of GPU d's block: 1, where it starts
 * inside [s, e) in *cs and where it ends in *ce (past e when it goes on: all
 * of [*cs, *ce) is someone else's, and a search jumps over it whole); 0 when
 * none; -1 with errno.
 */
static int conflict(int d, off_t s, off_t e, off_t *cs, off_t *ce)
{
	struct flock fl;
	off_t r;
	int f = where(d, s, &r);
	if (query(f, r, e - s, &fl) != 0)
		return -1;
	if (fl.l_type == F_UNLCK)
		return 0;
	off_t a = fl.l_start - r + s, b = fl.l_len > 0 ? a + fl.l_len : INT64_MAX / 2;
	*cs = a > s ? a : s;
	*ce = b;
	return 1;
}

/* Stretches one grant took, to give back if it fails as a whole. */
struct taken {
	int n;
	struct stretch st[MAX_STRETCHES];
};

/*
 * Takes up to want bytes of [lo, hi) of GPU d that no other process holds,
 * by set-then-test, starting at our cursor (a random place the first time)
 * and going round once. Stops early at the first lock met once it has
 * least: beyond that, more is worth no search. Adds to *got and records
 * each stretch in *t. 0, or -1 with errno (the stretches taken so far stay
 * ours and in *t).
 */
static int take_stretches(int d, off_t lo, off_t hi, uint64_t least, uint64_t want, uint64_t *got, struct taken *t)
{
	struct lease *l = &lz[d];
	off_t start = l->cursor;
	if (!l->placed || start < lo || start >= hi) {
		off_t span = hi - lo - (want < (uint64_t)(hi - lo) ? (off_t)want : hi - lo);
		start = lo + (span > 0 ? (off_t)(next_random() % (uint64_t)span) & ~(off_t)4095 : 0);
	}
	off_t c = start, end_lim = hi;
	int wrapped = 0, queries = 0;
	uint64_t got0 = *got;
	while (*got - got0 < want) {
		if (c >= end_lim) {
			if (wrapped || start == lo)
				break;
			wrapped = 1;
			c = lo;
			end_lim = start;
			continue;
		}
		off_t next;
		int i = own_at(l, c, &next);
		if (i >= 0) {
			c = l->st[i].e;
			continue;
		}
		uint64_t rest = want - (*got - got0);
		off_t e = (uint64_t)(end_lim - c) < rest ? end_lim : c + (off_t)rest;
		if (e > next)
			e = next;
		if (t->n >= (int)(sizeof(t->st) / sizeof(t->st[0])) || (queries += 2) > MAX_QUERIES) {
			errno = E2BIG;
			return -1;
		}
		if (slk(d, F_RDLCK, c, e - c) != 0)
			return -1;
		off_t cs = 0, ce = 0, skip = 0;
		int r;
		while ((r = conflict(d, c, e, &cs, &ce)) == 1) {
			skip = ce;
			if (cs <= c) {
				slk(d, F_UNLCK, c, e - c);
				e = c;
				break;
			}
			/* Free up to the lock found, perhaps: keep that part and test it again. */
			slk(d, F_UNLCK, cs, e - cs);
			e = cs;
			if (++queries > MAX_QUERIES) {
				slk(d, F_UNLCK, c, e - c);
				errno = E2BIG;
				return -1;
			}
		}
		if (r < 0) {
			int err = errno;
			slk(d, F_UNLCK, c, e - c);
			errno = err;
			return -1;
		}
		if (e > c) {
			if (add_stretch(l, c, e) != 0) {
				slk(d, F_UNLCK, c, e - c);
				errno = ENOSPC;
				return -1;
			}
			t->st[t->n++] = (struct stretch){c, e};
			*got += (uint64_t)(e - c);
			leased[d] += (uint64_t)(e - c);
			l->cursor = e;
			l->placed = 1;
		}
		if (skip) {
			if (*got - got0 >= least)
				break;
			c = skip;
		} else {
			c = e;
		}
	}
	return 0;
}

/*
 * Takes up to want bytes of GPU d's pool, at least least if it can: from our
 * home sub-pool first (where our last stretch is, usually: extending it),
 * then from the next ones in order. A sub-pool is another shard's: looked
 * at only when the ones before had too little, so a refusal has looked at
 * every one, and a grant that fits at home costs what it costs at any N.
 */
static int take_pool(int d, uint64_t least, uint64_t want, uint64_t *got, struct taken *t)
{
	int k = shards(), h = home_of(slot >= 0 ? slot : me);
	uint64_t got0 = *got;
	for (int i = 0; i < k && *got - got0 < want; i++) {
		if (i && *got - got0 >= least)
			break;
		int j = (h + i) % k;
		uint64_t g = *got - got0;
		if (take_stretches(d, sub_lo(j), sub_lo(j) + sub_len(d, j), least > g ? least - g : 0, want - g, got,
				   t) != 0)
			return -1;
	}
	return 0;
}

static int leases_of_others(int idx, uint64_t *bytes);

#ifdef VGPU_TEST_HOOKS
/* Test builds only (build/testhooks): the first NRI_VGPU_TEST_LOST_SEARCHES
 * searches of the pool in this process find nothing, as a search does that
 * another process's, made at the same moment over the same places, made
 * give up every place it set (see take_pool_settled). */
static int lost_search(void)
{
	static int left = -1;
	if (left < 0) {
		const char *e = getenv("NRI_VGPU_TEST_LOST_SEARCHES");
		left = e ? atoi(e) : 0;
	}
	return left > 0 ? left--, 1 : 0;
}
#else
static int lost_search(void)
{
	return 0;
}
#endif

#define SEARCH_ROUNDS 8      /* searches of one grant, at most */
#define SEARCH_PAUSE_NS 100000ll /* the first pause between them; each next one twice as long at most */

/*
 * take_pool, searched again while it comes up short of least though the
 * leases of all the processes leave the pool room for it. Set-then-test
 * never lets two processes both keep a place, but it lets both give it up:
 * two searches over the same places at the same moment each find the
 * other's lock in its test and move on, and in step they do so in every
 * sub-pool they both walk, each ending short while the pool has room (seen
 * under load with two processes filling a slice side by side). A pause of
 * random length, longer each round, takes them out of step. The check is
 * made only on a short search: the union of the others' leases, ours and
 * what is missing must fit the pool, or no search could find it and the
 * grant is refused at once, as before.
 */
static int take_pool_settled(int d, uint64_t least, uint64_t want, uint64_t *got, struct taken *t)
{
	uint64_t got0 = *got;
	for (int round = 0;; round++) {
		uint64_t g = *got - got0;
		if (!lost_search() && take_pool(d, least > g ? least - g : 0, want - g, got, t) != 0)
			return -1;
		g = *got - got0;
		uint64_t others = 0;
		if (g >= least || round + 1 >= SEARCH_ROUNDS || leases_of_others(d, &others) != 0 ||
		    vgpu_sat_add(vgpu_sat_add(others, leased[d]), least - g) > (uint64_t)pool_len(d))
			return 0;
		struct timespec ts = {0, (long)(next_random() % (uint64_t)(SEARCH_PAUSE_NS << round))};
		nanosleep(&ts, NULL);
	}
}

/* Gives back what one grant took, the last taken first: each step restores
 * the table as it was before that stretch, so no step splits a stretch. */
static void drop_stretches(int d, struct taken *t)
{
	for (int i = t->n - 1; i >= 0; i--)
		leased[d] -= drop_stretch(d, &lz[d], t->st[i].s, t->st[i].e);
	t->n = 0;
}

/* Whether any process holds overflow on GPU d (us included), or another owes
 * a debt there (its flag, just past the overflow: the same query): 1, 0, or
 * -1 with errno. */
static int over_held(int d)
{
	struct lease *l = &lz[d];
	if (l->n && l->st[l->n - 1].e > OVER_V)
		return 1;
	return locked_by_other(lfd(), block_of(d) + OVER_AT, DEBT_FLAG + 1 - OVER_AT, NULL);
}

static int others(const struct family *f, int idx, uint64_t *bytes);
static int still_ours(void);

/* Makes our locks say owed[d]: the debt ranges, and the flag while it is
 * not 0. 0, or -1 with errno (they say what they said). */
static int publish_debt(int d)
{
	uint64_t was = owed_pub[d], now = owed[d];
	if (now == was)
		return 0;
	if (now && take_slot() != 0)
		return -1;
	if (now && !was && setlk(lfd(), F_RDLCK, block_of(d) + DEBT_FLAG, 1) != 0)
		return -1;
	if (put(&DEBT, d, was, now) != 0) {
		int e = errno;
		if (!was)
			setlk(lfd(), F_UNLCK, block_of(d) + DEBT_FLAG, 1);
		errno = e;
		return -1;
	}
	/* Cleared last: the debt's place in the pool was taken before (settle()). */
	if (!now)
		setlk(lfd(), F_UNLCK, block_of(d) + DEBT_FLAG, 1);
	owed_pub[d] = now;
	return 0;
}

/* Moves what we owe on GPU d into the pool, else the overflow, wherever
 * either has room now; the debt shrinks only after (counted twice for a
 * moment, never not at all). */
static void settle(int d)
{
	uint64_t want = owed[d], got = 0;
	if (!want)
		return;
	struct taken t = {0}, o = {0};
	take_pool(d, want, want, &got, &t);
	if (got < want)
		take_stretches(d, OVER_V, OVER_V + POOL_MAX, want - got, want - got, &got, &o);
	if (!got)
		return;
	owed[d] -= got;
	if (publish_debt(d) != 0) /* smaller: cannot fail */
		LOGD("ledger: cannot publish the debt on GPU %d: %s", d, strerror(errno));
}

/* The debts the other processes owe on GPU d (0 without a flag): 0, or -1 with errno. */
static int debts_of_others(int d, uint64_t *bytes)
{
	*bytes = 0;
	int r = locked_by_other(lfd(), block_of(d) + DEBT_FLAG, 1, NULL);
	return r <= 0 ? r : others(&DEBT, d, bytes);
}

/* What the others have taken of GPU d's quota: their debts, then the union
 * of their leases. In that order: a debt placed between the two reads is
 * then counted twice, never missed. 0, or -1 with errno. */
static int committed_by_others(int d, uint64_t *bytes)
{
	uint64_t debts = 0, leases = 0;
	if (debts_of_others(d, &debts) != 0 || leases_of_others(d, &leases) != 0)
		return -1;
	*bytes = leases + debts < leases ? UINT64_MAX : leases + debts;
	return 0;
}

uint64_t vgpu_ledger_owed(int idx)
{
	return idx >= 0 && idx < VGPU_MAX_DEVICES ? owed[idx] : 0;
}

void vgpu_ledger_settle(int idx)
{
	if (idx >= 0 && idx < VGPU_MAX_DEVICES && owed[idx] && still_ours())
		settle(idx);
}

static void shrink_stretches(int idx, uint64_t bytes);

int vgpu_ledger_grow(int idx, uint64_t least, uint64_t want, int force, uint64_t *got, uint64_t *short_by)
{
	*got = 0;
	*short_by = 0;
	if (!still_ours())
		return -1;
	stood = 1;
	if (idx < 0 || idx >= VGPU_MAX_DEVICES || want < least || want > MAX_BYTES ||
	    leased[idx] + owed[idx] + want > MAX_BYTES) {
		errno = ERANGE;
		return -1;
	}
	/* What we owe goes first, where there is room now. */
	if (unlikely(owed[idx]))
		settle(idx);
	/* A process whose holdings no report could name takes no lease: the
	 * slot first (memory the driver already handed out is counted without). */
	if (take_slot() != 0 && !force)
		return -1;
	struct taken t = {0};
	if (force) {
		/* Counted whether it fits or not: the pool wherever it has room,
		 * searched whole (what a failed search took stays taken), the
		 * overflow only for the rest. Overflow while the pool has room
		 * would make the container read as past its limit. */
		take_pool_settled(idx, want, want, got, &t);
		uint64_t rest = want - *got, more = 0;
		if (!rest)
			return 0;
		struct taken o = {0};
		take_stretches(idx, OVER_V, OVER_V + POOL_MAX, rest, rest, &more, &o);
		*got += more;
		if (more == rest)
			return 0;
		/* Neither has room (locks forged over both): our debt, counted
		 * against the quota by every grant and placed when room appears. */
		owed[idx] += rest - more;
		if (publish_debt(idx) != 0) {
			int e = errno;
			owed[idx] -= rest - more;
			errno = e;
			return -1;
		}
		*got = want;
		return 0;
	}
	if (take_pool_settled(idx, least, want, got, &t) != 0) {
		int e = errno;
		/* A pool cut into more pieces than a search may walk or a lease
		 * may keep (locks sprayed over it): no room found, a refusal. */
		if (e == E2BIG || e == ENOSPC) {
			LOGD("ledger: GPU %d's pool is in too many pieces to find %llu bytes in", idx,
			     (unsigned long long)least);
			e = EDQUOT;
			*short_by = least > *got ? least - *got : 0;
		}
		drop_stretches(idx, &t);
		*got = 0;
		errno = e;
		return -1;
	}
	if (*got < least) {
		*short_by = least - *got;
		drop_stretches(idx, &t);
		*got = 0;
		errno = EDQUOT;
		return -1;
	}
	uint64_t limit = vgpu.limits.gpu[idx].memory, others = 0, mine = leased[idx] + owed[idx];
	int r = limit ? over_held(idx) : 0;
	if (r == 0 && limit && owed[idx])
		r = 1; /* our own debt: the pool alone does not hold it */
	if (r == 1 && (r = committed_by_others(idx, &others)) == 0 && (others > limit || mine > limit - others)) {
		uint64_t total = others + mine;
		if (others <= limit && total - limit <= *got - least) {
			/* What was asked fits, all of the chunk does not: the pool
			 * has room past the limit while overflow is held, so the
			 * chunk gives way here instead. */
			shrink_stretches(idx, total - limit);
			*got -= total - limit;
			r = 0;
		} else {
			/* Past the limit already (memory counted by force): only what is given back makes room. */
			*short_by = total - limit < least ? total - limit : least;
			r = 1;
			errno = EDQUOT;
		}
	} else if (r == 1) {
		r = 0;
	}
	if (r != 0) {
		int e = errno;
		drop_stretches(idx, &t);
		*got = 0;
		errno = e;
		return -1;
	}
	return 0;
}

void vgpu_ledger_shrink(int idx, uint64_t bytes)
{
	if (idx < 0 || idx >= VGPU_MAX_DEVICES)
		return;
	/* The debt first: it is what the pool could not hold. */
	if (unlikely(owed[idx])) {
		uint64_t o = bytes < owed[idx] ? bytes : owed[idx];
		owed[idx] -= o;
		bytes -= o;
		if (publish_debt(idx) != 0) /* smaller: cannot fail */
			LOGD("ledger: cannot publish the debt on GPU %d: %s", idx, strerror(errno));
	}
	shrink_stretches(idx, bytes);
}

/* Gives back bytes of our stretches on idx, from the top. */
static void shrink_stretches(int idx, uint64_t bytes)
{
	struct lease *l = &lz[idx];
	/* From the top: the overflow first, then the pool's last stretches. */
	while (bytes && l->n) {
		struct stretch *t = &l->st[l->n - 1];
		uint64_t len = (uint64_t)(t->e - t->s), give = bytes < len ? bytes : len;
		off_t s = t->e - (off_t)give, e = t->e;
		leased[idx] -= drop_stretch(idx, l, s, e); /* a tail: never a split */
		bytes -= give;
		l->cursor = s < OVER_V ? s : l->cursor;
	}
	/* No stretches while they wait to be taken again (the descriptor was
	 * closed, still_ours()): less to take again. */
	if (bytes && !l->n)
		leased[idx] -= bytes < leased[idx] ? bytes : leased[idx];
}

/*
 * Takes our leases again after the description holding them was closed:
 * where they were if no one took those places meanwhile, by force in any
 * case (the memory is held). 0, or -1 with errno.
 */
static int retake(int d)
{
	uint64_t bytes = leased[d], got, short_by;
	memset(&lz[d], 0, sizeof(lz[d]));
	leased[d] = 0;
	if (!bytes || vgpu_ledger_grow(d, bytes, bytes, 1, &got, &short_by) == 0)
		return 0;
	/* still_ours() gives the description up, and with it what this took:
	 * all of it is to be taken again. */
	int e = errno;
	leased[d] = bytes;
	errno = e;
	return -1;
}

/* Whether the descriptor still reaches the limits file: a reader's check,
 * without the process's mutex (a program may have closed it and opened
 * another file under its number, whose locks would read as nobody's). */
int vgpu_ledger_readable(void)
{
	int f = lfd();
	return f >= 0 && same_file(f, &ident);
}

int vgpu_ledger_reader(void)
{
	if (vgpu_ledger_readable())
		return 0;
	vgpu_ledger_lock();
	int rc = vgpu_ledger_check();
	vgpu_ledger_unlock();
	return rc;
}

/* Whether a process-associated query (F_GETLK) finds a lock at byte at of
 * file f: it counts a description's lock as another owner's, ours included,
 * so it finds ours while our description lives. */
static int process_query_finds(int f, off_t at)
{
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
	while (syscall(SYS_fcntl, f, F_GETLK, &fl) != 0)
		if (errno != EINTR)
			return 0;
	return fl.l_type != F_UNLCK;
}

/*
 * Whether fd is still our open file description. A program that dup2()s or
 * dup3()s another open of the limits file over fd has closed our
 * description, and every lock it held, while fstat still finds the same
 * file. Any close of a descriptor of the file also drops this process's own
 * locks on it, the slot's identity byte among them: while that stands (a
 * query reports it as this process's), nothing was closed: one query. Gone,
 * the ownership byte tells: a process-associated query (F_GETLK) counts a
 * description's lock as another owner's, so it finds ours while our
 * description lives; then only the process's locks went (the program closed
 * a descriptor of its own) and they are taken again here.
 */
static int description_stands(void)
{
	struct flock fl;
	if (slot < 0 || fd < 0)
		return 1; /* no slot: nothing of ours under one to lose */
	int f = shard(home_of(slot));
	if (query(f, ID_AT + slot, 1, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid == me)
		return 1;
	if (!process_query_finds(f, OWN_AT + slot))
		return 0;
	if (claim_lk(f, F_RDLCK, ID_AT + slot) != 0 ||
	    (claimed_hp && claim_lk(f, F_RDLCK, hp_at(slot, claimed_hp)) != 0))
		return 0;
	claim_seen_ns = claimed_hp ? vgpu_coarse_ns() : 0;
	return 1;
}

/*
 * Whether the shards our stretches lie on are still ours to lock through: the
 * descriptor still on the shard first opened, and (away from the home shard,
 * where description_stands() tells) the first stretch there still locked
 * through it.
 */
static int shards_stand(void)
{
	if (!nsh)
		return 1;
	int k = shards(), h = slot >= 0 ? home_of(slot) : -1, seen = -1;
	if (h >= 0) {
		int f = shfd1[h] - 1;
		struct stat st;
		if (f < 0 || syscall(SYS_fstat, f, &st) != 0 || st.st_ino != shino[h] || st.st_dev != ident.st_dev)
			return 0;
	}
	for (int d = 0; d < VGPU_MAX_DEVICES && d < vgpu.limits.ngpu; d++)
		for (int i = 0; i < lz[d].n; i++) {
			off_t v = lz[d].st[i].s;
			if (v >= OVER_V)
				break;
			int j = (int)(v / POOL_MAX);
			if (j == h || j == seen || j >= k)
				continue;
			seen = j; /* sorted: each shard's first stretch is checked */
			int f = shfd1[j] - 1;
			struct stat st;
			if (f < 0 || syscall(SYS_fstat, f, &st) != 0 || st.st_ino != shino[j] ||
			    st.st_dev != ident.st_dev || !process_query_finds(f, block_of(d) + v % POOL_MAX))
				return 0;
		}
	return 1;
}

/*
 * Whether fd is still the limits file. A program that closes descriptors it
 * did not open drops our locks with ours (the others then count us for
 * nothing until we publish again), and may have the number reused by another
 * file, where locks would publish nothing: open the file again (a number
 * that has become someone else's is left to them) and publish again all we
 * hold. Without the file, every publication fails: allocations fail closed.
 */
static int still_ours(void)
{
	if (vgpu_ledger_readable() && shards_stand() && description_stands())
		return 1;
	if (fd < 0 && !ident.st_ino) {
		errno = EBADF;
		return 0;
	}
	int nfd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (nfd >= 0 && !same_file(nfd, &ident)) {
		close(nfd);
		nfd = -1;
	}
	__atomic_store_n(&fd, vgpu_high_fd(nfd), __ATOMIC_RELEASE);
	/* The shards too, opened again at their next use: what of ours is
	 * still on them goes, and is taken again below with the rest. */
	drop_shards();
	if (fd < 0) {
		errno = EBADF;
		return 0;
	}
	LOGW("the limits file's descriptor was closed or replaced by the program; opened again, GPU memory use "
	     "published again");
	/* Closing the description dropped our slot with everything in it (and
	 * our process's locks with it): take one again, perhaps another. The SM
	 * use is published again at the limiter's next measure. */
	slot = -1;
	memset(util, 0, sizeof(util));
	memset(owed_pub, 0, sizeof(owed_pub)); /* went with the description; owed[] stays: ours to publish again */
	int any = claimed_hp != 0;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		any |= leased[d] || held[d] || owed[d];
	int ok = !any || take_slot() == 0;
	for (int d = 0; d < VGPU_MAX_DEVICES && ok; d++)
		ok = retake(d) == 0 && (slot < 0 || put(&HELD, d, 0, held[d]) == 0) && publish_debt(d) == 0;
	if (ok && claimed_hp)
		ok = claim_lk(shard(home_of(slot)), F_RDLCK, hp_at(slot, claimed_hp)) == 0;
	if (!ok) {
		int e = errno;
		int old = fd;
		__atomic_store_n(&fd, -1, __ATOMIC_RELEASE);
		close(old); /* drops what was published again: the next call starts over */
		drop_shards();
		slot = -1;
		memset(lz, 0, sizeof(lz)); /* leased[] and owed[] stay: what to take again */
		memset(owed_pub, 0, sizeof(owed_pub));
		errno = e;
	}
	return ok;
}

int vgpu_ledger_check(void)
{
	return still_ours() ? 0 : -1;
}

static int publish(const struct family *f, uint64_t *pub, int idx, uint64_t bytes)
{
	if (idx < 0 || idx >= VGPU_MAX_DEVICES || bytes > MAX_BYTES) {
		errno = ERANGE;
		return -1;
	}
	/* Unchanged: nothing to do (a lost descriptor is found by the keeper's
	 * check and at the next change). */
	if (bytes == pub[idx] && fd >= 0)
		return 0;
	if (!(stood && fd >= 0) && !still_ours())
		return -1;
	stood = 0;
	if (bytes == pub[idx])
		return 0;
	if (take_slot() != 0)
		return -1;
	if (put(f, idx, pub[idx], bytes) != 0)
		return -1;
	pub[idx] = bytes;
	return 0;
}

static int publish_util_locked(int idx, unsigned percent)
{
	if (slot < 0 && !percent)
		return 0; /* nothing to say yet: no slot taken for it */
	return publish(&UTIL, util, idx, percent > 100 ? 100 : percent);
}

void vgpu_ledger_publish_util(int idx, unsigned percent)
{
	vgpu_ledger_lock();
	if (publish_util_locked(idx, percent) != 0)
		LOGD("ledger: cannot publish SM use on GPU %d: %s", idx, strerror(errno));
	vgpu_ledger_unlock();
}

int vgpu_ledger_publish_held(int idx, uint64_t bytes)
{
	int rc = publish(&HELD, held, idx, bytes);
	/* What a reader may have seen on the way: a change that failed half-way
	 * was visible for a moment too. */
	if (idx >= 0 && idx < VGPU_MAX_DEVICES && bytes <= MAX_BYTES) {
		if (bytes < held_least[idx])
			held_least[idx] = bytes;
		if (bytes > held_most[idx])
			held_most[idx] = bytes;
	}
	return rc;
}

/*
 * Whether our claim still stands. A process drops its process-associated
 * locks when it closes any descriptor of the file, ours or not: a program
 * that reads the limits file itself drops the claim, and the descriptor
 * check of still_ours() cannot see that. Checked (one query) when the claim
 * is written, which the SM limiter's watcher does periodically, unless it was
 * made or checked within CLAIM_FRESH_NS. The
 * slot's identity byte goes with it (the same kind of lock, dropped at the
 * same moment) and is taken again with it.
 */
static int claim_stands(void)
{
	/* Made or found standing moments ago: a process's start writes it two or
	 * three times within a millisecond, and each query walks every lock on
	 * the file. A claim dropped since is found at the next write after this. */
	if (vgpu_coarse_ns() - claim_seen_ns < CLAIM_FRESH_NS)
		return 1;
	struct flock fl;
	if (fd < 0 || slot < 0 || query(shard(home_of(slot)), hp_at(slot, claimed_hp), 1, &fl) != 0)
		return 1; /* cannot tell: still_ours() below deals with a lost descriptor */
	int ok = fl.l_type != F_UNLCK && fl.l_pid == me;
	if (ok)
		claim_seen_ns = vgpu_coarse_ns();
	return ok;
}

int vgpu_ledger_claim_host_pid(int32_t hp)
{
	if (hp == claimed_hp && (!hp || claim_stands()))
		return 0;
	if (!still_ours())
		return -1;
	int fresh = slot < 0; /* take_slot() below takes the identity with the slot */
	if (hp && take_slot() != 0)
		return -1;
	/* Identity first: a claim names us only while we hold our slot's identity. */
	int hf = slot >= 0 ? shard(home_of(slot)) : -1;
	if (hp && ((!fresh && claim_lk(hf, F_RDLCK, ID_AT + slot) != 0) || claim_lk(hf, F_RDLCK, hp_at(slot, hp)) != 0))
		return -1;
	if (claimed_hp && claimed_hp != hp && slot >= 0)
		claim_lk(hf, F_UNLCK, hp_at(slot, claimed_hp));
	claimed_hp = hp;
	claim_seen_ns = hp ? vgpu_coarse_ns() : 0;
	return 0;
}

/*
 * Visits every stretch of [lo, hi) covered by another description's lock,
 * each covered point once (the union): a query returns one conflicting lock,
 * and the parts of the range on either side of it are queried in turn.
 * Returns 0, or -1 with errno.
 */
static int scan(int f, off_t lo, off_t hi, void (*visit)(off_t s, off_t e, int32_t owner, void *arg), void *arg)
{
	struct span {
		off_t lo, hi;
	} first[64], *todo = first;
	size_t n = 0, cap = 64;
	int queries = 0, rc = 0;
	if (f < 0) {
		errno = EBADF;
		return -1;
	}
	todo[n++] = (struct span){lo, hi};
	while (n) {
		struct span sp = todo[--n];
		if (sp.lo >= sp.hi)
			continue;
		if (++queries > MAX_QUERIES) {
			errno = E2BIG;
			rc = -1;
			break;
		}
		struct flock fl;
		if (query(f, sp.lo, sp.hi - sp.lo, &fl) != 0) {
			rc = -1;
			break;
		}
		if (fl.l_type == F_UNLCK)
			continue;
		off_t s = fl.l_start, e = fl.l_len > 0 && fl.l_start <= INT64_MAX - fl.l_len ? fl.l_start + fl.l_len
										       : INT64_MAX;
		if (s < sp.lo)
			s = sp.lo;
		if (e > sp.hi)
			e = sp.hi;
		if (s >= e) /* cannot happen: the lock conflicts with the range */
			continue;
		visit(s, e, fl.l_pid, arg); /* owner: -1 for a description's lock, 0 when not in our namespace */
		if (n + 2 > cap) {
			size_t ncap = cap * 2;
			struct span *t = malloc(ncap * sizeof(*t));
			if (!t) {
				errno = ENOMEM;
				rc = -1;
				break;
			}
			memcpy(t, todo, n * sizeof(*t));
			if (todo != first)
				free(todo);
			todo = t;
			cap = ncap;
		}
		todo[n++] = (struct span){sp.lo, s};
		todo[n++] = (struct span){e, sp.hi};
	}
	if (todo != first)
		free(todo);
	return rc;
}

struct measure {
	const struct family *f;
	int idx;
	uint64_t units, bytes;
	int home; /* scanning our slot's home shard */
	int collision;
};

static void add_len(uint64_t *sum, off_t len)
{
	uint64_t v = *sum + (uint64_t)len;
	*sum = v < *sum ? UINT64_MAX : v;
}

static int overlaps(off_t s, off_t e, off_t a, off_t b)
{
	return s < b && a < e;
}

static void measure_visit(off_t s, off_t e, int32_t owner, void *arg)
{
	(void)owner;
	struct measure *m = arg;
	off_t lo_part = ((off_t)m->idx << DEV_SHIFT) + m->f->lo;
	if (s < lo_part)
		add_len(&m->units, (e < lo_part ? e : lo_part) - s);
	if (e > lo_part)
		add_len(&m->bytes, e - (s > lo_part ? s : lo_part));
	/* Someone else's lock in our own slot's ranges: a forgery (no other
	 * process takes a slot with locks in it). Our measurement of others
	 * would miss whatever of theirs lies under ours. */
	if (slot < 0 || !m->home)
		return;
	off_t h = hi_at(m->f, m->idx, slot), l = lo_at(m->f, m->idx, slot);
	if (overlaps(s, e, h, h + ((off_t)1 << m->f->span)) || overlaps(s, e, l, l + ((off_t)1 << m->f->unit)))
		m->collision = 1;
}

static void sum_visit(off_t s, off_t e, int32_t owner, void *arg)
{
	(void)owner;
	add_len(arg, e - s);
}

/* The others' leases on idx: the union of their stretches, pool and overflow. */
static int leases_of_others(int idx, uint64_t *bytes)
{
	if (idx < 0 || idx >= VGPU_MAX_DEVICES) {
		errno = ERANGE;
		return -1;
	}
	uint64_t sum = 0;
	off_t b = block_of(idx);
	for (int j = 0; j < shards(); j++)
		if (scan(shard_checked(j), b, b + sub_len(idx, j), sum_visit, &sum) != 0)
			return -1;
	if (scan(lfd(), b + OVER_AT, b + OVER_END, sum_visit, &sum) != 0)
		return -1;
	*bytes = sum;
	return 0;
}

/* What the others publish in family f on idx: the union of their locks. */
static int others(const struct family *f, int idx, uint64_t *bytes)
{
	struct measure m = {.f = f, .idx = idx};
	if (idx < 0 || idx >= VGPU_MAX_DEVICES) {
		errno = ERANGE;
		return -1;
	}
	off_t base = (off_t)idx << DEV_SHIFT;
	for (int j = 0; j < shards(); j++) {
		m.home = slot >= 0 && j == home_of(slot);
		/* The debts are a quota decision's; the held reports only a report. */
		if (scan(f == &DEBT ? shard_checked(j) : shard(j), base + f->hi, base + FAMILY_END(*f), measure_visit, &m) != 0)
			return -1;
	}
	if (m.collision) {
		errno = EEXIST;
		return -1;
	}
	uint64_t total = m.units > (UINT64_MAX >> f->unit) ? UINT64_MAX : m.units << f->unit;
	add_len(&total, (off_t)(m.bytes > INT64_MAX ? INT64_MAX : m.bytes));
	*bytes = total;
	return 0;
}

int vgpu_ledger_others(int idx, uint64_t *bytes)
{
	if (idx < 0 || idx >= VGPU_MAX_DEVICES) {
		errno = ERANGE;
		return -1;
	}
	return committed_by_others(idx, bytes);
}

int vgpu_ledger_others_held(int idx, uint64_t *bytes)
{
	return others(&HELD, idx, bytes);
}

/* ---- per process, for rebuilding the region ------------------------------------------ */

/*
 * The pid, in our pid namespace, of the process that owns slot k: the holder
 * of its identity byte; 0 when none can be named (not visible from here, or
 * no process-associated lock there).
 */
static int32_t owner_of(int32_t k)
{
	int32_t pid = 0;
	if (locked_by_other(shard(home_of(k)), ID_AT + k, 1, &pid) != 1 || pid < 0)
		return 0;
	return pid;
}

struct attribute {
	int idx;
	void (*fn)(int32_t pid, int idx, uint64_t bytes, void *arg);
	void *arg;
	int32_t k, pid; /* the last slot looked up, and its owner (k = -1: none yet) */
};

/* Hands a stretch of slot k's held range to the callback under k's owner's pid. */
static void attribute_to(struct attribute *a, int32_t k, uint64_t bytes)
{
	if (k != a->k) {
		a->k = k;
		a->pid = owner_of(k);
	}
	/* Nameless (another pid namespace's): counted in every measurement,
	 * named in no list. */
	if (a->pid > 0)
		a->fn(a->pid, a->idx, bytes, a->arg);
}

static void attribute_visit(off_t s, off_t e, int32_t owner, void *arg)
{
	(void)owner;
	struct attribute *a = arg;
	const struct family *f = &HELD;
	off_t base = ((off_t)a->idx << DEV_SHIFT) + f->hi, rel = s - base, lo = f->lo - f->hi;
	/* Only a stretch inside one slot's range can be told apart; anything
	 * wider is no process's own (it is still measured above). */
	if (rel < lo) {
		int32_t k = (int32_t)(rel >> f->span);
		if (((e - 1 - base) >> f->span) == k)
			attribute_to(a, k, (uint64_t)(e - s) << f->unit);
	} else {
		int32_t k = (int32_t)((rel - lo) >> f->unit);
		if (((e - 1 - base - lo) >> f->unit) == k)
			attribute_to(a, k, (uint64_t)(e - s));
	}
}

/* What each other process says it holds (not its lease): the report. */
int vgpu_ledger_scan_held(int idx, void (*fn)(int32_t pid, int idx, uint64_t bytes, void *arg), void *arg)
{
	struct attribute a = {idx, fn, arg, -1, 0};
	off_t base = (off_t)idx << DEV_SHIFT;
	for (int j = 0; j < shards(); j++)
		if (scan(shard(j), base + HELD.hi, base + FAMILY_END(HELD), attribute_visit, &a) != 0)
			return -1;
	return 0;
}

struct claims {
	void (*fn)(int32_t pid, int32_t hp, void *arg);
	void *arg;
	struct vgpu_hp_set *set;
	/* Claims of processes this pid namespace cannot name: their host pids
	 * into hidden, what they publish as SM use of GPU d summed in util. */
	struct vgpu_hp_set *hidden;
	int d;
	uint64_t util;
	int failed;
};

static void set_add(struct vgpu_hp_set *set, uint32_t lo, uint32_t hi)
{
	if (set->n >= VGPU_HP_RANGES) {
		set->all = 1; /* too many to keep: count every process as ours */
		return;
	}
	set->r[set->n].lo = lo;
	set->r[set->n].hi = hi;
	set->n++;
}

static void claims_visit(off_t s, off_t e, int32_t owner, void *arg)
{
	struct claims *c = arg;
	off_t rel = s - HP_AT, rel_end = e - HP_AT; /* rel_end exclusive */
	/* A claim names a process only when that very process holds it: the
	 * kernel's owner pid is the one that holds the identity of the slot
	 * whose range it lies in. */
	if (c->fn && rel_end - rel == 1 && owner > 0 && owner == owner_of((int32_t)(rel >> 32)))
		c->fn(owner, (int32_t)(uint32_t)rel, c->arg);
	if (c->hidden && rel_end - rel == 1 && owner == 0) {
		/* A process lock whose holder has no pid here: the container's
		 * process in another pid namespace (a forgery would be our own
		 * namespace's, or an OFD lock, owner -1). */
		int32_t k = (int32_t)(rel >> 32);
		off_t at = lo_at(&UTIL, c->d, k);
		set_add(c->hidden, (uint32_t)rel, (uint32_t)rel);
		if (scan(shard(home_of(k)), at, at + ((off_t)1 << UTIL.unit), sum_visit, &c->util) != 0)
			c->failed = 1;
	}
	if (!c->set)
		return;
	/* Every host pid inside a claimed stretch is claimed, whoever claims it:
	 * a forged claim can only make the container look busier. */
	if (rel_end - rel >= ((off_t)1 << 32)) {
		c->set->all = 1;
		return;
	}
	uint32_t lo = (uint32_t)rel, hi = (uint32_t)(rel_end - 1);
	if (lo <= hi) {
		set_add(c->set, lo, hi);
	} else {
		set_add(c->set, lo, UINT32_MAX);
		set_add(c->set, 0, hi);
	}
}

/* Every shard's host pid claims. */
static int scan_claims(struct claims *c)
{
	for (int j = 0; j < shards(); j++)
		if (scan(shard(j), HP_AT, HP_END, claims_visit, c) != 0)
			return -1;
	return 0;
}

int vgpu_ledger_host_pids(int d, struct vgpu_hp_set *set, struct vgpu_hp_set *hidden, unsigned *util)
{
	set->n = set->all = 0;
	hidden->n = hidden->all = 0;
	struct claims c = {.set = set, .hidden = hidden, .d = d};
	if (d < 0 || d >= VGPU_MAX_DEVICES) {
		errno = ERANGE;
		return -1;
	}
	if (scan_claims(&c) != 0 || c.failed)
		return -1;
	*util = c.util > 100 * (uint64_t)SLOTS ? 100 * (unsigned)SLOTS : (unsigned)c.util;
	return 0;
}

int vgpu_hp_set_has(const struct vgpu_hp_set *set, unsigned pid)
{
	if (set->all)
		return 1;
	for (int i = 0; i < set->n; i++)
		if (pid >= set->r[i].lo && pid <= set->r[i].hi)
			return 1;
	return 0;
}

int vgpu_ledger_scan_claims(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg)
{
	struct claims c = {.fn = fn, .arg = arg};
	return scan_claims(&c);
}

int vgpu_ledger_scan_claims_all(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg, struct vgpu_hp_set *set)
{
	set->n = 0;
	set->all = 0;
	struct claims c = {.fn = fn, .arg = arg, .set = set};
	return scan_claims(&c);
}
