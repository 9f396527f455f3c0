/*
 * make bench, SM limiter part: each mix runs in a container of its own (a
 * process with the shim preloaded, its own limits file and region, one
 * simulated 132-SM GPU shared through the fake driver's state) at limits 30,
 * 50 and 70, and prints one line per container:
 *
 *   BENCHSM <mix> <limit> <share_pct> <longest_wait_ms> <period_ms>
 *
 * share_pct: the container's GPU time over the measuring window, from the
 * fake driver's device-time accounting (not from the launcher's wall time);
 * longest_wait_ms: the longest single launch call of the whole run, i.e. the
 * longest the limiter held a launch; period_ms: the limiter's control period.
 * Targets: share within 5 points of the limit, longest wait at most twice
 * the period.
 *
 * Mixes (kernel lengths per wave of 132 blocks, set through the fake's
 * fakecudaSetKernelUs hook):
 *   tiny      1-block kernels of 50 us, flat out, never synchronised;
 *   training  iterations of 120 kernels of 2-20 waves at 50 us a wave and an
 *             optimiser kernel of 200 waves at 5 us, synchronised each iteration;
 *   vllm      decode steps (60 one-wave kernels of 15 us, synchronised: the
 *             token goes back to the host) with a prefill burst every 20 steps
 *             (24 kernels of 20 waves at 100 us, 2 ms each);
 *   contend   two containers at once: vllm at the limit, training at 100 - limit.
 *
 * Usage: limiterbench BUILD_DIR [SECONDS] (SECONDS measured after 1.5 s of
 * warm-up; default 3). The child mode "limiterbench --load MIX SECONDS WARMUP"
 * is what each container runs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define PERIOD_MS 50 /* the limiter's control period (src/limiter.c PERIOD_NS) */
#define UUID "GPU-11111111-2222-3333-4444-555555555555"

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
			void **, void **);

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "limiterbench: %s failed (%d)\n", what, rc);
	exit(1);
}

/* ---- one container's load -------------------------------------------------------------------- */

static long long (*busy_fn)(int, int, long long *);
static void (*set_us)(long long);
static double longest; /* seconds */

static void launch(unsigned grid, long long us)
{
	set_us(us);
	double t0 = now_s();
	CUresult rc = cuLaunchKernel(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
	double d = now_s() - t0;
	if (rc != CUDA_SUCCESS)
		die("cuLaunchKernel", rc);
	if (d > longest)
		longest = d;
}

static void sync_all(void)
{
	CUresult rc = cuCtxSynchronize();
	if (rc != CUDA_SUCCESS)
		die("cuCtxSynchronize", rc);
}

/* One step of a mix: a few milliseconds of work at most. */
static void step(const char *mix, unsigned n)
{
	if (!strcmp(mix, "tiny")) {
		for (int k = 0; k < 64; k++)
			launch(1, 50);
	} else if (!strcmp(mix, "training")) {
		for (int k = 0; k < 120; k++)
			launch(132 * (2 + (n * 7 + (unsigned)k * 5) % 19), 50); /* 2..20 waves */
		launch(132 * 200, 5);
		sync_all();
	} else if (!strcmp(mix, "vllm")) {
		if (n % 20 == 0) {
			for (int k = 0; k < 24; k++)
				launch(132 * 20, 100);
			sync_all();
		}
		for (int k = 0; k < 60; k++)
			launch(1 + (unsigned)k % 132, 15);
		sync_all();
	} else {
		fprintf(stderr, "limiterbench: unknown mix %s\n", mix);
		exit(2);
	}
}

static int load(const char *mix, double seconds, double warm)
{
	CUdevice dev;
	CUcontext ctx;
	CUresult rc;
	if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) || (rc = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
	    (rc = cuCtxSetCurrent(ctx)))
		die("context setup", rc);
	busy_fn = (long long (*)(int, int, long long *))dlsym(RTLD_DEFAULT, "fakecudaBusyNs");
	set_us = (void (*)(long long))dlsym(RTLD_DEFAULT, "fakecudaSetKernelUs");
	if (!busy_fn || !set_us) {
		fprintf(stderr, "limiterbench: not the fake driver (fakecudaBusyNs, fakecudaSetKernelUs)\n");
		return 1;
	}
	double t0 = now_s();
	long long b0 = -1, w0 = 0;
	for (unsigned n = 0; now_s() - t0 < warm + seconds; n++) {
		if (b0 < 0 && now_s() - t0 >= warm)
			b0 = busy_fn(getpid(), 0, &w0);
		step(mix, n);
	}
	long long w1 = 0, b1 = busy_fn(getpid(), 0, &w1);
	sync_all();
	printf("%.1f %.1f\n", (double)(b1 - b0) / (double)(w1 - w0) * 100.0, longest * 1000.0);
	return 0;
}

