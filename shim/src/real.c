/*
 * The real libraries: libcuda.so.1 and libnvidia-ml.so.1 are never linked,
 * only opened on first use, so the shim loads harmlessly into any process
 * (bash, python) that never touches a GPU.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "footprint.h"
#include "lifecycle.h"
#include "log.h"
#include "real.h"

static const char *const lib_names[] = {"libcuda.so.1", "libnvidia-ml.so.1"};
static void *lib_handle[2];
static int lib_absent[2]; /* the loader's search found no such library: not searched again */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

/*
 * glibc's dlsym, or that of an interposer loaded after us. Looked up with
 * dlvsym, which we do not interpose; idempotent, so racing threads are fine
 * and no pthread_once is needed (a dlsym hook must not take locks that the
 * lazy initialisation may hold while it runs dlopen).
 */
static dlsym_fn get_real_dlsym(void)
{
	dlsym_fn f = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
	if (likely(f))
		return f;
	f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	if (!f)
		f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	__atomic_store_n(&real_dlsym_fn, f, __ATOMIC_RELEASE);
	return f;
}

void *(*vgpu_real_dlsym_fn(void))(void *, const char *)
{
	return get_real_dlsym();
}

void *vgpu_lib_sym(int id)
{
	static void *cache[HOOK_COUNT];
	void *p = __atomic_load_n(&cache[id], __ATOMIC_ACQUIRE);
	if (p)
		return p;
	void *h = vgpu_lib_handle(vgpu_hooks[id].lib);
	p = h ? vgpu_real_dlsym(h, vgpu_hooks[id].name) : NULL;
	if (p)
		__atomic_store_n(&cache[id], p, __ATOMIC_RELEASE);
	return p;
}

