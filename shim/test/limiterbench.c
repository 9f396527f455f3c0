/*
 * make bench, SM limiter part: each mix runs in a container of its own (a
 * process with the shim preloaded, its own limits file and region, one
 * simulated 132-SM GPU shared through the fake driver's state) at limits 30,
 * 50 and 70, and prints one line per container:
 *
 *   BENCHSM <mix> <limit> <share_pct> <longest_wait_ms> <period_ms> <longest_less_runq_ms>
 *
 * share_pct: the container's GPU time over the measuring window, from the
 * fake driver's device-time accounting (not from the launcher's wall time);
 * longest_wait_ms: the longest single launch call of the whole run, i.e. the
 * longest the limiter held a launch; period_ms: the limiter's control period;
 * longest_less_runq_ms: the longest launch call less the time its thread
 * spent runnable but not running during it (the kernel's run_delay in
 * /proc/thread-self/schedstat): what is left when the host's scheduling
 * delay is taken out, the limiter's own part of the wait.
 * Targets: share within 5 points of the limit, longest wait at most twice
 * the period.
 *
 * Mixes (kernel lengths per wave of 132 blocks, one per process, set through
 * the fake's fakecudaSetKernelUs hook):
 *   tiny      1-block kernels of 50 us, flat out, never synchronised;
 *   training  iterations of 120 kernels of 2-20 waves at 50 us a wave and an
 *             optimiser kernel of 1 ms, synchronised each iteration;
 *   vllm      decode steps as a CUDA graph captured once (120 kernels of 1-8
 *             waves at 15 us, 7.9 ms), launched and synchronised each step (the
 *             tokens go back to the host), and an eager prefill burst every 20
 *             steps (24 kernels of 133 waves, 2 ms each);
 *   vllm-sat  vllm with two steps in flight (two threads, each with its own
 *             stream and decode graph);
 *   contend   two containers at once: vllm-sat at the limit, training at
 *             100 - limit;
 *   offered   vllm-sat and training alone at cores=100: the load they offer.
 *
 * Usage: limiterbench BUILD_DIR [SECONDS] (SECONDS measured after 3 s of
 * warm-up, long enough for the rate to reach 15 us waves from its first guess
 * of 1 ms; default 3; LIMITERBENCH_WARMUP=S sets the warm-up, 0 measures the
 * climb itself). The child mode "limiterbench --load MIX SECONDS WARMUP" is
 * what each container runs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);

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
static pthread_mutex_t longest_mu = PTHREAD_MUTEX_INITIALIZER;
static double longest;     /* seconds: the longest single launch call of any thread */
static double longest_own; /* the longest call less the runqueue delay during it */
static volatile int stop;

/* Seconds this thread has spent runnable but not running (schedstat's second
 * field); 0 when the kernel does not keep it. */
static double run_delay(void)
{
	static __thread int fd = -2;
	char buf[128];
	if (fd == -2)
		fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
	unsigned long long run, wait;
	if (n <= 0)
		return 0;
	buf[n] = 0;
	return sscanf(buf, "%llu %llu", &run, &wait) == 2 ? (double)wait / 1e9 : 0;
}

struct call {
	double t0, q0;
};

static struct call call_begin(void)
{
	return (struct call){now_s(), run_delay()};
}

static void call_end(struct call c)
{
	double d = now_s() - c.t0, own = d - (run_delay() - c.q0);
	pthread_mutex_lock(&longest_mu);
	if (d > longest)
		longest = d;
	if (own > longest_own)
		longest_own = own;
	pthread_mutex_unlock(&longest_mu);
}

static void launch(unsigned grid, CUstream s)
{
	struct call c = call_begin();
	CUresult rc = cuLaunchKernel(NULL, grid, 1, 1, 128, 1, 1, 0, s, NULL, NULL);
	call_end(c);
	if (rc != CUDA_SUCCESS)
		die("cuLaunchKernel", rc);
}

static void launch_graph(CUgraphExec g, CUstream s)
{
	struct call c = call_begin();
	CUresult rc = cuGraphLaunch(g, s);
	call_end(c);
	if (rc != CUDA_SUCCESS)
		die("cuGraphLaunch", rc);
}

