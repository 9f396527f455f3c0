/*
 * NVML's process lists inside a vGPU container (Contract 7): on a GPU of the
 * limits file, nvidia-smi and every other NVML client see only the
 * container's processes, named by their pids in the container, with the
 * memory the shim counts for each, so that the column adds up to the "used"
 * nvmlDeviceGetMemoryInfo reports for the slice (report.c).
 *
 * Who belongs to the container is the ledger's answer (ledger.c): each
 * process claims its host pid there (NVML's numbering, hostpid.c) and
 * publishes the bytes it holds on each GPU, under its own pid. A claim
 * counts here only when the kernel says the process whose range it lies in
 * holds it: a process of the container cannot put another container's host
 * pid in someone else's name, nor in a pid that does not exist. This process
 * answers for itself from its own records. An entry of NVML's list is kept
 * when its pid is one the container claims, and is shown under the claimer's
 * pid; every other entry (other containers, the host) is dropped. What each
 * process holds is what it publishes (its counted allocations plus its
 * context footprint), not NVML's figure, which includes memory the slice
 * does not count and cannot be read at all on some platforms (WDDM).
 *
 * A process of the container that holds memory on the GPU but whose host pid
 * is unknown (hostpid.c leaves an ambiguous one unknown) is not in any entry
 * NVML lists as the container's: the compute lists show it anyway, under its
 * container pid, so no counted byte goes missing. The bytes the ledger
 * counts for the container but cannot name a process for (a forged lock
 * spanning several processes' ranges, or a process that changed its count
 * between the two reads) are added to the process that holds the most, so
 * the column still sums to "used"; where no process holds anything, they
 * are not shown.
 *
 * Utilisation samples and accounting (nvmlDeviceGetAccountingPids, with
 * nvmlDeviceGetAccountingStats asked by the container's pid) are filtered
 * and renamed the same way; accounting also keeps processes that have
 * exited, whose claims are gone with them, so only live ones of the
 * container are shown. nvmlDeviceGetVgpuProcessUtilization is left alone: it
 * samples processes inside vGPU guests of a hypervisor host (guest pids,
 * not the host's), never another container's. Process names
 * (nvmlSystemGetProcessName) of the container's pids are read from the
 * container's own /proc, since NVML would take them for host pids.
 *
 * On a GPU the limits file does not list, and without a valid limits file,
 * every call passes through, as nvmlDeviceGetMemoryInfo does there. Sizes
 * follow NVML's protocol: *count in (capacity) and out (entries, or the
 * entries needed with NVML_ERROR_INSUFFICIENT_SIZE); a NULL array asks only
 * for the count. No lock is held across an NVML call.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "hostpid.h"
#include "ledger.h"
#include "log.h"
#include "quota.h"
#include "real.h"

#define NVML_ERROR_MEMORY 20 /* ABI notes: MEMORY 20 */
#define NO_INSTANCE 0xFFFFFFFFu

/* ---- the container's processes ---------------------------------------------------------- */

struct member {
	int32_t pid;    /* in the container's pid namespace */
	int32_t hp;     /* NVML's pid for it; 0 = unknown */
	uint64_t bytes; /* what it publishes on the GPU */
	int shown;
};

struct members {
	int n, cap, failed;
	struct member *m;
	uint64_t rest;  /* counted bytes no process can be named for */
	int32_t heir;   /* who carries them: the process holding the most; 0 = none */
};

static struct member *member_of(struct members *ms, int32_t pid)
{
	for (int i = 0; i < ms->n; i++)
		if (ms->m[i].pid == pid)
			return &ms->m[i];
	if (ms->n == ms->cap) {
		int cap = ms->cap ? ms->cap * 2 : 16;
		struct member *m = realloc(ms->m, (size_t)cap * sizeof(*m));
		if (!m) {
			ms->failed = 1;
			return NULL;
		}
		ms->m = m;
		ms->cap = cap;
	}
	ms->m[ms->n] = (struct member){.pid = pid};
	return &ms->m[ms->n++];
}

