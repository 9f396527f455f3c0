/*
 * Shared state of the fake driver and NVML (see fakestate.h).
 *
 * The fake machine's GPUs: $FAKECUDA_DEVICES, a comma-separated list of
 *
 *     uuid:memory:SMs[:name[:minor]]
 *
 * memory as bytes or with KiB/MiB/GiB/TiB; name (no ':' or ',') defaults to
 * "Fake GPU <index>"; minor, the N of /dev/nvidiaN, defaults to the index.
 * Unset: one GPU, GPU-00000000-0000-0000-0000-000000000001:16GiB:108.
 * The PCI bus id is derived from the index: bus 0x10 + index, i.e.
 * "00000000:10:00.0" for GPU 0, "00000000:11:00.0" for GPU 1 (FK_PCI_BUS).
 * Read once, when the state is created: every process of one fake machine
 * sees the same GPUs.
 *
 * What only fake NVML reads (fakenvml.c), at each call:
 *   FAKECUDA_DRIVER_VERSION   nvmlSystemGetDriverVersion (default 580.159.04,
 *                             the version a fake driver root's file names carry)
 *   FAKECUDA_VERSION          the CUDA version, as cuDriverGetVersion's (12080)
 *   FAKECUDA_NVML_EVENT_TYPES the event types every GPU supports, a number
 *                             (0x... for hex); default 0xf = single- and
 *                             double-bit ECC, P-state and XID critical errors
 *   FAKECUDA_NVML_REFUSE_EVENTS types listed as supported whose registration
 *                             fails with NOT_SUPPORTED (a mask, as above)
 *   FAKECUDA_XID              an XID critical error: "uuid:xid", or the path of
 *                             a file holding it; see nvmlEventSetWait_v2
 */
#define _GNU_SOURCE
#include "fakestate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FK_MAGIC 0x46414b4543554444ull /* changes with the layout */

struct fk_state *fk;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int shared; /* the state is a file's, seen by other processes */

static void robust_init(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (!strncmp(end, "TiB", 3))
		v *= 1099511627776.0;
	else if (!strncmp(end, "GiB", 3))
		v *= 1073741824.0;
	else if (!strncmp(end, "MiB", 3))
		v *= 1048576.0;
	else if (!strncmp(end, "KiB", 3))
		v *= 1024.0;
	return (uint64_t)v;
}

