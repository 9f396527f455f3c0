/*
 * Device memory the process holds without allocating it through the
 * allocation calls: imported external memory and memory bound to multicast
 * objects. IPC-imported memory is deliberately not here (see the README's
 * accounting section): the exporter holds it and is charged for it.
 *
 * External memory (cuImportExternalMemory: a Vulkan, D3D or NvSciBuf
 * allocation) is device memory another API allocated, which the shim never
 * sees; the import holds a reference to it until cuDestroyExternalMemory,
 * whatever the other API does meanwhile. So the import is charged its size
 * on the current context's device, before the driver is asked, and the
 * destroy gives it back. The buffers and arrays mapped from it
 * (cuExternalMemoryGetMappedBuffer / ...MipmappedArray) are views of that
 * memory: not charged again, and their cuMemFree gives nothing back.
 *
 * Multicast objects own no device memory; memory is bound to them per
 * device. A cuMemCreate allocation bound to one is held like a mapping: a
 * cuMemRelease while bound leaves it counted until cuMulticastUnbind.
 */
#include "glibc_compat.h"

#include <pthread.h>
#include <stdlib.h>

#include "mem.h"
#include "shim.h"
#include "track.h"

/* ---- external memory ------------------------------------------------------------------------ */

VGPU_EXPORT CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc)
{
	uint64_t bytes = desc ? desc->size : 0;
	int idx, go = vgpu_mem_admit_current(bytes, &idx);
	if (go == GO_REFUSE)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = NEXT(cuImportExternalMemory)(ext, desc);
	return vgpu_mem_settle(rc, go, TRACK_EXTMEM, ext ? (uint64_t)(uintptr_t)*ext : 0, bytes, idx);
}

static CUresult do_destroy(void *a)
{
	return NEXT(cuDestroyExternalMemory)(*(CUexternalMemory *)a);
}

VGPU_EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory ext)
{
	return vgpu_mem_release(TRACK_EXTMEM, (uint64_t)(uintptr_t)ext, do_destroy, &ext);
}

/* ---- multicast binds --------------------------------------------------------------------------- */

/* A tracked cuMemCreate handle bound to a multicast object, for the unbind. */
struct bind {
	struct bind *next;
	CUmemGenericAllocationHandle mc, mem;
	CUdevice dev; /* -1: not known (then any unbind of the range releases it) */
	size_t off, size;
};
static struct bind *binds;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef CUresult (*props_fn)(CUmemAllocationProp *, CUmemGenericAllocationHandle);

/* The device a cuMemCreate handle's memory is on; -1 when the driver cannot say. */
static CUdevice handle_device(CUmemGenericAllocationHandle h)
{
	static props_fn f;
	if (!f) {
		void *lib = vgpu_lib_handle(LIB_CUDA);
		f = lib ? (props_fn)vgpu_real_dlsym(lib, "cuMemGetAllocationPropertiesFromHandle") : NULL;
	}
	CUmemAllocationProp p;
	if (!f || f(&p, h) != CUDA_SUCCESS || p.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return -1;
	return p.location.id;
}

/* After a successful bind of handle mem: it now has one more holder. */
static void bound(CUmemGenericAllocationHandle mc, CUdevice dev, size_t off, size_t size,
		  CUmemGenericAllocationHandle mem)
{
	if (vgpu.mode != VGPU_ENFORCE || vgpu_track_handle_adjust(mem, 0, 1, NULL) != 0)
		return; /* not memory the shim counts */
	struct bind *b = malloc(sizeof(*b));
	if (!b) {
		vgpu_track_handle_adjust(mem, 0, -1, NULL); /* cannot remember it: count as unbound */
		return;
	}
	*b = (struct bind){NULL, mc, mem, dev < 0 ? handle_device(mem) : dev, off, size};
	pthread_mutex_lock(&mu);
	b->next = binds;
	binds = b;
	pthread_mutex_unlock(&mu);
}

VGPU_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_off, CUmemGenericAllocationHandle mem,
					size_t mem_off, size_t size, unsigned long long flags)
{
	CUresult rc = NEXT(cuMulticastBindMem)(mc, mc_off, mem, mem_off, size, flags);
	if (rc == CUDA_SUCCESS)
		bound(mc, -1, mc_off, size, mem);
	return rc;
}

VGPU_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off,
					   CUmemGenericAllocationHandle mem, size_t mem_off, size_t size,
					   unsigned long long flags)
{
	CUresult rc = NEXT(cuMulticastBindMem_v2)(mc, dev, mc_off, mem, mem_off, size, flags);
	if (rc == CUDA_SUCCESS)
		bound(mc, dev, mc_off, size, mem);
	return rc;
}

/* The cuMemCreate handle mapped at va, if any (pool memory has none: its
 * pool holds it and is charged for it). */
static int handle_at(CUdeviceptr va, CUmemGenericAllocationHandle *h)
{
	CUresult (*retain)(CUmemGenericAllocationHandle *, void *) = vgpu_lib_sym(HOOK_cuMemRetainAllocationHandle);
	CUresult (*rel)(CUmemGenericAllocationHandle) = vgpu_lib_sym(HOOK_cuMemRelease);
	if (!retain || !rel || retain(h, (void *)(uintptr_t)va) != CUDA_SUCCESS)
		return 0;
	rel(*h); /* the reference just taken, straight to the driver: it was never counted */
	return 1;
}

VGPU_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_off, CUdeviceptr va, size_t size,
					 unsigned long long flags)
{
	CUresult rc = NEXT(cuMulticastBindAddr)(mc, mc_off, va, size, flags);
	CUmemGenericAllocationHandle h;
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE && handle_at(va, &h))
		bound(mc, -1, mc_off, size, h);
	return rc;
}

VGPU_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off,
					    CUdeviceptr va, size_t size, unsigned long long flags)
{
	CUresult rc = NEXT(cuMulticastBindAddr_v2)(mc, dev, mc_off, va, size, flags);
	CUmemGenericAllocationHandle h;
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE && handle_at(va, &h))
		bound(mc, dev, mc_off, size, h);
	return rc;
}

VGPU_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off, size_t size)
{
	CUresult rc = NEXT(cuMulticastUnbind)(mc, dev, mc_off, size);
	if (rc != CUDA_SUCCESS)
		return rc;
	/* Every bind of dev that starts in the unbound range goes. */
	struct bind *gone = NULL;
	pthread_mutex_lock(&mu);
	for (struct bind **pp = &binds; *pp;) {
		struct bind *b = *pp;
		if (b->mc == mc && (b->dev == dev || b->dev < 0) && b->off >= mc_off && b->off - mc_off < size) {
			*pp = b->next;
			b->next = gone;
			gone = b;
		} else {
			pp = &b->next;
		}
	}
	pthread_mutex_unlock(&mu);
	while (gone) {
		struct bind *b = gone;
		struct vgpu_tracked t;
		gone = b->next;
		if (vgpu_track_handle_adjust(b->mem, 0, -1, &t) == 1)
			vgpu_unreserve(t.idx, t.bytes); /* released meanwhile: this was its last holder */
		free(b);
	}
	return rc;
}

void vgpu_import_after_fork(void)
{
	/* The child holds none of the parent's binds; entries leak on purpose. */
	pthread_mutex_init(&mu, NULL);
	binds = NULL;
}
