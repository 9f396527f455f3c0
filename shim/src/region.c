/*
 * The container's memory accounting, and the usage region (Contract 5).
 *
 * What a process holds is known for certain only to the process itself
 * (own[], in its private memory). It publishes that in the ledger (ledger.c:
 * fcntl locks on the read-only limits file, which no other process can
 * lower and which vanish with the process), and every quota decision is
 * taken on its own count plus what the ledger shows of the others. The
 * limit comes from the limits file. Nothing is ever read back from the
 * region to decide anything.
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
 * child reopens the file to get a description of its own. It makes the
 * container's processes reserve one at a time, so that near the quota one of
 * two gets the memory rather than both refusing. The quota does not depend
 * on it: a process publishes before it measures the others, so two processes
 * that reserve at once without it (the tenant replaced the file between them)
 * can both refuse, never both pass.
 *
 * The mapping is only touched under the lock, after the size check, so a
 * truncated file costs no SIGBUS; a truncation racing with that access still
 * can, and hurts only the process that raced.
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

#include "shim.h"

#define RSIZE ((off_t)sizeof(struct vgpu_region))
#define RETRY_NS 1000000000ll /* no usable region file: try again after this long */
#define SYNC_NS 1000000000ll  /* rebuild the other processes' slots at least this often */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char region_dir[4096], region_path[4200];
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
static uint64_t my_start;   /* /proc/self/stat field 22 */
/* What this process holds per limits index: the truth, for itself. */
static uint64_t own[VGPU_MAX_DEVICES];
static uint64_t launches[VGPU_MAX_DEVICES];
static int warned_damage, warned_unusable, warned_unrecorded, warned_slots;

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

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

