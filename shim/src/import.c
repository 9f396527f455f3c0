/*
 * Device memory the process holds without allocating it through the
 * allocation calls: imported external memory, IPC-imported memory and memory
 * bound to multicast objects.
 *
 * IPC-imported memory (cuIpcOpenMemHandle, and a stream-ordered pool's
 * pointer imported with cuMemPoolImportPointer) is charged to the importer too,
 * its size on the device it lives on, refused (the import closed again) over
 * the quota. The driver keeps an exported allocation alive while any import
 * of it is open, after the exporter's cuMemFree and after the exporter's
 * exit (seen on an H200, driver 580: validate.sh check 10), so an import is
 * a reference of its own, as an imported VMM handle is. Charging only the
 * exporter let a container hold memory nothing counted: allocate, export,
 * import in a sibling, free in the exporter, again. A pool import is freed
 * with cuMemFree[Async] in the importer; the driver requires that before the
 * exporter's free, as it does the close of an IPC import before the
 * exporter's cuMemFree, which the 580 driver does not enforce: a tenant need
 * not keep either rule, so both are charged alike. Marks that would let a
 * holder skip its charge while another pays could be forged by any process
 * that can open the limits file; a charge each holder takes for itself
 * cannot. So while both hold it the block counts twice (an overestimate, as
 * for VMM imports and external memory).
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
 * VMM memory imported from a shareable handle (cuMemImportFromShareableHandle:
 * another process's cuMemCreate allocation, exported as a file descriptor or
 * fabric handle) is charged to the importer, unlike IPC-imported memory: the
 * rule is the same, who holds the memory. An IPC import holds nothing (the
 * exporter must keep its allocation until every import is closed), but an
 * imported VMM handle is a reference of its own: the allocation lives until
 * every handle in every process is released and unmapped, so the exporter may
 * release its handle and the memory lives on through the importer. Both are
 * charged while both hold it (an overestimate, as for external memory). The
 * import does not say how large the allocation is: the handle is charged at
 * its first cuMemMap, the mapped size (refused there over the quota), on the
 * device of the context current at the import, and from then on counted like
 * a cuMemCreate handle (released while mapped, it stays counted until the
 * unmap). An imported handle released without ever being mapped costs
 * nothing: it can be neither used nor mapped after that.
 *
 * Sparse CUDA arrays own no device memory either; tiles of cuMemCreate
 * allocations mapped into them (cuMemMapArrayAsync) are held like mappings.
 *
 * Multicast objects own no device memory; memory is bound to them per
 * device. A cuMemCreate allocation bound to one is held like a mapping: a
 * cuMemRelease while bound leaves it counted until cuMulticastUnbind.
 */
#include "glibc_compat.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core.h"
#include "import.h"
#include "lifecycle.h"
#include "log.h"
#include "mem.h"
#include "quota.h"
#include "real.h"
#include "track.h"

/* ---- external memory ------------------------------------------------------------------------ */

VGPU_EXPORT CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc)
{
	uint64_t bytes = desc ? desc->size : 0;
	int idx, go = vgpu_mem_charge_current(bytes, &idx);
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
	return vgpu_mem_uncharge(TRACK_EXTMEM, (uint64_t)(uintptr_t)ext, do_destroy, &ext);
}

/* ---- IPC-imported memory ------------------------------------------------------------------------ */

#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

/* Size and limits index of the allocation an imported pointer maps: 0, or -1
 * when the driver cannot say (the import is then not counted, said once). */
static int ipc_extent(CUdeviceptr p, uint64_t *bytes, int *idx)
{
	static CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
	static CUresult (*attr)(void *, int, CUdeviceptr);
	void *lib = vgpu_lib_handle(LIB_CUDA);
	if (!range && lib)
		range = (CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr))vgpu_real_dlsym(lib, "cuMemGetAddressRange_v2");
	if (!attr && lib)
		attr = (CUresult(*)(void *, int, CUdeviceptr))vgpu_real_dlsym(lib, "cuPointerGetAttribute");
	CUdeviceptr base = 0;
	size_t size = 0;
	if (!range || range(&base, &size, p) != CUDA_SUCCESS || !size)
		return -1;
	int ord = -1;
	*idx = attr && attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS && ord >= 0
		       ? vgpu_device_index(ord)
		       : vgpu_current_index(NULL);
	*bytes = size;
	return 0;
}

