/*
 * Calls after which the context footprint (footprint.c) may have changed:
 * code loaded or unloaded, and limits that reserve memory (a stack for every
 * resident thread, the device heap, the printf FIFO). The driver has no
 * query for what they cost, so each is followed by a measure through NVML;
 * a lookup of a function, where lazy loading loads its code, only marks the
 * footprint for the next allocation (programs may look functions up often).
 */
#include "glibc_compat.h"

#include "common.h"
#include "core.h"
#include "footprint.h"
#include "real.h"

/* After a successful call that may have changed what the driver holds. */
static CUresult changed(CUresult rc)
{
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE)
		vgpu_fp_changed();
	return rc;
}

static CUresult looked_up(CUresult rc)
{
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE)
		vgpu_fp_mark();
	return rc;
}

VGPU_EXPORT CUresult cuModuleLoad(CUmodule *m, const char *fname)
{
	vgpu_init();
	return changed(NEXT(cuModuleLoad)(m, fname));
}

VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
	vgpu_init();
	return changed(NEXT(cuModuleLoadData)(m, image));
}

VGPU_EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *opts,
					void **vals)
{
	vgpu_init();
	return changed(NEXT(cuModuleLoadDataEx)(m, image, n, opts, vals));
}

VGPU_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin)
{
	vgpu_init();
	return changed(NEXT(cuModuleLoadFatBinary)(m, fatbin));
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule m)
{
	vgpu_init();
	return changed(NEXT(cuModuleUnload)(m));
}

VGPU_EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned nj,
				       CUlibraryOption *lo, void **lv, unsigned nl)
{
	vgpu_init();
	return changed(NEXT(cuLibraryLoadData)(l, code, jo, jv, nj, lo, lv, nl));
}

VGPU_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *file, CUjit_option *jo, void **jv,
					   unsigned nj, CUlibraryOption *lo, void **lv, unsigned nl)
{
	vgpu_init();
	return changed(NEXT(cuLibraryLoadFromFile)(l, file, jo, jv, nj, lo, lv, nl));
}

VGPU_EXPORT CUresult cuLibraryUnload(CUlibrary l)
{
	vgpu_init();
	return changed(NEXT(cuLibraryUnload)(l));
}

/* The library's module in the current context: with context-independent
 * loading (lazy, the default since CUDA 12.2) this is where the library's
 * code is loaded into the context. */
VGPU_EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l)
{
	vgpu_init();
	return changed(NEXT(cuLibraryGetModule)(m, l));
}

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	vgpu_init();
	/* Without a host pid no measure can follow: the growth is charged from
	 * the value asked, before the call (footprint.c). OUT_OF_MEMORY is what
	 * the driver itself returns when it cannot reserve a limit. */
	struct vgpu_fp_limit l;
	if (vgpu_fp_limit_charge(limit, value, &l) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = NEXT(cuCtxSetLimit)(limit, value);
	vgpu_fp_limit_settle(rc, &l);
	return changed(rc);
}

VGPU_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	vgpu_init();
	return looked_up(NEXT(cuModuleGetFunction)(f, m, name));
}

VGPU_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
	vgpu_init();
	return looked_up(NEXT(cuKernelGetFunction)(f, k));
}
