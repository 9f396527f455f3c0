/*
 * The fake driver's modules, libraries and context limits: device memory a
 * process holds beyond its allocations, which NVML's per-process used memory
 * shows and the shim must count as the context's footprint.
 *
 *  - A module or library (cuModuleLoad*, cuLibraryLoad*) costs
 *    FAKECUDA_MODULE_BYTES (default 4 MiB) on the current context's device
 *    when loaded eagerly. With CUDA_MODULE_LOADING=LAZY (the real driver's
 *    variable; its default since CUDA 12.2, not this fake's) loading costs
 *    nothing and each function costs FAKECUDA_FUNCTION_BYTES (default 1 MiB)
 *    on first use: cuModuleGetFunction, cuKernelGetFunction, or the first
 *    launch of a library kernel (a CUkernel passed as a CUfunction).
 *    cuLibraryGetModule loads a lazily loaded library's whole code into the
 *    context: FAKECUDA_MODULE_BYTES once.
 *  - A launch of any function reserves FAKECUDA_LAUNCH_LMEM bytes of local
 *    memory on the device if less is reserved: the reservation grows to what
 *    the most demanding kernel needs and stays.
 *  - cuCtxSetLimit: the stack size is reserved for every resident thread
 *    (2048 per SM); the malloc heap and the printf FIFO are their size.
 *
 * Unloading gives back what the module or library holds.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "fakestate.h"

#define EXPORT __attribute__((visibility("default")))
#define FN_MAGIC 0x66756e63u
#define MOD_MAGIC 0x6d6f646cu
#define MAX_FUNCS 16
#define THREADS_PER_SM 2048

CUresult cuCtxGetDevice(CUdevice *d);

struct CUfunc_st {
	unsigned magic;
	int loaded;
	struct CUmod_st *mod;
	char name[64];
};

/* A module; a library is one too (CUlibrary points at the same struct). */
struct CUmod_st {
	unsigned magic;
	int dev;
	int lazy;
	int whole; /* a library's module was asked for: all its code is loaded */
	uint64_t held; /* bytes this module holds on dev */
	int nfuncs;
	struct CUfunc_st funcs[MAX_FUNCS];
};

static uint64_t knob_bytes(const char *name, uint64_t def)
{
	const char *e = getenv(name);
	return e && *e ? strtoull(e, NULL, 10) : def;
}

static int lazy_mode(void)
{
	const char *e = getenv("CUDA_MODULE_LOADING");
	return e && !strcmp(e, "LAZY");
}

