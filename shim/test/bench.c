/*
 * make bench: cost of the shim on the hot paths, in one run, the fake driver
 * called directly and through the shim's wrappers. One machine-readable line
 * per measure (the interface; human lines may come before them):
 *
 *   BENCH <name> <direct_ns> <shim_ns> <ratio>
 *
 *   alloc_free_quota  cuMemAlloc_v2 + cuMemFree_v2 of 4 KiB with a memory
 *                     limit (the lease's lock-free path), ns per pair
 *   launch_cores100   cuLaunchKernel with cores = 100 (a flag test), ns per launch
 *   alloc_free_1m_cold  cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB in a process that
 *                     holds nothing else through the shim: no lease, so each
 *                     allocation is a grant and each free gives it back
 *   meminfo           cuMemGetInfo_v2, nothing held, ns per call
 *   init_512          512 processes started at once, each timing cuInit ->
 *                     primary context -> first cuMemAlloc_v2; mean ns per
 *                     process, without and with LD_PRELOAD of the shim. As on
 *                     a GPU node: NVML where the loader finds it (the shim
 *                     asks it for the host pid and the context footprint at
 *                     the first context), the region on tmpfs (/run there;
 *                     /dev/shm here when it is one)
 *
 *   init_512_nvml     the same, the shim not loaded, each process making the
 *                     NVML calls the shim's start makes itself (nvmlInit, the
 *                     process list before and after the context): what any
 *                     start that measures a new context before its first
 *                     allocation costs on this fake driver; direct as above
 *   start_own_<N>     N = 8, 64, 512 processes started at once: the CPU each
 *                     used from cuInit to its first allocation's return,
 *                     mean a process, the NVML floor's (as init_512_nvml)
 *                     against the shim's; their difference is the shim's own
 *                     start, which should not grow with N
 *
 * Each run of the shim's side starts from the empty usage region the host
 * writes for a new container (host_region).
 *
 * BENCH_INIT_ONLY=shim (or direct, or nvml) runs only that side of init_512,
 * once, for profiling; BENCH_INIT_PROCS=N (1..512) starts N processes instead.
 *
 * The machine is shared and noisy: the call measures alternate direct and
 * shim in 300 short rounds and keep the fastest round of each; the process
 * measures run each side three times (start_own at 8 and 64: five),
 * alternating, and keep the fastest mean (of CPU, for start_own). The fake
 * driver's own cost is a few hundred ns, so ratios overstate what a real
 * driver (microseconds per call) would see; the absolute ns added carry over.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "region.h"

#define UUID "GPU-11111111-2222-3333-4444-555555555555"
#define NPROC 512
#define LIMIT 8589934592ull
static int nproc = NPROC; /* processes an init run starts */

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*meminfo_fn)(size_t *, size_t *);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* CPU this process has used (every thread: the shim's keeper too), ns. */
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
		fprintf(stderr, "bench: %s: %s\n", n, dlerror());
		exit(1);
	}
	return p;
}

