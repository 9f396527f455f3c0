/*
 * make bench: the shim's cost against the number of processes in one
 * container. The container's ledger is the locks on its one limits file
 * (src/ledger.c), which every process of the container shares, so what a
 * process pays there can grow with the others. One machine-readable line per
 * measure, as test/bench.c prints them:
 *
 *   BENCH <name> <base_ns> <measured_ns> <ratio>
 *
 *   grant_<N>  N = 8, 64, 512: one grant, a 1 MiB cuMemAlloc_v2 by a process
 *              that holds no lease (its previous one went back after its
 *              free, by its keeper: the granter waits RETURN_MS after each
 *              free), so the ledger takes a new stretch of the pool; ns, the
 *              median of a round. Base: the process alone in its container;
 *              measured: with N - 1 other processes of its container idle,
 *              each holding 2 MiB. Both measuring processes are alive at
 *              once on the one fake GPU (the same fake driver, the same
 *              processes on it), their rounds alternating; the fastest round
 *              of each side is kept.
 *   idle_<N>   N = 8, 64, 256 processes of one container, each holding 2 MiB
 *              and doing nothing: the CPU one of them uses meanwhile (every
 *              thread: the shim's keeper too), ns per second, the mean over
 *              the processes in a window of IDLE_S seconds after they have
 *              settled; of IDLE_WINDOWS windows one after the other, the
 *              one with the lower mean.
 *              Base: a budget of 1,000,000 (1 ms of CPU a second). The
 *              human lines add the same measure of 8 processes without the
 *              shim: what the samples themselves cost (each wakes the
 *              process to read its CPU clock).
 *
 * SCALEBENCH_ONLY=grant (or idle) runs that measure alone, for profiling;
 * SCALEBENCH_PROCS=N with it, at N processes only.
 *
 * Every process runs with the shim preloaded, on the fake driver, NVML where
 * the loader finds it and the region on tmpfs, as test/bench.c's init_512.
 * A failed measure (a process that does not start, allocate or answer)
 * exits 1; the figures themselves are never judged here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define UUID "GPU-11111111-2222-3333-4444-555555555555"
#define MAXPROC 512
#define GRANTS 5      /* grants a round, the median kept */
#define ROUNDS 12     /* rounds a side */
/* After each grant's free, the granter waits this long: a free keeps what it
 * freed leased, and only the keeper (within a 0.1 s period) gives it back, so
 * that the next allocation is a grant again. */
#define RETURN_MS 250
#define SETTLE_MS 600 /* after the holders start: their keepers give unused lease back, then park */
#define IDLE_SETTLE_MS 1500
#define IDLE_S 2
#define IDLE_WINDOWS 2
#define BUSY_NS 100000 /* a process using more than this a second is counted as busy (human line) */
#define ANSWER_S 180 /* a child that says nothing for this long has failed */

