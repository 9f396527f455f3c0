/*
 * A library the test program links before libcuda. The shim is preloaded,
 * so this library comes after it in the search order and its
 * dlsym(RTLD_NEXT, "cuMemAlloc_v2") would find the driver's own function
 * unless the shim's dlsym hook answers it (next_lookup_wrapped).
 */
#define _GNU_SOURCE
#include <dlfcn.h>

/* Not a tail call: glibc takes the caller from dlsym's return address,
 * which must lie in this library, not in the program. */
__attribute__((visibility("default"))) void *next_lookup(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);
	__asm__ volatile("" : "+r"(p));
	return p;
}

__attribute__((visibility("default"))) void *next_vlookup(const char *name, const char *version)
{
	void *p = dlvsym(RTLD_NEXT, name, version);
	__asm__ volatile("" : "+r"(p));
	return p;
}
