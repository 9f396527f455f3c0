/*
 * A fake libnvidia-ml.so.1 for tests, over the same shared state as the fake
 * driver: memory per device and per process, and utilisation derived from
 * the simulated SM timeline (the GPU time each process's kernels took since
 * the caller's previous sample).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fakestate.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
	int index;
};
static struct nvmlDevice_st handles[FK_MAX_DEV];
static int inited;

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	/* FAKECUDA_NVML_INIT_FAIL: the driver's own NVML cannot start (as with a driver/NVML mismatch). */
	if (getenv("FAKECUDA_NVML_INIT_FAIL"))
		return NVML_ERROR_UNKNOWN;
	fk_init();
	for (int i = 0; i < FK_MAX_DEV; i++)
		handles[i].index = i;
	inited = 1;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit(void)
{
	return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned flags)
{
	(void)flags;
	return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
	return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
	return r == NVML_SUCCESS ? "Success" : "Error";
}

#define NEED_INIT()                                       \
	do {                                              \
		if (!inited)                              \
			return NVML_ERROR_UNINITIALIZED;  \
	} while (0)
#define DEV_IDX(h) ((h) ? (h)->index : -1)
#define CHECK(h)                                                  \
	do {                                                      \
		NEED_INIT();                                      \
		if (DEV_IDX(h) < 0 || DEV_IDX(h) >= fk->ndev)     \
			return NVML_ERROR_INVALID_ARGUMENT;       \
	} while (0)

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n)
{
	NEED_INIT();
	*n = (unsigned)fk->ndev;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned *n)
{
	return nvmlDeviceGetCount_v2(n);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *h)
{
	NEED_INIT();
	if (i >= (unsigned)fk->ndev)
		return NVML_ERROR_INVALID_ARGUMENT;
	*h = &handles[i];
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned i, nvmlDevice_t *h)
{
	return nvmlDeviceGetHandleByIndex_v2(i, h);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h)
{
	NEED_INIT();
	/* FAKECUDA_NVML_NO_HANDLE: NVML knows no GPU by its UUID (as when it and CUDA disagree). */
	if (getenv("FAKECUDA_NVML_NO_HANDLE"))
		return NVML_ERROR_NOT_FOUND;
	for (int i = 0; i < fk->ndev; i++)
		if (!strcasecmp(fk->dev[i].uuid, uuid)) {
			*h = &handles[i];
			return NVML_SUCCESS;
		}
	return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned len)
{
	CHECK(h);
	if (strlen(fk->dev[h->index].uuid) + 1 > len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, fk->dev[h->index].uuid);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *buf, unsigned len)
{
	CHECK(h);
	if (!buf || strlen(fk->dev[h->index].name) + 1 > len)
		return buf ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_INVALID_ARGUMENT;
	strcpy(buf, fk->dev[h->index].name);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m)
{
	CHECK(h);
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	fk_lock();
	fk_reap();
	m->total = fk->dev[h->index].total;
	m->used = fk->dev[h->index].used;
	m->free = m->total - m->used;
	fk_unlock();
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m)
{
	CHECK(h);
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (m->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	fk_lock();
	fk_reap();
	m->total = fk->dev[h->index].total;
	m->reserved = 0;
	m->used = fk->dev[h->index].used;
	m->free = m->total - m->used;
	fk_unlock();
	return NVML_SUCCESS;
}

/*
 * The process lists. Every process with a context or memory on the device is
 * a compute process; $FAKECUDA_PROC_KIND (read by the fake driver at the
 * process's first context) also lists it as a graphics and/or MPS client.
 * Records are written in the caller's ABI: v1 {pid, used}, v2/v3 with the MIG
 * instance ids (none: 0xFFFFFFFF), or the detail list's.
 */
enum { L_COMPUTE, L_GRAPHICS, L_MPS, L_ALL };
enum { R_V1, R_V2, R_DETAIL };

/*
 * Knobs of the per-process memory lists (fakestate.h's fk_knob: "1" or a
 * path that exists, so a test can turn one on while a process runs):
 *   FAKECUDA_NVML_EXTRA_PROCS=N    N compute processes of other containers
 *                                  listed first (pids FK_EXTRA_PID+i, 1 MiB
 *                                  each), without forking them
 *   FAKECUDA_NVML_USED_NA          usedGpuMemory is NVML_VALUE_NOT_AVAILABLE,
 *                                  as always under WDDM / WSL2
 *   FAKECUDA_NVML_PROCS_FAIL       the lists fail with NVML_ERROR_UNKNOWN
 *   FAKECUDA_NVML_LOG=FILE         a line "list PID" appended for every
 *                                  list asked for (what a start costs the driver)
 */
#define FK_EXTRA_PID 30000000u

static int listed(const struct fk_proc *p, int d, int which)
{
	/* A process with a context is listed even before it allocates, as on hardware. */
	if (!p->pid || (!p->used[d] && !p->ctxs[d]) || !fk_nvml_visible(p))
		return 0;
	switch (which) {
	case L_GRAPHICS:
		return (p->also & FK_ALSO_GRAPHICS) != 0;
	case L_MPS:
		return (p->also & FK_ALSO_MPS) != 0;
	default:
		return 1;
	}
}

static nvmlReturn_t list_procs(nvmlDevice_t h, int which, int rec, unsigned *count, void *out)
{
	CHECK(h);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (fk_knob("FAKECUDA_NVML_PROCS_FAIL"))
		return NVML_ERROR_UNKNOWN;
	const char *log = getenv("FAKECUDA_NVML_LOG");
	int lfd = log && *log ? open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666) : -1;
	if (lfd >= 0) {
		char line[32];
		int len = snprintf(line, sizeof(line), "list %d\n", (int)getpid());
		if (write(lfd, line, (size_t)len) != len)
			fprintf(stderr, "fakenvml: FAKECUDA_NVML_LOG: short write\n");
		close(lfd);
	}
	unsigned n = 0;
	nvmlReturn_t rc = NVML_SUCCESS;
	const char *extra = getenv("FAKECUDA_NVML_EXTRA_PROCS");
	unsigned nextra = extra && (which == L_COMPUTE || which == L_ALL) ? (unsigned)atoi(extra) : 0;
	int na = fk_knob("FAKECUDA_NVML_USED_NA");
	fk_lock();
	fk_reap(); /* the driver lists no process that has exited */
	for (int i = -(int)nextra; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = i >= 0 ? &fk->proc[i] : NULL;
		if (p && !listed(p, h->index, which))
			continue;
		if (n < *count && out) {
			unsigned pid = p ? fk_nvml_pid(p) : FK_EXTRA_PID + (unsigned)(i + (int)nextra);
			uint64_t used = na ? NVML_VALUE_NOT_AVAILABLE : p ? p->used[h->index] : 1u << 20;
			if (rec == R_V1)
				((nvmlProcessInfo_v1_t *)out)[n] = (nvmlProcessInfo_v1_t){pid, used};
			else if (rec == R_V2)
				((nvmlProcessInfo_v2_t *)out)[n] = (nvmlProcessInfo_v2_t){pid, used, ~0u, ~0u};
			else
				((nvmlProcessDetail_v1_t *)out)[n] = (nvmlProcessDetail_v1_t){pid, used, ~0u, ~0u, 0};
		} else {
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		}
		n++;
	}
	fk_unlock();
	*count = n;
	return rc;
}

