/*
 * The usage region (Contract 5): the container's report for the host. It
 * decides nothing. What a process holds is known for certain only to the
 * process itself (quota.c); it publishes that in the ledger (ledger.c:
 * fcntl locks on the read-only limits file, which no other process can
 * lower and which vanish with the process), and every quota decision is
 * taken there. Nothing is ever read back from the region to decide anything.
 *
 * The region file <dir>/usage is the report for the host (`nri-vgpu status`,
 * metrics): a header, the devices with their limit and the bytes the
 * container holds, a slot per process. The container can write it, delete
 * it, truncate it or put something else at its path, so every access under
 * the lock first checks that the path still names the mapped file and that
 * the file has its size, its header and device entries, and this process's
 * slot what the process knows; what is wrong is rebuilt, the other processes'
 * slots and the devices' totals from the ledger (also once a second, for a
 * forged slot that nothing else gives away). Damage changes what the host
 * sees until the next access, never what is allowed.
 *
 * The lock is a thread mutex plus an fcntl OFD write lock on the whole
 * region file: the kernel drops an OFD lock when its holder dies (no wedge);
 * it does not exclude the threads of one process (hence the mutex); a fork
 * child reopens the file to get a description of its own. The thread
 * mutex is the process's (ledger.c), under which the leases change too; the
 * file's lock guards the report only: the quota is the ledger's pool, taken
 * under the thread mutex alone. So no process waits long for it: the
 * report of a grant or a free takes it only if it is free and otherwise
 * leaves the report to the keeper thread (quota.c; a process that sleeps
 * for it on a busy node waits behind every runnable process before it runs
 * again, for a report that can wait), the keeper and an exit wait a little
 * longer and leave what they could not write to
 * the next report or rebuild, a process's start maps a sound file without
 * it, and making or repairing the file waits OPEN_WAIT_NS (a process
 * stopped while it holds the lock, or a tenant holding it, must not stop the
 * container's allocations, frees, exits and starts).
 *
 * The mapping is only touched under the lock, after the size check, so a
 * truncated file costs no SIGBUS there; a truncation racing with that access
 * (the tenant need not take the lock to truncate) is caught by a SIGBUS
 * guard in place only while the lock is held (guard_begin): a fault inside
 * the mapping replaces it with anonymous memory, so the access completes,
 * and the region is mapped and rebuilt anew at the next access; any other
 * SIGBUS goes to what the program had installed. No tenant can kill a
 * process of the container through the region.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "hostpid.h"
#include "ledger.h"
#include "lifecycle.h"
#include "limits.h"
#include "log.h"
#include "quota.h"
#include "region.h"

#define RSIZE ((off_t)sizeof(struct vgpu_region))
#define RETRY_NS 1000000000ll /* no usable region file: try again after this long */
#define SYNC_NS 1000000000ll  /* rebuild the other processes' slots at least this often */
#define REPORT_WAIT_NS 100000000ll /* a report waits this long for the region's lock at most */
#define REPORT_TRY_NS 0ll          /* a grant's or a free's report: one try, the keeper writes it later */
#define OPEN_WAIT_NS 5000000000ll   /* opening the region waits this long for its lock at most */

/* On the heap: page-sized buffers here would cost a page fault each at every
 * start. NULL only when they could not be had (no region then). */
static char *region_dir, *region_path;
static struct vgpu_region *region; /* the mapped file; NULL while there is none */
static int rfd = -1;
static dev_t rdev;                 /* the file rfd was opened on: a program that closes */
static ino_t rino;                 /* descriptors it did not open may reuse the number */
static int attached;        /* this process had a region file: losing it is news */
static int64_t retry_at;    /* CLOCK_MONOTONIC ns: when to look for a usable file again */
static int64_t synced_at;   /* CLOCK_MONOTONIC ns of the last rebuild of the slots */
static int64_t looked_at;   /* CLOCK_MONOTONIC ns the path was last compared with the file */
static int slot = -1;       /* our index in procs[], -1 = none yet */
static int exiting;         /* the slot was given back at exit: take no other */
static int32_t self;        /* getpid(), a system call with glibc >= 2.25: kept (reset in a fork child) */
static uint64_t my_start;   /* our start time as others read it (read_self) */
static int32_t outer_pid;   /* our pid as /proc numbers it when that is another namespace's; else 0 */
static int self_read;       /* my_start and outer_pid are this process's */
static int32_t slot_hp;     /* the host pid our slot was last given */
static int32_t hp_tried;    /* the host pid a slot write last tried to give it (under the mutex) */
/* What this process holds per limits index as it last published it (the
 * ledger's held part, its slot); the truth is vgpu_quota_held (quota.c). */
static uint64_t shown[VGPU_MAX_DEVICES];
static uint64_t launches[VGPU_MAX_DEVICES];
/* ns this process's launches waited on the SM limiter (limiter.c), not yet
 * added to the devices' throttled_ns: added at a flush or at exit. */
static uint64_t throttled[VGPU_MAX_DEVICES];
static int warned_damage, warned_unusable, warned_slots;

/* ---- the SIGBUS guard ---------------------------------------------------------------- */