static double bench_launch(launch_fn f, int n)
{
	double t0 = now();
	for (int i = 0; i < n; i++)
		f(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	return (now() - t0) / n;
}

static double bench_alloc_size(alloc_fn a, free_fn f, size_t size, int n)
{
	double t0 = now();
	for (int i = 0; i < n; i++) {
		CUdeviceptr p;
		if (a(&p, size) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS) {
			fprintf(stderr, "bench: alloc/free failed\n");
			exit(1);
		}
	}
	return (now() - t0) / n;
}

static double bench_alloc(alloc_fn a, free_fn f, int n)
{
	return bench_alloc_size(a, f, 4096, n);
}

static double bench_meminfo(meminfo_fn g, int n)
{
	double t0 = now();
	for (int i = 0; i < n; i++) {
		size_t fr, tot;
		if (g(&fr, &tot) != CUDA_SUCCESS || tot == 0) {
			fprintf(stderr, "bench: cuMemGetInfo_v2 failed\n");
			exit(1);
		}
	}
	return (now() - t0) / n;
}

static void line(const char *name, double direct, double shim)
{
	printf("BENCH %s %.0f %.0f %.3f\n", name, direct, shim, shim / direct);
}

/* ---- init_512: one child process ---------------------------------------------------- */

/* The NVML calls the shim's start makes (host-pid discovery and the context
 * footprint's first measure: src/hostpid.c), made by the program itself:
 * what any start that measures a new context before its first allocation
 * pays on this fake driver, the shim's own work left out. */
typedef struct {
	nvmlReturn_t (*init)(void);
	nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
	nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
	nvmlDevice_t dev;
} nvml_calls;

static int nvml_list(nvml_calls *n)
{
	static nvmlProcessInfo_v1_t v[1024];
	unsigned count = 1024;
	return n->procs(n->dev, &count, v) == NVML_SUCCESS ? 0 : -1;
}

static int nvml_start(nvml_calls *n)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_LAZY);
	if (!h)
		return -1;
	n->init = sym(h, "nvmlInit_v2");
	n->by_uuid = sym(h, "nvmlDeviceGetHandleByUUID");
	n->procs = sym(h, "nvmlDeviceGetComputeRunningProcesses");
	if (n->init() != NVML_SUCCESS || n->by_uuid(UUID, &n->dev) != NVML_SUCCESS)
		return -1;
	return nvml_list(n); /* the list before the context */
}

/* A fresh container's usage region, as the host writes it at provision
 * (pkg/region Empty): the header and the GPU's entry, no process. Each run
 * of the shim's side starts from one, as a new container's processes do. */
static int host_region(const char *dir)
{
	static struct vgpu_region r;
	char path[4200], tmp[4200];
	memset(&r, 0, sizeof(r));
	r.hdr.magic = VGPU_REGION_MAGIC;
	r.hdr.version = VGPU_REGION_VERSION;
	r.hdr.header_size = (uint32_t)offsetof(struct vgpu_region, procs);
	r.hdr.size = sizeof(r);
	r.hdr.device_count = 1;
	r.hdr.proc_slots = VGPU_MAX_PROCS;
	snprintf(r.devices[0].uuid, sizeof(r.devices[0].uuid), "%s", UUID);
	r.devices[0].limit = LIMIT;
	r.devices[0].cores = 100;
	snprintf(path, sizeof(path), "%s/%s", dir, VGPU_REGION_FILE);
	snprintf(tmp, sizeof(tmp), "%s/.host-region", dir);
	FILE *f = fopen(tmp, "w");
	if (!f || fwrite(&r, sizeof(r), 1, f) != 1 || fclose(f) != 0 || chmod(tmp, 0666) != 0 || rename(tmp, path) != 0) {
		perror("bench: the host's usage region");
		return -1;
	}
	return 0;
}

/* bench --init-child BUILD GO_FD OUT_FD END_FD [nvml]: loads the fake driver,
 * says it is ready on OUT_FD (READY), waits for GO_FD to close, times cuInit
 * to the first allocation (with the shim's NVML calls when "nvml" is given),
 * writes the ns to OUT_FD and stays (holding its allocation) until END_FD
 * closes. */