/* Accounting: every process listed as compute (FAKECUDA_NVML_EXTRA_PROCS too), in NVML's numbering. */
EXPORT nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t h, unsigned *count, unsigned *pids)
{
	CHECK(h);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned n = 0;
	nvmlReturn_t rc = NVML_SUCCESS;
	const char *extra = getenv("FAKECUDA_NVML_EXTRA_PROCS");
	unsigned nextra = extra ? (unsigned)atoi(extra) : 0;
	fk_lock();
	fk_reap();
	for (int i = -(int)nextra; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = i >= 0 ? &fk->proc[i] : NULL;
		if (p && !listed(p, h->index, L_COMPUTE))
			continue;
		if (n < *count && pids)
			pids[n] = p ? fk_nvml_pid(p) : FK_EXTRA_PID + (unsigned)(i + (int)nextra);
		else
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		n++;
	}
	fk_unlock();
	*count = n;
	return rc;
}

/* A listed process's stats (pid in NVML's numbering): its memory as maxMemoryUsage. */
EXPORT nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t h, unsigned pid, nvmlAccountingStats_t *st)
{
	CHECK(h);
	if (!st)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
	const char *extra = getenv("FAKECUDA_NVML_EXTRA_PROCS");
	unsigned nextra = extra ? (unsigned)atoi(extra) : 0;
	if (pid >= FK_EXTRA_PID && pid < FK_EXTRA_PID + nextra) {
		*st = (nvmlAccountingStats_t){.maxMemoryUsage = 1u << 20, .isRunning = 1};
		return NVML_SUCCESS;
	}
	fk_lock();
	for (int i = 0; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = &fk->proc[i];
		if (listed(p, h->index, L_COMPUTE) && fk_nvml_pid(p) == pid) {
			*st = (nvmlAccountingStats_t){.maxMemoryUsage = p->used[h->index], .isRunning = 1};
			rc = NVML_SUCCESS;
			break;
		}
	}
	fk_unlock();
	return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	/* FAKECUDA_FAIL=nvmlDeviceGetComputeRunningProcesses:N: the list a process's Nth call asks for is unavailable. */
	if (fk_fault("nvmlDeviceGetComputeRunningProcesses"))
		return NVML_ERROR_UNKNOWN;
	return list_procs(h, L_COMPUTE, R_V1, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v2_t *out)
{
	return list_procs(h, L_COMPUTE, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_t *out)
{
	return list_procs(h, L_COMPUTE, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	return list_procs(h, L_GRAPHICS, R_V1, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v2_t *out)
{
	return list_procs(h, L_GRAPHICS, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_t *out)
{
	return list_procs(h, L_GRAPHICS, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	return list_procs(h, L_MPS, R_V1, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v2_t *out)
{
	return list_procs(h, L_MPS, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_t *out)
{
	return list_procs(h, L_MPS, R_V2, count, out);
}

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t h, nvmlProcessDetailList_v1_t *l)
{
	CHECK(h);
	if (!l)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (l->version != nvmlProcessDetailList_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	if (l->mode > NVML_PROCESS_MODE_ALL)
		return NVML_ERROR_INVALID_ARGUMENT;
	static const int which[] = {L_COMPUTE, L_GRAPHICS, L_MPS, L_ALL};
	return list_procs(h, which[l->mode], R_DETAIL, &l->numProcArrayEntries, l->procArray);
}

/* The name of a process as NVML gives it: its command line's first word
 * (the pid is NVML's, i.e. offset by FAKECUDA_PIDNS_OFFSET). */
EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned len)
{
	NEED_INIT();
	if (!name || !len)
		return NVML_ERROR_INVALID_ARGUMENT;
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/%u/cmdline", pid - (unsigned)fk_pidns_offset());
	FILE *f = fopen(path, "r");
	if (!f)
		return NVML_ERROR_NOT_FOUND;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	snprintf(name, len, "%s", buf);
	return NVML_SUCCESS;
}

/* Per-caller previous sample of each process's GPU time. */
static struct {
	int pid;
	int64_t busy, ts;
} last[FK_MAX_DEV][FK_MAX_PROC];
static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *s,
						    unsigned *count, unsigned long long since)
{
	(void)since; /* samples are "since this caller's previous call" */
	CHECK(h);
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	int d = h->index;
	int64_t now = fk_now();
	unsigned n = 0;
	/* Real NVML samples every ~1/6 s: FAKECUDA_SAMPLE_MS makes calls in between
	 * find nothing new, as they would on hardware. */
	static int64_t last_call[FK_MAX_DEV];
	const char *e = getenv("FAKECUDA_SAMPLE_MS");
	int64_t period = e ? atoll(e) * 1000000ll : 0;
	/* FAKECUDA_UTIL_IDLE: how a process that ran under 1 % of the window shows.
	 * Unset: listed (smUtil 0) if it ran at all. "absent": left out, NOT_FOUND when
	 * nobody is left (NVML with no samples). "zero": every process with a context
	 * listed, idle ones with smUtil 0 (NVML with zero samples).
	 * FAKECUDA_UTIL_UNSUPPORTED=1: NVML_ERROR_NOT_SUPPORTED, as where per-process
	 * utilisation is not available. */
	const char *idle = getenv("FAKECUDA_UTIL_IDLE");
	int absent = idle && !strcmp(idle, "absent"), zero = idle && !strcmp(idle, "zero");
	if (getenv("FAKECUDA_UTIL_UNSUPPORTED"))
		return NVML_ERROR_NOT_SUPPORTED;
	/* The window moves on only when the samples are handed over (or there
	 * are none): a call that only asks how many there are (no buffer, or one
	 * too small, as go-nvml's first call) leaves them for the next call, as
	 * NVML's sample buffer does. */
	static struct {
		int i, pid;
		int64_t busy;
	} moved[FK_MAX_PROC];
	int nmoved = 0;
	pthread_mutex_lock(&last_mu);
	if (period && last_call[d] && now - last_call[d] < period) {
		pthread_mutex_unlock(&last_mu);
		return NVML_ERROR_NOT_FOUND;
	}
	fk_lock();
	for (int i = 0; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = &fk->proc[i];
		if (!p->pid || !fk_nvml_visible(p))
			continue;
		/* What ran in the window, not what was queued in it: NVML samples the GPU. */
		int64_t ran = fk_ran_ns(p, d, now);
		if (last[d][i].pid != p->pid || !last[d][i].ts) {
			moved[nmoved++] = (__typeof__(moved[0])){i, p->pid, ran};
			continue;
		}
		int64_t busy = ran - last[d][i].busy, win = now - last[d][i].ts;
		unsigned util = win > 0 && busy > 0 ? (unsigned)(busy * 100 / win) : 0;
		if (win <= 0 || (busy <= 0 && !(zero && p->ctxs[d])) || (absent && !util)) {
			if (win > 0)
				moved[nmoved++] = (__typeof__(moved[0])){i, p->pid, ran};
			continue;
		}
		if (util > 100)
			util = 100;
		if (s && n < *count)
			s[n] = (nvmlProcessUtilizationSample_t){.pid = fk_nvml_pid(p),
								.timeStamp = (unsigned long long)(now / 1000),
								.smUtil = util};
		n++;
		moved[nmoved++] = (__typeof__(moved[0])){i, p->pid, ran};
	}
	fk_unlock();
	nvmlReturn_t rc = !n ? NVML_ERROR_NOT_FOUND : (!s || n > *count) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
	if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
		last_call[d] = now;
		for (int k = 0; k < nmoved; k++) {
			last[d][moved[k].i].pid = moved[k].pid;
			last[d][moved[k].i].busy = moved[k].busy;
			last[d][moved[k].i].ts = now;
		}
	}
	pthread_mutex_unlock(&last_mu);
	if (rc != NVML_ERROR_NOT_FOUND)
		*count = n;
	return rc;
}

/* The samples above, reached within this library: a preloaded library that
 * interposes the exported name must not see this library's own call. */
static nvmlReturn_t own_process_utilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *,
					    unsigned long long) __attribute__((alias("nvmlDeviceGetProcessUtilization")));

/* The versioned form of the same samples (NVML 12.x): one more field each. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t h, nvmlProcessesUtilizationInfo_v1_t *u)
{
	CHECK(h);
	if (!u)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (u->version != nvmlProcessesUtilizationInfo_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlProcessUtilizationSample_t s[FK_MAX_PROC];
	unsigned n = FK_MAX_PROC;
	nvmlReturn_t rc = own_process_utilization(h, s, &n, u->lastSeenTimeStamp);
	if (rc != NVML_SUCCESS)
		return rc;
	if (!u->procUtilArray || u->processSamplesCount < n) {
		u->processSamplesCount = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	for (unsigned i = 0; i < n; i++)
		u->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){.timeStamp = s[i].timeStamp,
									 .pid = s[i].pid,
									 .smUtil = s[i].smUtil,
									 .memUtil = s[i].memUtil};
	u->processSamplesCount = n;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u)
{
	CHECK(h);
	u->gpu = fk->dev[h->index].busy_until_ns > fk_now() ? 100 : 0;
	u->memory = 0;
	return NVML_SUCCESS;
}

/* The driver version: the one a fake driver root's file names carry
 * (libnvidia-ml.so.<version>), so a library that compares the two agrees. */
static const char *driver_version(void)
{
	const char *v = getenv("FAKECUDA_DRIVER_VERSION");
	return v && *v ? v : "580.159.04";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned len)
{
	if (!buf || strlen(driver_version()) + 1 > len)
		return buf ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_INVALID_ARGUMENT;
	strcpy(buf, driver_version());
	return NVML_SUCCESS;
}

/* NVML's own version: the CUDA major, then the driver version ("13.580.159.04"). */
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned len)
{
	const char *e = getenv("FAKECUDA_VERSION");
	int cuda = e ? atoi(e) : 12080;
	if (!buf)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((unsigned)snprintf(buf, len, "%d.%s", cuda / 1000, driver_version()) >= len)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	return NVML_SUCCESS;
}

/* The CUDA version the driver supports, as cuDriverGetVersion says it (FAKECUDA_VERSION). */
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
	if (!v)
		return NVML_ERROR_INVALID_ARGUMENT;
	const char *e = getenv("FAKECUDA_VERSION");
	*v = e ? atoi(e) : 12080;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
	return nvmlSystemGetCudaDriverVersion_v2(v);
}

/* ---- identity: index, minor, PCI, MIG, architecture ----------------------- */

/* nvmlPciInfo_t as nvml.h declares it since NVML 11 (the ABI notes, section 4):
 * the _v2 and _v3 entry points fill all 68 bytes. */
typedef struct {
	char busIdLegacy[16];
	unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "pci.busId");

/* The unversioned entry point's record, from before busId grew to 32 bytes:
 * 52 bytes, so it never writes past what an old caller allocated. */
typedef struct {
	char busId[16];
	unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
	unsigned reserved[4];
} nvmlPciInfo_v1_t;
_Static_assert(sizeof(nvmlPciInfo_v1_t) == 52, "nvmlPciInfo_v1_t");

/* An H200's PCI device id (0x2335) with NVIDIA's vendor id, as NVML packs them. */
#define FK_PCI_DEVICE_ID 0x233510deu

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned *i)
{
	CHECK(h);
	if (!i)
		return NVML_ERROR_INVALID_ARGUMENT;
	*i = (unsigned)h->index;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned *minor)
{
	CHECK(h);
	if (!minor)
		return NVML_ERROR_INVALID_ARGUMENT;
	*minor = (unsigned)fk->dev[h->index].minor;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *p)
{
	CHECK(h);
	if (!p)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(p, 0, sizeof(*p));
	p->bus = (unsigned)FK_PCI_BUS(h->index);
	p->pciDeviceId = FK_PCI_DEVICE_ID;
	snprintf(p->busIdLegacy, sizeof(p->busIdLegacy), "0000:%02x:00.0", p->bus);
	snprintf(p->busId, sizeof(p->busId), "00000000:%02x:00.0", p->bus);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t *p)
{
	return nvmlDeviceGetPciInfo_v3(h, p);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_v1_t *p)
{
	CHECK(h);
	if (!p)
		return NVML_ERROR_INVALID_ARGUMENT;
	memset(p, 0, sizeof(*p));
	p->bus = (unsigned)FK_PCI_BUS(h->index);
	p->pciDeviceId = FK_PCI_DEVICE_ID;
	snprintf(p->busId, sizeof(p->busId), "0000:%02x:00.0", p->bus);
	return NVML_SUCCESS;
}

/* A bus id in any of NVML's spellings ("00000000:10:00.0", "0000:10:00.0",
 * "10:00.0", either case). */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *h)
{
	NEED_INIT();
	if (!id || !h)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned dom = 0, bus, dev, fn;
	if (sscanf(id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 &&
	    (dom = 0, sscanf(id, "%x:%x.%x", &bus, &dev, &fn) != 3))
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < fk->ndev; i++)
		if (dom == 0 && bus == (unsigned)FK_PCI_BUS(i) && dev == 0 && fn == 0) {
			*h = &handles[i];
			return NVML_SUCCESS;
		}
	return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *h)
{
	return nvmlDeviceGetHandleByPciBusId_v2(id, h);
}