/*
 * A tenant can truncate the region file at any moment, lock or not: an
 * access to a mapped page past the file's end then raises SIGBUS, which by
 * default kills the process. While a thread of ours holds the region's lock
 * (the only time the mapping is touched) our handler is installed and SIGBUS
 * unblocked in that thread (a blocked or ignored fault is fatal: the kernel
 * puts the default action back). A fault inside the mapping
 * (guard_lo .. + RSIZE) is answered by mapping anonymous memory over it, so
 * the access completes on a stand-in, and region_lost makes the next access
 * map the file again and rebuild it. Any other SIGBUS, from the program's own
 * mappings in another thread meanwhile, goes to what the program had
 * installed, or takes the default action as it would have. The handler
 * calls nothing but system calls and the program's handler. Installed per
 * access rather than for the process's life: a program that installs its
 * own SIGBUS handler later (a runtime, a crash reporter) would replace it,
 * and one that chains to the handler it replaced would loop with ours.
 */
static char *guard_lo;                /* the mapping the guard answers for; NULL: none */
static volatile sig_atomic_t region_lost; /* a fault replaced the mapping: map the file again */
static struct sigaction guard_prev;   /* the program's SIGBUS disposition, saved at guard_begin */
static int guard_in;                  /* guard_prev is saved and ours installed */
static sigset_t guard_mask;           /* the thread's mask before guard_begin */
static volatile sig_atomic_t guard_resend; /* a sent SIGBUS met our handler: send it again at guard_end */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	int e = errno;
	char *lo = __atomic_load_n(&guard_lo, __ATOMIC_RELAXED), *a = si ? (char *)si->si_addr : NULL;
	if (si && si->si_code > 0 && lo && a >= lo && a < lo + RSIZE &&
	    syscall(SYS_mmap, lo, (size_t)RSIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
		    0) == (long)lo) {
		region_lost = 1;
		errno = e;
		return;
	}
	struct sigaction p = guard_prev;
	errno = e;
	if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction && p.sa_sigaction != on_sigbus) {
		p.sa_sigaction(sig, si, uc);
		return;
	}
	if (!(p.sa_flags & SA_SIGINFO) && p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
		p.sa_handler(sig);
		return;
	}
	if (!(p.sa_flags & SA_SIGINFO) && p.sa_handler == SIG_IGN && si && si->si_code <= 0)
		return; /* sent, and ignored: as without us */
	if (guard_in && (!si || si->si_code <= 0)) {
		/* Sent (kill), to the default action, while this thread had it
		 * unblocked for the guard only: sent again once the program's
		 * disposition and mask are back, so it goes where it would have
		 * (a thread waiting for it in sigwait, or the default action). */
		guard_resend = 1;
		return;
	}
	/* The default action, as without us: a fault happens again on return, a
	 * sent signal is sent again (blocked until the handler returns). */
	struct sigaction d;
	memset(&d, 0, sizeof(d));
	d.sa_handler = SIG_DFL;
	sigaction(sig, &d, NULL);
	if (!si || si->si_code <= 0)
		syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), sig);
	errno = e;
}

/* Caller holds the process's mutex: one guarded access at a time in the process. */
static void guard_begin(void)
{
	struct sigaction sa;
	sigset_t bus;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	guard_in = sigaction(SIGBUS, &sa, &guard_prev) == 0;
	sigemptyset(&bus);
	sigaddset(&bus, SIGBUS);
	pthread_sigmask(SIG_UNBLOCK, &bus, &guard_mask);
}

static void guard_end(void)
{
	struct sigaction cur;
	/* Put the program's back; if it installed another meanwhile, that one stays. */
	if (guard_in && sigaction(SIGBUS, &guard_prev, &cur) == 0 &&
	    (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus))
		sigaction(SIGBUS, &cur, NULL);
	guard_in = 0;
	pthread_sigmask(SIG_SETMASK, &guard_mask, NULL);
	if (guard_resend) {
		guard_resend = 0;
		kill(getpid(), SIGBUS);
	}
}

