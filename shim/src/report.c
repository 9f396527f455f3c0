/*
 * Reported memory (Contract 7): inside a vGPU container, per
 * GPU, total = min(limit, real total), used = what the container's processes
 * hold (from the ledger: all of them, not just the caller), free =
 * min(total - used, real free), saturating, and never more than this process
 * can get: the other processes' unused leases (quota.c) are neither used
 * nor free to it (NVML v2 reports them as reserved). cuMemGetInfo_v2,
 * cuDeviceTotalMem_v2 and both nvmlDeviceGetMemoryInfo ABIs agree, so
 * nvidia-smi, PyTorch's mem_get_info and TensorFlow plan within the slice.
 * NULL out-pointers are accepted (OptiX passes NULL for free). The pre-3.2
 * cuMemGetInfo and cuDeviceTotalMem report the same, in 32 bits.
 */
#include "glibc_compat.h"

#include <limits.h>

#include "common.h"
#include "core.h"
#include "quota.h"
#include "real.h"

struct slice {
	uint64_t total, used, free, leased; /* leased: others' unused leases, within total - used */
};

/* Rewrites real (total, free) for limits index idx. Returns 0 when idx has no memory limit. */
static int slice_of(int idx, uint64_t real_total, uint64_t real_free, struct slice *s)
{
	uint64_t limit = vgpu.limits.gpu[idx].memory;
	if (!limit)
		return 0;
	s->total = limit < real_total ? limit : real_total;
	uint64_t committed;
	vgpu_quota_view(idx, &s->used, &committed);
	s->free = s->total > committed ? s->total - committed : 0;
	uint64_t room = s->total > s->used ? s->total - s->used : 0;
	s->leased = room - (s->free < room ? s->free : room);
	if (s->free > real_free)
		s->free = real_free;
	return 1;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
	vgpu_init();
	size_t f = 0, t = 0;
	CUresult rc = NEXT(cuMemGetInfo_v2)(&f, &t);
	if (rc != CUDA_SUCCESS)
		return rc;
	struct slice s;
	if (vgpu.mode == VGPU_FAIL_CLOSED) {
		f = 0; /* nothing can be allocated: do not invite attempts */
	} else if (vgpu.mode == VGPU_ENFORCE) {
		int idx = vgpu_current_index(NULL);
		if (idx >= 0 && slice_of(idx, t, f, &s)) {
			f = s.free;
			t = s.total;
		}
	}
	if (free_out)
		*free_out = f;
	if (total_out)
		*total_out = t;
	return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	vgpu_init();
	CUresult rc = NEXT(cuDeviceTotalMem_v2)(bytes, dev);
	if (rc != CUDA_SUCCESS || !bytes || vgpu.mode != VGPU_ENFORCE)
		return rc;
	int idx = vgpu_device_index(dev);
	uint64_t limit = idx >= 0 ? vgpu.limits.gpu[idx].memory : 0;
	if (limit && limit < *bytes)
		*bytes = limit;
	return rc;
}

/*
 * The pre-3.2 ABIs under the bare names, 32-bit sizes (a dlsym of the bare
 * name, or cuGetProcAddress below 3020): the same slice as the _v2s,
 * saturated at 4 GiB - 1. What the real pre-3.2 entries answer past 4 GiB is
 * unverified (not in the ABI notes); saturating never reports more than the
 * slice.
 */
static unsigned int sat32(uint64_t v)
{
	return v > UINT_MAX ? UINT_MAX : (unsigned int)v;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free_out, unsigned int *total_out)
{
	vgpu_init();
	if (vgpu.mode == VGPU_PASSTHROUGH)
		return NEXT(cuMemGetInfo)(free_out, total_out);
	size_t f = 0, t = 0;
	CUresult rc = cuMemGetInfo_v2(&f, &t);
	if (rc == CUDA_SUCCESS && free_out)
		*free_out = sat32(f);
	if (rc == CUDA_SUCCESS && total_out)
		*total_out = sat32(t);
	return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	vgpu_init();
	if (vgpu.mode == VGPU_PASSTHROUGH || !bytes)
		return NEXT(cuDeviceTotalMem)(bytes, dev); /* the driver's own answer to NULL */
	size_t b = 0;
	CUresult rc = cuDeviceTotalMem_v2(&b, dev);
	if (rc == CUDA_SUCCESS)
		*bytes = sat32(b);
	return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
	vgpu_init();
	nvmlReturn_t rc = NEXT(nvmlDeviceGetMemoryInfo)(dev, m);
	if (rc != NVML_SUCCESS || !m || vgpu.mode != VGPU_ENFORCE)
		return rc;
	struct slice s;
	int idx = vgpu_nvml_index(dev);
	if (idx >= 0 && slice_of(idx, m->total, m->free, &s)) {
		m->total = s.total;
		m->used = s.used;
		m->free = s.free;
	}
	return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
	vgpu_init();
	nvmlReturn_t rc = NEXT(nvmlDeviceGetMemoryInfo_v2)(dev, m);
	if (rc != NVML_SUCCESS || !m || vgpu.mode != VGPU_ENFORCE)
		return rc;
	struct slice s;
	int idx = vgpu_nvml_index(dev);
	if (idx >= 0 && slice_of(idx, m->total, m->free, &s)) {
		/* The driver's reservation is outside the slice: total = reserved +
		 * used + free, reserved being the other processes' unused leases. */
		m->total = s.total;
		m->reserved = s.leased;
		m->used = s.used;
		m->free = s.free;
	}
	return rc;
}