/* No fake GPU is MIG-capable: NVML says so for every GPU before Ampere. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned *current, unsigned *pending)
{
	CHECK(h);
	(void)current;
	(void)pending;
	return NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned *isMig)
{
	CHECK(h);
	if (!isMig)
		return NVML_ERROR_INVALID_ARGUMENT;
	*isMig = 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned *n)
{
	CHECK(h);
	if (!n)
		return NVML_ERROR_INVALID_ARGUMENT;
	*n = 0;
	return NVML_SUCCESS;
}

/* ATS/HMM addressing (the CDI library's coherence annotation): not a feature of these GPUs. */
EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t h, void *mode)
{
	CHECK(h);
	(void)mode;
	return NVML_ERROR_NOT_SUPPORTED;
}

/* Hopper (compute capability 9.0, NVML_DEVICE_ARCH_HOPPER 9), an NVIDIA-brand data-centre part (NVML_BRAND_NVIDIA 14). */
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor)
{
	CHECK(h);
	if (!major || !minor)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = 9;
	*minor = 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t h, unsigned *arch)
{
	CHECK(h);
	if (!arch)
		return NVML_ERROR_INVALID_ARGUMENT;
	*arch = 9;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t h, int *brand)
{
	CHECK(h);
	if (!brand)
		return NVML_ERROR_INVALID_ARGUMENT;
	*brand = 14;
	return NVML_SUCCESS;
}