#define READY ((int64_t)-2)
static int init_child(int argc, char **argv)
{
	int with_nvml = argc > 6 && !strcmp(argv[6], "nvml");
	nvml_calls nv;
	char path[4096];
	int go = atoi(argv[3]), out = atoi(argv[4]), end = atoi(argv[5]);
	snprintf(path, sizeof(path), "%s/fake/libcuda.so.1", argv[2]);
	if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
		fprintf(stderr, "bench child: %s\n", dlerror());
		return 1;
	}
	/* The global scope: the preloaded shim's wrappers first, when there is one. */
	CUresult (*init)(unsigned) = sym(RTLD_DEFAULT, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = sym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = sym(RTLD_DEFAULT, "cuCtxSetCurrent");
	alloc_fn alloc = sym(RTLD_DEFAULT, "cuMemAlloc_v2");
	char c;
	int64_t ready[2] = {READY, 0};
	if (write(out, ready, sizeof(ready)) != sizeof(ready))
		return 1;
	while (read(go, &c, 1) < 0 && errno == EINTR)
		;
	double t0 = now(), c0 = cpu_now();
	CUcontext ctx;
	CUdeviceptr p;
	int ok = init(0) == CUDA_SUCCESS && (!with_nvml || nvml_start(&nv) == 0) &&
		 retain(&ctx, 0) == CUDA_SUCCESS && (!with_nvml || nvml_list(&nv) == 0) &&
		 setcur(ctx) == CUDA_SUCCESS && alloc(&p, 1 << 20) == CUDA_SUCCESS;
	/* A record whatever happened: the parent waits for one from each child. */
	int64_t rec[2] = {ok ? (int64_t)(now() - t0) : -1, (int64_t)(cpu_now() - c0)};
	if (write(out, rec, sizeof(rec)) != sizeof(rec) || !ok) {
		fprintf(stderr, "bench child: initialisation or first allocation failed\n");
		return 1;
	}
	while (read(end, &c, 1) < 0 && errno == EINTR)
		;
	return 0;
}

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* CPU time (user + system) of the children waited for so far, in ns. */
static double children_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_CHILDREN, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e9 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e3;
}

static double last_cpu;        /* CPU per child of the last init_run, start-up included, ns */
static double last_window_cpu; /* CPU per child between cuInit and its first allocation's return, ns */

enum side { DIRECT, SHIM, NVML_ONLY };
static const char *side_name[] = {"direct", "shim", "nvml"};

/* Starts NPROC children (with the shim preloaded for SHIM, making the shim's
 * NVML calls themselves for NVML_ONLY), lets them go at once, returns the
 * mean of their times; fills p50/p99. */
static double init_run(const char *self, const char *b, const char *state, enum side side, int64_t *p50, int64_t *p99)
{
	double cpu0 = children_cpu();
	int go[2], out[2], end[2];
	if (pipe(go) || pipe(out) || pipe(end)) {
		perror("bench: pipe");
		exit(1);
	}
	char lib[4096], sgo[16], sout[16], send[16];
	snprintf(lib, sizeof(lib), "%s/libvgpu-shim.so", b);
	snprintf(sgo, sizeof(sgo), "%d", go[0]);
	snprintf(sout, sizeof(sout), "%d", out[1]);
	snprintf(send, sizeof(send), "%d", end[0]);
	/* A fresh fake machine for each run: no processes left over. */
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s", state, state);
	if (system(cmd) != 0)
		exit(1);
	pid_t kids[NPROC];
	fflush(stdout);
	for (int i = 0; i < nproc; i++) {
		kids[i] = fork();
		if (kids[i] < 0) {
			perror("bench: fork");
			exit(1);
		}
		if (kids[i] == 0) {
			close(go[1]);
			close(out[0]);
			close(end[1]);
			if (side == SHIM)
				setenv("LD_PRELOAD", lib, 1);
			execl(self, self, "--init-child", b, sgo, sout, send, side == NVML_ONLY ? "nvml" : "-",
			      (char *)NULL);
			_exit(127);
		}
	}
	close(go[0]);
	close(out[1]);
	close(end[0]);
	/* Let them all load first (each says so), and settle: the measure is
	 * cuInit -> first allocation, not process start. */
	int64_t t[NPROC];
	double wcpu = 0;
	int n = 0, ready = 0, gone = 0;
	while (n < nproc) {
		int64_t rec[2]; /* wall ns, CPU ns: written whole (less than PIPE_BUF) */
		ssize_t r = read(out[0], rec, sizeof(rec));
		if (r == 0 || (r < 0 && errno != EINTR))
			break;
		if (r != sizeof(rec))
			continue;
		int64_t v = rec[0];
		if (v == READY) {
			if (++ready == nproc) {
				struct timespec ts = {0, 200000000};
				nanosleep(&ts, NULL);
				close(go[1]);
				gone = 1;
			}
			continue;
		}
		wcpu += (double)rec[1];
		t[n++] = v;
	}
	if (!gone)
		close(go[1]);
	close(end[1]);
	close(out[0]);
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += t[i] < 0;
	for (int i = 0; i < nproc; i++) {
		int st;
		if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad++;
	}
	if (n < nproc || bad) {
		fprintf(stderr, "bench: init: %d of %d processes reported, %d failed\n", n, nproc, bad);
		exit(1);
	}
	qsort(t, nproc, sizeof(t[0]), cmp);
	double sum = 0;
	for (int i = 0; i < nproc; i++)
		sum += (double)t[i];
	*p50 = t[nproc / 2];
	*p99 = t[nproc * 99 / 100];
	last_cpu = (children_cpu() - cpu0) / nproc;
	last_window_cpu = wcpu / nproc;
	return sum / nproc;
}