uint64_t vgpu_proc_start_time(int pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* comm (field 2) may contain spaces and ')': fields resume after the last ')'. */
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p++;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	return p ? strtoull(p + 1, NULL, 10) : 0;
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

/* Writes this process's slot (taking one if it has none) and its host-pid claim. */
static void write_own_slot_locked(void)
{
	int32_t hp = vgpu_host_pid();
	if (vgpu_ledger_claim_host_pid(hp) != 0)
		LOGD("cannot claim host pid %d in the ledger: %s", (int)hp, strerror(errno));
	if (!region || exiting)
		return;
	int32_t me = self;
	if (slot >= 0 && region->procs[slot].pid != me)
		slot = -1; /* someone wrote another pid over it */
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
	if (!my_start)
		my_start = vgpu_proc_start_time(me);
	s->start_time = my_start;
	s->host_pid = hp;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
		s->used[d] = __atomic_load_n(&own[d], __ATOMIC_RELAXED);
		s->launches[d] = __atomic_load_n(&launches[d], __ATOMIC_RELAXED);
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
		h->bytes[idx] = sat_add(h->bytes[idx], bytes);
}

static void held_claim(int32_t pid, int32_t hp, void *arg)
{
	(void)arg;
	struct held *h = held_of(pid, 1);
	if (h)
		h->hp = hp;
}

/*
 * Rebuilds every slot and the devices' totals from the ledger: gone
 * processes and second slots of one pid are dropped, each live process's
 * bytes and host pid are what it publishes, processes that publish but have
 * no slot get one, ours is what we know. Caller holds the lock.
 */
static void sync_locked(void)
{
	struct vgpu_region *r = region;
	int32_t me = self;
	int ngpu = vgpu.limits.ngpu;
	synced_at = now_ns();
	ntab = 0;
	for (int d = 0; d < ngpu; d++)
		if (vgpu_ledger_scan_held(d, held_bytes, NULL) != 0)
			LOGD("ledger scan of GPU %d failed: %s", d, strerror(errno));
	if (vgpu_ledger_scan_claims(held_claim, NULL) != 0)
		LOGD("ledger scan of host pids failed: %s", strerror(errno));
	for (int i = 0; i < VGPU_MAX_PROCS; i++) {
		struct vgpu_region_proc *s = &r->procs[i];
		int32_t pid = s->pid;
		if (!pid)
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
		if (vgpu_ledger_others(d, &others) == 0) {
			sum = sat_add(own[d], others);
		} else {
			for (int i = 0; i < VGPU_MAX_PROCS; i++)
				if (r->procs[i].pid)
					sum = sat_add(sum, r->procs[i].used[d]);
		}
		__atomic_store_n(&r->devices[d].used, sum, __ATOMIC_RELAXED);
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
	if (region)
		munmap(region, (size_t)RSIZE); /* only ever touched under the lock we hold */
	rfd = -1;
	region = NULL;
	slot = -1;
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
		} else if (ofd_lock(fd, F_WRLCK, 1) != 0) {
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
		rfd = vgpu_high_fd(fd);
		rdev = st.st_dev;
		rino = st.st_ino;
		region = m;
		return created;
	}
	errno = EAGAIN;
	return -1;
}

static int own_slot_ok(void)
{
	const struct vgpu_region_proc *s = &region->procs[slot];
	if (s->pid != self || s->start_time != my_start || s->host_pid != vgpu_host_pid())
		return 0;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		if (s->used[d] != own[d])
			return 0;
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
	if (what || fresh || rebuild)
		sync_locked();
}

/* Under the lock, before the region is touched: see the top of the file. */
static void check_locked(void)
{
	const char *what = NULL;
	if (region) {
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
	} else if (retry_at && now_ns() < retry_at) {
		return;
	}
	int created = attach_locked();
	if (created < 0) {
		int e = errno;
		retry_at = now_ns() + RETRY_NS;
		if (!warned_unusable++)
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
	validate_locked(fresh, 1); /* a file we did not have before: put ourselves and the others in */
}

static void lock(void)
{
	pthread_mutex_lock(&mu);
	if (rfd >= 0 && ofd_lock(rfd, F_WRLCK, 1) != 0)
		LOGD("usage region lock failed: %s", strerror(errno));
	check_locked();
}

static void unlock(void)
{
	if (rfd >= 0)
		ofd_lock(rfd, F_UNLCK, 0);
	pthread_mutex_unlock(&mu);
}

int vgpu_region_open(const char *dir, const struct vgpu_limits *l)
{
	(void)l; /* the same as vgpu.limits, which every later check reads */
	pthread_mutex_lock(&mu);
	detach_locked(); /* a re-run of the initialisation in a fork child */
	snprintf(region_dir, sizeof(region_dir), "%s", dir);
	snprintf(region_path, sizeof(region_path), "%s/%s", region_dir, VGPU_REGION_FILE);
	attached = 0;
	retry_at = 0;
	self = (int32_t)getpid();
	my_start = vgpu_proc_start_time((int)self);
	check_locked();
	int ok = region != NULL;
	unlock();
	return ok ? 0 : -1;
}

void vgpu_region_lock(void)
{
	lock();
}

void vgpu_region_unlock(void)
{
	unlock();
}

void vgpu_region_set_host_pid_locked(int32_t hp)
{
	(void)hp; /* vgpu_host_pid() already answers hp */
	if (region && slot < 0)
		sync_locked();
	else
		write_own_slot_locked();
}

/* ---- accounting ----------------------------------------------------------------------- */

static void unrecorded(int e)
{
	if (warned_unrecorded++) {
		LOGD("GPU memory refused: still cannot record it in the ledger: %s", strerror(e));
		return;
	}
	if (e == EEXIST)
		LOGE("GPU memory refused: another process publishes its GPU memory under this process's id "
		     "(pid %d in another pid namespace?); allocations are refused while it does",
		     (int)getpid());
	else
		LOGE("cannot record GPU memory use in the container's ledger (a lock on the limits file): %s; "
		     "GPU memory allocations are refused while it cannot",
		     strerror(e));
}

/*
 * The region's view of limits index idx after our own count went from
 * before to own[idx], others holding others (measured: a reservation): a
 * total that is not what it was (a process died, or the file was written)
 * means a rebuild. Frees do not measure: they take their bytes off the total.
 * Caller holds the lock.
 */
static void note_locked(int idx, uint64_t before, const uint64_t *others)
{
	if (!region)
		return;
	struct vgpu_region_device *d = &region->devices[idx];
	uint64_t total = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
	if (slot < 0 || (others && total != sat_add(before, *others)) || now_ns() - synced_at > SYNC_NS)
		sync_locked();
	else
		write_own_slot_locked();
	if (others)
		total = sat_add(own[idx], *others);
	else
		total = total > before - own[idx] ? total - (before - own[idx]) : 0;
	__atomic_store_n(&d->used, total, __ATOMIC_RELAXED);
}

static int reserve(int idx, uint64_t bytes, int force)
{
	if (bytes == 0 || idx < 0 || idx >= VGPU_MAX_DEVICES)
		return 0;
	lock();
	uint64_t before = own[idx], after = sat_add(before, bytes), others = 0;
	int rc = 0;
	/* Publish first, then measure the others: of two processes reserving
	 * at once, the later to measure sees the earlier. */
	if (vgpu_ledger_publish(idx, after) != 0) {
		unrecorded(errno);
		if (!force) {
			rc = VGPU_UNRECORDED;
			goto out;
		}
	} else if (vgpu_ledger_others(idx, &others) != 0) {
		int e = errno;
		unrecorded(e);
		if (!force) {
			vgpu_ledger_publish(idx, before);
			rc = VGPU_UNRECORDED;
			goto out;
		}
		others = 0;
	} else if (!force) {
		uint64_t limit = vgpu.limits.gpu[idx].memory; /* the limits file's, never the region's */
		if (limit && (others > limit || after > limit - others)) {
			vgpu_ledger_publish(idx, before);
			rc = VGPU_OVER_QUOTA;
			goto out;
		}
	}
	__atomic_store_n(&own[idx], after, __ATOMIC_RELAXED);
	note_locked(idx, before, &others);
out:
	unlock();
	return rc;
}

int vgpu_reserve(int idx, uint64_t bytes)
{
	return reserve(idx, bytes, 0);
}

void vgpu_reserve_force(int idx, uint64_t bytes)
{
	reserve(idx, bytes, 1);
}

void vgpu_unreserve(int idx, uint64_t bytes)
{
	if (bytes == 0 || idx < 0 || idx >= VGPU_MAX_DEVICES)
		return;
	lock();
	uint64_t before = own[idx], after = before > bytes ? before - bytes : 0;
	__atomic_store_n(&own[idx], after, __ATOMIC_RELAXED);
	/* Shrinking a lock cannot fail; if it did, the container would only be
	 * counted for more than it holds. */
	if (vgpu_ledger_publish(idx, after) != 0)
		LOGD("ledger: cannot shrink GPU %d to %llu bytes: %s", idx, (unsigned long long)after, strerror(errno));
	note_locked(idx, before, NULL);
	unlock();
}

uint64_t vgpu_own_used(int idx)
{
	return __atomic_load_n(&own[idx], __ATOMIC_RELAXED);
}

uint64_t vgpu_used(int idx)
{
	uint64_t mine = __atomic_load_n(&own[idx], __ATOMIC_RELAXED), others;
	if (vgpu_ledger_others(idx, &others) != 0) {
		/* Unknown: report the slice as full rather than invite allocations. */
		uint64_t limit = vgpu.limits.gpu[idx].memory;
		return limit > mine ? limit : mine;
	}
	return sat_add(mine, others);
}

void vgpu_count_launch(int idx)
{
	__atomic_add_fetch(&launches[idx], 1, __ATOMIC_RELAXED);
}

void vgpu_region_flush(void)
{
	if (pthread_mutex_trylock(&mu) != 0)
		return;
	if (rfd >= 0 && ofd_lock(rfd, F_WRLCK, 0) != 0) {
		pthread_mutex_unlock(&mu);
		return;
	}
	check_locked();
	if (region && slot < 0)
		sync_locked();
	else
		write_own_slot_locked();
	unlock();
}

/*
 * On a normal exit the driver frees everything this process held: give its
 * slot back now rather than leaving it for the next rebuild. The ledger's
 * locks stay until the process is gone, when the driver has freed the memory
 * too. (Not a constructor: nothing runs at load time.)
 */
__attribute__((destructor)) static void release_slot(void)
{
	if (__atomic_load_n(&slot, __ATOMIC_RELAXED) < 0)
		return;
	/* Not lock(): a file that is gone or damaged by now is not worth
	 * rebuilding on the way out, only worth not touching. */
	pthread_mutex_lock(&mu);
	struct stat st;
	if (rfd >= 0 && (ofd_lock(rfd, F_WRLCK, 1) != 0 || xfstat(rfd, &st) != 0 || st.st_size != RSIZE))
		slot = -1;
	if (region && slot >= 0 && region->procs[slot].pid == self) {
		for (int d = 0; d < vgpu.limits.ngpu; d++) {
			uint64_t u = region->devices[d].used;
			__atomic_store_n(&region->devices[d].used, u > own[d] ? u - own[d] : 0, __ATOMIC_RELAXED);
		}
		clear_slot(&region->procs[slot]);
	}
	slot = -1;
	exiting = 1;
	unlock();
}

void vgpu_region_after_fork(void)
{
	/* Single-threaded here (fork child). A parent thread may have held the mutex. */
	pthread_mutex_init(&mu, NULL);
	/* The inherited descriptor shares the parent's OFD lock: the child opens
	 * the file again at its next access. Closing ours releases nothing of
	 * the parent's, which still holds the description. */
	if (rfd >= 0)
		close(rfd);
	if (region)
		munmap(region, (size_t)RSIZE);
	rfd = -1;
	region = NULL;
	slot = -1;
	exiting = 0;
	attached = 0;
	retry_at = 0;
	synced_at = 0;
	looked_at = 0;
	self = (int32_t)getpid();
	my_start = 0;
	/* The child holds none of the parent's device memory (CUDA state does not survive fork). */
	memset(own, 0, sizeof(own));
	memset(launches, 0, sizeof(launches));
}
