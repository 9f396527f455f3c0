/*
 * The pre-3.2 ("v1") ABIs still exported under the bare names: cuMemAlloc,
 * cuMemAllocPitch, cuMemFree, cuArrayCreate, cuArray3DCreate. 32-bit sizes
 * and a 32-bit CUdeviceptr_v1. A program linked before CUDA 3.2, a dlsym of
 * the bare name, or cuGetProcAddress with a cudaVersion below 3020 reaches
 * them; uncounted they would be a way around the quota. Each counts like
 * its _v2 twin, under the zero-extended address, so either free finds it.
 */
#include "glibc_compat.h"

#include "common.h"
#include "mem.h"
#include "quota.h"
#include "real.h"
#include "track.h"

#define REFUSED CUDA_ERROR_OUT_OF_MEMORY

VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemAlloc)(dptr, bytes);
	return vgpu_mem_settle(rc, go, TRACK_PTR, dptr ? *dptr : 0, bytes, idx);
}

VGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
				     unsigned int height, unsigned int elem)
{
	/* As cuMemAllocPitch_v2: a bound first (pitch alignment is at most 512
	 * bytes), then the real pitch x height. */
	uint64_t est = ((uint64_t)width + 511) / 512 * 512 * height;
	int idx, go = vgpu_mem_charge_current(est, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuMemAllocPitch)(dptr, pitch, width, height, elem);
	if (go != GO_COUNTED)
		return rc;
	if (rc != CUDA_SUCCESS || !pitch)
		return vgpu_mem_settle(rc, go, TRACK_PTR, dptr ? *dptr : 0, est, idx);
	uint64_t real = (uint64_t)*pitch * height;
	if (real > est) {
		if (vgpu_mem_charge_index(idx, real - est) != GO_COUNTED) {
			vgpu_quota_uncharge(idx, est);
			NEXT(cuMemFree)(*dptr);
			*dptr = 0;
			return REFUSED;
		}
	} else {
		vgpu_quota_uncharge(idx, est - real);
	}
	return vgpu_mem_settle(rc, go, TRACK_PTR, *dptr, real, idx);
}

static CUresult do_free(void *a)
{
	return NEXT(cuMemFree)(*(CUdeviceptr_v1 *)a);
}

VGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p)
{
	return vgpu_mem_uncharge(TRACK_PTR, p, do_free, &p);
}

VGPU_EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *a)
{
	uint64_t bytes = a ? vgpu_array_bytes(a->Width, a->Height, 0, a->Format, a->NumChannels) : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuArrayCreate)(arr, a);
	return vgpu_mem_settle(rc, go, TRACK_ARRAY, arr ? (uint64_t)(uintptr_t)*arr : 0, bytes, idx);
}

VGPU_EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a)
{
	uint64_t bytes = a ? vgpu_array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels) : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
	if (go == GO_REFUSE)
		return REFUSED;
	CUresult rc = NEXT(cuArray3DCreate)(arr, a);
	return vgpu_mem_settle(rc, go, TRACK_ARRAY, arr ? (uint64_t)(uintptr_t)*arr : 0, bytes, idx);
}
