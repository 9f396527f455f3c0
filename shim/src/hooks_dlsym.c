/*
 * The dlsym override. cudart 12 (even when linked statically), PyTorch,
 * nvidia-smi and most Python bindings reach the driver with dlopen + dlsym,
 * so a preloaded wrapper alone would never be called.
 *
 * Exported twice: dlsym@GLIBC_2.2.5 (binaries built against glibc < 2.34,
 * which bind to libdl's version) and dlsym@@GLIBC_2.34 (newer binaries).
 *
 * Rules:
 *  - RTLD_NEXT and every name we do not hook are passed on by a *tail call*:
 *    glibc's dlsym looks at its return address to find the caller, and with a
 *    jump it still sees the original caller, so a second interposer's
 *    dlsym(RTLD_NEXT, ...) resolves relative to itself, not to us.
 *  - a hooked name gets our wrapper only when the real lookup succeeded, and
 *    never when the driver itself is asking.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <dlfcn.h>

#include "shim.h"

static const char *const lib_names[] = {"libcuda.so.1", "libnvidia-ml.so.1"};

static __attribute__((noinline)) void *hooked(void *handle, const char *name, int id, void *caller)
{
	void *p = vgpu_real_dlsym(handle, name);
	if (!p)
		return NULL;
	if (vgpu_addr_in_self(p)) {
		/* A global lookup found our own export. Only the real library can say
		 * whether the symbol exists; never load it just to find out. */
		void *lh = dlopen(lib_names[vgpu_hooks[id].lib], RTLD_LAZY | RTLD_NOLOAD);
		void *q = lh ? vgpu_real_dlsym(lh, name) : NULL;
		if (lh)
			dlclose(lh);
		if (!q)
			return NULL;
		return vgpu_addr_in_driver(caller) ? q : p;
	}
	if (vgpu_addr_in_driver(caller))
		return p;
	return vgpu_wrappers[id];
}

static inline __attribute__((always_inline)) void *dlsym_hook(void *handle, const char *name, void *caller)
{
	if (handle != RTLD_NEXT) {
		int id = vgpu_hook_find(name);
		if (id >= 0)
			return hooked(handle, name, id, caller);
	}
	return vgpu_real_dlsym_tail(handle, name);
}

__asm__(".symver vgpu_dlsym_2_2_5,dlsym@GLIBC_2.2.5");
__asm__(".symver vgpu_dlsym_2_34,dlsym@@GLIBC_2.34");

VGPU_EXPORT void *vgpu_dlsym_2_2_5(void *handle, const char *name)
{
	return dlsym_hook(handle, name, __builtin_return_address(0));
}

VGPU_EXPORT void *vgpu_dlsym_2_34(void *handle, const char *name)
{
	return dlsym_hook(handle, name, __builtin_return_address(0));
}