/* ---- the driver: containers on one fake GPU --------------------------------------------------- */

static char self[4096], build[4096], root[4096];
static double seconds = 3.0;

struct container {
	const char *mix;
	int limit;
	pid_t pid;
	int fd; /* the child's stdout */
};

static void start(struct container *c, int idx, const char *state)
{
	char dir[4200], path[4300], secs[32];
	snprintf(dir, sizeof(dir), "%s/c%d", root, idx);
	snprintf(path, sizeof(path), "%s/region", dir);
	if (mkdir(dir, 0755) != 0 || mkdir(path, 0755) != 0) {
		perror("limiterbench: mkdir");
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/limits", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		perror(path);
		exit(1);
	}
	fprintf(f, "version=1\ngpu.0.uuid=%s\ngpu.0.memory=4294967296\ngpu.0.cores=%d\ncores.policy=hard\n"
		   "log.level=warn\n",
		UUID, c->limit);
	fclose(f);
	int p[2];
	if (pipe(p) != 0) {
		perror("pipe");
		exit(1);
	}
	snprintf(secs, sizeof(secs), "%g", seconds);
	c->pid = fork();
	if (c->pid == 0) {
		char v[4400];
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		setenv("FAKECUDA_STATE", state, 1);
		setenv("FAKECUDA_DEVICES", UUID ":16GiB:132", 1);
		setenv("FAKECUDA_SAMPLE_MS", "166", 1); /* NVML's per-process sampling on hardware */
		setenv("NRI_VGPU_LIMITS", path, 1);
		snprintf(v, sizeof(v), "%s/region", dir);
		setenv("NRI_VGPU_REGION_DIR", v, 1);
		snprintf(v, sizeof(v), "%s/fake", build);
		setenv("LD_LIBRARY_PATH", v, 1);
		snprintf(v, sizeof(v), "%s/libvgpu-shim.so", build);
		setenv("LD_PRELOAD", v, 1);
		execl(self, self, "--load", c->mix, secs, "1.5", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	c->fd = p[0];
}

static void finish(struct container *c, const char *name)
{
	char buf[256] = {0};
	ssize_t n, got = 0;
	while (got < (ssize_t)sizeof(buf) - 1 && (n = read(c->fd, buf + got, sizeof(buf) - 1 - (size_t)got)) > 0)
		got += n;
	close(c->fd);
	int st;
	waitpid(c->pid, &st, 0);
	double share, wait_ms;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || sscanf(buf, "%lf %lf", &share, &wait_ms) != 2) {
		fprintf(stderr, "limiterbench: %s at %d failed\n", name, c->limit);
		exit(1);
	}
	printf("BENCHSM %s %d %.1f %.1f %d\n", name, c->limit, share, wait_ms, PERIOD_MS);
	fflush(stdout);
}

static int bench(void)
{
	static const char *mixes[] = {"tiny", "training", "vllm"};
	static const int limits[] = {30, 50, 70};
	int idx = 0;
	for (unsigned l = 0; l < sizeof(limits) / sizeof(limits[0]); l++) {
		for (unsigned m = 0; m < sizeof(mixes) / sizeof(mixes[0]) + 1; m++) {
			char state[4200];
			snprintf(state, sizeof(state), "%s/state%d", root, idx);
			if (mkdir(state, 0755) != 0) {
				perror("limiterbench: mkdir");
				return 1;
			}
			if (m < sizeof(mixes) / sizeof(mixes[0])) {
				struct container c = {.mix = mixes[m], .limit = limits[l]};
				start(&c, idx++, state);
				finish(&c, mixes[m]);
			} else {
				/* Two containers contend for the GPU, each held to its own limit. */
				struct container a = {.mix = "vllm", .limit = limits[l]};
				struct container b = {.mix = "training", .limit = 100 - limits[l]};
				start(&a, idx++, state);
				start(&b, idx++, state);
				finish(&a, "contend-vllm");
				finish(&b, "contend-training");
			}
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--load"))
		return load(argv[2], atof(argv[3]), atof(argv[4]));
	if (argc < 2) {
		fprintf(stderr, "usage: limiterbench BUILD_DIR [SECONDS]\n");
		return 2;
	}
	if (argc > 2)
		seconds = atof(argv[2]);
	if (!realpath("/proc/self/exe", self) || !realpath(argv[1], build)) {
		perror("limiterbench: realpath");
		return 1;
	}
	snprintf(root, sizeof(root), "/tmp/limiterbench.XXXXXX");
	if (!mkdtemp(root)) {
		perror("limiterbench: mkdtemp");
		return 1;
	}
	printf("# BENCHSM mix limit share_pct longest_wait_ms period_ms (fake GPU, 132 SMs)\n");
	fflush(stdout);
	int rc = bench();
	char cmd[4300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "limiterbench: could not remove %s\n", root);
	return rc;
}