void *vgpu_real_dlsym(void *handle, const char *name)
{
	dlsym_fn f = get_real_dlsym();
	return f ? f(handle, name) : NULL;
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

struct loaded {
	const char *name;
	char path[PATH_MAX];
};

static int loaded_visit(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct loaded *l = arg;
	const char *n = info->dlpi_name;
	if (!n || strcmp(base_name(n), l->name) != 0)
		return 0;
	snprintf(l->path, sizeof(l->path), "%s", n);
	return 1;
}

/* Whether dir/name exists. */
static int in_dir(const char *dir, size_t len, const char *name)
{
	char p[PATH_MAX];
	if (len == 0)
		dir = ".", len = 1; /* an empty entry of LD_LIBRARY_PATH is the working directory */
	if (snprintf(p, sizeof(p), "%.*s/%s", (int)len, dir, name) >= (int)sizeof(p))
		return 0;
	return access(p, F_OK) == 0;
}

/* Whether the loader's cache (/etc/ld.so.cache) names name: its string table holds every soname. */
static int in_cache(const char *name)
{
	int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct stat st;
	void *m = MAP_FAILED;
	/* fstat through syscall(2): glibc >= 2.33 exports fstat@GLIBC_2.33. */
	if (syscall(SYS_fstat, fd, &st) == 0 && st.st_size > 0 && st.st_size < (64 << 20))
		m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return 0;
	int found = memmem(m, (size_t)st.st_size, name, strlen(name) + 1) != NULL; /* with its NUL */
	munmap(m, (size_t)st.st_size);
	return found;
}

/*
 * Whether dlopen(name) could find the library, asked of the places its search
 * looks (LD_LIBRARY_PATH, the loader's cache, the system directories: those
 * of libc and the usual ones) rather than of the loader itself: a search
 * that finds nothing walks every directory and its hardware-capability
 * subdirectories, about a hundred lookups and 0.1 ms at each process's first
 * context where NVML is not installed, where this costs a few. A program's
 * own RPATH/RUNPATH is not looked at: NVIDIA's driver libraries come from
 * the driver, never with a program (and one the program loads itself is
 * found among the loaded objects: already_loaded()).
 */
static int findable(const char *name)
{
	const char *lp = getenv("LD_LIBRARY_PATH");
	for (const char *p = lp; p && *p;) {
		size_t n = strcspn(p, ":;");
		if (in_dir(p, n, name))
			return 1;
		p += n;
		if (*p)
			p++;
	}
	if (in_cache(name))
		return 1;
	static const char *const sys[] = {"/lib64", "/usr/lib64", "/lib", "/usr/lib"};
	for (size_t i = 0; i < sizeof(sys) / sizeof(sys[0]); i++)
		if (in_dir(sys[i], strlen(sys[i]), name))
			return 1;
	/* libc's own directory, and its twin under /usr (multiarch: /lib/x86_64-linux-gnu).
	 * Found among the loaded objects: dladdr() would scan libc's symbols. */
	struct loaded libc = {"libc.so.6", ""};
	if (dl_iterate_phdr(loaded_visit, &libc) && strrchr(libc.path, '/')) {
		const char *d = libc.path;
		size_t n = (size_t)(strrchr(d, '/') - d);
		char usr[PATH_MAX];
		if (in_dir(d, n, name))
			return 1;
		if (!strncmp(d, "/lib/", 5) && snprintf(usr, sizeof(usr), "/usr%.*s", (int)n, d) < (int)sizeof(usr) &&
		    in_dir(usr, strlen(usr), name))
			return 1;
	}
	return 0;
}

/*
 * A handle on name if the process has loaded it (by any path), else NULL.
 * Not dlopen(name, RTLD_NOLOAD): that searches the file system first, as
 * for a load, before it says no.
 */
static void *already_loaded(const char *name)
{
	struct loaded l = {name, ""};
	if (!dl_iterate_phdr(loaded_visit, &l))
		return NULL;
	return dlopen(l.path, RTLD_LAZY | RTLD_NOLOAD);
}

void *vgpu_lib_handle(int lib)
{
	void *h = __atomic_load_n(&lib_handle[lib], __ATOMIC_ACQUIRE);
	if (likely(h))
		return h;
	/* Prefer the copy the process already has (whatever path it came from). */
	h = already_loaded(lib_names[lib]);
	/* A search that failed once fails again (it costs a hundred lookups of
	 * paths that do not exist, at each context creation and each NVML
	 * question): after that, only a copy the program loads itself is used. */
	if (!h && !__atomic_load_n(&lib_absent[lib], __ATOMIC_RELAXED)) {
		/* NVML only: libcuda is loaded by the time anything here runs. */
		h = lib == LIB_CUDA || findable(lib_names[lib]) ? dlopen(lib_names[lib], RTLD_LAZY) : NULL;
		if (!h)
			__atomic_store_n(&lib_absent[lib], 1, __ATOMIC_RELAXED);
	}
	if (h) {
		void *prev = NULL;
		/* Lost a race: drop our extra reference (the handle is the same). */
		if (!__atomic_compare_exchange_n(&lib_handle[lib], &prev, h, 0, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE))
			dlclose(h), h = prev;
	}
	return h;
}

/* Read-only after relocation (RELRO) whatever its size: a large object would
 * otherwise go to the writable large data section (Makefile). */
const struct vgpu_hook vgpu_hooks[HOOK_COUNT] __attribute__((section(".data.rel.ro"))) = {
#define HOOK(lib, name, base, ver, ptsz) [HOOK_##name] = {#name, #base, lib, ver, ptsz},
#include "hooks.def"
#undef HOOK
};

void *vgpu_next_fn[HOOK_COUNT]; /* read inline by NEXT (real.h) */

/*
 * The implementation a wrapper forwards to: the library's own definition
 * (libcuda linked, or dlopen'ed RTLD_LOCAL the cudart way). Never an object
 * loaded after us that defines the name too: its dlsym(RTLD_NEXT) gets our
 * wrapper (hooks_dlsym.c), so forwarding to it would loop, and whatever it
 * did with the driver's function would not be counted.
 */
void *vgpu_next(int id)
{
	void *p = __atomic_load_n(&vgpu_next_fn[id], __ATOMIC_ACQUIRE);
	if (likely(p))
		return p;
	p = vgpu_lib_sym(id);
	if (p)
		__atomic_store_n(&vgpu_next_fn[id], p, __ATOMIC_RELEASE);
	return p;
}

int vgpu_hook_find(const char *name)
{
	/* Cheap filter: every hooked name starts with "cu" or "nvml". */
	if (!name || (name[0] != 'c' && name[0] != 'n'))
		return -1;
	for (int i = 0; i < HOOK_COUNT; i++)
		if (strcmp(vgpu_hooks[i].name, name) == 0)
			return i;
	return -1;
}

/*
 * The loaded object an address lies in, found by its load segments. Not
 * dladdr(): that also looks for the nearest symbol, scanning the object's
 * whole symbol table, tens of microseconds in a large library, and these run
 * at every cuGetProcAddress and dlsym a program makes (cudart makes
 * hundreds as it starts).
 */
struct owner {
	uintptr_t addr;
	const char *name; /* the object's path ("" for the program) */
	uintptr_t bias;   /* its load address: with name, which object */
};

static int owner_visit(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct owner *o = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && o->addr >= lo && o->addr - lo < ph->p_memsz) {
			o->name = info->dlpi_name ? info->dlpi_name : "";
			o->bias = (uintptr_t)info->dlpi_addr;
			return 1;
		}
	}
	return 0;
}

