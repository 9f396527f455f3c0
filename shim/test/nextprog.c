/*
 * nextprog N [dl] — allocates 16 MiB N times with the cuMemAlloc_v2 that
 * libnextlookup.so (linked before libcuda) finds with dlsym(RTLD_NEXT) (with
 * dl: libnextdl.so, the same code loaded with dlopen, RTLD_LOCAL, needing
 * libcuda itself: its RTLD_NEXT searches its own dependencies), and
 * prints which object each lookup resolved into and how many allocations
 * succeeded (next_lookup_wrapped in run.sh).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"

void *next_lookup(const char *name);
void *next_vlookup(const char *name, const char *version);

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);

static const char *owner(void *p)
{
	Dl_info i;
	if (!p)
		return "none";
	if (!dladdr(p, &i) || !i.dli_fname)
		return "unknown";
	const char *s = strrchr(i.dli_fname, '/');
	return s ? s + 1 : i.dli_fname;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 8;
	CUcontext ctx;
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
		fprintf(stderr, "nextprog: no context\n");
		return 1;
	}
	void *(*lookup)(const char *) = next_lookup;
	void *(*vlookup)(const char *, const char *) = next_vlookup;
	if (argc > 2 && !strcmp(argv[2], "dl")) {
		void *h = dlopen("libnextdl.so", RTLD_NOW | RTLD_LOCAL);
		lookup = h ? (void *(*)(const char *))dlsym(h, "next_lookup") : NULL;
		vlookup = h ? (void *(*)(const char *, const char *))dlsym(h, "next_vlookup") : NULL;
		if (!lookup || !vlookup) {
			fprintf(stderr, "nextprog: libnextdl.so: %s\n", dlerror());
			return 1;
		}
	}
	CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))lookup("cuMemAlloc_v2");
	printf("next cuMemAlloc_v2 %s\n", owner((void *)alloc));
	printf("vnext cuMemAlloc_v2 %s\n", owner(vlookup("cuMemAlloc_v2", "GLIBC_2.2.5")));
	printf("next cuMemFree_v2 %s\n", owner(lookup("cuMemFree_v2")));
	/* A name the shim does not hook is the driver's own, relative to the caller. */
	printf("next cuDeviceGet %s\n", owner(lookup("cuDeviceGet")));
	if (!alloc)
		return 1;
	int ok = 0;
	for (int i = 0; i < n; i++) {
		CUdeviceptr p;
		if (alloc(&p, 16u << 20) == CUDA_SUCCESS)
			ok++;
	}
	printf("allocated %d\n", ok);
	return 0;
}