/* After a successful import: charges it (kind), or undoes it over the quota. */
static CUresult ipc_opened(CUresult rc, CUdeviceptr *p, int kind, CUresult (*undo)(CUdeviceptr))
{
	static int warned;
	uint64_t bytes;
	int idx;
	if (rc != CUDA_SUCCESS || !p || vgpu.mode == VGPU_PASSTHROUGH)
		return rc;
	if (ipc_extent(*p, &bytes, &idx) != 0) {
		if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
			LOGW("IPC-imported memory at 0x%llx: the driver does not say its size; imports are not counted",
			     (unsigned long long)*p);
		return rc;
	}
	int go = vgpu_mem_charge_index(idx, bytes);
	if (go == GO_REFUSE) {
		undo(*p);
		*p = 0;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return vgpu_mem_settle(rc, go, kind, *p, bytes, idx);
}

static CUresult ipc_close(CUdeviceptr p)
{
	return NEXT(cuIpcCloseMemHandle)(p);
}

VGPU_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	vgpu_init();
	return ipc_opened(NEXT(cuIpcOpenMemHandle)(p, h, flags), p, TRACK_IPC, ipc_close);
}

VGPU_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	vgpu_init();
	return ipc_opened(NEXT(cuIpcOpenMemHandle_v2)(p, h, flags), p, TRACK_IPC, ipc_close);
}

static CUresult do_ipc_close(void *a)
{
	return NEXT(cuIpcCloseMemHandle)(*(CUdeviceptr *)a);
}

VGPU_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	return vgpu_mem_uncharge(TRACK_IPC, p, do_ipc_close, &p);
}

/* ---- pool pointers imported from another process ----------------------------------------------- */

static CUresult pool_import_free(CUdeviceptr p)
{
	return NEXT(cuMemFree_v2)(p);
}

/* Freed by cuMemFree[Async] (mem.c finds the entry when the pointer is none of its own). */
VGPU_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *data)
{
	vgpu_init();
	return ipc_opened(NEXT(cuMemPoolImportPointer)(p, pool, data), p, TRACK_POOL_IMPORT, pool_import_free);
}

/* ---- VMM handles imported from another process ---------------------------------------------- */

struct vimp {
	struct vimp *next;
	CUmemGenericAllocationHandle h;
	int idx;
};
static struct vimp *vimps; /* imported, not mapped yet */
static pthread_mutex_t vmu = PTHREAD_MUTEX_INITIALIZER;

VGPU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type)
{
	vgpu_init();
	CUresult rc = NEXT(cuMemImportFromShareableHandle)(h, os_handle, type);
	if (rc != CUDA_SUCCESS || !h || vgpu.mode != VGPU_ENFORCE)
		return rc;
	struct vimp *v = malloc(sizeof(*v));
	if (!v) {
		LOGW("imported VMM handle %llu: out of host memory to remember it; it is not counted",
		     (unsigned long long)*h);
		return rc;
	}
	v->h = *h;
	v->idx = vgpu_current_index(NULL);
	pthread_mutex_lock(&vmu);
	v->next = vimps;
	vimps = v;
	pthread_mutex_unlock(&vmu);
	return rc;
}

/* Takes imported handle h off the list: 1 (and its index) when it was there. */
static int vimp_take(uint64_t h, int *idx)
{
	pthread_mutex_lock(&vmu);
	for (struct vimp **pp = &vimps; *pp; pp = &(*pp)->next)
		if ((*pp)->h == h) {
			struct vimp *v = *pp;
			*pp = v->next;
			pthread_mutex_unlock(&vmu);
			*idx = v->idx;
			free(v);
			return 1;
		}
	pthread_mutex_unlock(&vmu);
	return 0;
}

static void vimp_put(uint64_t h, int idx)
{
	struct vimp *v = malloc(sizeof(*v));
	if (!v)
		return;
	*v = (struct vimp){NULL, h, idx};
	pthread_mutex_lock(&vmu);
	v->next = vimps;
	vimps = v;
	pthread_mutex_unlock(&vmu);
}