static int owner_of_addr(const void *addr, struct owner *o)
{
	*o = (struct owner){(uintptr_t)addr, NULL, 0};
	return addr && dl_iterate_phdr(owner_visit, o) != 0;
}

int vgpu_addr_in_driver(const void *addr)
{
	struct owner o;
	if (!owner_of_addr(addr, &o))
		return 0;
	const char *b = base_name(o.name);
	return strncmp(b, "libcuda.so", 10) == 0 || strncmp(b, "libnvidia-ml.so", 15) == 0;
}

int vgpu_addr_in_self(const void *addr)
{
	struct owner self, other;
	if (!owner_of_addr((const void *)&vgpu_addr_in_self, &self) || !owner_of_addr(addr, &other))
		return 0;
	return self.bias == other.bias && self.name == other.name;
}

/* ---- NVML for the shim's own use -------------------------------------------------- */

/*
 * The shim's own NVML reads (the SM limiter's samples, the context footprint,
 * host-pid discovery) decide what the container gets, so they go only to the
 * NVML that came with the driver: the libnvidia-ml.so.1 in the directory of the
 * libcuda.so.1 the process runs (the real file, symbolic links followed: a link
 * in a directory of the tenant's to the driver's libcuda changes nothing),
 * opened by that absolute path, RTLD_LOCAL. Never through the loader's search
 * (LD_LIBRARY_PATH, the program's RUNPATH), where the tenant can put a library
 * of its own first: one whose nvmlInit fails turned the SM limiter off, one
 * that lists no processes left every context's own memory uncounted. The
 * program's own NVML calls still go to whichever library it loaded (the
 * hooks' NEXT): what it tells itself is its own affair.
 *
 * Where the driver's directory has no NVML, or it cannot be opened, the shim
 * has none (vgpu_nvml_usable()): it then fails closed (limiter.c, footprint.c).
 */
static void *own_nvml;
static int own_nvml_state; /* 0: not looked for yet; 1: opened; -1: none */
static int nvml_init_state; /* 0: not tried yet (in this process); 1: initialised; -1: failed */

/* The directory of the driver's libcuda.so.1 (its real file) into dir: 0, or -1. */
static int driver_dir(char *dir, size_t len)
{
	void *h = vgpu_lib_handle(LIB_CUDA);
	void *sym = h ? vgpu_real_dlsym(h, "cuInit") : NULL;
	struct owner o;
	char real[PATH_MAX];
	if (!sym || !owner_of_addr(sym, &o) || !o.name || !*o.name || !realpath(o.name, real))
		return -1;
	char *slash = strrchr(real, '/');
	if (!slash || (size_t)(slash - real) >= len)
		return -1;
	*slash = 0;
	snprintf(dir, len, "%s", real);
	return 0;
}

static void *own_nvml_handle(void)
{
	int st = __atomic_load_n(&own_nvml_state, __ATOMIC_ACQUIRE);
	if (likely(st))
		return st > 0 ? own_nvml : NULL;
	char dir[PATH_MAX], p[PATH_MAX + 32];
	void *h = NULL;
	if (driver_dir(dir, sizeof(dir)) == 0 &&
	    snprintf(p, sizeof(p), "%s/libnvidia-ml.so.1", dir) < (int)sizeof(p) && access(p, F_OK) == 0)
		h = dlopen(p, RTLD_LAZY | RTLD_LOCAL);
	/* Racing threads open the same object (a reference each, harmless). */
	__atomic_store_n(&own_nvml, h, __ATOMIC_RELEASE);
	__atomic_store_n(&own_nvml_state, h ? 1 : -1, __ATOMIC_RELEASE);
	return h;
}

