/*
 * cuGetProcAddress (4 arguments, CUDA 11.3-11.8) and cuGetProcAddress_v2
 * (5 arguments, 12.0+): how cudart and cudaGetDriverEntryPoint reach every
 * driver function. The driver picks the ABI from (name, cudaVersion, flags);
 * we let it, then swap in our wrapper only when the pointer it returned is
 * the library's own export of a hooked name. So the requested version is
 * honoured exactly (a 3020 caller of cuCtxCreate gets _v2, never _v3), the
 * _ptsz/_ptds twins keep their stream semantics, and a failed or NULL lookup
 * stays failed or NULL.
 */
#include "glibc_compat.h"

#include <string.h>

#include "common.h"
#include "log.h"
#include "real.h"

/* Fallback for a pointer we cannot identify: the ABI the version rules name. */
static void *by_version(const char *sym, int ver, cuuint64_t flags)
{
	int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	int best = -1;
	for (int pass = 0; pass < 2 && best < 0; pass++) {
		int ptsz = pass == 0 ? want_ptsz : 0;
		if (pass == 1 && !want_ptsz)
			break;
		for (int i = 0; i < HOOK_COUNT; i++) {
			const struct vgpu_hook *h = &vgpu_hooks[i];
			if (h->ptsz != ptsz || h->version > ver || strcmp(h->base, sym) != 0)
				continue;
			if (best < 0 || h->version > vgpu_hooks[best].version)
				best = i;
		}
	}
	return best >= 0 && vgpu_lib_sym(best) ? vgpu_wrappers[best] : NULL;
}

static void *substitute(const char *sym, void *p, int ver, cuuint64_t flags)
{
	int candidates = 0;
	for (int i = 0; i < HOOK_COUNT; i++) {
		if (vgpu_hooks[i].lib != LIB_CUDA || strcmp(vgpu_hooks[i].base, sym) != 0)
			continue;
		candidates++;
		if (vgpu_lib_sym(i) == p)
			return vgpu_wrappers[i];
	}
	if (!candidates || vgpu_addr_in_self(p))
		return p;
	/* Same base name, unknown pointer: wrap only if the rules name a hooked
	 * ABI, else (e.g. a legacy ABI we do not wrap) leave it alone. */
	void *w = by_version(sym, ver, flags);
	if (w)
		LOGD("cuGetProcAddress(%s, %d, %llu): unrecognised driver pointer, wrapped by version", sym, ver,
		     (unsigned long long)flags);
	return w ? w : p;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
	CUresult rc = NEXT(cuGetProcAddress)(sym, pfn, ver, flags);
	if (rc == CUDA_SUCCESS && sym && pfn && *pfn && !vgpu_addr_in_driver(__builtin_return_address(0)))
		*pfn = substitute(sym, *pfn, ver, flags);
	return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
					 CUdriverProcAddressQueryResult *status)
{
	CUresult rc = NEXT(cuGetProcAddress_v2)(sym, pfn, ver, flags, status);
	if (rc == CUDA_SUCCESS && sym && pfn && *pfn && !vgpu_addr_in_driver(__builtin_return_address(0)))
		*pfn = substitute(sym, *pfn, ver, flags);
	return rc;
}
