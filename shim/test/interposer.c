/*
 * A second interposer, preloaded after the shim: it wraps cuMemAlloc_v2 the
 * classic way, finding the next definition with dlsym(RTLD_NEXT). If the
 * shim's dlsym hook resolved RTLD_NEXT relative to itself instead of to this
 * library, the lookup would return this very function and recurse forever.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_abi.h"

static int calls;
/* Our own address, immune to interposition (the preloaded shim defines the name too). */
__attribute__((visibility("hidden"))) CUresult own_cuMemAlloc_v2(CUdeviceptr *p, size_t n);

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	static CUresult (*next)(CUdeviceptr *, size_t);
	if (!next)
		next = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
	if (!next || (void *)next == (void *)own_cuMemAlloc_v2) {
		fprintf(stderr, "interposer: RTLD_NEXT lookup returned %p\n", (void *)next);
		abort();
	}
	calls++;
	return next(p, n);
}

CUresult own_cuMemAlloc_v2(CUdeviceptr *p, size_t n) __attribute__((alias("cuMemAlloc_v2")));

__attribute__((destructor)) static void report(void)
{
	fprintf(stderr, "interposer: %d calls\n", calls);
}