static CUresult load(struct CUmod_st **out, const void *what)
{
	CUdevice d;
	if (!out || !what)
		return CUDA_ERROR_INVALID_VALUE;
	if (cuCtxGetDevice(&d) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct CUmod_st *m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = MOD_MAGIC;
	m->dev = d;
	m->lazy = lazy_mode();
	if (!m->lazy) {
		uint64_t b = knob_bytes("FAKECUDA_MODULE_BYTES", 4u << 20);
		if (b && fk_mem_take(d, b) != CUDA_SUCCESS) {
			free(m);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		m->held = b;
	}
	*out = m;
	return CUDA_SUCCESS;
}

static CUresult unload(struct CUmod_st *m)
{
	if (!m || m->magic != MOD_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	if (m->held)
		fk_mem_give(m->dev, m->held);
	m->magic = 0;
	free(m);
	return CUDA_SUCCESS;
}

/* The function name of m, made on first request (not loaded yet). */
static struct CUfunc_st *function(struct CUmod_st *m, const char *name)
{
	for (int i = 0; i < m->nfuncs; i++)
		if (!strcmp(m->funcs[i].name, name))
			return &m->funcs[i];
	if (m->nfuncs == MAX_FUNCS)
		return NULL;
	struct CUfunc_st *f = &m->funcs[m->nfuncs++];
	f->magic = FN_MAGIC;
	f->mod = m;
	f->loaded = !m->lazy;
	snprintf(f->name, sizeof(f->name), "%s", name);
	return f;
}

/* First use of a lazily loaded function: its code goes to the device now. */
static CUresult use(struct CUfunc_st *f)
{
	if (f->loaded)
		return CUDA_SUCCESS;
	uint64_t b = knob_bytes("FAKECUDA_FUNCTION_BYTES", 1u << 20);
	if (b && fk_mem_take(f->mod->dev, b) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->mod->held += b;
	f->loaded = 1;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoad(CUmodule *m, const char *fname)
{
	return load((struct CUmod_st **)m, fname);
}

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
	return load((struct CUmod_st **)m, image);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *opts, void **vals)
{
	(void)n, (void)opts, (void)vals;
	return load((struct CUmod_st **)m, image);
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin)
{
	return load((struct CUmod_st **)m, fatbin);
}

EXPORT CUresult cuModuleUnload(CUmodule m)
{
	return unload((struct CUmod_st *)m);
}

EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	struct CUmod_st *mod = (struct CUmod_st *)m;
	if (!f || !name || !mod || mod->magic != MOD_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUfunc_st *fn = function(mod, name);
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = use(fn);
	if (rc == CUDA_SUCCESS)
		*f = fn;
	return rc;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned nj,
				  CUlibraryOption *lo, void **lv, unsigned nl)
{
	(void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
	return load((struct CUmod_st **)l, code);
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *file, CUjit_option *jo, void **jv, unsigned nj,
				      CUlibraryOption *lo, void **lv, unsigned nl)
{
	(void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
	return load((struct CUmod_st **)l, file);
}

EXPORT CUresult cuLibraryUnload(CUlibrary l)
{
	return unload((struct CUmod_st *)l);
}

/* A library's kernel: a handle only; its code loads at first use. */
EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name)
{
	struct CUmod_st *mod = (struct CUmod_st *)l;
	if (!k || !name || !mod || mod->magic != MOD_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUfunc_st *fn = function(mod, name);
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	*k = (CUkernel)fn;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetModule(CUmodule *out, CUlibrary l)
{
	struct CUmod_st *mod = (struct CUmod_st *)l;
	if (!out || !mod || mod->magic != MOD_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	if (mod->lazy && !mod->whole) {
		uint64_t b = knob_bytes("FAKECUDA_MODULE_BYTES", 4u << 20);
		if (b && fk_mem_take(mod->dev, b) != CUDA_SUCCESS)
			return CUDA_ERROR_OUT_OF_MEMORY;
		mod->held += b;
		mod->whole = 1;
	}
	*out = (CUmodule)mod;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
	struct CUfunc_st *fn = (struct CUfunc_st *)k;
	if (!f || !fn || fn->magic != FN_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = use(fn);
	if (rc == CUDA_SUCCESS)
		*f = fn;
	return rc;
}

/* Per device: local memory reserved for launches and the limits' reservations. */
static uint64_t lmem[FK_MAX_DEV], limit_held[FK_MAX_DEV][3];
static size_t limit_value[FK_MAX_DEV][3];
_Static_assert(THREADS_PER_SM == FK_THREADS_PER_SM, "what cuDeviceGetAttribute says");

/* Moves what is reserved for a purpose on d from *held to want bytes. */
static CUresult reserve(int d, uint64_t *held, uint64_t want)
{
	if (want > *held) {
		if (fk_mem_take(d, want - *held) != CUDA_SUCCESS)
			return CUDA_ERROR_OUT_OF_MEMORY;
	} else if (want < *held) {
		fk_mem_give(d, *held - want);
	}
	*held = want;
	return CUDA_SUCCESS;
}

void fk_function_launched(struct CUfunc_st *f)
{
	CUdevice d;
	if (!f || cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= FK_MAX_DEV)
		return;
	if (f->magic == FN_MAGIC)
		use(f);
	uint64_t need = knob_bytes("FAKECUDA_LAUNCH_LMEM", 0);
	if (need > lmem[d])
		reserve(d, &lmem[d], need);
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	CUdevice d;
	if (cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= FK_MAX_DEV)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (limit < CU_LIMIT_STACK_SIZE || limit > CU_LIMIT_MALLOC_HEAP_SIZE)
		return CUDA_ERROR_NOT_SUPPORTED; /* the others hold no memory here */
	uint64_t want = value;
	if (limit == CU_LIMIT_STACK_SIZE)
		want = (uint64_t)value * (uint64_t)(fk->dev[d].sms > 0 ? fk->dev[d].sms : 1) * THREADS_PER_SM;
	CUresult rc = reserve(d, &limit_held[d][limit], want);
	if (rc == CUDA_SUCCESS)
		limit_value[d][limit] = value;
	return rc;
}

/* What was set last on the device (0 before: this driver holds nothing for a limit until it is set). */
EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit)
{
	CUdevice d;
	if (cuCtxGetDevice(&d) != CUDA_SUCCESS || d < 0 || d >= FK_MAX_DEV)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!value || limit < CU_LIMIT_STACK_SIZE || limit > CU_LIMIT_MALLOC_HEAP_SIZE)
		return CUDA_ERROR_NOT_SUPPORTED;
	*value = limit_value[d][limit];
	return CUDA_SUCCESS;
}