static void sync_all(void)
{
	CUresult rc = cuCtxSynchronize();
	if (rc != CUDA_SUCCESS)
		die("cuCtxSynchronize", rc);
}

/* vLLM's decode step as it runs it: one CUDA graph captured once, 120 kernels of 1 to 8 waves
 * (7.9 ms of GPU time at 15 us a wave). */
static CUgraphExec decode_graph(CUstream s)
{
	CUgraph g;
	CUgraphExec e;
	CUresult rc;
	if ((rc = cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL)))
		die("cuStreamBeginCapture_v2", rc);
	for (unsigned k = 0; k < 120; k++)
		launch(1 + (k % 8) * 132, s); /* recorded, not run: the limiter lets it through */
	if ((rc = cuStreamEndCapture(s, &g)) || (rc = cuGraphInstantiateWithFlags(&e, g, 0)))
		die("capturing the decode graph", rc);
	return e;
}

/* One thread of a mix, until stop: steps of a few milliseconds of work at most. */
static void run_mix(const char *mix)
{
	CUstream s;
	CUresult rc = cuStreamCreate(&s, 0);
	if (rc != CUDA_SUCCESS)
		die("cuStreamCreate", rc);
	CUgraphExec decode = strncmp(mix, "vllm", 4) ? NULL : decode_graph(s);
	for (unsigned n = 0; !stop; n++) {
		if (!strcmp(mix, "tiny")) {
			for (int k = 0; k < 64; k++)
				launch(1, s);
		} else if (!strcmp(mix, "training")) {
			for (int k = 0; k < 120; k++)
				launch(132 * (2 + (n * 7 + (unsigned)k * 5) % 19), s); /* 2..20 waves of 50 us */
			launch(132 * 20, s); /* the optimiser: 1 ms */
			sync_all();
		} else if (!strncmp(mix, "vllm", 4)) {
			if (n % 20 == 0) {
				for (int k = 0; k < 24; k++)
					launch(132 * 133, s); /* prefill: 133 waves of 15 us, 2 ms each, eager */
				sync_all();
			}
			launch_graph(decode, s); /* decode: the tokens go back to the host */
			sync_all();
		} else {
			fprintf(stderr, "limiterbench: unknown mix %s\n", mix);
			exit(2);
		}
	}
}

static CUcontext ctx;

static void *thread_main(void *mix)
{
	CUresult rc = cuCtxSetCurrent(ctx); /* a new thread has no current context */
	if (rc != CUDA_SUCCESS)
		die("cuCtxSetCurrent", rc);
	run_mix(mix);
	return NULL;
}

/* The threads of a mix: "vllm-sat" is vllm with two steps in flight at once, each on a stream and
 * decode graph of its own, as with overlapped scheduling (the GPU is not left idle while the host
 * handles a step's tokens). */
static int load(const char *mix, double seconds, double warm)
{
	CUdevice dev;
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
	/* Microseconds a wave, one length per mix (the fake's setting is per process). */
	set_us(!strcmp(mix, "training") ? 50 : !strncmp(mix, "vllm", 4) ? 15 : 50);
	int nthreads = !strcmp(mix, "vllm-sat") ? 2 : 1;
	const char *base = !strcmp(mix, "vllm-sat") ? "vllm" : mix;
	pthread_t t[2];
	for (int i = 0; i < nthreads; i++)
		if (pthread_create(&t[i], NULL, thread_main, (void *)base) != 0)
			die("pthread_create", 0);
	long long w0 = 0, w1 = 0;
	usleep((useconds_t)(warm * 1e6));
	long long b0 = busy_fn(getpid(), 0, &w0);
	usleep((useconds_t)(seconds * 1e6));
	long long b1 = busy_fn(getpid(), 0, &w1);
	stop = 1;
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	sync_all();
	pthread_mutex_lock(&longest_mu);
	printf("%.1f %.1f %.1f\n", (double)(b1 - b0) / (double)(w1 - w0) * 100.0, longest * 1000.0,
	       longest_own * 1000.0);
	pthread_mutex_unlock(&longest_mu);
	return 0;
}