int vgpu_vmm_import_map_begin(uint64_t h, uint64_t size, int *idx)
{
	if (!__atomic_load_n(&vimps, __ATOMIC_RELAXED) || !vimp_take(h, idx))
		return GO_FORWARD;
	/* Off the list while the driver maps: a second map of h meanwhile is not charged twice. */
	int go = vgpu_mem_charge_index(*idx, size);
	if (go != GO_COUNTED)
		vimp_put(h, *idx);
	return go;
}

void vgpu_vmm_import_map_end(uint64_t h, CUresult rc, int go, uint64_t size, int idx)
{
	if (go != GO_COUNTED)
		return;
	CUcontext ctx = NULL;
	vgpu_cu_ctx_get_current(&ctx);
	if (rc == CUDA_SUCCESS && vgpu_track_add(TRACK_HANDLE, h, size, idx, vgpu_ctx_owner(ctx)) == 0)
		return;
	vgpu_quota_uncharge(idx, size);
	if (rc != CUDA_SUCCESS)
		vimp_put(h, idx);
}

void vgpu_vmm_import_release(uint64_t h)
{
	int idx;
	if (__atomic_load_n(&vimps, __ATOMIC_RELAXED))
		vimp_take(h, &idx);
}

/* ---- multicast binds --------------------------------------------------------------------------- */

/* A tracked cuMemCreate handle bound to a multicast object, for the unbind. */
struct bind {
	struct bind *next;
	CUmemGenericAllocationHandle mc, mem;
	CUdevice dev; /* -1: not known (asked again at each unbind) */
	size_t off, size;
	uint64_t unbound; /* dev -1: the devices (< 64) whose unbind of the range came since */
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

/* How many devices the process sees; 0 when the driver cannot say. */
static int device_count(void)
{
	static CUresult (*f)(int *);
	if (!f) {
		void *lib = vgpu_lib_handle(LIB_CUDA);
		f = lib ? (CUresult(*)(int *))vgpu_real_dlsym(lib, "cuDeviceGetCount") : NULL;
	}
	int n = 0;
	return f && f(&n) == CUDA_SUCCESS && n > 0 ? (n < 64 ? n : 64) : 0;
}

/* Handle h has one holder (mapping or bind) fewer: when that was its last,
 * after its release, its bytes go back. */
static void holder_gone(uint64_t h)
{
	struct vgpu_tracked t;
	if (vgpu_track_handle_adjust(h, 0, -1, &t) == 1)
		vgpu_quota_uncharge(t.idx, t.bytes); /* released meanwhile: this was its last holder */
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
	*b = (struct bind){NULL, mc, mem, dev < 0 ? handle_device(mem) : dev, off, size, 0};
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
	/* Every bind of dev that starts in the unbound range goes. One whose
	 * device the driver could not say is asked again; still unknown, it
	 * goes at the last unbind that can concern it, once every device has
	 * unbound the range (an unbind of another device must not give back
	 * memory that stays bound). */
	int ndev = device_count();
	CUmemGenericAllocationHandle ask[16];
	CUdevice got[16];
	int nask = 0;
	pthread_mutex_lock(&mu);
	for (struct bind *b = binds; b && nask < 16; b = b->next)
		if (b->mc == mc && b->dev < 0 && b->off >= mc_off && b->off - mc_off < size)
			ask[nask++] = b->mem;
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < nask; i++) /* the driver is asked with no lock held */
		got[i] = handle_device(ask[i]);
	struct bind *gone = NULL;
	pthread_mutex_lock(&mu);
	for (struct bind **pp = &binds; *pp;) {
		struct bind *b = *pp;
		int in = b->mc == mc && b->off >= mc_off && b->off - mc_off < size;
		for (int i = 0; in && b->dev < 0 && i < nask; i++)
			if (ask[i] == b->mem)
				b->dev = got[i];
		if (in && b->dev < 0 && dev >= 0 && dev < 64)
			b->unbound |= 1ull << dev;
		if (in && (b->dev == dev || (b->dev < 0 && ndev > 0 && __builtin_popcountll(b->unbound) >= ndev))) {
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
		gone = b->next;
		holder_gone(b->mem);
		free(b);
	}
	return rc;
}

/* ---- memory mapped into sparse arrays ------------------------------------------------------------ */

/*
 * A sparse CUDA array (or one with deferred mapping) holds no memory of its
 * own (mem.c charges it nothing): tiles of cuMemCreate allocations are mapped
 * into it with cuMemMapArrayAsync. Such an allocation lives while it is
 * mapped there, after its cuMemRelease, as after a cuMemMap: each map entry
 * is one more mapping of its handle until an unmap entry names the same
 * array and subresource, or the array is destroyed. An unmap naming a region
 * no map named (a part of one, or several) cannot say which handle it
 * frees: those stay counted until the array goes. Counted at the call, not
 * when the stream gets there: a mapping still queued is counted already.
 */
struct amap {
	struct amap *next;
	void *res;
	int sub_type;
	unsigned int sub[8];
	uint64_t h;
};

static struct amap *amaps;
static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;

static void amap_key(const CUarrayMapInfo *m, struct amap *k)
{
	k->res = m->resource;
	k->sub_type = m->subresourceType;
	memcpy(k->sub, &m->subresource, sizeof(k->sub));
}

static void array_mapped(const CUarrayMapInfo *list, unsigned n)
{
	static int warned;
	for (unsigned i = 0; i < n; i++) {
		const CUarrayMapInfo *m = &list[i];
		struct amap k;
		amap_key(m, &k);
		if (m->memOperationType == CU_MEM_OPERATION_TYPE_MAP && m->memHandleType == CU_MEM_HANDLE_TYPE_GENERIC) {
			struct amap *e = malloc(sizeof(*e));
			if (!e || vgpu_track_handle_adjust(m->memHandle, 0, 1, NULL) != 0) {
				free(e); /* not a handle of ours (or no memory): nothing to keep */
				continue;
			}
			*e = k;
			e->h = m->memHandle;
			pthread_mutex_lock(&amu);
			e->next = amaps;
			amaps = e;
			pthread_mutex_unlock(&amu);
		} else if (m->memOperationType == CU_MEM_OPERATION_TYPE_UNMAP) {
			struct amap *gone = NULL;
			pthread_mutex_lock(&amu);
			for (struct amap **pp = &amaps; *pp; pp = &(*pp)->next)
				if ((*pp)->res == k.res && (*pp)->sub_type == k.sub_type &&
				    !memcmp((*pp)->sub, k.sub, sizeof(k.sub))) {
					gone = *pp;
					*pp = gone->next;
					break;
				}
			pthread_mutex_unlock(&amu);
			if (gone) {
				holder_gone(gone->h);
				free(gone);
			} else if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
				LOGD("sparse array %p: an unmap that no single map named; what is mapped there stays "
				     "counted until the array is destroyed",
				     m->resource);
			}
		}
	}
}

