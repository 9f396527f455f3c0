/*
 * real.c: the libraries the shim wraps, opened lazily; the next
 * implementation of each hook; the plain driver and NVML calls the shim
 * makes for itself.
 */
#ifndef VGPU_REAL_H
#define VGPU_REAL_H

#include "common.h"
#include "protos.h"

enum vgpu_lib { LIB_CUDA = 0, LIB_NVML = 1 };

enum vgpu_hook_id {
#define HOOK(lib, name, base, ver, ptsz) HOOK_##name,
#include "hooks.def"
#undef HOOK
	HOOK_COUNT
};

struct vgpu_hook {
	const char *name;
	const char *base;
	int lib;
	int version;
	int ptsz;
};
extern const struct vgpu_hook vgpu_hooks[HOOK_COUNT];
/* Our exported wrapper for each hook (wrappers.c). */
extern void *const vgpu_wrappers[HOOK_COUNT];

/* glibc's dlsym (the GLIBC_2.2.5 one, or the next interposer's). */
void *vgpu_real_dlsym(void *handle, const char *name);
/* The dlsym to forward to, for a tail call that keeps the caller's return address. */
void *(*vgpu_real_dlsym_fn(void))(void *, const char *);
#define vgpu_real_dlsym_tail(h, n) (vgpu_real_dlsym_fn()((h), (n)))
/* The real library's own definition of a hooked name (not a stacked interposer's). */
void *vgpu_lib_sym(int id);
/* Handle of the real library, opened on first use; NULL if it cannot be. */
void *vgpu_lib_handle(int lib);
/* The function a wrapper forwards to: the library's own definition. */
void *vgpu_next(int id);
/* Hook id of an exported name, or -1. */
int vgpu_hook_find(const char *name);
/* Whether addr lies in the real libcuda/libnvidia-ml (driver-internal calls). */
int vgpu_addr_in_driver(const void *addr);
/* Whether addr lies in this library. */
int vgpu_addr_in_self(const void *addr);

/* Forwarding helper: typed pointer to the next implementation of a hook. */
/* Inline: a launch at cores = 100 costs only this and a flag test. */
extern void *vgpu_next_fn[HOOK_COUNT];
static inline void *vgpu_next_fast(int id)
{
	void *p = __atomic_load_n(&vgpu_next_fn[id], __ATOMIC_ACQUIRE);
	return likely(p) ? p : vgpu_next(id);
}
#define NEXT(name) ((__typeof__(&name))vgpu_next_fast(HOOK_##name))

/* Plain (non-hooked) driver calls the shim makes for itself. */
CUresult vgpu_cu_ctx_get_device(CUdevice *dev);
CUresult vgpu_cu_device_uuid(CUdevice dev, CUuuid *uuid);
CUresult vgpu_cu_device_attr(int *value, int attr, CUdevice dev);
CUresult vgpu_cu_ctx_get_current(CUcontext *ctx);
CUresult vgpu_cu_ctx_set_current(CUcontext ctx);
/* cuCtxFromGreenCtx; CUDA_ERROR_NOT_FOUND when the driver lacks it. */
CUresult vgpu_cu_ctx_from_green(CUcontext *ctx, CUgreenCtx g);
/* The context a (non-special) stream belongs to; CUDA_ERROR_NOT_FOUND when
 * the driver lacks cuStreamGetCtx. */
CUresult vgpu_cu_stream_get_ctx(CUstream s, CUcontext *ctx);
/* The device of any context, current or not. */
CUresult vgpu_cu_ctx_device(CUcontext ctx, CUdevice *dev);
/* The UUID of a handle the program got from the NVML it loaded (the reporting hooks). */
nvmlReturn_t vgpu_nvml_device_uuid(nvmlDevice_t dev, char *buf, unsigned len);
/* The rest are the shim's own NVML reads, from the libnvidia-ml.so.1 beside the
 * driver's libcuda.so.1 only (never the loader's search, which the tenant steers). */
/* Whether that NVML is there and nvmlInit_v2 succeeded (tried once per process;
 * when not, says once at warn what the shim does instead). */
int vgpu_nvml_usable(void);
/* NVML has no handle for a GPU of the limits file: says so once, as above. */
void vgpu_nvml_unknown_gpu(const char *uuid);
nvmlReturn_t vgpu_nvml_handle_by_uuid(const char *uuid, nvmlDevice_t *dev);
nvmlReturn_t vgpu_nvml_process_utilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
					   unsigned *count, unsigned long long since);
nvmlReturn_t vgpu_nvml_compute_procs(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out);
nvmlReturn_t vgpu_nvml_init(void);

#endif
