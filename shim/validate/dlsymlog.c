/*
 * A dlsym logger for validate.sh: preloaded into a program (nvidia-smi), it
 * writes each name the program resolves with dlsym to standard error as
 * "dlsym NAME" and hands the call on. It answers which NVML entry points
 * nvidia-smi reaches through dlsym, and so which of them the shim must hook.
 * A validation aid only: never preloaded with the shim.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

typedef void *(*dlsym_fn)(void *, const char *);

static dlsym_fn next_dlsym(void)
{
	static dlsym_fn next;

	if (!next)
		next = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!next)
		next = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	return next;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
	dlsym_fn next = next_dlsym();

	fprintf(stderr, "dlsym %s\n", name);
	return next ? next(handle, name) : NULL;
}
