/*
 * The dlsym override. cudart 12 (even when linked statically), PyTorch,
 * nvidia-smi and most Python bindings reach the driver with dlopen + dlsym,
 * so a preloaded wrapper alone would never be called.
 *
 * Exported twice: dlsym@GLIBC_2.2.5 (binaries built against glibc < 2.34,
 * which bind to libdl's version) and dlsym@@GLIBC_2.34 (newer binaries).
 *
 * Rules:
 *  - every name we do not hook is passed on by a *tail call*: glibc's dlsym
 *    looks at its return address to find the caller, and with a jump it
 *    still sees the original caller, so dlsym(RTLD_NEXT, ...) of such a name
 *    resolves relative to the caller, not to us.
 *  - a hooked name gets our wrapper only when the real lookup succeeded, and
 *    never when the driver itself is asking.
 *  - so does dlsym(RTLD_NEXT, hooked name) from any object but the driver
 *    and the shim: the shim is preloaded, so every object loaded after it (a
 *    library the program links before libcuda, a stacked interposer) would
 *    otherwise find the driver's own function and allocate past the quota.
 *    The wrappers forward to the library's own definition (vgpu_next), never
 *    to such an object, so an interposer that wraps a hooked name after us
 *    and chains with RTLD_NEXT gets our wrapper without a loop; it is not
 *    called through us (one loaded before us, from LD_PRELOAD, still is:
 *    glibc loads LD_PRELOAD before /etc/ld.so.preload).
 *  - dlvsym is not interposed: the driver's names carry no symbol version,
 *    and glibc's dlvsym finds no unversioned definition under any version
 *    name (checked by next_lookup_wrapped).
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <dlfcn.h>

#include "common.h"
#include "real.h"

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

/* dlsym(RTLD_NEXT, name) of hooked name id from caller: our wrapper when the
 * real library is loaded and defines name, else NULL (the lookup is passed on
 * as it is). Never loads the library just to find out. */
static __attribute__((noinline)) void *next_hooked(const char *name, int id, void *caller)
{
	if (vgpu_addr_in_driver(caller) || vgpu_addr_in_self(caller))
		return NULL;
	void *lh = dlopen(lib_names[vgpu_hooks[id].lib], RTLD_LAZY | RTLD_NOLOAD);
	void *q = lh ? vgpu_real_dlsym(lh, name) : NULL;
	if (lh)
		dlclose(lh);
	return q ? vgpu_wrappers[id] : NULL;
}

static inline __attribute__((always_inline)) void *dlsym_hook(void *handle, const char *name, void *caller)
{
	int id = vgpu_hook_find(name);
	if (id >= 0) {
		if (handle != RTLD_NEXT)
			return hooked(handle, name, id, caller);
		void *w = next_hooked(name, id, caller);
		if (w)
			return w;
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