static void configure(void)
{
	const char *d = getenv("FAKECUDA_DEVICES");
	if (!d || !*d)
		d = "GPU-00000000-0000-0000-0000-000000000001:16GiB:108";
	char *copy = strdup(d), *save = NULL;
	fk->ndev = 0;
	for (char *tok = strtok_r(copy, ",", &save); tok && fk->ndev < FK_MAX_DEV; tok = strtok_r(NULL, ",", &save)) {
		struct fk_dev *dev = &fk->dev[fk->ndev];
		char *c1 = strchr(tok, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		char *c3 = c2 ? strchr(c2 + 1, ':') : NULL;
		char *c4 = c3 ? strchr(c3 + 1, ':') : NULL;
		if (!c1 || !c2 || (c4 && strchr(c4 + 1, ':'))) {
			fprintf(stderr, "fakecuda: bad FAKECUDA_DEVICES entry %s (want uuid:memory:SMs[:name[:minor]])\n", tok);
			abort();
		}
		*c1 = *c2 = '\0';
		if (c3)
			*c3 = '\0';
		if (c4)
			*c4 = '\0';
		snprintf(dev->uuid, sizeof(dev->uuid), "%s", tok);
		dev->total = parse_size(c1 + 1);
		dev->sms = atoi(c2 + 1);
		if (c3 && c3[1])
			snprintf(dev->name, sizeof(dev->name), "%s", c3 + 1);
		else
			snprintf(dev->name, sizeof(dev->name), "Fake GPU %d", fk->ndev);
		dev->minor = c4 && c4[1] ? atoi(c4 + 1) : fk->ndev;
		fk->ndev++;
	}
	free(copy);
	fk->pidns_offset = fk_pidns_offset();
}

int32_t fk_pidns_offset(void)
{
	const char *off = getenv("FAKECUDA_PIDNS_OFFSET");
	return off ? atoi(off) : 0;
}

static void init_once(void)
{
	const char *dir = getenv("FAKECUDA_STATE");
	if (dir && *dir) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/fakecuda.state", dir);
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		if (fd < 0) {
			fprintf(stderr, "fakecuda: %s: %s\n", path, strerror(errno));
			abort();
		}
		/* The file's lock only while it is made: from then on, fk->mu. */
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
		while (fcntl(fd, F_OFD_SETLKW, &fl) != 0 && errno == EINTR)
			;
		if (ftruncate(fd, sizeof(struct fk_state)) != 0)
			abort();
		fk = mmap(NULL, sizeof(*fk), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (fk == MAP_FAILED)
			abort();
		if (fk->magic != FK_MAGIC) {
			robust_init(&fk->mu);
			configure();
			fk->magic = FK_MAGIC;
		}
		/* Unlocked by hand: the mapping keeps the open file description,
		 * and with it the lock, after the close. */
		fl.l_type = F_UNLCK;
		fcntl(fd, F_OFD_SETLK, &fl);
		close(fd);
		shared = 1;
	} else {
		fk = calloc(1, sizeof(*fk));
		pthread_mutex_init(&fk->mu, NULL); /* one process: a plain mutex, as cheap as before */
		configure();
		fk->magic = FK_MAGIC;
	}
}

void fk_init(void)
{
	pthread_once(&once, init_once);
}

void fk_lock(void)
{
	if (pthread_mutex_lock(&fk->mu) == EOWNERDEAD) /* never, for the plain mutex of a machine of one process */
		pthread_mutex_consistent(&fk->mu); /* its holder was killed mid-call: the driver goes on */
}

void fk_unlock(void)
{
	pthread_mutex_unlock(&fk->mu);
}

/*
 * Whether the process of slot p is gone. Its live mutex held (by a thread of
 * the process: EBUSY) says it is not, without a system call; released by the
 * kernel (the holding thread gone: EOWNERDEAD) or never taken, the kernel is
 * asked, as before: a process whose holding thread exited lives on, and a
 * zombie counts as alive until it is waited for. Caller holds the lock.
 */
static int gone(struct fk_proc *p)
{
	int rc = pthread_mutex_trylock(&p->live);
	if (rc == EOWNERDEAD)
		pthread_mutex_consistent(&p->live);
	if (rc == 0 || rc == EOWNERDEAD)
		pthread_mutex_unlock(&p->live); /* left free: the process takes it again at its next call */
	else if (rc != ENOTRECOVERABLE)
		return 0;
	return kill(p->pid, 0) != 0 && errno == ESRCH;
}

/* This process holds its slot's live mutex (see gone): taken at the slot's
 * first use, and again after a thread that held it exited. */
static void hold_live(struct fk_proc *p, int fresh)
{
	if (!shared)
		return; /* a machine of one process: nobody else reaps it */
	if (fresh)
		robust_init(&p->live);
	if (pthread_mutex_trylock(&p->live) == EOWNERDEAD)
		pthread_mutex_consistent(&p->live); /* ours now; EBUSY: a thread of ours has it */
}

void fk_reap(void)
{
	for (int i = 0; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = &fk->proc[i];
		/* A process of another (simulated) pid namespace cannot be checked from here. */
		if (!p->pid || p->nvpid != p->pid + fk_pidns_offset() || !gone(p))
			continue;
		/* The process is gone: the driver frees what it held. */
		for (int d = 0; d < FK_MAX_DEV; d++)
			fk->dev[d].used = fk->dev[d].used > p->used[d] ? fk->dev[d].used - p->used[d] : 0;
		memset(p, 0, sizeof(*p));
	}
}

uint64_t fk_own_pidns(void)
{
	static uint64_t ino;
	struct stat st;
	if (!ino && stat("/proc/self/ns/pid", &st) == 0)
		ino = (uint64_t)st.st_ino;
	return ino;
}

struct fk_proc *fk_me(void)
{
	int me = getpid(), nv = me + fk_pidns_offset(), free_slot = -1;
	/* Matched by pid namespace too: the pid 7 of two containers (real pid
	 * namespaces, one FAKECUDA_PIDNS_OFFSET) are two processes. */
	uint64_t ns = fk_own_pidns();
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < FK_MAX_PROC; i++) {
			if (fk->proc[i].pid == me && fk->proc[i].nvpid == nv && fk->proc[i].pidns == ns) {
				hold_live(&fk->proc[i], 0);
				return &fk->proc[i];
			}
			if (!fk->proc[i].pid && free_slot < 0)
				free_slot = i;
		}
		if (free_slot >= 0)
			break;
		fk_reap();
	}
	if (free_slot < 0) {
		fprintf(stderr, "fakecuda: too many processes\n");
		abort();
	}
	memset(&fk->proc[free_slot], 0, sizeof(fk->proc[free_slot]));
	fk->proc[free_slot].pid = me;
	fk->proc[free_slot].nvpid = nv;
	fk->proc[free_slot].pidns = ns;
	hold_live(&fk->proc[free_slot], 1);
	return &fk->proc[free_slot];
}

/* The pid namespace inode of /proc/<pid>/ns/pid, 0 if unreadable. */
/* Where host pids are looked up: FAKECUDA_PROC, else /proc. A process in a
 * pid namespace of its own (a pod) given the host's /proc mounted elsewhere
 * names processes by host pid as the real NVML does. */
static const char *proc_root(void)
{
	const char *p = getenv("FAKECUDA_PROC");
	return p && *p ? p : "/proc";
}

static uint64_t pidns_of(int pid)
{
	char path[4200];
	struct stat st;
	snprintf(path, sizeof(path), "%s/%d/ns/pid", proc_root(), pid);
	return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* The last pid of /proc/<pid>/status's NSpid line: the process's pid in its
 * own pid namespace; -1 if unreadable. */
static int32_t nspid_of(int pid)
{
	char path[4200], line[256];
	snprintf(path, sizeof(path), "%s/%d/status", proc_root(), pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	int32_t last = -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "NSpid:", 6) != 0)
			continue;
		for (char *tok = strtok(line + 6, " \t\n"); tok; tok = strtok(NULL, " \t\n"))
			last = (int32_t)atoi(tok);
		break;
	}
	fclose(f);
	return last;
}

