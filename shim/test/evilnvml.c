/*
 * A tenant's own libnvidia-ml.so.1, put first on LD_LIBRARY_PATH to steer the
 * shim's NVML reads (t_nvmlown.sh). EVILNVML says how it misleads:
 *   fail  nvmlInit fails (as no NVML at all would look)
 *   liar  everything succeeds, but no GPU runs a process and every sample
 *         says 0 % (as an NVML that hides the container's work would)
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
	int index;
};
static struct nvmlDevice_st dev0;

static int liar(void)
{
	const char *m = getenv("EVILNVML");
	return m && !strcmp(m, "liar");
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	return liar() ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
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

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h)
{
	(void)uuid;
	*h = &dev0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned len)
{
	(void)h;
	if (len < 2)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, "x");
	return NVML_SUCCESS;
}

/* No process anywhere: nothing to measure a context by, no host pid to find. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	(void)h;
	(void)out;
	*count = 0;
	return NVML_SUCCESS;
}

/* A fresh sample at 0 % each time: the container looks idle however it runs. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *s, unsigned *count,
						     unsigned long long since)
{
	(void)h;
	(void)since;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (!s || *count < 1) {
		*count = 1;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	memset(s, 0, sizeof(*s));
	s->pid = (unsigned)getpid();
	s->timeStamp = (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
	*count = 1;
	return NVML_SUCCESS;
}
