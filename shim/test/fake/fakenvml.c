/*
 * A fake libnvidia-ml.so.1 for tests, over the same shared state as the fake
 * driver: memory per device and per process, and utilisation derived from
 * the simulated SM timeline (the GPU time each process's kernels took since
 * the caller's previous sample).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	snprintf(buf, len, "Fake GPU %d", h->index);
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

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	CHECK(h);
	unsigned n = 0;
	nvmlReturn_t rc = NVML_SUCCESS;
	fk_lock();
	fk_reap(); /* the driver lists no process that has exited */
	for (int i = 0; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = &fk->proc[i];
		/* A process with a context is listed even before it allocates, as on hardware. */
		if (!p->pid || (!p->used[h->index] && !p->ctxs[h->index]))
			continue;
		if (n < *count && out)
			out[n] = (nvmlProcessInfo_v1_t){fk_nvml_pid(p->pid), p->used[h->index]};
		else
			rc = NVML_ERROR_INSUFFICIENT_SIZE;
		n++;
	}
	fk_unlock();
	*count = n;
	return rc;
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
	int d = h->index;
	int64_t now = fk_now();
	unsigned n = 0;
	/* Real NVML samples every ~1/6 s: FAKECUDA_SAMPLE_MS makes calls in between
	 * find nothing new, as they would on hardware. */
	static int64_t last_call[FK_MAX_DEV];
	const char *e = getenv("FAKECUDA_SAMPLE_MS");
	int64_t period = e ? atoll(e) * 1000000ll : 0;
	pthread_mutex_lock(&last_mu);
	if (period && last_call[d] && now - last_call[d] < period) {
		pthread_mutex_unlock(&last_mu);
		return NVML_ERROR_NOT_FOUND;
	}
	last_call[d] = now;
	fk_lock();
	for (int i = 0; i < FK_MAX_PROC; i++) {
		struct fk_proc *p = &fk->proc[i];
		if (!p->pid)
			continue;
		/* What ran in the window, not what was queued in it: NVML samples the GPU. */
		int64_t ran = fk_ran_ns(p, d, now);
		if (last[d][i].pid != p->pid || !last[d][i].ts) {
			last[d][i].pid = p->pid;
			last[d][i].busy = ran;
			last[d][i].ts = now;
			continue;
		}
		int64_t busy = ran - last[d][i].busy, win = now - last[d][i].ts;
		if (win <= 0 || busy <= 0) {
			if (win > 0) {
				last[d][i].busy = ran;
				last[d][i].ts = now;
			}
			continue;
		}
		unsigned util = (unsigned)(busy * 100 / win);
		if (util > 100)
			util = 100;
		if (s && n < *count)
			s[n] = (nvmlProcessUtilizationSample_t){.pid = fk_nvml_pid(p->pid),
								.timeStamp = (unsigned long long)(now / 1000),
								.smUtil = util};
		n++;
		last[d][i].busy = ran;
		last[d][i].ts = now;
	}
	fk_unlock();
	pthread_mutex_unlock(&last_mu);
	if (!n)
		return NVML_ERROR_NOT_FOUND;
	if (n > *count) {
		*count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	*count = n;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u)
{
	CHECK(h);
	u->gpu = fk->dev[h->index].busy_until_ns > fk_now() ? 100 : 0;
	u->memory = 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned len)
{
	snprintf(buf, len, "999.99-fake");
	return NVML_SUCCESS;
}