/* Resolved (pid namespace, pid in it) -> pid in the caller's /proc, kept
 * while /proc still agrees, so a query scans /proc only for a process it
 * has not resolved before. Caller holds the lock (fk_nvml_pid). */
static struct {
	uint64_t pidns;
	int32_t nspid, pid;
} host_pids[FK_MAX_PROC];

static int32_t host_pid(uint64_t pidns, int32_t nspid)
{
	int free_slot = -1;
	for (int i = 0; i < FK_MAX_PROC; i++) {
		if (!host_pids[i].pid) {
			if (free_slot < 0)
				free_slot = i;
			continue;
		}
		if (host_pids[i].pidns != pidns || host_pids[i].nspid != nspid)
			continue;
		if (pidns_of(host_pids[i].pid) == pidns && nspid_of(host_pids[i].pid) == nspid)
			return host_pids[i].pid;
		host_pids[i].pid = 0; /* gone, or its pid reused */
		if (free_slot < 0)
			free_slot = i;
	}
	DIR *d = opendir(proc_root());
	if (!d)
		return 0;
	int32_t found = 0;
	for (struct dirent *e; !found && (e = readdir(d));) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		if (pidns_of((int)pid) == pidns && nspid_of((int)pid) == nspid)
			found = (int32_t)pid;
	}
	closedir(d);
	if (found && free_slot >= 0)
		host_pids[free_slot].pidns = pidns, host_pids[free_slot].nspid = nspid, host_pids[free_slot].pid = found;
	return found;
}

unsigned fk_nvml_pid(const struct fk_proc *p)
{
	if (fk_knob("FAKECUDA_HOST_PIDS"))
		return p->pidns == fk_own_pidns() ? (unsigned)p->pid : (unsigned)host_pid(p->pidns, p->pid);
	return (unsigned)p->nvpid;
}

int fk_nvml_visible(const struct fk_proc *p)
{
	const char *host = getenv("FAKECUDA_HOST_PIDNS");
	if (!host || !*host)
		return 1;
	uint64_t me = fk_own_pidns();
	return me == strtoull(host, NULL, 10) || p->pidns == me;
}

int64_t fk_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

void fk_retire(int d, int64_t now)
{
	struct fk_dev *dev = &fk->dev[d];
	while (dev->qlen && dev->queue[dev->qhead].end_ns <= now) {
		dev->qhead = (dev->qhead + 1) % FK_QUEUE_LEN;
		dev->qlen--;
	}
}

int64_t fk_ran_ns(const struct fk_proc *p, int d, int64_t now)
{
	const struct fk_dev *dev = &fk->dev[d];
	int64_t ahead = 0;
	for (uint32_t k = 0; k < dev->qlen; k++) {
		const struct fk_kernel *q = &dev->queue[(dev->qhead + k) % FK_QUEUE_LEN];
		if (q->pid == p->pid && q->end_ns > now)
			ahead += q->end_ns - (q->start_ns > now ? q->start_ns : now);
	}
	return p->busy_ns[d] - ahead;
}

void fk_sleep_ns(int64_t ns)
{
	if (ns <= 0)
		return;
	struct timespec ts = {ns / 1000000000ll, ns % 1000000000ll};
	while (nanosleep(&ts, &ts) != 0)
		;
}

int fk_fault(const char *name)
{
	static int counts[64];
	static char names[64][64];
	const char *spec = getenv("FAKECUDA_FAIL");
	if (!spec || !*spec)
		return 0;
	size_t nlen = strlen(name);
	for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
		if (strncmp(p, name, nlen) != 0 || p[nlen] != ':')
			continue;
		int slot = -1;
		for (int i = 0; i < 64; i++)
			if (!strcmp(names[i], name) || !names[i][0]) {
				slot = i;
				break;
			}
		if (slot < 0)
			return 0;
		snprintf(names[slot], sizeof(names[slot]), "%s", name);
		int n = __atomic_add_fetch(&counts[slot], 1, __ATOMIC_SEQ_CST);
		char *end;
		long want = strtol(p + nlen + 1, &end, 10);
		if (n != want)
			return 0;
		if (*end == ':') {
			fk_sleep_ns(strtol(end + 1, NULL, 10) * 1000000ll);
			return 0;
		}
		return 1;
	}
	return 0;
}

void fk_uuid_bytes(const char *s, unsigned char out[16])
{
	memset(out, 0, 16);
	if (!strncmp(s, "GPU-", 4))
		s += 4;
	for (int i = 0; i < 16 && *s;) {
		if (*s == '-') {
			s++;
			continue;
		}
		unsigned v;
		if (sscanf(s, "%2x", &v) != 1)
			break;
		out[i++] = (unsigned char)v;
		s += 2;
	}
}

int fk_knob(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	return !strcmp(v, "1") || access(v, F_OK) == 0;
}