/* ---- events --------------------------------------------------------------- */

/* nvmlEventData_t (the ABI notes, section 4); nvmlEventSetWait (v1) fills
 * only the first three fields, the record from before MIG. */
typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned gpuInstanceId;
	unsigned computeInstanceId;
} nvmlEventData_t;
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(offsetof(nvmlEventData_t, eventData) == 16, "ev.eventData");

#define FK_EVENT_XID 0x8ull
#define FK_EVENT_ALL 0x1ffull /* every type nvml.h knows of, up to MIG configuration changes */

struct nvmlEventSet_st {
	unsigned long long mask[FK_MAX_DEV]; /* what each device registered */
	/* The FAKECUDA_XID already delivered (its text and, for a file, the
	 * file's identity), so each one is delivered once per set. */
	char seen[160];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

static unsigned long long supported_events(void)
{
	const char *e = getenv("FAKECUDA_NVML_EVENT_TYPES");
	return e && *e ? strtoull(e, NULL, 0) & FK_EVENT_ALL : 0xfull;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types)
{
	CHECK(h);
	if (!types)
		return NVML_ERROR_INVALID_ARGUMENT;
	*types = supported_events();
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	NEED_INIT();
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	*set = calloc(1, sizeof(**set));
	return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	NEED_INIT();
	free(set);
	return NVML_SUCCESS;
}

/* Types the device does not support make the whole call fail, as NVML's
 * documentation says: "NOT_SUPPORTED if ... some of requested event types".
 * FAKECUDA_NVML_REFUSE_EVENTS (a mask) fails it for types the device lists
 * as supported, as a driver with ECC turned off may. */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set)
{
	CHECK(h);
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	const char *refuse = getenv("FAKECUDA_NVML_REFUSE_EVENTS");
	if ((types & ~supported_events()) || (refuse && (types & strtoull(refuse, NULL, 0))))
		return NVML_ERROR_NOT_SUPPORTED;
	set->mask[h->index] |= types;
	return NVML_SUCCESS;
}