static void on_held(int32_t pid, int idx, uint64_t bytes, void *arg)
{
	(void)idx;
	struct member *m = member_of(arg, pid);
	if (m)
		m->bytes = m->bytes + bytes < m->bytes ? UINT64_MAX : m->bytes + bytes;
}

static void on_claim(int32_t pid, int32_t hp, void *arg)
{
	if (pid == (int32_t)getpid())
		return; /* ours is what hostpid.c says, not what the ledger shows */
	struct member *m = member_of(arg, pid);
	/* The ledger passes only claims their pid holds itself (ledger.c); one
	 * process never holds two for long (a change of host pid), so two
	 * claims of one pid name no process: neither is shown. */
	if (m)
		m->hp = m->hp && m->hp != hp ? -1 : hp;
}

/* The container's processes as they stand on limits index idx (idx < 0:
 * claims only). Returns 0, or -1 when the ledger cannot be read. */
static int gather(int idx, struct members *ms)
{
	memset(ms, 0, sizeof(*ms));
	struct member *me = member_of(ms, (int32_t)getpid());
	if (me) {
		me->hp = vgpu_host_pid();
		me->bytes = idx >= 0 ? vgpu_quota_held(idx) : 0;
	}
	if (vgpu_ledger_reader() != 0 || (idx >= 0 && vgpu_ledger_scan_held(idx, on_held, ms) != 0) ||
	    vgpu_ledger_scan_claims(on_claim, ms) != 0 ||
	    ms->failed) {
		LOGD("NVML process list: the ledger cannot be read (%s); no process is shown", strerror(errno));
		free(ms->m);
		memset(ms, 0, sizeof(*ms));
		return -1;
	}
	if (idx < 0)
		return 0;
	uint64_t sum = 0, used = vgpu_quota_used(idx);
	struct member *heir = NULL;
	for (int i = 0; i < ms->n; i++) {
		struct member *m = &ms->m[i];
		sum = sum + m->bytes < sum ? UINT64_MAX : sum + m->bytes;
		if (m->bytes && (!heir || m->bytes > heir->bytes || (m->bytes == heir->bytes && m->pid < heir->pid)))
			heir = m;
	}
	ms->rest = used > sum ? used - sum : 0;
	ms->heir = heir ? heir->pid : 0;
	return 0;
}

static struct member *by_host_pid(struct members *ms, unsigned hp)
{
	for (int i = 0; hp && i < ms->n; i++)
		if (ms->m[i].hp > 0 && (unsigned)ms->m[i].hp == hp)
			return &ms->m[i];
	return NULL;
}

static uint64_t shown_bytes(const struct members *ms, const struct member *m)
{
	uint64_t b = m->bytes;
	if (m->pid == ms->heir)
		b = b + ms->rest < b ? UINT64_MAX : b + ms->rest;
	return b;
}

/* Limits index of dev when the container's view applies, else -1 (pass through). */
static int ours(nvmlDevice_t dev)
{
	vgpu_init();
	return vgpu.mode == VGPU_ENFORCE ? vgpu_nvml_index(dev) : -1;
}

/* ---- process lists ---------------------------------------------------------------------- */

/* Which list: the values are nvmlProcessMode_t's. */
enum { L_COMPUTE = 0, L_GRAPHICS = 1, L_MPS = 2, L_ALL = 3 };
/* Record ABI: nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t (= _v3's), nvmlProcessDetail_v1_t. */
enum { R_V1, R_V2, R_DETAIL };

struct entry {
	unsigned pid, gi, ci;
	uint64_t bytes, cc;
};

static size_t rec_size(int rec)
{
	return rec == R_V1 ? sizeof(nvmlProcessInfo_v1_t)
			   : rec == R_V2 ? sizeof(nvmlProcessInfo_v2_t) : sizeof(nvmlProcessDetail_v1_t);
}

