/*
 * Test program for NVML's process lists, two roles:
 *
 *   nvmlprocs worker DEV BYTES PIDFILE ENDFILE [launch]
 *       a GPU process: a context on CUDA device DEV, BYTES allocated, its
 *       pid (getpid) written to PIDFILE, kernels launched while it waits
 *       (with "launch") until ENDFILE exists (60 s at most)
 *   nvmlprocs smi DEV
 *       reads NVML the way nvidia-smi does (dlopen + dlsym of every process
 *       list, each asked for its count, then with one record too few, then
 *       in full) and prints what it saw, one line each:
 *         used BYTES                         nvmlDeviceGetMemoryInfo
 *         list NAME PID:BYTES,... sum=BYTES  sorted by pid ("-" when empty)
 *         util NAME PID,...                  pids over several samples
 *         name PID NAME                      nvmlSystemGetProcessName
 *         acct PID:MAXMEM ...                with SMI_ACCT: nvmlDeviceGetAccountingPids,
 *                                            each asked for nvmlDeviceGetAccountingStats
 *                                            (PID:rc=N when that fails; "-" when none)
 *         acctprobe RC                       with SMI_ACCT_PROBE=PID: the stats call for PID
 *       A broken size protocol prints "FAIL: ..." and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

static void die(const char *what)
{
	printf("FAIL: %s\n", what);
	fflush(stdout);
	exit(1);
}

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		printf("FAIL: no %s\n", name);
		exit(1);
	}
	return p;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000l};
	nanosleep(&ts, NULL);
}

static int worker(int dev, unsigned long long bytes, const char *pidfile, const char *endfile, int launch)
{
	alarm(60);
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		die("dlopen libcuda.so.1");
	CUresult (*init)(unsigned) = sym(h, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = sym(h, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = sym(h, "cuCtxSetCurrent");
	CUresult (*alloc)(CUdeviceptr *, size_t) = sym(h, "cuMemAlloc_v2");
	CUresult (*lk)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
		       void **, void **) = sym(h, "cuLaunchKernel");
	CUresult (*sync)(void) = sym(h, "cuCtxSynchronize");
	CUcontext ctx;
	CUdeviceptr p;
	if (init(0) || retain(&ctx, dev) || setcur(ctx))
		die("worker: no context");
	if (bytes && alloc(&p, (size_t)bytes))
		die("worker: allocation refused");
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", pidfile);
	FILE *f = fopen(tmp, "w");
	if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) || rename(tmp, pidfile))
		die("worker: cannot write the pid file");
	while (access(endfile, F_OK) != 0) {
		if (launch && (lk(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) || sync()))
			die("worker: launch failed");
		sleep_ms(launch ? 2 : 20);
	}
	return 0;
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, void *);

struct rec {
	unsigned pid;
	unsigned long long bytes;
};

static int by_pid(const void *a, const void *b)
{
	const struct rec *x = a, *y = b;
	return x->pid < y->pid ? -1 : x->pid > y->pid;
}

static void print_list(const char *name, struct rec *r, unsigned n)
{
	unsigned long long sum = 0;
	qsort(r, n, sizeof(*r), by_pid);
	printf("list %s ", name);
	for (unsigned i = 0; i < n; i++) {
		printf("%s%u:%llu", i ? "," : "", r[i].pid, r[i].bytes);
		sum += r[i].bytes;
	}
	printf("%s sum=%llu\n", n ? "" : "-", sum);
}

/*
 * Count, short and full calls of one list (size: one record's bytes; the
 * full call reads records through get). Every step is checked against
 * NVML's protocol.
 */
static void one_list(const char *name, nvmlReturn_t (*call)(void *arg, unsigned *count, void *buf), void *arg,
		     size_t size, struct rec (*get)(const void *buf, unsigned i))
{
	char why[256];
	unsigned n = 0;
	nvmlReturn_t rc = call(arg, &n, NULL);
	if (!((rc == NVML_SUCCESS && n == 0) || (rc == NVML_ERROR_INSUFFICIENT_SIZE && n > 0))) {
		snprintf(why, sizeof(why), "%s count query: rc=%d count=%u", name, rc, n);
		die(why);
	}
	unsigned cap = n + 4;
	unsigned char *buf = malloc(cap * size);
	if (n > 0) {
		unsigned short_n = n - 1;
		rc = call(arg, &short_n, short_n ? buf : NULL);
		if (rc != NVML_ERROR_INSUFFICIENT_SIZE || short_n != n) {
			snprintf(why, sizeof(why), "%s with %u of %u records: rc=%d count=%u", name, n - 1, n, rc,
				 short_n);
			die(why);
		}
	}
	unsigned got = cap;
	rc = call(arg, &got, buf);
	if (rc != NVML_SUCCESS || got != n) {
		snprintf(why, sizeof(why), "%s full: rc=%d count=%u, counted %u", name, rc, got, n);
		die(why);
	}
	struct rec r[64];
	for (unsigned i = 0; i < got && i < 64; i++)
		r[i] = get(buf, i);
	print_list(name, r, got < 64 ? got : 64);
	free(buf);
}