static CUresult map_array(CUresult rc, const CUarrayMapInfo *list, unsigned n)
{
	if (rc == CUDA_SUCCESS && list && vgpu.mode == VGPU_ENFORCE)
		array_mapped(list, n);
	return rc;
}

VGPU_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned n, CUstream s)
{
	vgpu_init();
	return map_array(NEXT(cuMemMapArrayAsync)(list, n, s), list, n);
}

VGPU_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned n, CUstream s)
{
	vgpu_init();
	return map_array(NEXT(cuMemMapArrayAsync_ptsz)(list, n, s), list, n);
}

void vgpu_array_maps_gone(void *res)
{
	struct amap *gone = NULL;
	pthread_mutex_lock(&amu);
	for (struct amap **pp = &amaps; *pp;) {
		struct amap *e = *pp;
		if (e->res == res) {
			*pp = e->next;
			e->next = gone;
			gone = e;
		} else {
			pp = &e->next;
		}
	}
	pthread_mutex_unlock(&amu);
	while (gone) {
		struct amap *e = gone;
		gone = e->next;
		holder_gone(e->h);
		free(e);
	}
}

static void after_fork(void)
{
	/* The child holds none of the parent's binds, imported handles or array
	 * mappings; entries leak on purpose. */
	pthread_mutex_init(&mu, NULL);
	binds = NULL;
	pthread_mutex_init(&vmu, NULL);
	vimps = NULL;
	pthread_mutex_init(&amu, NULL);
	amaps = NULL;
}

VGPU_LIFECYCLE(import, .order = VGPU_ORDER_IMPORT, .after_fork = after_fork);