static void sleep_ms(int ms);

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* What a child writes on the shared pipe: whole (less than PIPE_BUF). */
struct rec {
	int64_t who; /* the child's index */
	int64_t a;   /* READY, FAILED, or the answer's first figure */
	int64_t b;
};
#define READY ((int64_t)-2)
#define FAILED ((int64_t)-1)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *sym(void *h, const char *n)
{
	void *p = dlsym(h, n);
	if (!p) {
		fprintf(stderr, "scalebench: %s: %s\n", n, dlerror());
		exit(1);
	}
	return p;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* ---- the children ---------------------------------------------------------------------- */

static int say(int out, int64_t who, int64_t a, int64_t b)
{
	struct rec r = {who, a, b};
	return write(out, &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : -1;
}

/*
 * scalebench --child BUILD hold|grant WHO CMD_FD OUT_FD: with the shim
 * preloaded, makes a context; a holder then allocates 1 MiB twice and keeps
 * both (the second grant takes a chunk its keeper later gives back), a
 * granter makes one grant and gives it back (its slot taken, the shim
 * started). Says READY, then answers each byte read from CMD_FD: 'c' its
 * CPU and clock, 'g' a round of grants (the median and the mean, ns). Frees
 * what it holds and exits when CMD_FD closes.
 */
static int child(char **argv)
{
	const char *b = argv[2];
	int grant = !strcmp(argv[3], "grant");
	int64_t who = atoll(argv[4]);
	int cmd = atoi(argv[5]), out = atoi(argv[6]);
	char path[4096];
	snprintf(path, sizeof(path), "%s/fake/libcuda.so.1", b);
	if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
		fprintf(stderr, "scalebench child: %s\n", dlerror());
		say(out, who, FAILED, 0);
		return 1;
	}
	/* The global scope: the preloaded shim's wrappers first. */
	CUresult (*init)(unsigned) = sym(RTLD_DEFAULT, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = sym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = sym(RTLD_DEFAULT, "cuCtxSetCurrent");
	alloc_fn alloc = sym(RTLD_DEFAULT, "cuMemAlloc_v2");
	free_fn mfree = sym(RTLD_DEFAULT, "cuMemFree_v2");
	CUcontext ctx;
	CUdeviceptr held[2] = {0, 0}, p;
	int ok = init(0) == CUDA_SUCCESS && retain(&ctx, 0) == CUDA_SUCCESS && setcur(ctx) == CUDA_SUCCESS;
	if (ok && grant)
		ok = alloc(&p, 1 << 20) == CUDA_SUCCESS && mfree(p) == CUDA_SUCCESS;
	else if (ok)
		ok = alloc(&held[0], 1 << 20) == CUDA_SUCCESS && alloc(&held[1], 1 << 20) == CUDA_SUCCESS;
	if (!ok) {
		fprintf(stderr, "scalebench child: context or allocation failed\n");
		say(out, who, FAILED, 0);
		return 1;
	}
	if (say(out, who, READY, 0) != 0)
		return 1;
	for (;;) {
		char c;
		ssize_t r = read(cmd, &c, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (c == 'c') {
			if (say(out, who, (int64_t)cpu_now(), (int64_t)now()) != 0)
				return 1;
		} else if (c == 'g') {
			double t[GRANTS], sum = 0;
			for (int i = 0; i < GRANTS; i++) {
				double t0 = now();
				if (alloc(&p, 1 << 20) != CUDA_SUCCESS) {
					fprintf(stderr, "scalebench child: a grant failed\n");
					say(out, who, FAILED, 0);
					return 1;
				}
				t[i] = now() - t0;
				sum += t[i];
				if (mfree(p) != CUDA_SUCCESS) {
					fprintf(stderr, "scalebench child: a free failed\n");
					say(out, who, FAILED, 0);
					return 1;
				}
				sleep_ms(RETURN_MS);
			}
			qsort(t, GRANTS, sizeof(t[0]), cmp_d);
			if (say(out, who, (int64_t)t[GRANTS / 2], (int64_t)(sum / GRANTS)) != 0)
				return 1;
		}
	}
	for (int i = 0; i < 2; i++)
		if (held[i] && mfree(held[i]) != CUDA_SUCCESS)
			return 1;
	return 0;
}

/* ---- the parent ------------------------------------------------------------------------ */

static char self[4096];
static const char *build;
static int out_r, out_w; /* the children's shared pipe */
static int preload = 1;  /* children start with the shim preloaded (0: the control, without) */

struct kid {
	pid_t pid;
	int cmd; /* its command pipe's write end */
};

struct container {
	char limits[4200];
	char region[4200];
	char ledger[4200];
};

/* Starts child who of container c: a holder, or a granter when grant. */
static struct kid spawn(const struct container *c, int grant, int who)
{
	int cmd[2];
	if (pipe2(cmd, O_CLOEXEC)) {
		perror("scalebench: pipe");
		exit(1);
	}
	char lib[4200];
	snprintf(lib, sizeof(lib), "%s/libvgpu-shim.so", build);
	pid_t pid = fork();
	if (pid < 0) {
		perror("scalebench: fork");
		exit(1);
	}
	if (pid == 0) {
		/* Copies without close-on-exec: every other pipe end closes at exec. */
		int in = dup(cmd[0]), o = dup(out_w);
		char sw[24], si[16], so[16];
		snprintf(sw, sizeof(sw), "%d", who);
		snprintf(si, sizeof(si), "%d", in);
		snprintf(so, sizeof(so), "%d", o);
		setenv("NRI_VGPU_LIMITS", c->limits, 1);
		setenv("NRI_VGPU_REGION_DIR", c->region, 1);
		setenv("NRI_VGPU_LEDGER_DIR", c->ledger, 1);
		if (preload)
			setenv("LD_PRELOAD", lib, 1);
		execl(self, self, "--child", build, grant ? "grant" : "hold", sw, si, so, (char *)NULL);
		_exit(127);
	}
	close(cmd[0]);
	return (struct kid){pid, cmd[1]};
}

/* The next record from a child; exits on silence, a failure, or a lost pipe. */
static struct rec next_rec(void)
{
	struct pollfd pf = {out_r, POLLIN, 0};
	for (;;) {
		int r = poll(&pf, 1, ANSWER_S * 1000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "scalebench: no child answered in %d s\n", ANSWER_S);
			exit(1);
		}
		struct rec x;
		ssize_t n = read(out_r, &x, sizeof(x));
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(x)) {
			fprintf(stderr, "scalebench: a child's record was cut (%zd bytes)\n", n);
			exit(1);
		}
		if (x.a == FAILED) {
			fprintf(stderr, "scalebench: child %lld failed\n", (long long)x.who);
			exit(1);
		}
		return x;
	}
}

static void await_ready(int n)
{
	for (int i = 0; i < n; i++)
		if (next_rec().a != READY) {
			fprintf(stderr, "scalebench: an answer before every child was ready\n");
			exit(1);
		}
}

static void send_cmd(const struct kid *k, char c)
{
	if (write(k->cmd, &c, 1) != 1) {
		perror("scalebench: command");
		exit(1);
	}
}

/* Closes every command pipe (the children free and exit) and checks how they ended. */
static void end_all(struct kid *k, int n)
{
	for (int i = 0; i < n; i++)
		close(k[i].cmd);
	int bad = 0;
	for (int i = 0; i < n; i++) {
		int st;
		if (waitpid(k[i].pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad++;
	}
	if (bad) {
		fprintf(stderr, "scalebench: %d of %d processes did not end well\n", bad, n);
		exit(1);
	}
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void run(const char *fmt, const char *arg)
{
	char cmd[8600];
	snprintf(cmd, sizeof(cmd), fmt, arg, arg);
	if (system(cmd) != 0) {
		fprintf(stderr, "scalebench: %s failed\n", cmd);
		exit(1);
	}
}

/* A fresh fake machine (no processes left on it) and fresh regions. */
static void fresh(const char *state, const struct container *c, int nc)
{
	run("rm -rf %s && mkdir -p %s", state);
	for (int i = 0; i < nc; i++)
		run("rm -rf %s && mkdir -p %s", c[i].region);
}

static void make_container(const char *dir, const char *name, struct container *c)
{
	snprintf(c->limits, sizeof(c->limits), "%s/%s.limits", dir, name);
	snprintf(c->region, sizeof(c->region), "%s/%s.region", dir, name);
	snprintf(c->ledger, sizeof(c->ledger), "%s/%s.ledger", dir, name);
	/* The ledger's shards, as the host makes them (BENCH_SHARDS=0: none, the
	 * ledger on the limits file alone). */
	const char *ks = getenv("BENCH_SHARDS");
	int k = ks ? atoi(ks) : 64;
	if (k > 0) {
		char cmd[8600];
		snprintf(cmd, sizeof(cmd), "mkdir -p %s && cd %s && touch $(seq 0 %d)", c->ledger, c->ledger, k - 1);
		if (system(cmd) != 0) {
			fprintf(stderr, "scalebench: %s failed\n", cmd);
			exit(1);
		}
	}
	FILE *f = fopen(c->limits, "w");
	if (!f) {
		perror(c->limits);
		exit(1);
	}
	fprintf(f, "version=1\ngpu.0.uuid=" UUID "\ngpu.0.memory=8589934592\ngpu.0.cores=100\n");
	if (k > 0)
		fprintf(f, "ledger.shards=%d\n", k);
	if (fclose(f) != 0) {
		perror(c->limits);
		exit(1);
	}
}

/*
 * grant_<n>: container 0 holds the lone granter, container 1 n - 1 holders
 * and its granter. Fills the fastest round's median of each side (ns) and
 * the mean over all rounds' means.
 */
static void grants(int n, const char *state, struct container *c, double *base, double *meas, double *mean0,
		   double *mean1)
{
	static struct kid k[MAXPROC + 1];
	fresh(state, c, 2);
	int nk = 0;
	for (int i = 0; i < n - 1; i++, nk++)
		k[nk] = spawn(&c[1], 0, nk);
	await_ready(nk);
	struct kid *g0 = &k[nk], *g1 = &k[nk + 1];
	*g0 = spawn(&c[0], 1, nk);
	*g1 = spawn(&c[1], 1, nk + 1);
	nk += 2;
	await_ready(2);
	sleep_ms(SETTLE_MS);
	double best[2] = {1e18, 1e18}, sum[2] = {0, 0};
	for (int r = 0; r < ROUNDS; r++) {
		for (int j = 0; j < 2; j++) {
			int side = (r & 1) ? 1 - j : j; /* which goes first alternates too */
			send_cmd(side ? g1 : g0, 'g');
			struct rec x = next_rec();
			if (x.who != (side ? nk - 1 : nk - 2) || x.a <= 0 || x.b <= 0) {
				fprintf(stderr, "scalebench: a grant round's answer is malformed (%lld: %lld %lld)\n",
					(long long)x.who, (long long)x.a, (long long)x.b);
				exit(1);
			}
			if (x.a < best[side])
				best[side] = (double)x.a;
			sum[side] += (double)x.b;
		}
	}
	end_all(k, nk);
	*base = best[0];
	*meas = best[1];
	*mean0 = sum[0] / ROUNDS;
	*mean1 = sum[1] / ROUNDS;
}

/* Asks every holder for its CPU and clock: cpu[i], at[i]. */
static void sample(struct kid *k, int n, double *cpu, double *at)
{
	for (int i = 0; i < n; i++)
		send_cmd(&k[i], 'c');
	for (int i = 0; i < n; i++) {
		struct rec x = next_rec();
		if (x.who < 0 || x.who >= n || x.a < 0 || x.b <= 0) {
			fprintf(stderr, "scalebench: a CPU answer is malformed (%lld: %lld %lld)\n", (long long)x.who,
				(long long)x.a, (long long)x.b);
			exit(1);
		}
		cpu[x.who] = (double)x.a;
		at[x.who] = (double)x.b;
	}
}

/*
 * idle_<n>: n holders of one container, IDLE_WINDOWS windows of IDLE_S
 * seconds one after the other; of the window with the lower mean, the mean
 * and the most CPU one process used, ns a second.
 */
static void idle(int n, const char *state, struct container *c, double *mean, double *most, int *busy)
{
	static struct kid k[MAXPROC];
	static double cpu[2][MAXPROC], at[2][MAXPROC];
	fresh(state, c, 1);
	for (int i = 0; i < n; i++)
		k[i] = spawn(c, 0, i);
	await_ready(n);
	sleep_ms(IDLE_SETTLE_MS);
	*mean = 1e18;
	sample(k, n, cpu[0], at[0]);
	for (int w = 0; w < IDLE_WINDOWS; w++) {
		double *c0 = cpu[w & 1], *t0 = at[w & 1], *c1 = cpu[!(w & 1)], *t1 = at[!(w & 1)];
		sleep_ms(IDLE_S * 1000);
		sample(k, n, c1, t1);
		double sum = 0, hi = 0;
		int over = 0;
		for (int i = 0; i < n; i++) {
			double dt = t1[i] - t0[i], rate = (c1[i] - c0[i]) / dt * 1e9;
			over += rate > BUSY_NS;
			if (dt < IDLE_S * 1e9 * 0.9 || c1[i] < c0[i]) {
				fprintf(stderr, "scalebench: process %d's window is malformed (%.0f ns, CPU %.0f -> %.0f)\n", i,
					dt, c0[i], c1[i]);
				exit(1);
			}
			sum += rate;
			if (rate > hi)
				hi = rate;
		}
		if (sum / n < *mean) {
			*mean = sum / n;
			*most = hi;
			*busy = over;
		}
	}
	end_all(k, n);
}

static char tmpdir[64];

/* The fake machine, the limits files and the regions go, whichever way the run ends. */
static void cleanup(void)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (tmpdir[0] && system(cmd) != 0)
		fprintf(stderr, "scalebench: cannot remove %s\n", tmpdir);
}

static void line(const char *name, int n, double base, double meas)
{
	printf("BENCH %s_%d %.0f %.0f %.3f\n", name, n, base, meas, meas / base);
}

int main(int argc, char **argv)
{
	if (argc > 6 && !strcmp(argv[1], "--child"))
		return child(argv);
	build = argc > 1 ? argv[1] : "build";
	ssize_t sn = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sn <= 0)
		return 1;
	self[sn] = '\0';
	char tmpl[64], path[4200], state[4200];
	struct statfs sf;
	snprintf(tmpl, sizeof(tmpl), "%s/shimscale.XXXXXX",
		 statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(tmpl))
		return 1;
	memcpy(tmpdir, tmpl, sizeof(tmpdir));
	atexit(cleanup);
	struct container c[2];
	make_container(tmpl, "base", &c[0]);
	make_container(tmpl, "measured", &c[1]);
	snprintf(state, sizeof(state), "%s/state", tmpl);
	setenv("FAKECUDA_STATE", state, 1);
	setenv("FAKECUDA_DEVICES", UUID ":16GiB:132", 1);
	setenv("FAKECUDA_KERNEL_US", "0", 1);
	snprintf(path, sizeof(path), "%s/fake", build);
	setenv("LD_LIBRARY_PATH", path, 1); /* the driver's libraries where the loader looks, NVML among them */
	unsetenv("LD_PRELOAD");
	int op[2];
	if (pipe2(op, O_CLOEXEC)) {
		perror("scalebench: pipe");
		return 1;
	}
	out_r = op[0];
	out_w = op[1];
	signal(SIGPIPE, SIG_IGN); /* a child gone: its write fails and says so */
	fflush(stdout);

	int gn[3] = {8, 64, 512}, in[3] = {8, 64, 256}, ng = 3, ni = 3, floor = 1;
	/* For profiling: SCALEBENCH_ONLY=grant|idle runs one measure, at SCALEBENCH_PROCS=N if set. */
	const char *only = getenv("SCALEBENCH_ONLY"), *procs = getenv("SCALEBENCH_PROCS");
	if (only) {
		int grant_only = !strcmp(only, "grant");
		if (!grant_only && strcmp(only, "idle")) {
			fprintf(stderr, "scalebench: SCALEBENCH_ONLY=%s: want grant or idle\n", only);
			return 1;
		}
		if (procs) {
			int n = atoi(procs);
			if (n < 1 + grant_only || n > MAXPROC) {
				fprintf(stderr, "scalebench: SCALEBENCH_PROCS=%s: want %d..%d\n", procs, 1 + grant_only, MAXPROC);
				return 1;
			}
			gn[0] = in[0] = n;
			ng = ni = 1;
		}
		if (grant_only)
			ni = floor = 0;
		else
			ng = 0;
	}
	double gb[3], gm[3], g0[3], g1[3], im[3], ih[3], fm = 0, fh = 0;
	int ib[3], fb = 0;
	for (int i = 0; i < ng; i++)
		grants(gn[i], state, c, &gb[i], &gm[i], &g0[i], &g1[i]);
	for (int i = 0; i < ni; i++)
		idle(in[i], state, &c[1], &im[i], &ih[i], &ib[i]);
	if (floor) {
		/* The measure's own floor: the same 8 processes without the shim (the samples wake them). */
		preload = 0;
		idle(8, state, &c[1], &fm, &fh, &fb);
		preload = 1;
	}

	printf("shim scale bench (fake driver; memory limit 8 GiB, cores = 100; processes hold 2 MiB each)\n");
	for (int i = 0; i < ng; i++)
		printf("  grant, %3d processes  alone %8.0f ns   with %3d others %8.0f ns   (fastest median of %d; "
		       "means %.0f / %.0f)\n",
		       gn[i], gb[i], gn[i] - 1, gm[i], ROUNDS, g0[i], g1[i]);
	for (int i = 0; i < ni; i++)
		printf("  idle, %3d processes   CPU a process %8.0f ns a second (most %.0f; %d over %d), the lower of %d "
		       "windows of %d s\n",
		       in[i], im[i], ih[i], ib[i], BUSY_NS, IDLE_WINDOWS, IDLE_S);
	if (floor)
		printf("  idle,   8 processes   CPU a process %8.0f ns a second (most %.0f; %d over %d) without the shim: the "
		       "measure's floor\n",
		       fm, fh, fb, BUSY_NS);
	for (int i = 0; i < ng; i++)
		line("grant", gn[i], gb[i], gm[i]);
	for (int i = 0; i < ni; i++)
		line("idle", in[i], 1e6, im[i]);
	return 0;
}