/*
 * The pending XID of FAKECUDA_XID, if this set has not had it yet: "uuid:xid"
 * in the variable, or (a value starting with '/') in the file it names, read
 * at each wait so a test can make one happen in a running process; each new
 * content of the file (or a rewrite of it) is a new event. An empty uuid is
 * an error the driver attributes to no GPU (a NULL device).
 */
static int pending_xid(nvmlEventSet_t set, nvmlEventData_t *ev)
{
	const char *spec = getenv("FAKECUDA_XID");
	char text[128], key[160];
	if (!spec || !*spec)
		return 0;
	if (spec[0] == '/') {
		struct stat st;
		FILE *f = fopen(spec, "r");
		if (!f)
			return 0;
		size_t n = fread(text, 1, sizeof(text) - 1, f);
		int ok = fstat(fileno(f), &st) == 0;
		fclose(f);
		if (!ok)
			return 0;
		text[n] = '\0';
		text[strcspn(text, "\n")] = '\0';
		snprintf(key, sizeof(key), "%lu.%ld.%ld:%s", (unsigned long)st.st_ino, (long)st.st_mtim.tv_sec,
			 st.st_mtim.tv_nsec, text);
	} else {
		snprintf(text, sizeof(text), "%s", spec);
		snprintf(key, sizeof(key), "%s", text);
	}
	if (!strcmp(set->seen, key))
		return 0;
	char *colon = strrchr(text, ':');
	if (!colon)
		return 0;
	*colon = '\0';
	unsigned long long xid = strtoull(colon + 1, NULL, 10);
	int d = -1;
	if (text[0]) {
		for (int i = 0; i < fk->ndev; i++)
			if (!strcasecmp(fk->dev[i].uuid, text))
				d = i;
		if (d < 0 || !(set->mask[d] & FK_EVENT_XID))
			return 0; /* not a GPU of this set, or not registered for XIDs */
	}
	snprintf(set->seen, sizeof(set->seen), "%s", key);
	*ev = (nvmlEventData_t){.device = d >= 0 ? &handles[d] : NULL,
				.eventType = FK_EVENT_XID,
				.eventData = xid,
				.gpuInstanceId = ~0u,
				.computeInstanceId = ~0u};
	return 1;
}

/* Waits up to timeoutMs for an event (polling FAKECUDA_XID every 10 ms);
 * NVML_ERROR_TIMEOUT when none came. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutMs)
{
	NEED_INIT();
	if (!set || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	int64_t deadline = fk_now() + (int64_t)timeoutMs * 1000000ll;
	for (;;) {
		if (pending_xid(set, data))
			return NVML_SUCCESS;
		int64_t left = deadline - fk_now();
		if (left <= 0)
			return NVML_ERROR_TIMEOUT;
		fk_sleep_ns(left < 10000000ll ? left : 10000000ll);
	}
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutMs)
{
	nvmlEventData_t ev;
	if (!data)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t rc = nvmlEventSetWait_v2(set, &ev, timeoutMs);
	if (rc == NVML_SUCCESS)
		memcpy(data, &ev, offsetof(nvmlEventData_t, gpuInstanceId));
	return rc;
}