struct versioned {
	list_fn f;
	nvmlDevice_t dev;
};

static nvmlReturn_t call_versioned(void *arg, unsigned *count, void *buf)
{
	struct versioned *v = arg;
	return v->f(v->dev, count, buf);
}

static struct rec get_v1(const void *buf, unsigned i)
{
	const nvmlProcessInfo_v1_t *r = (const nvmlProcessInfo_v1_t *)buf + i;
	return (struct rec){r->pid, r->usedGpuMemory};
}

static struct rec get_v2(const void *buf, unsigned i)
{
	const nvmlProcessInfo_v2_t *r = (const nvmlProcessInfo_v2_t *)buf + i;
	if (r->gpuInstanceId != ~0u || r->computeInstanceId != ~0u)
		die("a v2 record lost its (non-MIG) instance ids");
	return (struct rec){r->pid, r->usedGpuMemory};
}

struct detail {
	nvmlReturn_t (*f)(nvmlDevice_t, nvmlProcessDetailList_v1_t *);
	nvmlDevice_t dev;
	unsigned mode;
};

static nvmlReturn_t call_detail(void *arg, unsigned *count, void *buf)
{
	struct detail *d = arg;
	nvmlProcessDetailList_v1_t l = {nvmlProcessDetailList_v1, d->mode, *count, buf};
	nvmlReturn_t rc = d->f(d->dev, &l);
	*count = l.numProcArrayEntries;
	return rc;
}

static struct rec get_detail(const void *buf, unsigned i)
{
	const nvmlProcessDetail_v1_t *r = (const nvmlProcessDetail_v1_t *)buf + i;
	return (struct rec){r->pid, r->usedGpuMemory};
}

static int cmp_unsigned(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
	return x < y ? -1 : x > y;
}

/* The pids of several rounds of samples (up to 8 s for NVML to have some). */
static void util(const char *name, void *h, nvmlDevice_t dev, int info)
{
	nvmlReturn_t (*pu)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *, unsigned long long) =
		info ? NULL : sym(h, "nvmlDeviceGetProcessUtilization");
	nvmlReturn_t (*pi)(nvmlDevice_t, nvmlProcessesUtilizationInfo_v1_t *) =
		info ? sym(h, "nvmlDeviceGetProcessesUtilizationInfo") : NULL;
	unsigned seen[256], nseen = 0;
	int rounds = 0;
	for (int tries = 0; tries < 40 && rounds < 5; tries++) {
		sleep_ms(200);
		unsigned pids[64], n = 64;
		nvmlReturn_t rc;
		if (!info) {
			nvmlProcessUtilizationSample_t s[64];
			rc = pu(dev, s, &n, 0);
			for (unsigned i = 0; rc == NVML_SUCCESS && i < n; i++)
				pids[i] = s[i].pid;
		} else {
			nvmlProcessUtilizationInfo_v1_t s[64];
			nvmlProcessesUtilizationInfo_v1_t u = {nvmlProcessesUtilizationInfo_v1, 64, 0, s};
			rc = pi(dev, &u);
			n = u.processSamplesCount;
			for (unsigned i = 0; rc == NVML_SUCCESS && i < n; i++)
				pids[i] = s[i].pid;
		}
		if (rc == NVML_ERROR_NOT_FOUND)
			continue;
		if (rc != NVML_SUCCESS || n > 64)
			die("utilisation samples: unexpected return");
		rounds++;
		for (unsigned i = 0; i < n; i++) {
			unsigned k = 0;
			while (k < nseen && seen[k] != pids[i])
				k++;
			if (k == nseen && nseen < 256)
				seen[nseen++] = pids[i];
		}
	}
	qsort(seen, nseen, sizeof(*seen), cmp_unsigned);
	printf("util %s ", name);
	for (unsigned i = 0; i < nseen; i++)
		printf("%s%u", i ? "," : "", seen[i]);
	printf("%s\n", nseen ? "" : "-");
}

