/*
 * make bench: cost of the shim on the hot paths, in one run — ns per
 * cuLaunchKernel (no SM limit: the cores = 100 path) and per cuMemAlloc_v2 +
 * cuMemFree_v2 pair (memory limit on: region lock + bookkeeping), called
 * straight into the fake driver and through the shim's wrappers.
 * The fake driver's own cost is a few dozen ns, so the ratios overstate what
 * a real driver (microseconds per call) would see; the absolute ns added are
 * the number that carries over.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			      CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
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

static double bench_alloc(alloc_fn a, free_fn f, int n)
{
	double t0 = now();
	for (int i = 0; i < n; i++) {
		CUdeviceptr p;
		if (a(&p, 4096) != CUDA_SUCCESS || f(p) != CUDA_SUCCESS) {
			fprintf(stderr, "bench: alloc/free failed\n");
			exit(1);
		}
	}
	return (now() - t0) / n;
}

int main(int argc, char **argv)
{
	const char *b = argc > 1 ? argv[1] : "build";
	char tmpl[] = "/tmp/shimbench.XXXXXX", path[4096];
	if (!mkdtemp(tmpl))
		return 1;
	snprintf(path, sizeof(path), "%s/limits", tmpl);
	FILE *lf = fopen(path, "w");
	fprintf(lf, "version=1\ngpu.0.uuid=GPU-11111111-2222-3333-4444-555555555555\ngpu.0.memory=8589934592\n"
		    "gpu.0.cores=100\n");
	fclose(lf);
	setenv("NRI_VGPU_LIMITS", path, 1);
	setenv("NRI_VGPU_REGION_DIR", tmpl, 1);
	setenv("FAKECUDA_DEVICES", "GPU-11111111-2222-3333-4444-555555555555:16GiB:132", 1);
	setenv("FAKECUDA_KERNEL_US", "0", 1);
	unsetenv("FAKECUDA_STATE");

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
	const int nl = 2000000, na = 200000;
	/* Warm both paths (lazy init, page faults), then measure, best of 3. */
	bench_launch(l_shim, 1000), bench_alloc(a_shim, f_shim, 1000);
	double lr = 1e18, ls = 1e18, ar = 1e18, as = 1e18;
	for (int r = 0; r < 3; r++) {
		double x;
		if ((x = bench_launch(l_real, nl)) < lr) lr = x;
		if ((x = bench_launch(l_shim, nl)) < ls) ls = x;
		if ((x = bench_alloc(a_real, f_real, na)) < ar) ar = x;
		if ((x = bench_alloc(a_shim, f_shim, na)) < as) as = x;
	}
	printf("shim bench (fake driver, no SM limit, memory limit on)\n");
	printf("  cuLaunchKernel        direct %8.1f ns   shim %8.1f ns   +%7.1f ns   ratio %.2f\n", lr, ls, ls - lr,
	       ls / lr);
	printf("  cuMemAlloc+cuMemFree  direct %8.1f ns   shim %8.1f ns   +%7.1f ns   ratio %.2f\n", ar, as, as - ar,
	       as / ar);
	snprintf(path, sizeof(path), "rm -rf %s", tmpl);
	if (system(path) != 0)
		return 1;
	return 0;
}