/* ---- the driver: containers on one fake GPU --------------------------------------------------- */

static char self[4096], build[4096], root[4096];
static double seconds = 3.0;
static const char *warmup = "3"; /* LIMITERBENCH_WARMUP: 0 measures the climb from the first guess */

struct container {
	const char *mix;
	int limit; /* its cores */
	int label; /* the limit its line names */
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
		execl(self, self, "--load", c->mix, secs, warmup, (char *)NULL);
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
	double share, wait_ms, own_ms;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || sscanf(buf, "%lf %lf %lf", &share, &wait_ms, &own_ms) != 3) {
		fprintf(stderr, "limiterbench: %s at %d failed\n", c->mix, c->limit);
		exit(1);
	}
	if (name) {
		printf("BENCHSM %s %d %.1f %.1f %d %.1f\n", name, c->label, share, wait_ms, PERIOD_MS, own_ms);
		fflush(stdout);
	}
}

/* A fresh fake GPU for the next run. */
static int new_state(char *state, size_t n, int idx)
{
	snprintf(state, n, "%s/state%d", root, idx);
	if (mkdir(state, 0755) != 0) {
		perror("limiterbench: mkdir");
		return -1;
	}
	return 0;
}

/* Two containers at once on a fresh GPU: a at limit, b at 100 - limit. */
static int contend(int *idx, int limit, const char *ma, const char *la, const char *mb, const char *lb)
{
	char state[4200];
	if (new_state(state, sizeof(state), *idx) != 0)
		return 1;
	struct container a = {.mix = ma, .limit = limit, .label = limit};
	struct container b = {.mix = mb, .limit = 100 - limit, .label = 100 - limit};
	start(&a, (*idx)++, state);
	start(&b, (*idx)++, state);
	finish(&a, la);
	finish(&b, lb);
	return 0;
}

/* One container alone on a fresh GPU. */
static int alone(int *idx, const char *mix, int limit, const char *label)
{
	char state[4200];
	if (new_state(state, sizeof(state), *idx) != 0)
		return 1;
	struct container c = {.mix = mix, .limit = limit, .label = limit};
	start(&c, (*idx)++, state);
	finish(&c, label);
	return 0;
}

static int bench(void)
{
	static const char *mixes[] = {"tiny", "training", "vllm"};
	static const int limits[] = {30, 50, 70};
	int idx = 0;
	/* What the contending mixes run when the GPU is theirs (cores=100): their offered load,
	 * above every limit they are held to below, so a share under the limit there is the
	 * limiter's doing, not the workload's. */
	if (alone(&idx, "vllm-sat", 100, "offered-vllm") || alone(&idx, "training", 100, "offered-training"))
		return 1;
	for (unsigned l = 0; l < sizeof(limits) / sizeof(limits[0]); l++) {
		for (unsigned m = 0; m < sizeof(mixes) / sizeof(mixes[0]); m++)
			if (alone(&idx, mixes[m], limits[l], mixes[m]))
				return 1;
		/* vLLM-like at high load (two steps in flight) against training. */
		if (contend(&idx, limits[l], "vllm-sat", "contend-vllm", "training", "contend-training"))
			return 1;
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
	if (getenv("LIMITERBENCH_WARMUP"))
		warmup = getenv("LIMITERBENCH_WARMUP");
	if (!realpath("/proc/self/exe", self) || !realpath(argv[1], build)) {
		perror("limiterbench: realpath");
		return 1;
	}
	snprintf(root, sizeof(root), "/tmp/limiterbench.XXXXXX");
	if (!mkdtemp(root)) {
		perror("limiterbench: mkdtemp");
		return 1;
	}
	printf("# BENCHSM mix limit share_pct longest_wait_ms period_ms longest_less_runq_ms (fake GPU, 132 SMs)\n");
	fflush(stdout);
	int rc = bench();
	char cmd[4300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "limiterbench: could not remove %s\n", root);
	return rc;
}