static void acct_list(void *h, nvmlDevice_t dev)
{
	nvmlReturn_t (*pids)(nvmlDevice_t, unsigned *, unsigned *) = sym(h, "nvmlDeviceGetAccountingPids");
	nvmlReturn_t (*stats)(nvmlDevice_t, unsigned, nvmlAccountingStats_t *) = sym(h, "nvmlDeviceGetAccountingStats");
	unsigned n = 0, v[256];
	nvmlReturn_t rc = pids(dev, &n, NULL);
	if ((rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE) || (rc == NVML_SUCCESS && n))
		die("accounting pids: the count");
	if (n > 256)
		die("accounting pids: too many");
	if (n && pids(dev, &n, v))
		die("accounting pids");
	qsort(v, n, sizeof(v[0]), cmp_unsigned);
	printf("acct");
	for (unsigned i = 0; i < n; i++) {
		nvmlAccountingStats_t st;
		rc = stats(dev, v[i], &st);
		if (rc)
			printf(" %u:rc=%d", v[i], rc);
		else
			printf(" %u:%llu", v[i], st.maxMemoryUsage);
	}
	printf("%s\n", n ? "" : " -");
	const char *probe = getenv("SMI_ACCT_PROBE");
	if (probe) {
		nvmlAccountingStats_t st;
		printf("acctprobe %d\n", stats(dev, (unsigned)atol(probe), &st));
	}
}

static int smi(unsigned index)
{
	alarm(60);
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!h)
		die("dlopen libnvidia-ml.so.1");
	nvmlReturn_t (*init)(void) = sym(h, "nvmlInit_v2");
	nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) = sym(h, "nvmlDeviceGetHandleByIndex_v2");
	nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *) = sym(h, "nvmlDeviceGetMemoryInfo");
	nvmlReturn_t (*pname)(unsigned, char *, unsigned) = sym(h, "nvmlSystemGetProcessName");
	nvmlDevice_t dev;
	nvmlMemory_t m;
	if (init() || get(index, &dev) || mem(dev, &m))
		die("nvml setup");
	printf("used %llu\n", m.used);
	static const char *const kinds[] = {"Compute", "Graphics", "MPSCompute"};
	for (int k = 0; k < 3; k++)
		for (int v = 1; v <= 3; v++) {
			char fn[128];
			snprintf(fn, sizeof(fn), "nvmlDeviceGet%sRunningProcesses%s", kinds[k],
				 v == 1 ? "" : v == 2 ? "_v2" : "_v3");
			struct versioned a = {(list_fn)sym(h, fn), dev};
			one_list(fn + 13, call_versioned, &a, v == 1 ? sizeof(nvmlProcessInfo_v1_t)
								     : sizeof(nvmlProcessInfo_v2_t),
				 v == 1 ? get_v1 : get_v2);
		}
	for (unsigned mode = 0; mode <= NVML_PROCESS_MODE_ALL; mode++) {
		char nm[64];
		struct detail d = {sym(h, "nvmlDeviceGetRunningProcessDetailList"), dev, mode};
		snprintf(nm, sizeof(nm), "DetailList/mode%u", mode);
		one_list(nm, call_detail, &d, sizeof(nvmlProcessDetail_v1_t), get_detail);
	}
	/* Names of what the v3 compute list shows. */
	nvmlProcessInfo_t p[64];
	unsigned n = 64;
	nvmlReturn_t (*v3)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *) =
		sym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (v3(dev, &n, p))
		die("v3 list");
	for (unsigned i = 0; i < n; i++) {
		char name[256];
		nvmlReturn_t rc = pname(p[i].pid, name, sizeof(name));
		if (rc)
			printf("name %u rc=%d\n", p[i].pid, rc);
		else
			printf("name %u %s\n", p[i].pid, name);
	}
	if (getenv("SMI_ACCT"))
		acct_list(h, dev);
	if (getenv("SMI_UTIL")) {
		util("ProcessUtilization", h, dev, 0);
		util("ProcessesUtilizationInfo", h, dev, 1);
	}
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 6 && !strcmp(argv[1], "worker"))
		return worker(atoi(argv[2]), strtoull(argv[3], NULL, 10), argv[4], argv[5],
			      argc > 6 && !strcmp(argv[6], "launch"));
	if (argc == 3 && !strcmp(argv[1], "smi"))
		return smi((unsigned)atoi(argv[2]));
	fprintf(stderr, "usage: nvmlprocs worker DEV BYTES PIDFILE ENDFILE [launch] | nvmlprocs smi DEV\n");
	return 2;
}