static struct entry read_rec(const void *v, int rec, unsigned i)
{
	if (rec == R_V1) {
		const nvmlProcessInfo_v1_t *r = (const nvmlProcessInfo_v1_t *)v + i;
		return (struct entry){r->pid, NO_INSTANCE, NO_INSTANCE, r->usedGpuMemory, 0};
	}
	if (rec == R_V2) {
		const nvmlProcessInfo_v2_t *r = (const nvmlProcessInfo_v2_t *)v + i;
		return (struct entry){r->pid, r->gpuInstanceId, r->computeInstanceId, r->usedGpuMemory, 0};
	}
	const nvmlProcessDetail_v1_t *r = (const nvmlProcessDetail_v1_t *)v + i;
	return (struct entry){r->pid, r->gpuInstanceId, r->computeInstanceId, r->usedGpuMemory, r->usedGpuCcProtectedMemory};
}

static void write_rec(void *v, int rec, unsigned i, const struct entry *e)
{
	if (rec == R_V1)
		((nvmlProcessInfo_v1_t *)v)[i] = (nvmlProcessInfo_v1_t){e->pid, e->bytes};
	else if (rec == R_V2)
		((nvmlProcessInfo_v2_t *)v)[i] = (nvmlProcessInfo_v2_t){e->pid, e->bytes, e->gi, e->ci};
	else
		((nvmlProcessDetail_v1_t *)v)[i] = (nvmlProcessDetail_v1_t){e->pid, e->bytes, e->gi, e->ci, e->cc};
}

/* One call of the real list: (device, in/out count, records). */
struct lister {
	nvmlReturn_t (*call)(const struct lister *l, unsigned *count, void *buf);
	nvmlDevice_t dev;
	nvmlReturn_t (*fn)(nvmlDevice_t, unsigned *, void *); /* the versioned lists */
	const nvmlProcessDetailList_v1_t *detail;             /* the detail list: the caller's request */
};

static nvmlReturn_t call_list(const struct lister *l, unsigned *count, void *buf)
{
	return l->fn(l->dev, count, buf);
}

static nvmlReturn_t call_detail(const struct lister *l, unsigned *count, void *buf)
{
	nvmlProcessDetailList_v1_t q = *l->detail;
	q.numProcArrayEntries = *count;
	q.procArray = buf;
	nvmlReturn_t rc = NEXT(nvmlDeviceGetRunningProcessDetailList)(l->dev, &q);
	*count = q.numProcArrayEntries;
	return rc;
}

/* NVML's whole list, in a malloc'ed array of n entries. */
static nvmlReturn_t fetch(const struct lister *l, int rec, struct entry **out, unsigned *n)
{
	unsigned cap = 64;
	void *buf = NULL;
	nvmlReturn_t rc = NVML_ERROR_MEMORY;
	*out = NULL;
	*n = 0;
	for (int tries = 0; tries < 8; tries++) {
		void *b = realloc(buf, cap * rec_size(rec));
		if (!b) {
			rc = NVML_ERROR_MEMORY;
			break;
		}
		buf = b;
		unsigned count = cap;
		rc = l->call(l, &count, buf);
		if (rc == NVML_SUCCESS) {
			unsigned k = count < cap ? count : cap;
			*out = malloc((k ? k : 1) * sizeof(**out));
			if (!*out) {
				rc = NVML_ERROR_MEMORY;
				break;
			}
			for (unsigned i = 0; i < k; i++)
				(*out)[i] = read_rec(buf, rec, i);
			*n = k;
			break;
		}
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
			break;
		cap = count + 16; /* processes may start in between */
	}
	free(buf);
	return rc;
}

/*
 * The container's part of a list: entries of its processes, renamed, with
 * their counted bytes; for the compute lists, also the processes NVML cannot
 * be matched with. Returns a malloc'ed array (n entries) or NULL.
 */