static void nvml_unusable(const char *why)
{
	static int said;
	if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		LOGW("NVML is unusable (%s): SM limits hold at their nominal rate, unsteered, and each new "
		     "context is charged %llu MiB as its own memory instead of what NVML would measure",
		     why, (unsigned long long)(VGPU_FP_BOUND >> 20));
}

int vgpu_nvml_usable(void)
{
	int st = __atomic_load_n(&nvml_init_state, __ATOMIC_ACQUIRE);
	if (likely(st))
		return st > 0;
	void *h = own_nvml_handle();
	nvmlReturn_t (*init)(void) = h ? (nvmlReturn_t(*)(void))vgpu_real_dlsym(h, "nvmlInit_v2") : NULL;
	nvmlReturn_t rc = init ? init() : NVML_ERROR_FUNCTION_NOT_FOUND;
	st = rc == NVML_SUCCESS ? 1 : -1;
	__atomic_store_n(&nvml_init_state, st, __ATOMIC_RELEASE);
	if (st < 0) {
		char msg[64];
		snprintf(msg, sizeof(msg), "nvmlInit_v2 failed: %d", (int)rc);
		nvml_unusable(!h ? "no libnvidia-ml.so.1 beside the driver's libcuda.so.1" :
			      !init ? "the driver's libnvidia-ml.so.1 has no nvmlInit_v2" : msg);
	}
	return st > 0;
}

void vgpu_nvml_unknown_gpu(const char *uuid)
{
	char msg[128];
	snprintf(msg, sizeof(msg), "it has no handle for %s", uuid);
	nvml_unusable(msg);
}

static void after_fork(void)
{
	/* The library stays mapped; NVML is initialised anew in the child, as before. */
	__atomic_store_n(&nvml_init_state, 0, __ATOMIC_RELEASE);
}
VGPU_LIFECYCLE(nvml, .order = VGPU_ORDER_NVML, .after_fork = after_fork);

/* ---- plain calls the shim makes for itself ------------------------------------ */

static void *plain(int lib, const char *name, void **cache)
{
	void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
	if (likely(p))
		return p;
	void *h = lib == LIB_NVML ? own_nvml_handle() : vgpu_lib_handle(lib);
	p = h ? vgpu_real_dlsym(h, name) : NULL;
	if (p)
		__atomic_store_n(cache, p, __ATOMIC_RELEASE);
	return p;
}

#define PLAIN(lib, name, type, fail, ...)                                 \
	do {                                                              \
		static void *cache_;                                      \
		__typeof__(type) f_ = (__typeof__(type))plain(lib, name, &cache_);              \
		return f_ ? f_(__VA_ARGS__) : (fail);                     \
	} while (0)

CUresult vgpu_cu_ctx_get_device(CUdevice *dev)
{
	PLAIN(LIB_CUDA, "cuCtxGetDevice", CUresult(*)(CUdevice *), CUDA_ERROR_NOT_FOUND, dev);
}

CUresult vgpu_cu_ctx_get_current(CUcontext *ctx)
{
	PLAIN(LIB_CUDA, "cuCtxGetCurrent", CUresult(*)(CUcontext *), CUDA_ERROR_NOT_FOUND, ctx);
}

CUresult vgpu_cu_ctx_set_current(CUcontext ctx)
{
	PLAIN(LIB_CUDA, "cuCtxSetCurrent", CUresult(*)(CUcontext), CUDA_ERROR_NOT_FOUND, ctx);
}

CUresult vgpu_cu_ctx_from_green(CUcontext *ctx, CUgreenCtx g)
{
	PLAIN(LIB_CUDA, "cuCtxFromGreenCtx", CUresult(*)(CUcontext *, CUgreenCtx), CUDA_ERROR_NOT_FOUND, ctx, g);
}

CUresult vgpu_cu_stream_get_ctx(CUstream s, CUcontext *ctx)
{
	/* Not in every driver we may meet (9.2+): absent, the caller falls back. */
	PLAIN(LIB_CUDA, "cuStreamGetCtx", PFN_cuStreamGetCtx, CUDA_ERROR_NOT_FOUND, s, ctx);
}