int main(int argc, char **argv)
{
	if (argc > 5 && !strcmp(argv[1], "--init-child"))
		return init_child(argc, argv);
	const char *b = argc > 1 ? argv[1] : "build";
	char tmpl[64], path[4096], state[4200];
	struct statfs sf;
	snprintf(tmpl, sizeof(tmpl), "%s/shimbench.XXXXXX",
		 statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(tmpl))
		return 1;
	/* The ledger's shards, as the host makes them (BENCH_SHARDS=0: none, the
	 * ledger on the limits file alone). */
	const char *ks = getenv("BENCH_SHARDS");
	int nshards = ks ? atoi(ks) : 64;
	if (nshards > 0) {
		snprintf(state, sizeof(state), "mkdir -p %s/ledger && cd %s/ledger && touch $(seq 0 %d)", tmpl, tmpl,
			 nshards - 1);
		if (system(state) != 0)
			return 1;
		snprintf(path, sizeof(path), "%s/ledger", tmpl);
		setenv("NRI_VGPU_LEDGER_DIR", path, 1);
	}
	snprintf(path, sizeof(path), "%s/limits", tmpl);
	FILE *lf = fopen(path, "w");
	fprintf(lf, "version=1\ngpu.0.uuid=" UUID "\ngpu.0.memory=%llu\ngpu.0.cores=100\n", LIMIT);
	if (nshards > 0)
		fprintf(lf, "ledger.shards=%d\n", nshards);
	fclose(lf);
	setenv("NRI_VGPU_LIMITS", path, 1);
	setenv("NRI_VGPU_REGION_DIR", tmpl, 1);
	setenv("FAKECUDA_DEVICES", UUID ":16GiB:132", 1);
	setenv("FAKECUDA_KERNEL_US", "0", 1);
	/* The driver's libraries where the loader looks, NVML among them. */
	snprintf(path, sizeof(path), "%s/fake", b);
	setenv("LD_LIBRARY_PATH", path, 1);
	unsetenv("FAKECUDA_STATE");
	unsetenv("LD_PRELOAD");

	const char *only = getenv("BENCH_INIT_ONLY");
	if (only) {
		char self[4096], st[4200];
		ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (k <= 0)
			return 1;
		self[k] = '\0';
		snprintf(st, sizeof(st), "%s/state", tmpl);
		setenv("FAKECUDA_STATE", st, 1);
		const char *np = getenv("BENCH_INIT_PROCS");
		if (np) {
			nproc = atoi(np);
			if (nproc < 1 || nproc > NPROC) {
				fprintf(stderr, "bench: BENCH_INIT_PROCS=%s: want 1..%d\n", np, NPROC);
				return 1;
			}
		}
		enum side side = DIRECT;
		while (strcmp(only, side_name[side]))
			if (++side > NVML_ONLY) {
				fprintf(stderr, "bench: BENCH_INIT_ONLY=%s: want direct, shim or nvml\n", only);
				return 1;
			}
		int64_t p50, p99;
		if (side == SHIM && host_region(tmpl) != 0)
			return 1;
		double m = init_run(self, b, st, side, &p50, &p99);
		printf("init %s, %d processes: mean %.0f p50 %lld p99 %lld ns; cpu %.0f ns a process in the window, "
		       "%.0f start-up included\n",
		       only, nproc, m, (long long)p50, (long long)p99, last_window_cpu, last_cpu);
		return 0;
	}

	/* ---- the calls, in this process ---- */
	snprintf(path, sizeof(path), "%s/fake/libcuda.so.1", b);
	void *cuda = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	snprintf(path, sizeof(path), "%s/libvgpu-shim.so", b);
	void *shim = dlopen(path, RTLD_NOW);
	if (!cuda || !shim) {
		fprintf(stderr, "bench: %s\n", dlerror());
		return 1;
	}
	CUresult (*init)(unsigned) = sym(cuda, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = sym(cuda, "cuDevicePrimaryCtxRetain");
	CUresult (*setcur)(CUcontext) = sym(cuda, "cuCtxSetCurrent");
	CUcontext ctx;
	init(0);
	retain(&ctx, 0);
	setcur(ctx);

	launch_fn l_real = sym(cuda, "cuLaunchKernel"), l_shim = sym(shim, "cuLaunchKernel");
	alloc_fn a_real = sym(cuda, "cuMemAlloc_v2"), a_shim = sym(shim, "cuMemAlloc_v2");
	free_fn f_real = sym(cuda, "cuMemFree_v2"), f_shim = sym(shim, "cuMemFree_v2");
	/* Many short rounds, alternating: on a shared machine the fastest of
	 * each side comes from the quiet moments, which short rounds catch. */
	const int nl = 10000, na = 4000, rounds = 300;

	/* First, while this process holds nothing through the shim: a 1 MiB
	 * pair with no lease (each allocation a grant, each free its return:
	 * too large to keep), and cuMemGetInfo_v2. */
	meminfo_fn g_real = sym(cuda, "cuMemGetInfo_v2"), g_shim = sym(shim, "cuMemGetInfo_v2");
	const int nc = 500, ng = 2000;
	bench_alloc_size(a_shim, f_shim, 1 << 20, 100), bench_meminfo(g_shim, 1000);
	bench_alloc_size(a_real, f_real, 1 << 20, 100), bench_meminfo(g_real, 1000);
	double cr = 1e18, cs = 1e18, gr = 1e18, gs = 1e18;
	for (int r = 0; r < rounds; r++) {
		double x;
		if ((x = bench_alloc_size(a_real, f_real, 1 << 20, nc)) < cr) cr = x;
		if ((x = bench_alloc_size(a_shim, f_shim, 1 << 20, nc)) < cs) cs = x;
		if ((x = bench_meminfo(g_real, ng)) < gr) gr = x;
		if ((x = bench_meminfo(g_shim, ng)) < gs) gs = x;
	}
	/* Warm both paths (lazy init, page faults), then measure. */
	bench_launch(l_shim, 1000), bench_alloc(a_shim, f_shim, 1000);
	bench_launch(l_real, 1000), bench_alloc(a_real, f_real, 1000);
	double lr = 1e18, ls = 1e18, ar = 1e18, as = 1e18;
	for (int r = 0; r < rounds; r++) {
		double x;
		if ((x = bench_launch(l_real, nl)) < lr) lr = x;
		if ((x = bench_launch(l_shim, nl)) < ls) ls = x;
		if ((x = bench_alloc(a_real, f_real, na)) < ar) ar = x;
		if ((x = bench_alloc(a_shim, f_shim, na)) < as) as = x;
	}
	printf("shim bench (fake driver; fastest of %d rounds; memory limit 8 GiB, cores = 100)\n", rounds);
	printf("  cuLaunchKernel        direct %8.1f ns   shim %8.1f ns   %+8.1f ns\n", lr, ls, ls - lr);
	printf("  cuMemAlloc+cuMemFree  direct %8.1f ns   shim %8.1f ns   %+8.1f ns\n", ar, as, as - ar);
	printf("  the same, 1 MiB, cold direct %8.1f ns   shim %8.1f ns   %+8.1f ns   (nothing else held)\n", cr, cs,
	       cs - cr);
	printf("  cuMemGetInfo_v2       direct %8.1f ns   shim %8.1f ns   %+8.1f ns\n", gr, gs, gs - gr);

	/* ---- init_512: processes, on a fake machine of their own ---- */
	snprintf(state, sizeof(state), "%s/state", tmpl);
	setenv("FAKECUDA_STATE", state, 1);
	snprintf(path, sizeof(path), "%s/region", tmpl);
	mkdir(path, 0777);
	setenv("NRI_VGPU_REGION_DIR", path, 1);
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return 1;
	self[n] = '\0';
	double ir = 1e18, is = 1e18, rc = 1e18, sc = 1e18, rw = 1e18, sw = 1e18, in = 1e18, nw = 1e18;
	int64_t r50 = 0, r99 = 0, s50 = 0, s99 = 0;
	for (int r = 0; r < 3; r++) {
		int64_t a50, a99;
		double x = init_run(self, b, state, DIRECT, &a50, &a99);
		if (x < ir)
			ir = x, r50 = a50, r99 = a99;
		if (last_cpu < rc)
			rc = last_cpu;
		if (last_window_cpu < rw)
			rw = last_window_cpu;
		if (host_region(tmpl) != 0)
			return 1;
		x = init_run(self, b, state, SHIM, &a50, &a99);
		if (x < is)
			is = x, s50 = a50, s99 = a99;
		if (last_cpu < sc)
			sc = last_cpu;
		if (last_window_cpu < sw)
			sw = last_window_cpu;
		if ((x = init_run(self, b, state, NVML_ONLY, &a50, &a99)) < in)
			in = x;
		if (last_window_cpu < nw)
			nw = last_window_cpu;
	}
	printf("  init, %d processes    direct %8.0f ns   shim %8.0f ns   (p50 %lld / %lld, p99 %lld / %lld ns)\n",
	       NPROC, ir, is, (long long)r50, (long long)s50, (long long)r99, (long long)s99);
	/* Less at the mercy of scheduling than the means: what each process cost in CPU. */
	printf("  init, CPU a process   direct %8.0f ns   shim %8.0f ns   (cuInit to the allocation's return)\n", rw, sw);
	printf("  init, CPU a process   direct %8.0f ns   shim %8.0f ns   (start-up included)\n", rc, sc);
	printf("  init, NVML calls only direct %8.0f ns   nvml %8.0f ns   (CPU in the window %.0f ns)\n", ir, in, nw);

	/* start_own_<N>: the shim's start against the NVML floor's, CPU a
	 * process in the window, N processes at once; 512 from the runs above. */
	static const int own_n[] = {8, 64, NPROC};
	double own_nvml[3] = {1e18, 1e18, nw}, own_shim[3] = {1e18, 1e18, sw};
	for (int k = 0; k < 2; k++) {
		nproc = own_n[k];
		for (int r = 0; r < 5; r++) { /* cheap at these sizes: more rounds for quiet moments */
			int64_t a50, a99;
			if (host_region(tmpl) != 0)
				return 1;
			init_run(self, b, state, SHIM, &a50, &a99);
			if (last_window_cpu < own_shim[k])
				own_shim[k] = last_window_cpu;
			init_run(self, b, state, NVML_ONLY, &a50, &a99);
			if (last_window_cpu < own_nvml[k])
				own_nvml[k] = last_window_cpu;
		}
	}
	nproc = NPROC;
	for (int k = 0; k < 3; k++)
		printf("  start, %3d at once    nvml %8.0f ns   shim %8.0f ns   %+8.0f ns   (CPU a process in the window)\n",
		       own_n[k], own_nvml[k], own_shim[k], own_shim[k] - own_nvml[k]);

	line("alloc_free_quota", ar, as);
	line("launch_cores100", lr, ls);
	line("alloc_free_1m_cold", cr, cs);
	line("meminfo", gr, gs);
	line("init_512", ir, is);
	line("init_512_nvml", ir, in);
	for (int k = 0; k < 3; k++) {
		char name[32];
		snprintf(name, sizeof(name), "start_own_%d", own_n[k]);
		line(name, own_nvml[k], own_shim[k]);
	}
	snprintf(path, sizeof(path), "rm -rf %s", tmpl);
	if (system(path) != 0)
		return 1;
	return 0;
}