static struct entry *keep(int idx, int which, const struct entry *raw, unsigned nraw, unsigned *n)
{
	struct members ms;
	*n = 0;
	if (gather(idx, &ms) != 0)
		return malloc(sizeof(struct entry)); /* nothing shown: the ledger is unreadable */
	struct entry *v = malloc(((size_t)nraw + (size_t)ms.n + 1) * sizeof(*v));
	if (!v) {
		free(ms.m);
		return NULL;
	}
	for (unsigned i = 0; i < nraw; i++) {
		struct member *m = by_host_pid(&ms, raw[i].pid);
		if (!m || m->shown)
			continue;
		m->shown = 1;
		struct entry e = raw[i];
		e.pid = (unsigned)m->pid;
		e.bytes = shown_bytes(&ms, m);
		v[(*n)++] = e;
	}
	for (int i = 0; (which == L_COMPUTE || which == L_ALL) && i < ms.n; i++) {
		struct member *m = &ms.m[i];
		if (m->shown || !m->bytes)
			continue;
		m->shown = 1;
		v[(*n)++] = (struct entry){(unsigned)m->pid, NO_INSTANCE, NO_INSTANCE, shown_bytes(&ms, m), 0};
	}
	free(ms.m);
	return v;
}

/* Gives the caller n entries by NVML's size protocol. */
static nvmlReturn_t deliver(const struct entry *v, unsigned n, int rec, unsigned *count, void *out)
{
	if (n && (!out || *count < n)) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (unsigned i = 0; i < n; i++)
		write_rec(out, rec, i, &v[i]);
	*count = n;
	return NVML_SUCCESS;
}

static nvmlReturn_t filtered(int idx, const struct lister *l, int which, int rec, unsigned *count, void *out)
{
	struct entry *raw;
	unsigned nraw, n;
	nvmlReturn_t rc = fetch(l, rec, &raw, &nraw);
	if (rc != NVML_SUCCESS)
		return rc;
	struct entry *v = keep(idx, which, raw, nraw, &n);
	free(raw);
	if (!v)
		return NVML_ERROR_MEMORY;
	rc = deliver(v, n, rec, count, out);
	free(v);
	return rc;
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, void *);

static nvmlReturn_t procs(int hook, nvmlDevice_t dev, int which, int rec, unsigned *count, void *out)
{
	list_fn next = (list_fn)vgpu_next(hook);
	if (!next)
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return next(dev, count, out);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	struct lister l = {call_list, dev, next, NULL};
	return filtered(idx, &l, which, rec, count, out);
}

#define LIST(name, which, rec, type)                                                   \
	VGPU_EXPORT nvmlReturn_t name(nvmlDevice_t dev, unsigned *count, type *out)     \
	{                                                                              \
		return procs(HOOK_##name, dev, which, rec, count, out);                \
	}

LIST(nvmlDeviceGetComputeRunningProcesses, L_COMPUTE, R_V1, nvmlProcessInfo_v1_t)
LIST(nvmlDeviceGetComputeRunningProcesses_v2, L_COMPUTE, R_V2, nvmlProcessInfo_v2_t)
LIST(nvmlDeviceGetComputeRunningProcesses_v3, L_COMPUTE, R_V2, nvmlProcessInfo_t)
LIST(nvmlDeviceGetGraphicsRunningProcesses, L_GRAPHICS, R_V1, nvmlProcessInfo_v1_t)
LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, L_GRAPHICS, R_V2, nvmlProcessInfo_v2_t)
LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, L_GRAPHICS, R_V2, nvmlProcessInfo_t)
LIST(nvmlDeviceGetMPSComputeRunningProcesses, L_MPS, R_V1, nvmlProcessInfo_v1_t)
LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, L_MPS, R_V2, nvmlProcessInfo_v2_t)
LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, L_MPS, R_V2, nvmlProcessInfo_t)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t dev, nvmlProcessDetailList_v1_t *l)
{
	if (!NEXT(nvmlDeviceGetRunningProcessDetailList))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return NEXT(nvmlDeviceGetRunningProcessDetailList)(dev, l);
	if (!l)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (l->version != nvmlProcessDetailList_v1) {
		/* A later layout we cannot filter: refused rather than shown whole. */
		LOGD("nvmlDeviceGetRunningProcessDetailList: struct version %#x is not known here", l->version);
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	}
	/* An unknown mode is NVML's to refuse (the call below); it lists no one else's. */
	struct lister q = {call_detail, dev, NULL, l};
	int which = l->mode <= L_ALL ? (int)l->mode : L_GRAPHICS;
	return filtered(idx, &q, which, R_DETAIL, &l->numProcArrayEntries, l->procArray);
}