/* fcntl through syscall(2): the libc wrapper is fcntl64@GLIBC_2.28 when built here. */
static int ofd_lock(int fd, short type, int wait)
{
	struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
	for (;;) {
		if (syscall(SYS_fcntl, fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

/*
 * The file's lock, waiting at most ns for another holder: 0, or -1 with
 * errno (EAGAIN: still held by another when the time was up). The kernel
 * has no timed wait for it: polled, from 50 us up to 5 ms apart.
 */
static int ofd_lock_within(int fd, int64_t ns)
{
	long step = 50000;
	for (int64_t waited = 0;; waited += step, step = step < 5000000 ? step * 2 : step) {
		if (ofd_lock(fd, F_WRLCK, 0) == 0)
			return 0;
		if (errno == EACCES)
			errno = EAGAIN;
		if (errno != EAGAIN || waited >= ns)
			return -1;
		struct timespec ts = {0, step};
		nanosleep(&ts, NULL);
	}
}

/* stat through syscall(2) too: glibc >= 2.33 exports fstat@GLIBC_2.33. */
static int xfstat(int fd, struct stat *st)
{
	return (int)syscall(SYS_fstat, fd, st);
}

static int xlstat(const char *p, struct stat *st)
{
	return (int)syscall(SYS_newfstatat, AT_FDCWD, p, st, AT_SYMLINK_NOFOLLOW);
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/*
 * Sets a device's total, its peak raised first so that a reader without
 * the lock (the host's) never sees the total above the peak. The peak is
 * raised on every write of the total, so one the tenant lowered is mended
 * at the next. Caller holds the lock.
 */
static void set_used_locked(struct vgpu_region_device *d, uint64_t used)
{
	if (__atomic_load_n(&d->peak, __ATOMIC_RELAXED) < used)
		__atomic_store_n(&d->peak, used, __ATOMIC_RELAXED);
	__atomic_store_n(&d->used, used, __ATOMIC_RELEASE);
}

/* Fields 1 (the pid, as the namespace /proc belongs to numbers it) and 22
 * (the start time, in clock ticks after boot) of a stat file of /proc:
 * 0, or -1 when it cannot be read or parsed. */
static int read_stat(const char *path, int32_t *pid, uint64_t *start)
{
	char buf[1024];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	long p1 = strtol(buf, NULL, 10);
	/* comm (field 2) may contain spaces and ')': fields resume after the last ')'. */
	char *p = strrchr(buf, ')');
	if (!p || p1 <= 0 || p1 > INT32_MAX)
		return -1;
	p++;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p)
		return -1;
	*pid = (int32_t)p1;
	*start = strtoull(p + 1, NULL, 10);
	return 0;
}

uint64_t vgpu_proc_start_time(int pid)
{
	char path[64];
	int32_t seen;
	uint64_t start;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	return read_stat(path, &seen, &start) == 0 ? start : 0;
}

/*
 * This process as /proc shows it, read once (a fork child reads again): its
 * start time as the others read it, at /proc/<getpid()>/stat (slot_alive),
 * and its pid in /proc's numbering when that is not getpid(): /proc then
 * belongs to an ancestor pid namespace, and the number is the outermost
 * pid this process can see of itself (the host pid where /proc is the
 * host's; hostpid.c). One read of /proc/self/stat answers both in the usual
 * case; only with an ancestor's /proc is /proc/<getpid()>/stat another
 * file. A pid equal in both numberings by chance reads as "no ancestor"
 * (host-pid discovery then decides, as it does for any container).
 * Two threads may both read it: the answers are the same.
 */
static void read_self(void)
{
	if (__atomic_load_n(&self_read, __ATOMIC_ACQUIRE))
		return;
	int32_t me = (int32_t)getpid(), seen = 0;
	uint64_t start = 0;
	if (read_stat("/proc/self/stat", &seen, &start) != 0)
		seen = 0;
	if (seen != me)
		start = vgpu_proc_start_time(me);
	__atomic_store_n(&outer_pid, seen != me && seen > 0 ? seen : 0, __ATOMIC_RELAXED);
	__atomic_store_n(&my_start, start, __ATOMIC_RELAXED);
	__atomic_store_n(&self_read, 1, __ATOMIC_RELEASE);
}

static uint64_t start_time(void)
{
	read_self();
	return __atomic_load_n(&my_start, __ATOMIC_RELAXED);
}

int32_t vgpu_outer_pid(void)
{
	read_self();
	return __atomic_load_n(&outer_pid, __ATOMIC_RELAXED);
}

/* Whether a slot still belongs to a live process (not a dead or reused pid). */
static int slot_alive(const struct vgpu_region_proc *s)
{
	if (s->pid <= 0 || (kill(s->pid, 0) != 0 && errno == ESRCH))
		return 0;
	uint64_t st = vgpu_proc_start_time(s->pid);
	return st == 0 || st == s->start_time; /* unreadable /proc: assume alive */
}

static void damaged(const char *what)
{
	if (!warned_damage++)
		LOGW("usage region %s was tampered with (%s); rebuilt from the processes' own records "
		     "(quotas never depend on it)",
		     region_path, what);
	else
		LOGD("usage region %s: %s; rebuilt", region_path, what);
}

/* ---- slots --------------------------------------------------------------------------- */

static void clear_slot(struct vgpu_region_proc *s)
{
	__atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
	memset(s, 0, sizeof(*s));
}

static int free_slot_locked(void)
{
	for (int i = 0; i < VGPU_MAX_PROCS; i++)
		if (!region->procs[i].pid)
			return i;
	return -1;
}

/* Claims this process's host pid in the ledger (what the SM limiter counts). Caller holds the process's mutex. */
static void claim_locked(void)
{
	int32_t hp = vgpu_host_pid();
	if (vgpu_ledger_claim_host_pid(hp) != 0)
		LOGD("cannot claim host pid %d in the ledger: %s", (int)hp, strerror(errno));
}

/* Writes this process's slot (taking one if it has none) and its host-pid claim. */
static void write_own_slot_locked(void)
{
	claim_locked();
	int32_t hp = vgpu_host_pid();
	__atomic_store_n(&hp_tried, hp, __ATOMIC_RELAXED);
	if (!region || exiting)
		return;
	int32_t me = self;
	if (slot >= 0 && region->procs[slot].pid != me)
		slot = -1; /* someone wrote another pid over it */
	/* An entry another process's rebuild made for us (from the ledger) before
	 * our first report: ours, not a second one. */
	uint64_t st = start_time();
	for (int i = 0; slot < 0 && i < VGPU_MAX_PROCS; i++)
		if (region->procs[i].pid == me && region->procs[i].start_time == st)
			slot = i;
	if (slot < 0) {
		slot = free_slot_locked();
		if (slot < 0) {
			if (!warned_slots++)
				LOGW("usage region has no free process slot; this process is not reported to the host "
				     "(its quota holds)");
			return;
		}
		memset(&region->procs[slot], 0, sizeof(region->procs[slot]));
	}
	struct vgpu_region_proc *s = &region->procs[slot];
	s->start_time = st;
	s->host_pid = hp;
	slot_hp = hp;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
		s->used[d] = shown[d];
		s->launches[d] = __atomic_load_n(&launches[d], __ATOMIC_RELAXED);
		vgpu_ledger_held_mark(d, shown[d]); /* the others' rebuilds read what the ledger says from here on */
	}
	__atomic_store_n(&s->pid, me, __ATOMIC_RELEASE);
}

/* What the ledger says another process holds, for rebuilding its slot. */
struct held {
	int32_t pid, hp;
	int slotted;
	uint64_t bytes[VGPU_MAX_DEVICES];
};
static struct held tab[VGPU_MAX_PROCS];
static int ntab;

static struct held *held_of(int32_t pid, int add)
{
	for (int i = 0; i < ntab; i++)
		if (tab[i].pid == pid)
			return &tab[i];
	if (!add || ntab >= VGPU_MAX_PROCS)
		return NULL;
	memset(&tab[ntab], 0, sizeof(tab[ntab]));
	tab[ntab].pid = pid;
	return &tab[ntab++];
}

static void held_bytes(int32_t pid, int idx, uint64_t bytes, void *arg)
{
	(void)arg;
	struct held *h = held_of(pid, 1);
	if (h)
		h->bytes[idx] = vgpu_sat_add(h->bytes[idx], bytes);
}

static void held_claim(int32_t pid, int32_t hp, void *arg)
{
	(void)arg;
	struct held *h = held_of(pid, 1);
	if (h)
		h->hp = hp;
}

/* Every host pid claimed in the ledger, named or not (sync_locked). */
static struct vgpu_hp_set claimed;

/*
 * Whether slot s is a process of another pid namespace sharing the region
 * (containers of a pod sharing a claim): its host pid is claimed in the
 * ledger, but by no process this namespace can name. Its pid means nothing
 * here, so neither its liveness nor its pid's uniqueness can be judged from
 * here: its own namespace's processes keep it.
 */
static int elsewhere(const struct vgpu_region_proc *s)
{
	int32_t hp = s->host_pid;
	if (hp <= 0 || hp == vgpu_host_pid() || !vgpu_hp_set_has(&claimed, (unsigned)hp))
		return 0;
	for (int k = 0; k < ntab; k++)
		if (tab[k].hp == hp)
			return 0;
	return 1;
}

/*
 * Rebuilds every slot and the devices' totals from the ledger: gone
 * processes and second slots of one pid are dropped, each live process's
 * bytes and host pid are what it publishes, processes that publish but have
 * no slot get one, ours is what we know; slots of other pid namespaces'
 * processes are left to them. restart: the region was just made, or found
 * damaged: each device's peak starts again at the rebuilt total and its
 * throttled time at 0 (the processes add what they wait from then on);
 * otherwise (the periodic rebuild) the peak only rises and the throttled
 * time is left as it is. Caller holds the lock.
 */
static void sync_locked(int restart)
{
	struct vgpu_region *r = region;
	int32_t me = self;
	int ngpu = vgpu.limits.ngpu;
	synced_at = now_ns();
	ntab = 0;
	for (int d = 0; d < ngpu; d++)
		if (vgpu_ledger_scan_held(d, held_bytes, NULL) != 0)
			LOGD("ledger scan of GPU %d failed: %s", d, strerror(errno));
	if (vgpu_ledger_scan_claims_all(held_claim, NULL, &claimed) != 0) {
		LOGD("ledger scan of host pids failed: %s", strerror(errno));
		claimed.n = claimed.all = 0;
	}
	for (int i = 0; i < VGPU_MAX_PROCS; i++) {
		struct vgpu_region_proc *s = &r->procs[i];
		int32_t pid = s->pid;
		if (!pid || (i != slot && elsewhere(s)))
			continue;
		if (pid == me) {
			if (i != slot)
				clear_slot(s);
			continue;
		}
		struct held *h = held_of(pid, 0);
		if ((h && h->slotted) || !slot_alive(s)) {
			clear_slot(s);
			continue;
		}
		for (int d = 0; d < VGPU_MAX_DEVICES; d++)
			s->used[d] = h && d < ngpu ? h->bytes[d] : 0;
		if (h) {
			h->slotted = 1;
			if (h->hp)
				s->host_pid = h->hp;
		}
	}
	for (int k = 0; k < ntab; k++) {
		struct held *h = &tab[k];
		int any = h->hp != 0;
		for (int d = 0; d < ngpu; d++)
			any |= h->bytes[d] != 0;
		if (h->slotted || h->pid == me || h->pid <= 0 || !any)
			continue;
		uint64_t st = vgpu_proc_start_time(h->pid);
		int f = st ? free_slot_locked() : -1;
		if (f < 0)
			continue;
		struct vgpu_region_proc *s = &r->procs[f];
		memset(s, 0, sizeof(*s));
		s->host_pid = h->hp;
		s->start_time = st;
		memcpy(s->used, h->bytes, sizeof(s->used));
		__atomic_store_n(&s->pid, h->pid, __ATOMIC_RELEASE);
		h->slotted = 1;
	}
	write_own_slot_locked();
	for (int d = 0; d < ngpu; d++) {
		uint64_t others = 0, sum = 0;
		if (vgpu_ledger_others_held(d, &others) == 0) {
			sum = vgpu_sat_add(shown[d], others);
		} else {
			for (int i = 0; i < VGPU_MAX_PROCS; i++)
				if (r->procs[i].pid)
					sum = vgpu_sat_add(sum, r->procs[i].used[d]);
		}
		if (restart) {
			/* A region made or rebuilt after damage: what it said of
			 * the past is gone or not to be believed. */
			__atomic_store_n(&r->devices[d].peak, sum, __ATOMIC_RELAXED);
			__atomic_store_n(&r->devices[d].throttled_ns, 0, __ATOMIC_RELAXED);
		}
		set_used_locked(&r->devices[d], sum);
	}
}

/* ---- the file ------------------------------------------------------------------------- */

/* Whether fd is still the regular file at the region's path. */
static int at_path(int fd)
{
	struct stat a, b;
	return xfstat(fd, &a) == 0 && a.st_nlink > 0 && xlstat(region_path, &b) == 0 && S_ISREG(b.st_mode) &&
	       a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/*
 * A new, zero-filled region file put at the path in one step (written under
 * a temporary name and locked first), so no process ever opens a half-made
 * one. replace: over whatever is at the path (a symlink, a FIFO: rename);
 * else only where there is nothing (link: of processes that start together,
 * one makes the file and the others open it). Returns its descriptor,
 * locked; -1 with errno (EEXIST: someone else made one first).
 */
static int create_locked(int replace)
{
	char tmp[4300];
	snprintf(tmp, sizeof(tmp), "%s/.usage.%d.tmp", region_dir, (int)self);
	unlink(tmp); /* left by a process that had our pid and died mid-way */
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
	if (fd < 0)
		return -1;
	fchmod(fd, 0666); /* any uid in the container must be able to join, whatever the umask */
	int rc = ftruncate(fd, RSIZE);
	if (rc == 0)
		rc = ofd_lock(fd, F_WRLCK, 1);
	if (rc == 0)
		rc = replace ? rename(tmp, region_path) : link(tmp, region_path);
	int e = errno;
	unlink(tmp); /* after a rename: nothing there any more */
	if (rc != 0) {
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static void detach_locked(void)
{
	struct stat st;
	/* Not a descriptor that has become someone else's since. */
	if (rfd >= 0 && xfstat(rfd, &st) == 0 && st.st_ino == rino && st.st_dev == rdev) {
		ofd_lock(rfd, F_UNLCK, 0);
		close(rfd);
	}
	__atomic_store_n(&guard_lo, NULL, __ATOMIC_RELAXED);
	if (region)
		munmap(region, (size_t)RSIZE); /* only ever touched under the lock we hold (or the stand-in) */
	rfd = -1;
	region = NULL;
	region_lost = 0;
	slot = -1;
}

/* Takes fd (the file st describes), mapped at m, as the region. */
static void map_locked(int fd, const struct stat *st, void *m)
{
	rfd = vgpu_high_fd(fd);
	rdev = st->st_dev;
	rino = st->st_ino;
	region = m;
	__atomic_store_n(&guard_lo, (char *)m, __ATOMIC_RELAXED);
}

/*
 * Opens, locks and maps the file at the path, making it a region file of the
 * right size if it is not one. Returns 1 when this process created it, 0
 * when it opened one that was there, -1 when there is none to be had (errno).
 */
static int attach_locked(void)
{
	for (int tries = 0; tries < 4; tries++) {
		int created = 0;
		/* No following a symlink, no blocking on a FIFO, nothing but a regular file. */
		int fd = open(region_path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), missing = fd < 0 && errno == ENOENT;
		struct stat st;
		if (fd >= 0 && (xfstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
			close(fd);
			fd = -1;
		}
		if (fd < 0) {
			fd = create_locked(!missing);
			if (fd < 0 && errno == EEXIST)
				continue; /* another process made it meanwhile: open theirs */
			if (fd < 0)
				return -1;
			created = 1;
		} else if (ofd_lock_within(fd, OPEN_WAIT_NS) != 0) {
			/* Polled rather than queued: hundreds of processes starting at
			 * once each woke at every release of a queued lock. */
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		/* Replaced while we waited for the lock (or renamed over ours): again. */
		if (!at_path(fd)) {
			ofd_lock(fd, F_UNLCK, 0);
			close(fd);
			continue;
		}
		if (xfstat(fd, &st) != 0 || (st.st_size != RSIZE && ftruncate(fd, RSIZE) != 0)) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		void *m = mmap(NULL, (size_t)RSIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		map_locked(fd, &st, m);
		return created;
	}
	errno = EAGAIN;
	return -1;
}

/*
 * Whether our slot says what we wrote there, or what the ledger said for us
 * at some moment since: another process's rebuild (sync_locked) writes what
 * it read there when our report waited for the lock, and it is no damage.
 * Not only what the ledger says now: our report may have changed again
 * since that rebuild read it (a grant, then a free, both reports left to
 * the keeper). Taken as ours then. Caller holds the lock.
 */
static int own_slot_ok(void)
{
	struct vgpu_region_proc *s = &region->procs[slot];
	int32_t hp = s->host_pid;
	if (s->pid != self || s->start_time != start_time() || (hp != slot_hp && hp != vgpu_ledger_claimed()))
		return 0;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		if (s->used[d] != shown[d] && (d >= vgpu.limits.ngpu || !vgpu_ledger_held_seen(d, s->used[d])))
			return 0;
	slot_hp = hp;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
		shown[d] = s->used[d];
		vgpu_ledger_held_mark(d, shown[d]);
	}
	return 1;
}

/*
 * Checks the header, the device entries (against the limits file) and our
 * own slot, and rewrites what is wrong; then, if anything was, rebuilds the
 * slots. fresh: a file this process just made, filled in without a warning;
 * rebuild: rebuild the slots whatever the checks find.
 */
static void validate_locked(int fresh, int rebuild)
{
	struct vgpu_region *r = region;
	const struct vgpu_limits *l = &vgpu.limits;
	const char *what = NULL;
	struct vgpu_region_header *h = &r->hdr;
	if (h->magic != VGPU_REGION_MAGIC)
		what = "bad magic";
	else if (h->version != VGPU_REGION_VERSION)
		what = "bad version";
	else if (h->size != (uint64_t)RSIZE || h->header_size != offsetof(struct vgpu_region, procs))
		what = "bad size in the header";
	else if (h->device_count != (uint32_t)l->ngpu || h->proc_slots != VGPU_MAX_PROCS)
		what = "bad counts in the header";
	if (what) {
		__atomic_store_n(&h->magic, 0, __ATOMIC_RELAXED);
		memset(h, 0, sizeof(*h));
		h->version = VGPU_REGION_VERSION;
		h->header_size = (uint32_t)offsetof(struct vgpu_region, procs);
		h->size = (uint64_t)RSIZE;
		h->device_count = (uint32_t)l->ngpu;
		h->proc_slots = VGPU_MAX_PROCS;
		__atomic_store_n(&h->magic, VGPU_REGION_MAGIC, __ATOMIC_RELEASE);
	}
	for (int i = 0; i < l->ngpu; i++) {
		struct vgpu_region_device *d = &r->devices[i];
		size_t n = strlen(l->gpu[i].uuid);
		if (n >= sizeof(d->uuid))
			n = sizeof(d->uuid) - 1;
		if (memcmp(d->uuid, l->gpu[i].uuid, n) != 0 || d->uuid[n] != '\0' || d->limit != l->gpu[i].memory ||
		    d->cores != (uint32_t)l->gpu[i].cores) {
			memset(d->uuid, 0, sizeof(d->uuid));
			memcpy(d->uuid, l->gpu[i].uuid, n);
			d->limit = l->gpu[i].memory;
			d->cores = (uint32_t)l->gpu[i].cores;
			if (!what)
				what = "a device entry differs from the limits file";
		}
	}
	if (!what && slot >= 0 && !exiting && !own_slot_ok())
		what = "this process's slot was changed";
	if (what && !fresh)
		damaged(what);
	/* rebuild is only asked for a file this process just made, or one cut
	 * short or extended (damage too): the peak and the throttled time
	 * restart with every rebuild from here. */
	if (what || fresh || rebuild)
		sync_locked(1);
}

/* Under the lock, before the region is touched: see the top of the file. */
static void check_locked(void)
{
	const char *what = NULL;
	if (region && region_lost) {
		/* A fault put a stand-in over the mapping (the file was cut short
		 * under an access): map the file again, rebuilt. */
		detach_locked();
		what = "truncated while in use";
	} else if (region) {
		struct stat a, b;
		int64_t now = now_ns();
		/* Deleting or renaming over the file leaves it with no link: fstat
		 * sees that at once. Only a file kept alive by a second link while
		 * another takes its path needs the path, looked at once a second
		 * (until then this process reports to a file no one reads). */
		int look = now - looked_at > SYNC_NS;
		if (look)
			looked_at = now;
		if (xfstat(rfd, &a) != 0 || a.st_ino != rino || a.st_dev != rdev) {
			what = "lost"; /* the descriptor was closed behind our back */
		} else if (a.st_nlink == 0) {
			what = "deleted";
		} else if (look && (xlstat(region_path, &b) != 0 || !S_ISREG(b.st_mode) || a.st_ino != b.st_ino ||
				    a.st_dev != b.st_dev)) {
			what = "replaced";
		} else if (a.st_size != RSIZE) {
			what = "truncated or extended";
			if (ftruncate(rfd, RSIZE) == 0) { /* the same file again: no need to switch */
				damaged(what);
				validate_locked(0, 1);
				return;
			}
		}
		if (!what) {
			validate_locked(0, 0);
			return;
		}
		detach_locked();
	} else if ((retry_at && now_ns() < retry_at) || !region_path) {
		return;
	}
	int created = attach_locked();
	if (created < 0) {
		int e = errno;
		retry_at = now_ns() + RETRY_NS;
		if (e == EAGAIN) /* held by another all that time: tried again later, nothing wrong with it */
			LOGD("usage region %s: its lock is held by another process; opened later", region_path);
		else if (!warned_unusable++)
			LOGW("usage region %s unusable (%s); quotas are still enforced, usage is not reported to the host",
			     region_path, strerror(e));
		return;
	}
	retry_at = 0;
	/* The first file this process has, and it made it: the container's first process. */
	int fresh = created && !attached;
	if (what && !strcmp(what, "lost"))
		LOGD("usage region %s: the program closed the shim's descriptor; opened again", region_path);
	else if (!fresh && (what || created))
		damaged(what ? what : "deleted");
	attached = 1;
	/* A file we made over a damaged one: put ourselves and the others in. A
	 * sound file the others keep is only checked (a full rebuild reads every
	 * process's ledger entries and /proc: with hundreds of processes starting
	 * at once, registering that way costs more than everything else); our
	 * own slot comes with our first report, the periodic rebuild a second on. */
	synced_at = now_ns();
	validate_locked(fresh, created);
}

/*
 * The region's lock (the thread mutex, then the file's lock) for a report,
 * waiting at most ns for the file's lock, and the checks at the top of the
 * file: 1 (held, checked), or 0 with nothing held. The region is a
 * report: a process stopped while it holds the lock (or a tenant holding it
 * on purpose) must not hold up its container's allocations, frees and
 * exits; what is not written now is written at the next report, or by the
 * next rebuild. The kernel has no timed wait for the lock: polled.
 */
static int lock_within(int64_t ns)
{
	vgpu_ledger_lock();
	if (rfd >= 0 && ofd_lock_within(rfd, ns) != 0) {
		if (errno == EAGAIN) {
			vgpu_ledger_unlock();
			return 0;
		}
		LOGD("usage region lock failed: %s", strerror(errno));
	}
	guard_begin();
	check_locked();
	return 1;
}

static void unlock(void)
{
	if (rfd >= 0)
		ofd_lock(rfd, F_UNLCK, 0);
	guard_end();
	vgpu_ledger_unlock();
}

/*
 * At a process's start: the region file as it is, mapped without its lock,
 * when it is a regular file of the right size; it is checked (path, header,
 * devices), like at every access, under the lock at the first report. 0, or
 * -1 when it has to be made or put right, which takes the lock. Hundreds of
 * processes starting at once each waited here for the lock only to map the
 * file, and queued behind each other's checks for tens of milliseconds.
 */
static int attach_quietly(void)
{
	int fd = open(region_path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	void *m = MAP_FAILED;
	if (xfstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == RSIZE)
		m = mmap(NULL, (size_t)RSIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return -1;
	}
	map_locked(fd, &st, m);
	attached = 1;
	synced_at = now_ns(); /* the periodic rebuild a second on, as for any attach */
	return 0;
}

int vgpu_region_open(const char *dir, const struct vgpu_limits *l)
{
	(void)l; /* the same as vgpu.limits, which every later check reads */
	vgpu_ledger_lock();
	detach_locked(); /* a re-run of the initialisation in a fork child */
	free(region_dir);
	free(region_path);
	region_path = NULL;
	region_dir = strdup(dir);
	if (!region_dir || asprintf(&region_path, "%s/%s", dir, VGPU_REGION_FILE) < 0) {
		free(region_dir);
		region_dir = region_path = NULL;
		vgpu_ledger_unlock();
		LOGW("usage region in %s unusable (out of memory); quotas are still enforced, usage is not reported "
		     "to the host",
		     dir);
		return -1;
	}
	attached = 0;
	retry_at = 0;
	self = (int32_t)getpid();
	read_self();
	/* A sound file is only mapped: no lock taken, the mapping not touched,
	 * so neither the file's lock nor the SIGBUS guard (a start that has
	 * nothing of them to give back makes four system calls fewer). */
	if (attach_quietly() == 0) {
		vgpu_ledger_unlock();
		return 0;
	}
	guard_begin();
	check_locked(); /* made or put right under the lock (attach_locked takes it) */
	int ok = region != NULL;
	unlock();
	return ok ? 0 : -1;
}

/*
 * Whether the slots add up to the devices' totals, as the processes keep
 * them: checked when a process takes its slot, in place of the full rebuild
 * (see check_locked), so a slot forged with nothing else changed is rebuilt
 * then too. Caller holds the lock.
 */
static int slots_add_up_locked(void)
{
	for (int d = 0; d < vgpu.limits.ngpu; d++) {
		uint64_t sum = 0;
		for (int i = 0; i < VGPU_MAX_PROCS; i++)
			if (region->procs[i].pid)
				sum = vgpu_sat_add(sum, region->procs[i].used[d]);
		if (sum != __atomic_load_n(&region->devices[d].used, __ATOMIC_RELAXED))
			return 0;
	}
	return 1;
}

void vgpu_region_set_host_pid(int32_t hp)
{
	/* The claim at once (the ledger needs only the thread mutex); the slot
	 * if the region's lock is free, else by the keeper
	 * (this is on the way to the process's first context). */
	(void)hp; /* vgpu_host_pid() answers it already */
	vgpu_ledger_lock();
	claim_locked();
	vgpu_ledger_unlock();
	if (!lock_within(REPORT_TRY_NS)) {
		vgpu_ledger_lock();
		vgpu_quota_keeper_start();
		vgpu_ledger_unlock();
		return;
	}
	if (region && slot < 0 && !slots_add_up_locked())
		sync_locked(0);
	else
		write_own_slot_locked();
	unlock();
}


/* ---- what this process holds, reported -------------------------------------------------- */

/*
 * Publishes what this process holds on idx (ledger and region slot) and
 * moves the region's total by the difference; rebuilds the region from the
 * ledger instead when the total says the others hold more than the pool
 * leaves them beside our lease (someone went without telling the region:
 * killed, or a forged entry), or when the last rebuild is old (such an
 * entry is gone within that time whatever it says). Caller holds the lock.
 */
static void show_locked(int idx)
{
	uint64_t limit = vgpu.limits.gpu[idx].memory, mine = vgpu_quota_leased(idx);
	uint64_t now = vgpu_quota_held(idx), was = shown[idx];
	if (now != was) {
		vgpu_quota_publish_held(idx, now);
		shown[idx] = now;
	}
	if (!region)
		return;
	struct vgpu_region_device *d = &region->devices[idx];
	uint64_t total = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
	uint64_t others = total > was ? total - was : 0;
	if ((limit && others > limit - (mine < limit ? mine : limit)) || now_ns() - synced_at > SYNC_NS ||
	    (slot < 0 && !slots_add_up_locked())) {
		sync_locked(0);
		return;
	}
	write_own_slot_locked();
	set_used_locked(d, vgpu_sat_add(others, now));
}

/*
 * The region's part of a grant's or a free's report: now if its lock is
 * free, else by the keeper (a report it sees is not written
 * yet); the host pid claim (the SM limiter's) now either way.
 */
void vgpu_region_report(int idx)
{
	if (lock_within(REPORT_TRY_NS)) {
		show_locked(idx);
		unlock();
		return;
	}
	vgpu_ledger_lock();
	claim_locked();
	vgpu_quota_keeper_start();
	vgpu_ledger_unlock();
}

/* A host pid found while the region was busy, not in our slot yet (see write_own_slot_locked). */
static int host_pid_unwritten(void)
{
	return __atomic_load_n(&hp_tried, __ATOMIC_RELAXED) != vgpu_host_pid();
}

int vgpu_region_behind(void)
{
	int behind = host_pid_unwritten();
	for (int d = 0; d < vgpu.limits.ngpu; d++)
		behind |= shown[d] != vgpu_quota_held(d);
	return behind;
}

void vgpu_region_catch_up(int64_t wait_ns)
{
	if (!lock_within(wait_ns))
		return;
	for (int d = 0; d < vgpu.limits.ngpu; d++)
		if (shown[d] != vgpu_quota_held(d))
			show_locked(d);
	if (host_pid_unwritten())
		write_own_slot_locked();
	unlock();
}


void vgpu_count_launch(int idx)
{
	__atomic_add_fetch(&launches[idx], 1, __ATOMIC_RELAXED);
}

void vgpu_count_throttled(int idx, uint64_t ns)
{
	__atomic_add_fetch(&throttled[idx], ns, __ATOMIC_RELAXED);
}

/*
 * Adds the throttled time counted since the last call to the devices'
 * throttled_ns (saturating: the tenant may have written anything there;
 * the host's reader judges it). Kept for later while there is no region.
 * Caller holds the lock, after check_locked: a rebuild there restarts
 * throttled_ns at 0 before this adds to it.
 */
static void add_throttled_locked(void)
{
	if (!region)
		return;
	for (int d = 0; d < vgpu.limits.ngpu; d++) {
		uint64_t ns = __atomic_exchange_n(&throttled[d], 0, __ATOMIC_RELAXED);
		if (ns)
			__atomic_store_n(&region->devices[d].throttled_ns,
					 vgpu_sat_add(__atomic_load_n(&region->devices[d].throttled_ns, __ATOMIC_RELAXED), ns),
					 __ATOMIC_RELAXED);
	}
}

void vgpu_region_flush(void)
{
	if (vgpu_ledger_trylock() != 0)
		return;
	if (rfd >= 0 && ofd_lock(rfd, F_WRLCK, 0) != 0) {
		vgpu_ledger_unlock();
		return;
	}
	guard_begin();
	check_locked();
	if (region && slot < 0)
		sync_locked(0);
	else
		write_own_slot_locked();
	add_throttled_locked();
	unlock();
}

/*
 * On a normal exit the driver frees everything this process held: give its
 * slot back now rather than leaving it for the next rebuild. The ledger's
 * locks stay until the process is gone, when the driver has freed the memory
 * too. Runs after the limiter's and the quota's exit handlers (lifecycle.h):
 * the time launches have waited so far, threads still waiting included, is
 * counted (a process that exits while throttled has its last wait counted),
 * and the unused leases are back with the container.
 */
static void at_exit(void)
{
	vgpu_ledger_lock();
	int pending = 0;
	for (int d = 0; d < vgpu.limits.ngpu; d++)
		pending |= __atomic_load_n(&throttled[d], __ATOMIC_RELAXED) != 0;
	if (slot < 0 && !pending) {
		vgpu_ledger_unlock();
		return;
	}
	/* Not lock_within(): a file that is gone or damaged by now is not worth
	 * rebuilding on the way out, only worth not touching. */
	struct stat st;
	int held_lock = rfd >= 0 && ofd_lock_within(rfd, REPORT_WAIT_NS) == 0;
	int sound = rfd >= 0 && held_lock && xfstat(rfd, &st) == 0 && st.st_size == RSIZE && !region_lost;
	if (!sound)
		slot = -1; /* left to the next rebuild: this process is gone by then */
	guard_begin();
	if (region && sound)
		add_throttled_locked(); /* (what a damaged file would have had is lost with it) */
	if (region && slot >= 0 && region->procs[slot].pid == self) {
		for (int d = 0; d < vgpu.limits.ngpu; d++) {
			uint64_t u = region->devices[d].used;
			set_used_locked(&region->devices[d], u > shown[d] ? u - shown[d] : 0);
		}
		clear_slot(&region->procs[slot]);
	}
	slot = -1;
	exiting = 1;
	if (held_lock)
		ofd_lock(rfd, F_UNLCK, 0);
	guard_end();
	vgpu_ledger_unlock();
}

static void after_fork(void)
{
	/* The inherited descriptor shares the parent's OFD lock: the child opens
	 * the file again at its next access. Closing ours releases nothing of
	 * the parent's, which still holds the description. */
	if (rfd >= 0)
		close(rfd);
	if (region)
		munmap(region, (size_t)RSIZE);
	rfd = -1;
	region = NULL;
	guard_lo = NULL;
	region_lost = 0;
	guard_in = 0;
	guard_resend = 0;
	slot = -1;
	exiting = 0;
	attached = 0;
	retry_at = 0;
	synced_at = 0;
	looked_at = 0;
	self = (int32_t)getpid();
	my_start = 0;
	outer_pid = 0;
	self_read = 0;
	/* The child holds none of the parent's device memory (CUDA state does not survive fork). */
	memset(shown, 0, sizeof(shown));
	memset(launches, 0, sizeof(launches));
	memset(throttled, 0, sizeof(throttled)); /* the parent's waits are the parent's to report */
	slot_hp = 0;
	hp_tried = 0;
}
VGPU_LIFECYCLE(region, .order = VGPU_ORDER_REGION, .after_fork = after_fork, .at_exit = at_exit);
