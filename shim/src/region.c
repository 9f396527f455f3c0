/*
 * Cross-process accounting (Contract 5). Every process of the container maps
 * <dir>/usage MAP_SHARED. Updates happen under a thread mutex plus an fcntl
 * OFD write lock on the whole file: OFD locks belong to the open file
 * description, so the kernel drops them when a holder is killed (no wedge),
 * but they do not exclude the threads of one process (hence the mutex) and a
 * fork child must reopen the file to get a description of its own.
 *
 * Invariant: devices[d].used == sum of procs[*].used[d]. A process killed
 * between the two stores can break it for an instant; reaping recomputes the
 * device totals from the slots, so it heals itself.
 *
 * The mapping is never unmapped: other threads may still run hooks while the
 * process exits.
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
#include <unistd.h>

#include "shim.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char region_path[4096];
static int slot = -1;      /* our index in procs[], -1 = not registered */
static int slot_tried;     /* registration attempted (avoid retrying on every call) */

/* fcntl through syscall(2): the libc wrapper is fcntl64@GLIBC_2.28 when built here. */
static int ofd_lock(int fd, short type)
{
	struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
	for (;;) {
		if (syscall(SYS_fcntl, fd, F_OFD_SETLKW, &fl) == 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

static void lock(void)
{
	pthread_mutex_lock(&mu);
	if (vgpu.region_fd >= 0 && ofd_lock(vgpu.region_fd, F_WRLCK) != 0)
		LOGW("usage region lock failed: %s", strerror(errno));
}

static void unlock(void)
{
	if (vgpu.region_fd >= 0)
		ofd_lock(vgpu.region_fd, F_UNLCK);
	pthread_mutex_unlock(&mu);
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
	if (kill(s->pid, 0) != 0 && errno == ESRCH)
		return 0;
	uint64_t st = vgpu_proc_start_time(s->pid);
	return st == 0 || st == s->start_time; /* unreadable /proc: assume alive */
}

/* Frees dead slots and recomputes the device totals. Caller holds the lock. */
static void reap_locked(void)
{
	struct vgpu_region *r = vgpu.region;
	uint64_t sum[VGPU_MAX_DEVICES] = {0};
	int me = (int)getpid();
	for (int i = 0; i < VGPU_MAX_PROCS; i++) {
		struct vgpu_region_proc *s = &r->procs[i];
		if (!s->pid)
			continue;
		if (s->pid != me && !slot_alive(s)) {
			LOGD("reaping slot %d of gone process %d", i, s->pid);
			memset(s, 0, sizeof(*s));
			continue;
		}
		for (int d = 0; d < VGPU_MAX_DEVICES; d++)
			sum[d] += s->used[d];
	}
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		__atomic_store_n(&r->devices[d].used, sum[d], __ATOMIC_RELAXED);
}

static void init_devices_locked(const struct vgpu_limits *l)
{
	struct vgpu_region *r = vgpu.region;
	if (r->hdr.magic != VGPU_REGION_MAGIC || r->hdr.version != VGPU_REGION_VERSION ||
	    r->hdr.size != sizeof(*r)) {
		memset(r, 0, sizeof(*r));
		r->hdr.version = VGPU_REGION_VERSION;
		r->hdr.header_size = (uint32_t)offsetof(struct vgpu_region, procs);
		r->hdr.size = sizeof(*r);
		r->hdr.proc_slots = VGPU_MAX_PROCS;
	}
	for (int i = 0; i < l->ngpu; i++) {
		struct vgpu_region_device *d = &r->devices[i];
		if (strcmp(d->uuid, l->gpu[i].uuid) != 0) {
			memset(d->uuid, 0, sizeof(d->uuid));
			strcpy(d->uuid, l->gpu[i].uuid);
		}
		d->limit = l->gpu[i].memory;
		d->cores = (uint32_t)l->gpu[i].cores;
	}
	r->hdr.device_count = (uint32_t)l->ngpu;
	__atomic_store_n(&r->hdr.magic, VGPU_REGION_MAGIC, __ATOMIC_RELEASE);
}

static int open_file(void)
{
	int fd = open(region_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (fd >= 0)
		fchmod(fd, 0666); /* any uid in the container must be able to join; fails harmlessly if not ours */
	return fd;
}

int vgpu_region_open(const char *dir, const struct vgpu_limits *l)
{
	struct vgpu_region *r = MAP_FAILED;
	int fd = -1;
	if (snprintf(region_path, sizeof(region_path), "%s/%s", dir, VGPU_REGION_FILE) <
	    (int)sizeof(region_path))
		fd = open_file();
	if (fd >= 0 && ofd_lock(fd, F_WRLCK) == 0) {
		off_t size = lseek(fd, 0, SEEK_END);
		if (size == (off_t)sizeof(*r) || ftruncate(fd, (off_t)sizeof(*r)) == 0)
			r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	if (r == MAP_FAILED) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		/* Process-local accounting keeps the quota for this process at least. */
		vgpu.region = calloc(1, sizeof(*vgpu.region));
		vgpu.region_fd = -1;
		if (vgpu.region)
			init_devices_locked(l);
		errno = e;
		return -1;
	}
	vgpu.region = r;
	vgpu.region_fd = fd;
	init_devices_locked(l);
	ofd_lock(fd, F_UNLCK);
	return 0;
}

/* Claims a slot for this process. Caller holds the lock. */
static void register_locked(void)
{
	struct vgpu_region *r = vgpu.region;
	int me = (int)getpid();
	uint64_t st = vgpu_proc_start_time(me);
	slot_tried = 1;
	reap_locked();
	int free_slot = -1;
	for (int i = 0; i < VGPU_MAX_PROCS; i++) {
		struct vgpu_region_proc *s = &r->procs[i];
		if (s->pid == me) {
			/* Left by this pid before an exec (or a forged entry): whatever it
			 * held died with that address space. */
			for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
				uint64_t u = r->devices[d].used;
				r->devices[d].used = u > s->used[d] ? u - s->used[d] : 0;
			}
			memset(s, 0, sizeof(*s));
		}
		if (!s->pid && free_slot < 0)
			free_slot = i;
	}
	if (free_slot < 0) {
		LOGW("usage region has no free process slot; this process is accounted without one");
		return;
	}
	r->procs[free_slot].start_time = st;
	r->procs[free_slot].host_pid = vgpu_host_pid();
	__atomic_store_n(&r->procs[free_slot].pid, me, __ATOMIC_RELEASE);
	slot = free_slot;
}

static inline void ensure_slot_locked(void)
{
	if (slot < 0 && !slot_tried)
		register_locked();
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
	if (!vgpu.region)
		return;
	ensure_slot_locked();
	if (slot >= 0)
		__atomic_store_n(&vgpu.region->procs[slot].host_pid, hp, __ATOMIC_RELAXED);
}

int vgpu_region_host_pid_claimed_locked(int32_t hp)
{
	struct vgpu_region *r = vgpu.region;
	if (!r || !hp)
		return 0;
	int me = (int)getpid();
	for (int i = 0; i < VGPU_MAX_PROCS; i++) {
		const struct vgpu_region_proc *s = &r->procs[i];
		if (s->pid && s->pid != me && s->host_pid == hp && slot_alive(s))
			return 1;
	}
	return 0;
}

static int reserve(int idx, uint64_t bytes, int force)
{
	struct vgpu_region *r = vgpu.region;
	if (!r || bytes == 0)
		return 0;
	lock();
	ensure_slot_locked();
	struct vgpu_region_device *d = &r->devices[idx];
	int ok = 1;
	if (d->limit && !force) {
		if (d->used > d->limit || bytes > d->limit - d->used) {
			reap_locked(); /* maybe a dead process still holds some */
			ok = d->used <= d->limit && bytes <= d->limit - d->used;
		}
	}
	if (ok) {
		__atomic_store_n(&d->used, d->used + bytes, __ATOMIC_RELAXED);
		if (slot >= 0)
			r->procs[slot].used[idx] += bytes;
	}
	unlock();
	return ok ? 0 : -1;
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
	struct vgpu_region *r = vgpu.region;
	if (!r || bytes == 0)
		return;
	lock();
	struct vgpu_region_device *d = &r->devices[idx];
	__atomic_store_n(&d->used, d->used > bytes ? d->used - bytes : 0, __ATOMIC_RELAXED);
	if (slot >= 0) {
		uint64_t *u = &r->procs[slot].used[idx];
		*u = *u > bytes ? *u - bytes : 0;
	}
	unlock();
}

uint64_t vgpu_used(int idx)
{
	return vgpu.region ? __atomic_load_n(&vgpu.region->devices[idx].used, __ATOMIC_RELAXED) : 0;
}

void vgpu_count_launch(int idx)
{
	struct vgpu_region *r = vgpu.region;
	if (!r)
		return;
	if (unlikely(slot < 0)) {
		if (__atomic_load_n(&slot_tried, __ATOMIC_RELAXED))
			return;
		lock();
		ensure_slot_locked();
		unlock();
		if (slot < 0)
			return;
	}
	__atomic_add_fetch(&r->procs[slot].launches[idx], 1, __ATOMIC_RELAXED);
}

/*
 * On a normal exit the driver frees everything this process held: give its
 * slot back now rather than leaving it for the next reap. (Not a constructor:
 * nothing runs at load time. The mapping itself stays.)
 */
__attribute__((destructor)) static void release_slot(void)
{
	struct vgpu_region *r = vgpu.region;
	if (!r || slot < 0)
		return;
	lock();
	if (slot >= 0 && r->procs[slot].pid == (int32_t)getpid()) {
		for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
			uint64_t u = r->devices[d].used, mine = r->procs[slot].used[d];
			__atomic_store_n(&r->devices[d].used, u > mine ? u - mine : 0, __ATOMIC_RELAXED);
		}
		memset(&r->procs[slot], 0, sizeof(r->procs[slot]));
		slot = -1;
		slot_tried = 1;
	}
	unlock();
}

void vgpu_region_after_fork(void)
{
	/* Single-threaded here (fork child). A parent thread may have held the mutex. */
	pthread_mutex_init(&mu, NULL);
	slot = -1;
	slot_tried = 0;
	if (vgpu.region_fd >= 0) {
		/* The inherited descriptor shares the parent's OFD lock: get our own. */
		int fd = open_file();
		close(vgpu.region_fd);
		vgpu.region_fd = fd;
	}
}