/* ---- utilisation samples ---------------------------------------------------------------- */

/* Keeps the samples (n records of stride bytes, the pid at pid_at) of the
 * container's processes, renamed, at the front; returns how many. */
static unsigned keep_samples(void *base, size_t stride, size_t pid_at, unsigned n)
{
	struct members ms;
	unsigned k = 0;
	if (gather(-1, &ms) != 0) /* claims only: no bytes needed */
		return 0;
	for (unsigned i = 0; i < n; i++) {
		char *rec = (char *)base + i * stride;
		unsigned pid;
		memcpy(&pid, rec + pid_at, sizeof(pid));
		struct member *m = by_host_pid(&ms, pid);
		if (!m)
			continue;
		pid = (unsigned)m->pid;
		memcpy(rec + pid_at, &pid, sizeof(pid));
		if (k != i)
			memcpy((char *)base + k * stride, rec, stride);
		k++;
	}
	free(ms.m);
	return k;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
							 unsigned *count, unsigned long long since)
{
	if (!NEXT(nvmlDeviceGetProcessUtilization))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return NEXT(nvmlDeviceGetProcessUtilization)(dev, s, count, since);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned cap = 64, n = 0;
	nvmlProcessUtilizationSample_t *buf = NULL;
	nvmlReturn_t rc = NVML_ERROR_MEMORY;
	for (int tries = 0; tries < 8; tries++) {
		nvmlProcessUtilizationSample_t *b = realloc(buf, cap * sizeof(*b));
		if (!b)
			break;
		buf = b;
		n = cap;
		rc = NEXT(nvmlDeviceGetProcessUtilization)(dev, buf, &n, since);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
			break;
		cap = n + 16;
	}
	if (rc == NVML_SUCCESS) {
		n = keep_samples(buf, sizeof(*buf), offsetof(nvmlProcessUtilizationSample_t, pid), n < cap ? n : cap);
		if (!n) {
			rc = NVML_ERROR_NOT_FOUND; /* as NVML says when it has no sample */
		} else if (!s || *count < n) {
			*count = n;
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		} else {
			memcpy(s, buf, n * sizeof(*buf));
			*count = n;
		}
	}
	free(buf);
	return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t dev, nvmlProcessesUtilizationInfo_v1_t *u)
{
	if (!NEXT(nvmlDeviceGetProcessesUtilizationInfo))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return NEXT(nvmlDeviceGetProcessesUtilizationInfo)(dev, u);
	if (!u)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (u->version != nvmlProcessesUtilizationInfo_v1) {
		LOGD("nvmlDeviceGetProcessesUtilizationInfo: struct version %#x is not known here", u->version);
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	}
	nvmlProcessesUtilizationInfo_v1_t q = *u;
	unsigned cap = 64, n = 0;
	nvmlReturn_t rc = NVML_ERROR_MEMORY;
	q.procUtilArray = NULL;
	for (int tries = 0; tries < 8; tries++) {
		nvmlProcessUtilizationInfo_v1_t *b = realloc(q.procUtilArray, cap * sizeof(*b));
		if (!b)
			break;
		q.procUtilArray = b;
		q.processSamplesCount = cap;
		rc = NEXT(nvmlDeviceGetProcessesUtilizationInfo)(dev, &q);
		n = q.processSamplesCount;
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
			break;
		cap = n + 16;
	}
	if (rc == NVML_SUCCESS) {
		n = keep_samples(q.procUtilArray, sizeof(*q.procUtilArray), offsetof(nvmlProcessUtilizationInfo_v1_t, pid),
				 n < cap ? n : cap);
		if (!n) {
			rc = NVML_ERROR_NOT_FOUND;
		} else if (!u->procUtilArray || u->processSamplesCount < n) {
			u->processSamplesCount = n;
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		} else {
			memcpy(u->procUtilArray, q.procUtilArray, n * sizeof(*q.procUtilArray));
			u->processSamplesCount = n;
		}
	}
	free(q.procUtilArray);
	return rc;
}