CUresult vgpu_cu_ctx_device(CUcontext ctx, CUdevice *dev)
{
	/* CUDA 13 asks a context directly; before that, make it current for
	 * one cuCtxGetDevice (push and pop restore the caller's stack). */
	static void *v2, *push, *pop;
	static int no_v2; /* looked up and absent (before CUDA 13): do not ask dlsym again */
	PFN_cuCtxGetDevice_v2 get = NULL;
	if (!__atomic_load_n(&no_v2, __ATOMIC_RELAXED)) {
		get = (PFN_cuCtxGetDevice_v2)plain(LIB_CUDA, "cuCtxGetDevice_v2", &v2);
		if (!get && vgpu_lib_handle(LIB_CUDA))
			__atomic_store_n(&no_v2, 1, __ATOMIC_RELAXED);
	}
	if (get)
		return get(dev, ctx);
	PFN_cuCtxPushCurrent_v2 fpush = (PFN_cuCtxPushCurrent_v2)plain(LIB_CUDA, "cuCtxPushCurrent_v2", &push);
	PFN_cuCtxPopCurrent_v2 fpop = (PFN_cuCtxPopCurrent_v2)plain(LIB_CUDA, "cuCtxPopCurrent_v2", &pop);
	if (!fpush || !fpop)
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = fpush(ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = vgpu_cu_ctx_get_device(dev);
	CUcontext popped;
	fpop(&popped);
	return rc;
}

CUresult vgpu_cu_device_attr(int *value, int attr, CUdevice dev)
{
	PLAIN(LIB_CUDA, "cuDeviceGetAttribute", CUresult(*)(int *, int, CUdevice), CUDA_ERROR_NOT_FOUND,
	      value, attr, dev);
}

CUresult vgpu_cu_device_uuid(CUdevice dev, CUuuid *uuid)
{
	/* The bare ABI gives the physical GPU's UUID, which is what NVML and the
	 * limits file name; _v2 would give a MIG instance's. */
	static void *v1, *v2;
	CUresult (*f)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))plain(LIB_CUDA, "cuDeviceGetUuid", &v1);
	if (!f)
		f = (CUresult(*)(CUuuid *, CUdevice))plain(LIB_CUDA, "cuDeviceGetUuid_v2", &v2);
	return f ? f(uuid, dev) : CUDA_ERROR_NOT_FOUND;
}

nvmlReturn_t vgpu_nvml_init(void)
{
	return vgpu_nvml_usable() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t vgpu_nvml_device_uuid(nvmlDevice_t dev, char *buf, unsigned len)
{
	/* A handle the program got from the NVML it loaded: asked of that one. */
	static void *cache;
	void *p = __atomic_load_n(&cache, __ATOMIC_ACQUIRE);
	if (!p) {
		void *h = vgpu_lib_handle(LIB_NVML);
		if (h && (p = vgpu_real_dlsym(h, "nvmlDeviceGetUUID")))
			__atomic_store_n(&cache, p, __ATOMIC_RELEASE);
	}
	return p ? ((nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))p)(dev, buf, len) : NVML_ERROR_FUNCTION_NOT_FOUND;
}

nvmlReturn_t vgpu_nvml_handle_by_uuid(const char *uuid, nvmlDevice_t *dev)
{
	PLAIN(LIB_NVML, "nvmlDeviceGetHandleByUUID", nvmlReturn_t(*)(const char *, nvmlDevice_t *),
	      NVML_ERROR_FUNCTION_NOT_FOUND, uuid, dev);
}

nvmlReturn_t vgpu_nvml_process_utilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
					   unsigned *count, unsigned long long since)
{
	PLAIN(LIB_NVML, "nvmlDeviceGetProcessUtilization",
	      nvmlReturn_t(*)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned *, unsigned long long),
	      NVML_ERROR_FUNCTION_NOT_FOUND, dev, s, count, since);
}

nvmlReturn_t vgpu_nvml_compute_procs(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out)
{
	/* The bare name is the v1 ABI (16-byte records), present in every NVML. */
	PLAIN(LIB_NVML, "nvmlDeviceGetComputeRunningProcesses",
	      nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *), NVML_ERROR_FUNCTION_NOT_FOUND,
	      dev, count, out);
}