/* ---- accounting ------------------------------------------------------------------------- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t dev, unsigned *count, unsigned *pids)
{
	if (!NEXT(nvmlDeviceGetAccountingPids))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return NEXT(nvmlDeviceGetAccountingPids)(dev, count, pids);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned cap = 64, n = 0, *buf = NULL;
	nvmlReturn_t rc = NVML_ERROR_MEMORY;
	for (int tries = 0; tries < 8; tries++) {
		unsigned *b = realloc(buf, cap * sizeof(*b));
		if (!b)
			break;
		buf = b;
		n = cap;
		rc = NEXT(nvmlDeviceGetAccountingPids)(dev, &n, buf);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE)
			break;
		cap = n + 16;
	}
	if (rc == NVML_SUCCESS) {
		n = keep_samples(buf, sizeof(*buf), 0, n < cap ? n : cap);
		if (n && (!pids || *count < n)) {
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		} else if (n) {
			memcpy(pids, buf, n * sizeof(*buf));
		}
		*count = n;
	}
	free(buf);
	return rc;
}

/* pid is the container's (as the list above names it): asked under its host
 * pid; any other pid is not found, whoever NVML would take it for. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t dev, unsigned pid, nvmlAccountingStats_t *stats)
{
	if (!NEXT(nvmlDeviceGetAccountingStats))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	int idx = ours(dev);
	if (idx < 0)
		return NEXT(nvmlDeviceGetAccountingStats)(dev, pid, stats);
	struct members ms;
	int32_t hp = 0;
	if (gather(-1, &ms) == 0) {
		for (int i = 0; i < ms.n && !hp; i++)
			if ((unsigned)ms.m[i].pid == pid)
				hp = ms.m[i].hp;
		free(ms.m);
	}
	if (hp <= 0)
		return NVML_ERROR_NOT_FOUND;
	return NEXT(nvmlDeviceGetAccountingStats)(dev, (unsigned)hp, stats);
}

/* ---- process names ---------------------------------------------------------------------- */

/* Whether pid (the container's numbering) is one of the container's processes. */
static int is_member(int32_t pid)
{
	struct members ms;
	int found = 0;
	if (pid == (int32_t)getpid())
		return 1;
	for (int d = -1; d < vgpu.limits.ngpu && !found; d++) {
		if (gather(d, &ms) != 0)
			return 0;
		for (int i = 0; i < ms.n && !found; i++)
			found = ms.m[i].pid == pid && (ms.m[i].hp || ms.m[i].bytes);
		free(ms.m);
	}
	return found;
}

/* The first word of /proc/<pid>/cmdline (the comm name when that is empty); -1 when gone. */
static int proc_name(int32_t pid, char *out, size_t len)
{
	char path[64], buf[4096];
	ssize_t n = -1;
	for (int pass = 0; pass < 2 && n <= 0; pass++) {
		snprintf(path, sizeof(path), pass ? "/proc/%d/comm" : "/proc/%d/cmdline", (int)pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return -1;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
	}
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	snprintf(out, len, "%s", buf);
	return 0;
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned len)
{
	if (!NEXT(nvmlSystemGetProcessName))
		return NVML_ERROR_FUNCTION_NOT_FOUND;
	vgpu_init();
	/* The lists above name the container's processes by their pids here, which NVML would read as host pids. */
	if (vgpu.mode != VGPU_ENFORCE || pid == 0 || pid > INT32_MAX || !is_member((int32_t)pid))
		return NEXT(nvmlSystemGetProcessName)(pid, name, len);
	if (!name || !len)
		return NVML_ERROR_INVALID_ARGUMENT;
	return proc_name((int32_t)pid, name, len) == 0 ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}
