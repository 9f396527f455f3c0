/*
 * Test program: runs a script of driver operations given on the command line
 * and checks each result, reaching the driver one of three ways:
 *   -m direct  linked against libcuda (calls bind to the preloaded shim)
 *   -m rt12    the cudart 12 way: dlopen("libcuda.so.1") + dlsym of
 *              cuGetProcAddress_v2, then one lookup per symbol with that
 *              symbol's ABI version (-p: the per-thread-default-stream flag)
 *   -m rt11    the cudart 11.3-11.8 way, with the 4-argument cuGetProcAddress
 * NVML is read the way nvidia-smi does: dlopen + dlsym.
 *
 * Operations (SIZE accepts KiB/MiB/GiB suffixes; RC is the expected CUresult,
 * default 0; '-' skips a check). Any mismatch prints "FAIL: ..." and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

/* Direct-link prototypes (the exported ABI names). */
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxRelease(CUdevice);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice);
CUresult cuDevicePrimaryCtxReset(CUdevice);
CUresult cuMemGetInfo(unsigned *, unsigned *);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);
CUresult cuDeviceTotalMem(unsigned *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxCreate(CUcontext *, unsigned, CUdevice);
CUresult cuGLCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuMemMapArrayAsync(CUarrayMapInfo *, unsigned, CUstream);
CUresult cuVDPAUCtxCreate_v2(CUcontext *, unsigned, CUdevice, uint32_t, void *);
CUresult cuCtxDestroy(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuCtxGetDevice(CUdevice *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuDeviceSetMemPool(CUdevice, CUmemoryPool);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			     CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				   unsigned, CUstream, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
					unsigned, CUstream, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuLaunch(CUfunction);
CUresult cuLaunchGrid(CUfunction, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
/* Pools, CUDA 13 pools by location, the pre-3.2 allocation ABIs (the pool and legacy ops). */
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, int);
CUresult cuMemSetMemPool(CUmemLocation *, int, CUmemoryPool);
CUresult cuStreamSynchronize(CUstream);
CUresult cuCtxSynchronize_v2(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuMemAlloc(CUdeviceptr_v1 *, unsigned);
CUresult cuMemAllocPitch(CUdeviceptr_v1 *, unsigned *, unsigned, unsigned, unsigned);
CUresult cuMemFree(CUdeviceptr_v1);
CUresult cuArrayCreate(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
CUresult cuArray3DCreate(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleLoadDataEx(CUmodule *, const void *, unsigned, CUjit_option *, void **);
CUresult cuModuleLoadFatBinary(CUmodule *, const void *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLibraryLoadData(CUlibrary *, const void *, CUjit_option *, void **, unsigned, CUlibraryOption *, void **,
			   unsigned);
CUresult cuLibraryLoadFromFile(CUlibrary *, const char *, CUjit_option *, void **, unsigned, CUlibraryOption *,
			       void **, unsigned);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuLibraryGetModule(CUmodule *, CUlibrary);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);
CUresult cuCtxSetLimit(CUlimit, size_t);
/* IPC (the ipc ops). */
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *, CUdeviceptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
/* Green contexts (the green ops). */
CUresult cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
CUresult cuGreenCtxDestroy(CUgreenCtx);
CUresult cuCtxFromGreenCtx(CUcontext *, CUgreenCtx);
/* External memory and multicast objects (the ext and mc ops). */
CUresult cuImportExternalMemory(CUexternalMemory *, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *);
CUresult cuDestroyExternalMemory(CUexternalMemory);
CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *, CUexternalMemory, const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *);
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *);
CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle, CUdevice);
CUresult cuMulticastBindMem(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t, size_t,
			    unsigned long long);
CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle, CUdevice, size_t, CUmemGenericAllocationHandle, size_t,
			       size_t, unsigned long long);
CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long);
CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle, CUdevice, size_t, CUdeviceptr, size_t,
				unsigned long long);
CUresult cuMulticastUnbind(CUmemGenericAllocationHandle, CUdevice, size_t, size_t);

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*PrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
	CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
	CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*CtxGetDevice)(CUdevice *);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*DeviceGetMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
	CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*ArrayCreate)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
	CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
	CUresult (*ArrayDestroy)(CUarray);
	CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
	CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
	CUresult (*MemGetInfo)(size_t *, size_t *);
	CUresult (*DeviceTotalMem)(size_t *, CUdevice);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
	CUresult (*LaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
					    unsigned, CUstream, void **);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
} api;

/* Loaded modules and libraries (modload), newest last, and the function launchf launches. */
static struct {
	void *h;
	int lib;
} mods[64];
static int nmods;
static CUfunction cur_fn;

static const char *mode = "direct";
static void die(const char *fmt, const char *a, const char *b);

/* ctxcb: the driver's context-creation callback allocates cb_bytes in the new context. */
static unsigned long long cb_bytes;
static void ctx_created(CUcontext c)
{
	CUdeviceptr p;
	(void)c;
	CUresult rc = api.MemAlloc(&p, (size_t)cb_bytes);
	printf("context callback: cuMemAlloc %d\n", rc);
	if (rc != CUDA_SUCCESS)
		die("context callback: cuMemAlloc failed%s%s", "", "");
}
static int ptsz;
static void *libcuda;
static CUresult (*gpa4)(const char *, void **, int, cuuint64_t);
static CUresult (*gpa5)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void die(const char *fmt, const char *a, const char *b)
{
	printf("FAIL: ");
	printf(fmt, a, b);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static void *proc(const char *name, int ver, int stream_call)
{
	void *p = NULL;
	cuuint64_t flags = stream_call && ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
	CUresult rc;
	if (gpa5) {
		CUdriverProcAddressQueryResult st = -1;
		rc = gpa5(name, &p, ver, flags, &st);
		if (rc == CUDA_SUCCESS && !p && st == CU_GET_PROC_ADDRESS_SUCCESS)
			die("cuGetProcAddress_v2(%s): NULL pointer with SUCCESS status%s", name, "");
	} else {
		rc = gpa4(name, &p, ver, flags);
	}
	if (rc != CUDA_SUCCESS || !p)
		die("cannot resolve %s%s", name, "");
	return p;
}

#define P(field, name, ver, s) api.field = (__typeof__(api.field))proc(#name, ver, s)
/* An entry point the script ops resolve when used: the linked symbol in direct mode, else
 * cuGetProcAddress(base, ver) as cudart would. */
#define ENTRY(sym, base, ver, s) (!strcmp(mode, "direct") ? (void *)(sym) : proc(base, ver, s))

static void load(void)
{
	if (!strcmp(mode, "direct")) {
		api.Init = cuInit;
		api.DeviceGet = cuDeviceGet;
		api.PrimaryCtxRetain = cuDevicePrimaryCtxRetain;
		api.PrimaryCtxRelease = cuDevicePrimaryCtxRelease_v2;
		api.CtxSetCurrent = cuCtxSetCurrent;
		api.CtxCreate = cuCtxCreate_v2;
		api.CtxDestroy = cuCtxDestroy_v2;
		api.CtxSynchronize = cuCtxSynchronize;
		api.MemAlloc = cuMemAlloc_v2;
		api.MemAllocManaged = cuMemAllocManaged;
		api.MemAllocPitch = cuMemAllocPitch_v2;
		api.MemAllocAsync = ptsz ? cuMemAllocAsync_ptsz : cuMemAllocAsync;
		api.MemAllocFromPoolAsync = ptsz ? cuMemAllocFromPoolAsync_ptsz : cuMemAllocFromPoolAsync;
		api.MemFree = cuMemFree_v2;
		api.CtxGetDevice = cuCtxGetDevice;
		api.StreamCreate = cuStreamCreate;
		api.MemPoolCreate = cuMemPoolCreate;
		api.DeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool;
		api.DeviceGetMemPool = cuDeviceGetMemPool;
		api.DeviceSetMemPool = cuDeviceSetMemPool;
		api.MemFreeAsync = ptsz ? cuMemFreeAsync_ptsz : cuMemFreeAsync;
		api.MemCreate = cuMemCreate;
		api.MemRelease = cuMemRelease;
		api.MemRetainAllocationHandle = cuMemRetainAllocationHandle;
		api.MemAddressReserve = cuMemAddressReserve;
		api.MemMap = cuMemMap;
		api.MemUnmap = cuMemUnmap;
		api.ArrayCreate = cuArrayCreate_v2;
		api.Array3DCreate = cuArray3DCreate_v2;
		api.ArrayDestroy = cuArrayDestroy;
		api.MipmappedArrayCreate = cuMipmappedArrayCreate;
		api.MipmappedArrayDestroy = cuMipmappedArrayDestroy;
		api.MemGetInfo = cuMemGetInfo_v2;
		api.DeviceTotalMem = cuDeviceTotalMem_v2;
		api.LaunchKernel = ptsz ? cuLaunchKernel_ptsz : cuLaunchKernel;
		api.LaunchKernelEx = ptsz ? cuLaunchKernelEx_ptsz : cuLaunchKernelEx;
		api.LaunchCooperativeKernel = ptsz ? cuLaunchCooperativeKernel_ptsz : cuLaunchCooperativeKernel;
		api.GraphLaunch = ptsz ? cuGraphLaunch_ptsz : cuGraphLaunch;
		gpa5 = cuGetProcAddress_v2; /* for the gpa and calllegacy ops */
		return;
	}
	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!libcuda)
		die("dlopen libcuda.so.1: %s%s", dlerror(), "");
	if (!strcmp(mode, "rt12"))
		gpa5 = dlsym(libcuda, "cuGetProcAddress_v2");
	else if (!strcmp(mode, "rt11"))
		gpa4 = dlsym(libcuda, "cuGetProcAddress");
	else
		die("unknown mode %s%s", mode, "");
	if (!gpa4 && !gpa5)
		die("no cuGetProcAddress in %s%s", mode, "");
	P(Init, cuInit, 2000, 0);
	P(DeviceGet, cuDeviceGet, 2000, 0);
	P(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0);
	P(PrimaryCtxRelease, cuDevicePrimaryCtxRelease, 11000, 0);
	P(CtxSetCurrent, cuCtxSetCurrent, 4000, 0);
	P(CtxCreate, cuCtxCreate, 3020, 0);
	P(CtxDestroy, cuCtxDestroy, 4000, 0);
	P(CtxSynchronize, cuCtxSynchronize, 2000, 0);
	P(MemAlloc, cuMemAlloc, 3020, 0);
	P(MemAllocManaged, cuMemAllocManaged, 6000, 0);
	P(MemAllocPitch, cuMemAllocPitch, 3020, 0);
	P(MemAllocAsync, cuMemAllocAsync, 11020, 1);
	P(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 1);
	P(MemFree, cuMemFree, 3020, 0);
	P(CtxGetDevice, cuCtxGetDevice, 2000, 0);
	P(StreamCreate, cuStreamCreate, 2000, 0);
	P(MemPoolCreate, cuMemPoolCreate, 11020, 0);
	P(DeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, 0);
	P(DeviceGetMemPool, cuDeviceGetMemPool, 11020, 0);
	P(DeviceSetMemPool, cuDeviceSetMemPool, 11020, 0);
	P(MemFreeAsync, cuMemFreeAsync, 11020, 1);
	P(MemCreate, cuMemCreate, 10020, 0);
	P(MemRelease, cuMemRelease, 10020, 0);
	P(MemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0);
	P(MemAddressReserve, cuMemAddressReserve, 10020, 0);
	P(MemMap, cuMemMap, 10020, 0);
	P(MemUnmap, cuMemUnmap, 10020, 0);
	P(ArrayCreate, cuArrayCreate, 3020, 0);
	P(Array3DCreate, cuArray3DCreate, 3020, 0);
	P(ArrayDestroy, cuArrayDestroy, 2000, 0);
	P(MipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0);
	P(MipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0);
	P(MemGetInfo, cuMemGetInfo, 3020, 0);
	P(DeviceTotalMem, cuDeviceTotalMem, 3020, 0);
	P(LaunchKernel, cuLaunchKernel, ptsz ? 7000 : 4000, 1);
	P(LaunchKernelEx, cuLaunchKernelEx, 11060, 1);
	P(LaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 1);
	P(GraphLaunch, cuGraphLaunch, 10000, 1);
}

/* ---- script helpers ---------------------------------------------------------------- */

static unsigned long long size_arg(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (!strncmp(end, "GiB", 3))
		v *= 1073741824.0;
	else if (!strncmp(end, "MiB", 3))
		v *= 1048576.0;
	else if (!strncmp(end, "KiB", 3))
		v *= 1024.0;
	return (unsigned long long)v;
}

static void check_rc(const char *op, CUresult got, const char *want)
{
	int w = want && *want && strcmp(want, "-") ? atoi(want) : 0;
	if (want && !strcmp(want, "-"))
		return;
	if (got != w) {
		char b[64];
		snprintf(b, sizeof(b), "got %d want %d", got, w);
		die("%s: %s", op, b);
	}
}

static void check_val(const char *what, unsigned long long got, const char *want)
{
	if (!want || !*want || !strcmp(want, "-"))
		return;
	unsigned long long w = size_arg(want);
	if (got != w) {
		char b[96];
		snprintf(b, sizeof(b), "got %llu want %llu", got, w);
		die("%s: %s", what, b);
	}
}

enum { A_PTR, A_ASYNC, A_HANDLE, A_ARRAY, A_MIPMAP };
static struct {
	int kind;
	unsigned long long key;
} held[100000];
static int nheld;
static CUstream cur_stream;   /* stream of the async and pool ops (stream / nostream) */
static CUmemoryPool cur_pool; /* pool of the pool op (poolcreate, defpool, curpool / nopool) */

static void hold(int kind, unsigned long long key)
{
	held[nheld].kind = kind;
	held[nheld].key = key;
	nheld++;
}

static CUresult free_last(void)
{
	if (!nheld)
		die("free: nothing held%s%s", "", "");
	nheld--;
	switch (held[nheld].kind) {
	case A_PTR: return api.MemFree(held[nheld].key);
	case A_ASYNC: return api.MemFreeAsync(held[nheld].key, cur_stream);
	case A_HANDLE: return api.MemRelease(held[nheld].key);
	case A_ARRAY: return api.ArrayDestroy((CUarray)(uintptr_t)held[nheld].key);
	default: return api.MipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)held[nheld].key);
	}
}

static CUdeviceptr mapped; /* address of the last map op */

static CUcontext created[64];
static int ncreated;

static void set_ctx(int dev)
{
	CUdevice d;
	CUcontext c;
	check_rc("cuDeviceGet", api.DeviceGet(&d, dev), NULL);
	check_rc("cuDevicePrimaryCtxRetain", api.PrimaryCtxRetain(&c, d), NULL);
	check_rc("cuCtxSetCurrent", api.CtxSetCurrent(c), NULL);
}

static void *thread_alloc(void *arg)
{
	CUdeviceptr p;
	size_t f = 0, t = 0;
	long *rc = arg;
	rc[0] = api.MemAlloc(&p, 1 << 20);
	rc[1] = api.MemGetInfo(&f, &t);
	return NULL;
}

static long long (*busy_fn)(int, int, long long *);

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* launchthreads: one launching thread, flat out until the deadline. */
struct lt_arg {
	CUcontext ctx;
	unsigned grid;
	double until;
	unsigned long launches;
};

static void *lt_thread(void *p)
{
	struct lt_arg *t = p;
	check_rc("cuCtxSetCurrent", api.CtxSetCurrent(t->ctx), NULL); /* a new thread has none */
	while (now_s() < t->until) {
		check_rc("cuLaunchKernel", api.LaunchKernel(NULL, t->grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), NULL);
		t->launches++;
	}
	return NULL;
}

static void launch_once(unsigned grid)
{
	check_rc("cuLaunchKernel", api.LaunchKernel(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), NULL);
	check_rc("cuCtxSynchronize", api.CtxSynchronize(), NULL);
}

static const char *owner(void *p)
{
	Dl_info i;
	if (!p)
		return "NULL";
	if (!dladdr(p, &i) || !i.dli_fname)
		return "?";
	const char *s = strrchr(i.dli_fname, '/');
	return s ? s + 1 : i.dli_fname;
}

static const char *symname(void *p)
{
	Dl_info i;
	return p && dladdr(p, &i) && i.dli_sname ? i.dli_sname : "?";
}

static void run(int argc, char **argv);

/* dlsym as binaries built against glibc < 2.34 reference it. */
extern void *dlsym_2_2_5(void *, const char *);
__asm__(".symver dlsym_2_2_5,dlsym@GLIBC_2.2.5");

/*
 * A program with a SIGBUS handler of its own, for faults in a mapping of its
 * own (ownbus): a thread maps a 1-page file it has truncated to nothing and
 * touches it; the handler counts the fault and maps anonymous memory over the
 * page, and the thread starts over, for as long as asked.
 */
static volatile sig_atomic_t own_faults;
static char *volatile own_page;
static pthread_t own_bus;

static void own_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	char *p = own_page;
	if (p && (char *)si->si_addr >= p && (char *)si->si_addr < p + 4096 &&
	    mmap(p, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p) {
		own_faults++;
		return;
	}
	abort(); /* a fault this handler was not made for */
}

static void *own_bus_thread(void *arg)
{
	long ms = (long)arg;
	char path[] = "/tmp/cudaprog-bus.XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0 || ftruncate(fd, 4096) != 0)
		return NULL;
	unlink(path);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED || ftruncate(fd, 0) != 0)
			break;
		own_page = p;
		*(volatile char *)p = 1; /* faults: the file has no page there now */
		own_page = NULL;
		munmap(p, 4096);
		if (ftruncate(fd, 4096) != 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t1);
	} while ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < ms);
	close(fd);
	return NULL;
}

int main(int argc, char **argv)
{
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-m") && i + 1 < argc)
			mode = argv[++i];
		else if (!strcmp(argv[i], "-p"))
			ptsz = 1;
		else
			die("unknown option %s%s", argv[i], "");
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	load();
	run(argc - i, argv + i);
	printf("ok\n");
	return 0;
}

/* nvmlfork: threads that keep reading NVML memory info while the main thread forks. */
static nvmlReturn_t (*nf_meminfo)(nvmlDevice_t, nvmlMemory_t *);
static nvmlDevice_t nf_dev;
static int nf_stop;

static void *nf_spin(void *arg)
{
	(void)arg;
	nvmlMemory_t m;
	while (!__atomic_load_n(&nf_stop, __ATOMIC_RELAXED))
		nf_meminfo(nf_dev, &m);
	return NULL;
}

static void nvml_fork_race(int forks)
{
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	nvmlReturn_t (*init)(void) = h ? (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2") : NULL;
	nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) =
		h ? (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
	nf_meminfo = h ? (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo") : NULL;
	if (!init || !get || !nf_meminfo || init() != NVML_SUCCESS || get(0, &nf_dev) != NVML_SUCCESS)
		die("nvml setup failed%s%s", "", "");
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, nf_spin, NULL);
	for (int i = 0; i < forks; i++) {
		pid_t c = fork();
		if (c == 0) {
			nvmlMemory_t m;
			_exit(nf_meminfo(nf_dev, &m) == NVML_SUCCESS ? 0 : 1);
		}
		int st = 0, waited = 0;
		while (waitpid(c, &st, WNOHANG) == 0) {
			if (++waited > 5000) { /* 5 s */
				kill(c, SIGKILL);
				waitpid(c, &st, 0);
				die("fork child hung in nvmlDeviceGetMemoryInfo (a lock held at fork)%s%s", "", "");
			}
			usleep(1000);
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			die("fork child's nvmlDeviceGetMemoryInfo failed%s%s", "", "");
	}
	__atomic_store_n(&nf_stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	printf("nvmlfork %d ok\n", forks);
}

/* forkinit: a thread is inside the shim's first initialisation while the main thread forks. */
static void *fi_thread(void *arg)
{
	CUdeviceptr p;
	(void)arg;
	set_ctx(0); /* the first hooked call: initialises the shim */
	check_rc("thread cuMemAlloc", api.MemAlloc(&p, 1 << 20), NULL);
	return NULL;
}

static int fi_stop;

/* Frees an address nobody allocated, over and over: the shim's tracker lock
 * is held by this thread at many an instant the main thread forks. */
static void *fi_spin(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&fi_stop, __ATOMIC_RELAXED))
		api.MemFree(0x1000);
	return NULL;
}

/* Waits up to ms for child c; dies if it hangs or fails. */
static void reap_child(pid_t c, int ms, const char *what)
{
	int st = 0, waited = 0;
	while (waitpid(c, &st, WNOHANG) == 0) {
		if (++waited > ms) {
			kill(c, SIGKILL);
			waitpid(c, &st, 0);
			die("fork child hung in %s%s", what, "");
		}
		usleep(1000);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("fork child's %s failed%s", what, "");
}

static void fork_during_init(const char *forked, int delay_ms, int forks)
{
	pthread_t t, spin;
	pthread_create(&spin, NULL, fi_spin, NULL);
	pthread_create(&t, NULL, fi_thread, NULL);
	usleep((useconds_t)delay_ms * 1000);
	/* Children forked while the shim is half initialised must find no lock
	 * of the parent's threads still held. */
	for (int i = 0; i < forks; i++) {
		pid_t k = fork();
		if (k == 0)
			_exit(api.MemFree(0x1000) == CUDA_ERROR_INVALID_VALUE ? 0 : 1);
		reap_child(k, 5000, "cuMemFree");
	}
	__atomic_store_n(&fi_stop, 1, __ATOMIC_RELAXED);
	pthread_join(spin, NULL);
	pid_t c = fork();
	if (c == 0) {
		CUdeviceptr p;
		set_ctx(0);
		int ok = api.MemAlloc(&p, 1 << 20) == CUDA_SUCCESS;
		/* Its slot in the region may be left to its keeper thread (a tenth of a
		 * second) when the region's lock is busy: it stays long enough for that. */
		usleep(1000000);
		_exit(ok ? 0 : 1);
	}
	printf("forked %d from %d\n", c, getpid());
	FILE *f = fopen(forked, "w");
	if (f)
		fclose(f);
	pthread_join(t, NULL);
	/* 10 s after the parent's own initialisation finished. */
	reap_child(c, 10000, "initialisation and cuMemAlloc");
	printf("forkinit ok\n");
}

static void run(int argc, char **argv)
{
	for (int i = 0; i < argc; i++) {
		char buf[1024], *a[8] = {0};
		snprintf(buf, sizeof(buf), "%s", argv[i]);
		int n = 0;
		for (char *s = buf, *save = NULL, *t; n < 8 && (t = strtok_r(s, ":", &save)); s = NULL)
			a[n++] = t;
		const char *op = a[0];
		CUdeviceptr p = 0;
		CUresult rc;
		if (!strcmp(op, "init")) {
			check_rc("cuInit", api.Init(0), NULL);
			set_ctx(0);
		} else if (!strcmp(op, "cuinit")) {
			/* cuinit — cuInit only: no hooked call, the shim stays uninitialised. */
			check_rc("cuInit", api.Init(0), NULL);
		} else if (!strcmp(op, "forkinit")) {
			/* forkinit:FORKED:MS:N — a thread makes the first hooked call and another keeps
			 * freeing; MS later the main thread forks N children that each free once, then
			 * one more and touches FORKED; that child initialises, allocates 1 MiB and
			 * exits a second later. */
			fork_during_init(a[1], atoi(a[2]), atoi(a[3]));
		} else if (!strcmp(op, "ctx")) {
			set_ctx(atoi(a[1]));
		} else if (!strcmp(op, "primary")) {
			/* primary:DEV[:RC] — cuDevicePrimaryCtxRetain, made current when it succeeds. */
			CUdevice d;
			CUcontext c = NULL;
			check_rc("cuDeviceGet", api.DeviceGet(&d, atoi(a[1])), NULL);
			rc = api.PrimaryCtxRetain(&c, d);
			check_rc("cuDevicePrimaryCtxRetain", rc, a[2]);
			if (rc == CUDA_SUCCESS)
				check_rc("cuCtxSetCurrent", api.CtxSetCurrent(c), NULL);
		} else if (!strcmp(op, "green") || !strcmp(op, "greendestroy")) {
			/* green:DEV[:RC] — cuGreenCtxCreate on DEV (no resource descriptor), made current
			 * through cuCtxFromGreenCtx when it succeeds; greendestroy[:RC] — cuGreenCtxDestroy
			 * of the last one made. */
			static CUgreenCtx greens[16];
			static int ngreens;
			if (!strcmp(op, "green")) {
				CUresult (*f)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned) =
					ENTRY(cuGreenCtxCreate, "cuGreenCtxCreate", 12040, 0);
				CUresult (*from)(CUcontext *, CUgreenCtx) =
					ENTRY(cuCtxFromGreenCtx, "cuCtxFromGreenCtx", 12040, 0);
				CUdevice d;
				CUcontext c;
				check_rc("cuDeviceGet", api.DeviceGet(&d, atoi(a[1])), NULL);
				rc = f(&greens[ngreens], NULL, d, 0);
				check_rc("cuGreenCtxCreate", rc, a[2]);
				if (rc == CUDA_SUCCESS) {
					check_rc("cuCtxFromGreenCtx", from(&c, greens[ngreens++]), NULL);
					check_rc("cuCtxSetCurrent", api.CtxSetCurrent(c), NULL);
				}
			} else {
				CUresult (*f)(CUgreenCtx) = ENTRY(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040, 0);
				check_rc("cuGreenCtxDestroy", f(greens[--ngreens]), a[1]);
			}
		} else if (!strcmp(op, "noctx")) {
			check_rc("cuCtxSetCurrent", api.CtxSetCurrent(NULL), NULL);
		} else if (!strcmp(op, "newctx")) {
			check_rc("cuCtxCreate", api.CtxCreate(&created[ncreated++], 0, atoi(a[1])), a[2]);
		} else if (!strcmp(op, "delctx")) {
			check_rc("cuCtxDestroy", api.CtxDestroy(created[--ncreated]), a[1]);
		} else if (!strcmp(op, "newctxv1") || !strcmp(op, "delctxv1") || !strcmp(op, "newctxgl") ||
			   !strcmp(op, "newctxvdpau")) {
			/* newctxv1:DEV[:RC] / delctxv1[:RC] — the pre-3.2 cuCtxCreate / cuCtxDestroy (asked for
			 * at 2000); newctxgl / newctxvdpau:DEV[:RC] — cuGLCtxCreate_v2 / cuVDPAUCtxCreate_v2
			 * (no OpenGL or VDPAU device); on the same stack of contexts as newctx / delctx. */
			if (!strcmp(op, "newctxv1")) {
				CUresult (*f)(CUcontext *, unsigned, CUdevice) = ENTRY(cuCtxCreate, "cuCtxCreate", 2000, 0);
				check_rc("cuCtxCreate", f(&created[ncreated++], 0, atoi(a[1])), a[2]);
			} else if (!strcmp(op, "newctxgl")) {
				CUresult (*f)(CUcontext *, unsigned, CUdevice) =
					ENTRY(cuGLCtxCreate_v2, "cuGLCtxCreate", 3020, 0);
				check_rc("cuGLCtxCreate", f(&created[ncreated++], 0, atoi(a[1])), a[2]);
			} else if (!strcmp(op, "newctxvdpau")) {
				CUresult (*f)(CUcontext *, unsigned, CUdevice, uint32_t, void *) =
					ENTRY(cuVDPAUCtxCreate_v2, "cuVDPAUCtxCreate", 3020, 0);
				check_rc("cuVDPAUCtxCreate", f(&created[ncreated++], 0, atoi(a[1]), 0, NULL), a[2]);
			} else {
				CUresult (*f)(CUcontext) = ENTRY(cuCtxDestroy, "cuCtxDestroy", 2000, 0);
				check_rc("cuCtxDestroy", f(created[--ncreated]), a[1]);
			}
		} else if (!strcmp(op, "release")) {
			check_rc("cuDevicePrimaryCtxRelease", api.PrimaryCtxRelease(atoi(a[1])), a[2]);
		} else if (!strcmp(op, "relv1") || !strcmp(op, "reset") || !strcmp(op, "resetv1")) {
			/* relv1:DEV[:RC] — cuDevicePrimaryCtxRelease's pre-11.0 ABI (cuGetProcAddress at 7000, as
			 * cudart asks); reset / resetv1:DEV[:RC] — cuDevicePrimaryCtxReset_v2 / its pre-11.0 ABI. */
			CUresult (*f)(CUdevice) =
				!strcmp(op, "relv1") ? ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)
				: !strcmp(op, "reset") ? ENTRY(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)
						       : ENTRY(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0);
			check_rc(op, f(atoi(a[1])), a[2]);
		} else if (!strcmp(op, "alloc")) {
			rc = api.MemAlloc(&p, size_arg(a[1]));
			check_rc("cuMemAlloc", rc, a[2]);
			if (rc == CUDA_SUCCESS)
				hold(A_PTR, p);
		} else if (!strcmp(op, "managed")) {
			rc = api.MemAllocManaged(&p, size_arg(a[1]), 1);
			check_rc("cuMemAllocManaged", rc, a[2]);
			if (rc == CUDA_SUCCESS)
				hold(A_PTR, p);
		} else if (!strcmp(op, "pitch")) {
			size_t pitch = 0;
			rc = api.MemAllocPitch(&p, &pitch, size_arg(a[1]), size_arg(a[2]), 4);
			check_rc("cuMemAllocPitch", rc, a[3]);
			if (rc == CUDA_SUCCESS)
				hold(A_PTR, p);
			printf("pitch %zu\n", pitch);
		} else if (!strcmp(op, "async") || !strcmp(op, "pool")) {
			/* async:SIZE[:RC] / pool:SIZE[:RC] on the selected stream (default: NULL) and, for
			 * pool, the selected pool (default: the current device's default pool). */
			CUmemoryPool pool = cur_pool;
			if (!strcmp(op, "pool") && !pool) {
				CUdevice d;
				check_rc("cuCtxGetDevice", api.CtxGetDevice(&d), NULL);
				check_rc("cuDeviceGetDefaultMemPool", api.DeviceGetDefaultMemPool(&pool, d), NULL);
			}
			rc = !strcmp(op, "async") ? api.MemAllocAsync(&p, size_arg(a[1]), cur_stream)
						  : api.MemAllocFromPoolAsync(&p, size_arg(a[1]), pool, cur_stream);
			check_rc(op, rc, a[2]);
			if (rc == CUDA_SUCCESS)
				hold(A_ASYNC, p);
		} else if (!strcmp(op, "stream")) {
			/* stream — a new stream of the current context, used by later async/pool ops. */
			check_rc("cuStreamCreate", api.StreamCreate(&cur_stream, 0), NULL);
		} else if (!strcmp(op, "nostream")) {
			cur_stream = NULL;
		} else if (!strcmp(op, "poolcreate")) {
			/* poolcreate:DEV — a new pool located on DEV, used by later pool ops. */
			CUmemPoolProps props = {0};
			props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
			props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			props.location.id = atoi(a[1]);
			check_rc("cuMemPoolCreate", api.MemPoolCreate(&cur_pool, &props), NULL);
		} else if (!strcmp(op, "defpool")) {
			check_rc("cuDeviceGetDefaultMemPool", api.DeviceGetDefaultMemPool(&cur_pool, atoi(a[1])), NULL);
		} else if (!strcmp(op, "curpool")) {
			check_rc("cuDeviceGetMemPool", api.DeviceGetMemPool(&cur_pool, atoi(a[1])), NULL);
		} else if (!strcmp(op, "setpool")) {
			/* setpool:DEV — the selected pool becomes DEV's current pool. */
			check_rc("cuDeviceSetMemPool", api.DeviceSetMemPool(atoi(a[1]), cur_pool), NULL);
		} else if (!strcmp(op, "poolcreateat")) {
			/* poolcreateat:LOCTYPE:ID:ALLOCTYPE — a new pool anywhere (host, managed...), selected. */
			CUresult (*create)(CUmemoryPool *, const CUmemPoolProps *) =
				ENTRY(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0);
			CUmemPoolProps props = {0};
			props.allocType = atoi(a[3]);
			props.location.type = atoi(a[1]);
			props.location.id = atoi(a[2]);
			check_rc("cuMemPoolCreate", create(&cur_pool, &props), NULL);
		} else if (!strcmp(op, "locpool")) {
			/* locpool:default|current|set:LOCTYPE:ID:ALLOCTYPE — CUDA 13's pools by location:
			 * cuMemGetDefaultMemPool / cuMemGetMemPool select one, cuMemSetMemPool sets the selected. */
			CUmemLocation l = {atoi(a[2]), atoi(a[3])};
			int type = atoi(a[4]);
			if (!strcmp(a[1], "default")) {
				CUresult (*f)(CUmemoryPool *, CUmemLocation *, int) =
					ENTRY(cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", 13000, 0);
				check_rc("cuMemGetDefaultMemPool", f(&cur_pool, &l, type), a[5]);
			} else if (!strcmp(a[1], "current")) {
				CUresult (*f)(CUmemoryPool *, CUmemLocation *, int) =
					ENTRY(cuMemGetMemPool, "cuMemGetMemPool", 13000, 0);
				check_rc("cuMemGetMemPool", f(&cur_pool, &l, type), a[5]);
			} else {
				CUresult (*f)(CUmemLocation *, int, CUmemoryPool) =
					ENTRY(cuMemSetMemPool, "cuMemSetMemPool", 13000, 0);
				check_rc("cuMemSetMemPool", f(&l, type, cur_pool), a[5]);
			}
		} else if (!strcmp(op, "threshold") || !strcmp(op, "trim") || !strcmp(op, "poolattr") ||
			   !strcmp(op, "pooldestroy")) {
			/* threshold:BYTES (RELEASE_THRESHOLD; "max" = UINT64_MAX) / trim:KEEP (cuMemPoolTrimTo) /
			 * poolattr:reserved|reservedhigh|used|usedhigh:WANT / pooldestroy — on the selected
			 * pool, or the current device's default pool. */
			CUmemoryPool pool = cur_pool;
			if (!pool) {
				CUdevice d;
				check_rc("cuCtxGetDevice", api.CtxGetDevice(&d), NULL);
				check_rc("cuDeviceGetDefaultMemPool", api.DeviceGetDefaultMemPool(&pool, d), NULL);
			}
			if (!strcmp(op, "threshold")) {
				CUresult (*f)(CUmemoryPool, int, void *) =
					ENTRY(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0);
				cuuint64_t v = !strcmp(a[1], "max") ? UINT64_MAX : size_arg(a[1]);
				check_rc("cuMemPoolSetAttribute", f(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), NULL);
			} else if (!strcmp(op, "trim")) {
				CUresult (*f)(CUmemoryPool, size_t) = ENTRY(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0);
				check_rc("cuMemPoolTrimTo", f(pool, size_arg(a[1])), NULL);
			} else if (!strcmp(op, "pooldestroy")) {
				CUresult (*f)(CUmemoryPool) = ENTRY(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0);
				check_rc("cuMemPoolDestroy", f(pool), a[1]);
				cur_pool = NULL;
			} else {
				CUresult (*f)(CUmemoryPool, int, void *) =
					ENTRY(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, 0);
				int attr = !strcmp(a[1], "reserved")	   ? CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
					   : !strcmp(a[1], "reservedhigh") ? CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
					   : !strcmp(a[1], "used")	   ? CU_MEMPOOL_ATTR_USED_MEM_CURRENT
									   : CU_MEMPOOL_ATTR_USED_MEM_HIGH;
				cuuint64_t v = 0;
				check_rc("cuMemPoolGetAttribute", f(pool, attr, &v), NULL);
				printf("poolattr %s %llu\n", a[1], (unsigned long long)v);
				check_val(a[1], v, a[2]);
			}
		} else if (!strcmp(op, "ctxsync2")) {
			/* ctxsync2 — CUDA 13's cuCtxSynchronize_v2 on the current context. */
			CUresult (*f)(CUcontext) = ENTRY(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0);
			CUcontext c = NULL;
			check_rc("cuCtxGetCurrent", cuCtxGetCurrent(&c), NULL);
			check_rc("cuCtxSynchronize_v2", f(c), NULL);
		} else if (!strcmp(op, "streamsync")) {
			/* streamsync — cuStreamSynchronize on the selected stream (_ptsz with -p). */
			CUresult (*f)(CUstream) = ENTRY(ptsz ? cuStreamSynchronize_ptsz : cuStreamSynchronize,
						       "cuStreamSynchronize", ptsz ? 7000 : 2000, 1);
			check_rc("cuStreamSynchronize", f(cur_stream), NULL);
		} else if (!strcmp(op, "lalloc") || !strcmp(op, "lpitch")) {
			/* lalloc:SIZE[:RC] / lpitch:W:H[:RC] — the pre-3.2 cuMemAlloc / cuMemAllocPitch
			 * (32-bit sizes and pointer; cuGetProcAddress at 2000 outside direct mode). */
			CUdeviceptr_v1 q = 0;
			if (!strcmp(op, "lalloc")) {
				CUresult (*f)(CUdeviceptr_v1 *, unsigned) = ENTRY(cuMemAlloc, "cuMemAlloc", 2000, 0);
				rc = f(&q, (unsigned)size_arg(a[1]));
				check_rc("cuMemAlloc (v1)", rc, a[2]);
			} else {
				CUresult (*f)(CUdeviceptr_v1 *, unsigned *, unsigned, unsigned, unsigned) =
					ENTRY(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0);
				unsigned pitch = 0;
				rc = f(&q, &pitch, (unsigned)size_arg(a[1]), (unsigned)size_arg(a[2]), 4);
				check_rc("cuMemAllocPitch (v1)", rc, a[3]);
				printf("pitch %u\n", pitch);
			}
			if (rc == CUDA_SUCCESS)
				hold(A_PTR, q);
		} else if (!strcmp(op, "lfree")) {
			/* lfree[:RC] — the last held pointer freed with the pre-3.2 cuMemFree. */
			CUresult (*f)(CUdeviceptr_v1) = ENTRY(cuMemFree, "cuMemFree", 2000, 0);
			if (!nheld || held[nheld - 1].kind != A_PTR)
				die("lfree: no pointer held%s%s", "", "");
			check_rc("cuMemFree (v1)", f((CUdeviceptr_v1)held[--nheld].key), a[1]);
		} else if (!strcmp(op, "larray") || !strcmp(op, "larray3d")) {
			/* larray:W:H[:RC] / larray3d:W:H:D[:RC] — pre-3.2 arrays of FLOAT, one channel. */
			CUarray arr;
			if (!strcmp(op, "larray")) {
				CUresult (*f)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *) =
					ENTRY(cuArrayCreate, "cuArrayCreate", 2000, 0);
				CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)size_arg(a[1]), (unsigned)size_arg(a[2]), 0x20, 1};
				rc = f(&arr, &d);
				check_rc("cuArrayCreate (v1)", rc, a[3]);
			} else {
				CUresult (*f)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *) =
					ENTRY(cuArray3DCreate, "cuArray3DCreate", 2000, 0);
				CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)size_arg(a[1]), (unsigned)size_arg(a[2]),
								(unsigned)size_arg(a[3]), 0x20, 1, 0};
				rc = f(&arr, &d);
				check_rc("cuArray3DCreate (v1)", rc, a[4]);
			}
			if (rc == CUDA_SUCCESS)
				hold(A_ARRAY, (uintptr_t)arr);
		} else if (!strncmp(op, "ipc", 3) || !strcmp(op, "poolexport") || !strcmp(op, "poolimport")) {
			/* ipcexport:FILE / poolexport:FILE — the last held pointer's cuIpcGetMemHandle /
			 * cuMemPoolExportPointer written to FILE; ipcopen:FILE[:RC] — cuIpcOpenMemHandle of it
			 * (ipcclose closes the last opened); poolimport:FILE[:RC] — cuMemPoolImportPointer of it
			 * from the current device's default pool, held as an async pointer (free: cuMemFreeAsync). */
			static CUdeviceptr opened[16];
			static int nopened;
			unsigned char buf[64];
			if (!strcmp(op, "ipcexport") || !strcmp(op, "poolexport")) {
				if (!nheld)
					die("%s: nothing held%s", op, "");
				if (!strcmp(op, "ipcexport")) {
					CUresult (*f)(CUipcMemHandle *, CUdeviceptr) =
						ENTRY(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0);
					check_rc("cuIpcGetMemHandle", f((CUipcMemHandle *)buf, held[nheld - 1].key), NULL);
				} else {
					CUresult (*f)(CUmemPoolPtrExportData *, CUdeviceptr) =
						ENTRY(cuMemPoolExportPointer, "cuMemPoolExportPointer", 11020, 0);
					check_rc("cuMemPoolExportPointer", f((CUmemPoolPtrExportData *)buf, held[nheld - 1].key),
						 NULL);
				}
				FILE *fp = fopen(a[1], "w");
				if (!fp || fwrite(buf, 1, 64, fp) != 64 || fclose(fp) != 0)
					die("cannot write %s%s", a[1], "");
			} else if (!strcmp(op, "ipcclose")) {
				CUresult (*f)(CUdeviceptr) = ENTRY(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0);
				check_rc("cuIpcCloseMemHandle", f(opened[--nopened]), NULL);
			} else {
				FILE *fp = fopen(a[1], "r");
				if (!fp || fread(buf, 1, 64, fp) != 64)
					die("cannot read %s%s", a[1], "");
				fclose(fp);
				if (!strcmp(op, "ipcopen")) {
					CUresult (*f)(CUdeviceptr *, CUipcMemHandle, unsigned) =
						ENTRY(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0);
					CUipcMemHandle h;
					memcpy(&h, buf, 64);
					rc = f(&opened[nopened], h, 1);
					check_rc("cuIpcOpenMemHandle", rc, a[2]);
					if (rc == CUDA_SUCCESS)
						nopened++;
				} else {
					CUresult (*f)(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *) =
						ENTRY(cuMemPoolImportPointer, "cuMemPoolImportPointer", 11020, 0);
					CUmemoryPool pool;
					CUdevice d;
					check_rc("cuCtxGetDevice", api.CtxGetDevice(&d), NULL);
					check_rc("cuDeviceGetDefaultMemPool", api.DeviceGetDefaultMemPool(&pool, d), NULL);
					rc = f(&p, pool, (CUmemPoolPtrExportData *)buf);
					check_rc("cuMemPoolImportPointer", rc, a[2]);
					if (rc == CUDA_SUCCESS)
						hold(A_ASYNC, p);
				}
			}
		} else if (!strcmp(op, "extimport") || !strcmp(op, "extmap") || !strcmp(op, "extdestroy")) {
			/* extimport:SIZE[:RC] — imports SIZE bytes of another API's memory (opaque fd);
			 * extmap:SIZE — a buffer mapped from the last import, held as a pointer (free:
			 * cuMemFree); extdestroy[:RC] — cuDestroyExternalMemory of the last import. */
			static CUexternalMemory ext[16];
			static int next;
			if (!strcmp(op, "extimport")) {
				CUresult (*f)(CUexternalMemory *, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *) =
					ENTRY(cuImportExternalMemory, "cuImportExternalMemory", 10000, 0);
				CUDA_EXTERNAL_MEMORY_HANDLE_DESC d = {0};
				d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
				d.handle.fd = -1;
				d.size = size_arg(a[1]);
				rc = f(&ext[next], &d);
				check_rc("cuImportExternalMemory", rc, a[2]);
				if (rc == CUDA_SUCCESS)
					next++;
			} else if (!strcmp(op, "extmap")) {
				CUresult (*f)(CUdeviceptr *, CUexternalMemory, const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *) =
					ENTRY(cuExternalMemoryGetMappedBuffer, "cuExternalMemoryGetMappedBuffer", 10000, 0);
				CUDA_EXTERNAL_MEMORY_BUFFER_DESC d = {0};
				d.size = size_arg(a[1]);
				check_rc("cuExternalMemoryGetMappedBuffer", f(&p, ext[next - 1], &d), NULL);
				hold(A_PTR, p);
			} else {
				CUresult (*f)(CUexternalMemory) =
					ENTRY(cuDestroyExternalMemory, "cuDestroyExternalMemory", 10000, 0);
				check_rc("cuDestroyExternalMemory", f(ext[--next]), a[1]);
			}
		} else if (!strncmp(op, "mc", 2)) {
			/* mccreate:SIZE — a multicast object for devices 0 and 1, selected;
			 * mcbind:SIZE / mcbind2:DEV:SIZE — the last held VMM handle bound at offset 0
			 * (cuMulticastBindMem / _v2); mcbindaddr:SIZE / mcbindaddr2:DEV:SIZE — the memory
			 * mapped last, by address; mcunbind:DEV:SIZE — cuMulticastUnbind at offset 0. */
			static CUmemGenericAllocationHandle mc;
			CUmemGenericAllocationHandle mem = nheld ? held[nheld - 1].key : 0;
			if (!strcmp(op, "mccreate")) {
				CUresult (*f)(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *) =
					ENTRY(cuMulticastCreate, "cuMulticastCreate", 12010, 0);
				CUresult (*add)(CUmemGenericAllocationHandle, CUdevice) =
					ENTRY(cuMulticastAddDevice, "cuMulticastAddDevice", 12010, 0);
				CUmulticastObjectProp prop = {2, size_arg(a[1]), 0, 0};
				check_rc("cuMulticastCreate", f(&mc, &prop), NULL);
				check_rc("cuMulticastAddDevice", add(mc, 0), NULL);
				check_rc("cuMulticastAddDevice", add(mc, 1), NULL);
			} else if (!strcmp(op, "mcbind")) {
				CUresult (*f)(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t,
					      size_t, unsigned long long) =
					ENTRY(cuMulticastBindMem, "cuMulticastBindMem", 12010, 0);
				check_rc("cuMulticastBindMem", f(mc, 0, mem, 0, size_arg(a[1]), 0), NULL);
			} else if (!strcmp(op, "mcbind2")) {
				CUresult (*f)(CUmemGenericAllocationHandle, CUdevice, size_t, CUmemGenericAllocationHandle,
					      size_t, size_t, unsigned long long) =
					ENTRY(cuMulticastBindMem_v2, "cuMulticastBindMem", 13010, 0);
				check_rc("cuMulticastBindMem_v2", f(mc, atoi(a[1]), 0, mem, 0, size_arg(a[2]), 0), NULL);
			} else if (!strcmp(op, "mcbindaddr")) {
				CUresult (*f)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long) =
					ENTRY(cuMulticastBindAddr, "cuMulticastBindAddr", 12010, 0);
				check_rc("cuMulticastBindAddr", f(mc, 0, mapped, size_arg(a[1]), 0), NULL);
			} else if (!strcmp(op, "mcbindaddr2")) {
				CUresult (*f)(CUmemGenericAllocationHandle, CUdevice, size_t, CUdeviceptr, size_t,
					      unsigned long long) =
					ENTRY(cuMulticastBindAddr_v2, "cuMulticastBindAddr", 13010, 0);
				check_rc("cuMulticastBindAddr_v2", f(mc, atoi(a[1]), 0, mapped, size_arg(a[2]), 0), NULL);
			} else if (!strcmp(op, "mcunbind")) {
				CUresult (*f)(CUmemGenericAllocationHandle, CUdevice, size_t, size_t) =
					ENTRY(cuMulticastUnbind, "cuMulticastUnbind", 12010, 0);
				check_rc("cuMulticastUnbind", f(mc, atoi(a[1]), 0, size_arg(a[2])), NULL);
			} else {
				die("unknown op %s%s", op, "");
			}
		} else if (!strcmp(op, "nopool")) {
			cur_pool = NULL;
		} else if (!strcmp(op, "create")) {
			CUmemAllocationProp prop = {0};
			CUmemGenericAllocationHandle h;
			prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
			prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
			prop.location.id = atoi(a[1]);
			rc = api.MemCreate(&h, size_arg(a[2]), &prop, 0);
			check_rc("cuMemCreate", rc, a[3]);
			if (rc == CUDA_SUCCESS)
				hold(A_HANDLE, h);
		} else if (!strcmp(op, "array")) {
			CUDA_ARRAY_DESCRIPTOR d = {size_arg(a[1]), size_arg(a[2]), 0x20, 1};
			CUarray arr;
			rc = api.ArrayCreate(&arr, &d);
			check_rc("cuArrayCreate", rc, a[3]);
			if (rc == CUDA_SUCCESS)
				hold(A_ARRAY, (uintptr_t)arr);
		} else if (!strcmp(op, "map")) {
			/* map:SIZE — maps the last held VMM handle at a new address (unmap:SIZE undoes it). */
			if (!nheld || held[nheld - 1].kind != A_HANDLE)
				die("map: no handle held%s%s", "", "");
			check_rc("cuMemAddressReserve", api.MemAddressReserve(&mapped, size_arg(a[1]), 0, 0, 0), NULL);
			check_rc("cuMemMap", api.MemMap(mapped, size_arg(a[1]), 0, held[nheld - 1].key, 0), a[2]);
		} else if (!strcmp(op, "vmmexport") || !strcmp(op, "vmmimport")) {
			/* vmmexport — the last held VMM handle as a file descriptor (POSIX_FD, 1);
			 * vmmimport[:RC] — a new handle from it (cuGetProcAddress at 10020 outside direct mode),
			 * held like any other. */
			static int fd = -1;
			if (!strcmp(op, "vmmexport")) {
				CUresult (*f)(void *, CUmemGenericAllocationHandle, int, unsigned long long) =
					ENTRY(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0);
				if (!nheld || held[nheld - 1].kind != A_HANDLE)
					die("vmmexport: no handle held%s%s", "", "");
				check_rc("cuMemExportToShareableHandle", f(&fd, held[nheld - 1].key, 1, 0), NULL);
			} else {
				CUresult (*f)(CUmemGenericAllocationHandle *, void *, int) =
					ENTRY(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, 0);
				CUmemGenericAllocationHandle h;
				rc = f(&h, (void *)(intptr_t)fd, 1);
				check_rc("cuMemImportFromShareableHandle", rc, a[1]);
				if (rc == CUDA_SUCCESS)
					hold(A_HANDLE, h);
			}
		} else if (!strcmp(op, "unmap")) {
			check_rc("cuMemUnmap", api.MemUnmap(mapped, size_arg(a[1])), NULL);
		} else if (!strcmp(op, "retain")) {
			/* retain — a new reference to the handle mapped last, held like any other. */
			CUmemGenericAllocationHandle h;
			check_rc("cuMemRetainAllocationHandle",
				 api.MemRetainAllocationHandle(&h, (void *)(uintptr_t)mapped), NULL);
			hold(A_HANDLE, h);
		} else if (!strcmp(op, "arrayfmt")) {
			/* arrayfmt:FORMAT:CHANNELS:W:H[:RC] — a 2D array of any CUarray_format. */
			CUDA_ARRAY_DESCRIPTOR d = {size_arg(a[3]), size_arg(a[4]), (int)strtol(a[1], NULL, 0),
						   (unsigned)atoi(a[2])};
			CUarray arr;
			rc = api.ArrayCreate(&arr, &d);
			check_rc("cuArrayCreate", rc, a[5]);
			if (rc == CUDA_SUCCESS)
				hold(A_ARRAY, (uintptr_t)arr);
		} else if (!strcmp(op, "array3d")) {
			CUDA_ARRAY3D_DESCRIPTOR d = {size_arg(a[1]), size_arg(a[2]), size_arg(a[3]), 0x20, 1, 0};
			CUarray arr;
			rc = api.Array3DCreate(&arr, &d);
			check_rc("cuArray3DCreate", rc, a[4]);
			if (rc == CUDA_SUCCESS)
				hold(A_ARRAY, (uintptr_t)arr);
		} else if (!strcmp(op, "sparse")) {
			/* sparse:W:H[:RC] — a sparse 2D array (CUDA_ARRAY3D_SPARSE), held like any array. */
			CUDA_ARRAY3D_DESCRIPTOR d = {size_arg(a[1]), size_arg(a[2]), 0, 0x20, 1, CUDA_ARRAY3D_SPARSE};
			CUarray arr;
			rc = api.Array3DCreate(&arr, &d);
			check_rc("cuArray3DCreate", rc, a[3]);
			if (rc == CUDA_SUCCESS)
				hold(A_ARRAY, (uintptr_t)arr);
		} else if (!strcmp(op, "amap") || !strcmp(op, "aunmap")) {
			/* amap — maps the last held VMM handle into the last held array (level 0, a 64 x 64
			 * tile at the origin; cuGetProcAddress at 11010 outside direct mode); aunmap unmaps
			 * that tile. */
			CUresult (*f)(CUarrayMapInfo *, unsigned, CUstream) =
				ENTRY(cuMemMapArrayAsync, "cuMemMapArrayAsync", 11010, 0);
			CUarrayMapInfo m = {0};
			int ia = nheld - 1, ih = nheld - 1;
			while (ia >= 0 && held[ia].kind != A_ARRAY)
				ia--;
			while (ih >= 0 && held[ih].kind != A_HANDLE)
				ih--;
			if (ia < 0 || (!strcmp(op, "amap") && ih < 0))
				die("%s: no array or handle held%s", op, "");
			m.resourceType = 0;
			m.resource = (void *)(uintptr_t)held[ia].key;
			m.subresource.sparseLevel[5] = m.subresource.sparseLevel[6] = 64;
			m.subresource.sparseLevel[7] = 1;
			m.memOperationType = !strcmp(op, "amap") ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
			m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
			m.memHandle = !strcmp(op, "amap") ? held[ih].key : 0;
			m.deviceBitMask = 1;
			check_rc("cuMemMapArrayAsync", f(&m, 1, NULL), NULL);
		} else if (!strcmp(op, "mipmap")) {
			CUDA_ARRAY3D_DESCRIPTOR d = {size_arg(a[1]), size_arg(a[2]), 0, 0x20, 1, 0};
			CUmipmappedArray m;
			rc = api.MipmappedArrayCreate(&m, &d, (unsigned)atoi(a[3]));
			check_rc("cuMipmappedArrayCreate", rc, a[4]);
			if (rc == CUDA_SUCCESS)
				hold(A_MIPMAP, (uintptr_t)m);
		} else if (!strcmp(op, "sync")) {
			/* sync — cuCtxSynchronize: where pools give back what they keep above their threshold. */
			check_rc("cuCtxSynchronize", api.CtxSynchronize(), NULL);
		} else if (!strcmp(op, "free")) {
			check_rc("free", free_last(), a[1]);
		} else if (!strcmp(op, "freeall")) {
			while (nheld)
				check_rc("free", free_last(), NULL);
		} else if (!strcmp(op, "fill")) {
			unsigned long long chunk = size_arg(a[1]);
			int k = 0;
			while ((rc = api.MemAlloc(&p, chunk)) == CUDA_SUCCESS) {
				hold(A_PTR, p);
				k++;
			}
			check_rc("fill stops with OOM", rc, "2");
			printf("filled %d\n", k);
		} else if (!strcmp(op, "churn")) {
			/* churn:MS:MAX:SEED — for MS ms, allocates (64 KiB to MAX, at random) or frees one
			 * of at most 64 it holds, at random; frees them all at the end. Refusals are fine. */
			long ms = atol(a[1]);
			unsigned long long max = size_arg(a[2]);
			unsigned seed = (unsigned)atoi(a[3]);
			CUdeviceptr live[64];
			int nlive = 0, ok = 0, refused = 0;
			struct timespec t0, t1;
			clock_gettime(CLOCK_MONOTONIC, &t0);
			do {
				if (nlive < 64 && (nlive == 0 || rand_r(&seed) % 2)) {
					size_t sz = 65536 + (size_t)(rand_r(&seed) % (max - 65536 + 1));
					rc = api.MemAlloc(&live[nlive], sz);
					if (rc == CUDA_SUCCESS)
						nlive++, ok++;
					else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
						refused++;
					else
						check_rc("churn alloc", rc, "0");
				} else {
					int k = (int)(rand_r(&seed) % (unsigned)nlive);
					check_rc("churn free", api.MemFree(live[k]), "0");
					live[k] = live[--nlive];
				}
				clock_gettime(CLOCK_MONOTONIC, &t1);
			} while ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < ms);
			while (nlive)
				check_rc("churn free", api.MemFree(live[--nlive]), "0");
			printf("churn ok=%d refused=%d\n", ok, refused);
		} else if (!strcmp(op, "peak")) {
			/* peak:DEV:MAX — the fake machine's peak use of DEV must not pass MAX. */
			unsigned long long (*peak)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "fakecuda_peak");
			if (!peak)
				die("peak: %s%s", "the fake driver has no fakecuda_peak", "");
			unsigned long long got = peak(atoi(a[1]));
			printf("peak %llu\n", got);
			if (got > size_arg(a[2]))
				die("peak: %s%s", "the device's peak use passed the limit", "");
		} else if (!strcmp(op, "info")) {
			size_t f = 0, t = 0;
			check_rc("cuMemGetInfo", api.MemGetInfo(&f, &t), a[3]);
			printf("info free=%zu total=%zu\n", f, t);
			check_val("cuMemGetInfo free", f, a[1]);
			check_val("cuMemGetInfo total", t, a[2]);
		} else if (!strcmp(op, "infoloop")) {
			/* infoloop:N — N cuMemGetInfo calls in a row; prints how long they took, ms. */
			struct timespec t0, t1;
			int calls = atoi(a[1]);
			clock_gettime(CLOCK_MONOTONIC, &t0);
			for (int i = 0; i < calls; i++) {
				size_t f = 0, t = 0;
				check_rc("cuMemGetInfo", api.MemGetInfo(&f, &t), NULL);
			}
			clock_gettime(CLOCK_MONOTONIC, &t1);
			printf("infoloop ms=%lld\n",
			       (long long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
		} else if (!strcmp(op, "nvmlfork")) {
			nvml_fork_race(atoi(a[1]));
		} else if (!strcmp(op, "infonull")) {
			size_t f = 0, t = 0;
			check_rc("cuMemGetInfo(NULL, &total)", api.MemGetInfo(NULL, &t), NULL);
			check_rc("cuMemGetInfo(&free, NULL)", api.MemGetInfo(&f, NULL), NULL);
			check_rc("cuMemGetInfo(NULL, NULL)", api.MemGetInfo(NULL, NULL), NULL);
			printf("infonull free=%zu total=%zu\n", f, t);
			check_val("free", f, a[1]);
			check_val("total", t, a[2]);
		} else if (!strcmp(op, "info32")) {
			/* info32:FREE:TOTAL — the pre-3.2 cuMemGetInfo (32-bit sizes; at 2000 as cudart would). */
			CUresult (*f)(unsigned *, unsigned *) = ENTRY(cuMemGetInfo, "cuMemGetInfo", 2000, 0);
			unsigned fr = 0, t = 0;
			check_rc("cuMemGetInfo (pre-3.2)", f(&fr, &t), NULL);
			printf("info32 free=%u total=%u\n", fr, t);
			check_val("cuMemGetInfo (pre-3.2) free", fr, a[1]);
			check_val("cuMemGetInfo (pre-3.2) total", t, a[2]);
		} else if (!strcmp(op, "total32")) {
			/* total32:DEV:BYTES — the pre-3.2 cuDeviceTotalMem. */
			CUresult (*f)(unsigned *, CUdevice) = ENTRY(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0);
			unsigned t = 0;
			check_rc("cuDeviceTotalMem (pre-3.2)", f(&t, atoi(a[1])), NULL);
			printf("total32 %u\n", t);
			check_val("cuDeviceTotalMem (pre-3.2)", t, a[2]);
		} else if (!strcmp(op, "total")) {
			size_t t = 0;
			check_rc("cuDeviceTotalMem", api.DeviceTotalMem(&t, atoi(a[1])), NULL);
			printf("total %zu\n", t);
			check_val("cuDeviceTotalMem", t, a[2]);
		} else if (!strcmp(op, "nvml")) {
			void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
			if (!h)
				die("dlopen libnvidia-ml.so.1: %s%s", dlerror(), "");
			nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
			nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) =
				(nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
			nvmlReturn_t (*m1)(nvmlDevice_t, nvmlMemory_t *) =
				(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
			nvmlReturn_t (*m2)(nvmlDevice_t, nvmlMemory_v2_t *) =
				(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
			nvmlDevice_t dev;
			nvmlMemory_t v1;
			nvmlMemory_v2_t v2 = {.version = nvmlMemory_v2};
			if (!init || !get || !m1 || !m2 || init() || get((unsigned)atoi(a[1]), &dev) || m1(dev, &v1) ||
			    m2(dev, &v2))
				die("nvml calls failed%s%s", "", "");
			printf("nvml total=%llu used=%llu free=%llu\n", v1.total, v1.used, v1.free);
			printf("nvml_v2 total=%llu used=%llu free=%llu reserved=%llu\n", v2.total, v2.used, v2.free,
			       v2.reserved);
			check_val("nvml total", v1.total, a[2]);
			check_val("nvml used", v1.used, a[3]);
			check_val("nvml free", v1.free, a[4]);
			if (v1.total != v2.total || v1.used != v2.used || v1.free != v2.free)
				die("nvmlDeviceGetMemoryInfo and _v2 disagree%s%s", "", "");
			if (strcmp(owner((void *)m1), "libvgpu-shim.so") && getenv("LD_PRELOAD") &&
			    strstr(getenv("LD_PRELOAD"), "libvgpu-shim"))
				die("dlsym(nvmlDeviceGetMemoryInfo) not wrapped: %s%s", owner((void *)m1), "");
		} else if (!strcmp(op, "launch")) {
			int count = atoi(a[1]);
			unsigned grid = a[2] ? (unsigned)atoi(a[2]) : 1;
			for (int k = 0; k < count; k++)
				launch_once(grid);
		} else if (!strcmp(op, "launchall")) {
			CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
					      .blockDimZ = 1};
			check_rc("cuLaunchKernel", api.LaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), NULL);
			check_rc("cuLaunchKernelEx", api.LaunchKernelEx(&cfg, NULL, NULL, NULL), NULL);
			check_rc("cuLaunchCooperativeKernel",
				 api.LaunchCooperativeKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL), NULL);
			/* No executable graph: the driver's CUDA_ERROR_INVALID_VALUE, passed through. */
			check_rc("cuGraphLaunch", api.GraphLaunch(NULL, NULL), "1");
			check_rc("cuCtxSynchronize", api.CtxSynchronize(), NULL);
		} else if (!strcmp(op, "launchtimed")) {
			/* launchtimed:GRID — one launch, no synchronisation; prints how long the call took
			 * (the SM limiter's wait: the fake driver itself returns at once unless its queue
			 * is full). */
			double t0 = now_s();
			check_rc("cuLaunchKernel",
				 api.LaunchKernel(NULL, (unsigned)atoi(a[1]), 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), NULL);
			printf("launch_ms %.1f\n", (now_s() - t0) * 1000.0);
			fflush(stdout);
		} else if (!strcmp(op, "launchfor")) {
			/* launchfor:SECONDS:WARMUP:GRID — prints this process's share of GPU time after warm-up:
			 * the GPU time its kernels ran in the window over the window, both taken by the fake
			 * driver at one instant, so time this process spends descheduled (a loaded host) cannot
			 * skew the window against the GPU time in it. */
			double total = atof(a[1]), warm = atof(a[2]);
			unsigned grid = (unsigned)atoi(a[3]);
			/* launchfor:...:GRID:KIND — KIND coop or ex launches through
			 * cuLaunchCooperativeKernel or cuLaunchKernelEx instead; the pre-4.0 ABIs:
			 * grid (cuLaunchGrid, GRID x 1), gridasync (cuLaunchGridAsync), one
			 * (cuLaunch: one block, whatever GRID says), multi
			 * (cuLaunchCooperativeKernelMultiDevice, one entry). */
			const char *kind = a[4] ? a[4] : "kernel";
			/* ...:GRID:paced:PCT — cuLaunchKernel, each launch followed by a pause that makes
			 * the GPU time it adds (FAKECUDA_KERNEL_US a wave of the tests' 132 SMs) PCT % of
			 * the time: a load below the share, which the limiter lets through as it comes. */
			useconds_t pause = 0;
			if (!strcmp(kind, "paced")) {
				const char *us = getenv("FAKECUDA_KERNEL_US");
				double wave_us = (us ? atof(us) : 1000.0) * ((grid + 131) / 132), pct = a[5] ? atof(a[5]) : 0;
				if (pct <= 0 || pct > 100)
					die("launchfor paced: want a percentage%s%s", "", "");
				pause = (useconds_t)(wave_us * (100.0 / pct - 1.0));
			}
			CUresult (*lgrid)(CUfunction, int, int) = NULL;
			CUresult (*lgrida)(CUfunction, int, int, CUstream) = NULL;
			CUresult (*lone)(CUfunction) = NULL;
			CUresult (*lmulti)(CUDA_LAUNCH_PARAMS *, unsigned, unsigned) = NULL;
			CUDA_LAUNCH_PARAMS lp = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128,
						 .blockDimY = 1, .blockDimZ = 1};
			if (!strcmp(kind, "grid"))
				lgrid = ENTRY(cuLaunchGrid, "cuLaunchGrid", 2000, 0);
			else if (!strcmp(kind, "gridasync"))
				lgrida = ENTRY(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0);
			else if (!strcmp(kind, "one"))
				lone = ENTRY(cuLaunch, "cuLaunch", 2000, 0);
			else if (!strcmp(kind, "multi"))
				lmulti = ENTRY(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice",
					       9000, 0);
			CUlaunchConfig cfg = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128,
					      .blockDimY = 1, .blockDimZ = 1};
			if (!busy_fn)
				busy_fn = (long long (*)(int, int, long long *))dlsym(RTLD_DEFAULT, "fakecudaBusyNs");
			if (!busy_fn)
				die("fakecudaBusyNs not found%s%s", "", "");
			double t0 = now_s();
			long long b0 = -1, w0 = 0;
			while (now_s() - t0 < total) {
				if (b0 < 0 && now_s() - t0 >= warm)
					b0 = busy_fn(getpid(), 0, &w0);
				/* No synchronisation: the (fake) launch queue blocks when full, so
				 * an unthrottled process keeps the device busy, as on a real GPU. */
				if (lgrid)
					check_rc("cuLaunchGrid", lgrid(NULL, (int)grid, 1), NULL);
				else if (lgrida)
					check_rc("cuLaunchGridAsync", lgrida(NULL, (int)grid, 1, NULL), NULL);
				else if (lone)
					check_rc("cuLaunch", lone(NULL), NULL);
				else if (lmulti)
					check_rc("cuLaunchCooperativeKernelMultiDevice", lmulti(&lp, 1, 0), NULL);
				else if (!strcmp(kind, "coop"))
					check_rc("cuLaunchCooperativeKernel",
						 api.LaunchCooperativeKernel(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL),
						 NULL);
				else if (!strcmp(kind, "ex"))
					check_rc("cuLaunchKernelEx", api.LaunchKernelEx(&cfg, NULL, NULL, NULL), NULL);
				else
					check_rc("cuLaunchKernel",
						 api.LaunchKernel(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), NULL);
				if (pause)
					usleep(pause);
			}
			long long w1 = 0, b1 = busy_fn(getpid(), 0, &w1);
			check_rc("cuCtxSynchronize", api.CtxSynchronize(), NULL);
			printf("share %.1f\n", (double)(b1 - b0) / (double)(w1 - w0) * 100.0);
		} else if (!strcmp(op, "launchthreads")) {
			/* launchthreads:N:SECONDS:WARMUP:GRID — N threads launch GRID-block kernels flat out,
			 * unsynchronised, for SECONDS; prints this process's share of GPU time after WARMUP
			 * (as launchfor) and the launches of each thread. */
			int n = atoi(a[1]);
			double total = atof(a[2]), warm = atof(a[3]);
			if (n < 1 || n > 16 || !a[4])
				die("launchthreads:N:SECONDS:WARMUP:GRID wants 1 to 16 threads and a grid%s%s", "", "");
			if (!busy_fn)
				busy_fn = (long long (*)(int, int, long long *))dlsym(RTLD_DEFAULT, "fakecudaBusyNs");
			if (!busy_fn)
				die("fakecudaBusyNs not found%s%s", "", "");
			CUcontext c = NULL;
			check_rc("cuCtxGetCurrent", cuCtxGetCurrent(&c), NULL);
			struct lt_arg t[16];
			pthread_t th[16];
			double t0 = now_s();
			for (int k = 0; k < n; k++) {
				t[k] = (struct lt_arg){c, (unsigned)atoi(a[4]), t0 + total, 0};
				if (pthread_create(&th[k], NULL, lt_thread, &t[k]) != 0)
					die("pthread_create failed%s%s", "", "");
			}
			long long w0 = 0, w1 = 0, b0, b1;
			usleep((useconds_t)(warm * 1e6));
			b0 = busy_fn(getpid(), 0, &w0);
			double left = t0 + total - now_s();
			if (left > 0)
				usleep((useconds_t)(left * 1e6));
			b1 = busy_fn(getpid(), 0, &w1);
			for (int k = 0; k < n; k++)
				pthread_join(th[k], NULL);
			check_rc("cuCtxSynchronize", api.CtxSynchronize(), NULL);
			printf("share %.1f\n", (double)(b1 - b0) / (double)(w1 - w0) * 100.0);
			for (int k = 0; k < n; k++)
				printf("thread %d launches %lu\n", k, t[k].launches);
		} else if (!strcmp(op, "thread")) {
			/* A new thread has no current context: the driver's error, no crash, nothing counted. */
			pthread_t t;
			long rcs[2];
			pthread_create(&t, NULL, thread_alloc, rcs);
			pthread_join(t, NULL);
			printf("thread alloc=%ld info=%ld\n", rcs[0], rcs[1]);
			if (rcs[0] != CUDA_ERROR_INVALID_CONTEXT || rcs[1] != CUDA_ERROR_INVALID_CONTEXT)
				die("thread without context: unexpected results%s%s", "", "");
		} else if (!strcmp(op, "fork")) {
			/* fork:SIZE:PATH — the child allocates SIZE, then waits for PATH and exits. */
			pid_t c = fork();
			if (c == 0) {
				rc = api.MemAlloc(&p, size_arg(a[1]));
				printf("child %d alloc %d\n", getpid(), rc);
				fflush(stdout);
				while (access(a[2], F_OK) != 0)
					usleep(10000);
				_exit(rc == CUDA_SUCCESS ? 0 : 1);
			}
			printf("forked %d\n", c);
		} else if (!strcmp(op, "forkctx")) {
			/* forkctx:READY:END — the child retains a primary context of its own
			 * (CUDA state does not survive fork), allocates 1 MiB, touches READY,
			 * then waits for END and exits. */
			pid_t c = fork();
			if (c == 0) {
				set_ctx(0);
				check_rc("child cuMemAlloc", api.MemAlloc(&p, 1 << 20), NULL);
				FILE *f = fopen(a[1], "w");
				if (f)
					fclose(f);
				while (access(a[2], F_OK) != 0)
					usleep(10000);
				_exit(0);
			}
			printf("forked %d\n", c);
		} else if (!strcmp(op, "ctxcb")) {
			/* ctxcb:SIZE — from now on the driver calls back into this program while it creates
			 * a context, and the callback allocates SIZE there (must succeed). */
			void (*set)(void (*)(CUcontext)) =
				(void (*)(void (*)(CUcontext)))dlsym(RTLD_DEFAULT, "fakecudaSetContextCallback");
			if (!set)
				die("fakecudaSetContextCallback not found%s%s", "", "");
			cb_bytes = size_arg(a[1]);
			set(ctx_created);
		} else if (!strcmp(op, "modload")) {
			/* modload:KIND[:RC] — loads a module (KIND file, data, dataex, fatbin) or a library
			 * (lib, libfile); later getfunc/getkernel/modunload use the last one loaded. */
			static const char image[] = "fake cubin";
			const char *k = a[1] ? a[1] : "data";
			CUmodule m = NULL;
			CUlibrary l = NULL;
			int lib = !strncmp(k, "lib", 3);
			if (!strcmp(k, "file"))
				rc = cuModuleLoad(&m, "kernels.cubin");
			else if (!strcmp(k, "data"))
				rc = cuModuleLoadData(&m, image);
			else if (!strcmp(k, "dataex"))
				rc = cuModuleLoadDataEx(&m, image, 0, NULL, NULL);
			else if (!strcmp(k, "fatbin"))
				rc = cuModuleLoadFatBinary(&m, image);
			else if (!strcmp(k, "lib"))
				rc = cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0);
			else if (!strcmp(k, "libfile"))
				rc = cuLibraryLoadFromFile(&l, "kernels.fatbin", NULL, NULL, 0, NULL, NULL, 0);
			else
				die("modload: unknown kind %s%s", k, "");
			check_rc(k, rc, a[2]);
			if (rc == CUDA_SUCCESS) {
				mods[nmods].lib = lib;
				mods[nmods++].h = lib ? (void *)l : (void *)m;
			}
		} else if (!strcmp(op, "modunload")) {
			if (!nmods)
				die("modunload: nothing loaded%s%s", "", "");
			nmods--;
			check_rc("unload", mods[nmods].lib ? cuLibraryUnload((CUlibrary)mods[nmods].h)
							   : cuModuleUnload((CUmodule)mods[nmods].h), a[1]);
		} else if (!strcmp(op, "getfunc") || !strcmp(op, "getkernel")) {
			/* getfunc:NAME — the function NAME of the last module (through cuLibraryGetKernel and
			 * cuKernelGetFunction for a library); getkernel:NAME — a library's kernel handle only,
			 * launched as a function. launchf uses the last one. */
			if (!nmods)
				die("%s: nothing loaded%s", op, "");
			if (!mods[nmods - 1].lib) {
				check_rc("cuModuleGetFunction", cuModuleGetFunction(&cur_fn, (CUmodule)mods[nmods - 1].h, a[1]),
					 a[2]);
			} else {
				CUkernel k;
				check_rc("cuLibraryGetKernel", cuLibraryGetKernel(&k, (CUlibrary)mods[nmods - 1].h, a[1]), NULL);
				if (!strcmp(op, "getkernel"))
					cur_fn = (CUfunction)k;
				else
					check_rc("cuKernelGetFunction", cuKernelGetFunction(&cur_fn, k), a[2]);
			}
		} else if (!strcmp(op, "getmodule")) {
			/* getmodule[:RC] — cuLibraryGetModule of the last library loaded. */
			CUmodule m = NULL;
			if (!nmods || !mods[nmods - 1].lib)
				die("getmodule: no library loaded%s%s", "", "");
			check_rc("cuLibraryGetModule", cuLibraryGetModule(&m, (CUlibrary)mods[nmods - 1].h), a[1]);
		} else if (!strcmp(op, "launchf")) {
			/* launchf:N — N one-block launches of the function from getfunc/getkernel. */
			for (int k = 0; k < atoi(a[1]); k++)
				check_rc("cuLaunchKernel", api.LaunchKernel(cur_fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL),
					 NULL);
		} else if (!strcmp(op, "setlimit")) {
			/* setlimit:LIMIT:VALUE[:RC] — cuCtxSetLimit (0 stack size, 1 printf FIFO, 2 malloc heap). */
			check_rc("cuCtxSetLimit", cuCtxSetLimit(atoi(a[1]), (size_t)size_arg(a[2])), a[3]);
		} else if (!strcmp(op, "wait")) {
			int st;
			while (wait(&st) > 0)
				if (!WIFEXITED(st) || WEXITSTATUS(st))
					die("child failed%s%s", "", "");
		} else if (!strcmp(op, "closefds")) {
			/* closefds — as a program that closes every descriptor it did not open (3 and up) and
			 * then opens files: /dev/null until the numbers reach 400. */
			for (int fd = 3; fd < 4096; fd++)
				close(fd);
			for (int fd = 0; fd >= 0 && fd < 400;)
				fd = open("/dev/null", O_RDONLY);
		} else if (!strcmp(op, "ownbus")) {
			/* ownbus:MS — installs the program's SIGBUS handler (own_sigbus) and starts a thread
			 * that faults in a mapping of its own for MS ms. */
			struct sigaction sa;
			memset(&sa, 0, sizeof(sa));
			sa.sa_sigaction = own_sigbus;
			sa.sa_flags = SA_SIGINFO;
			sigaction(SIGBUS, &sa, NULL);
			if (pthread_create(&own_bus, NULL, own_bus_thread, (void *)atol(a[1])) != 0)
				die("ownbus: %s%s", "no thread", "");
		} else if (!strcmp(op, "ownbusjoin")) {
			/* ownbusjoin — waits for that thread; fails unless the program's handler saw its
			 * faults and is still the one installed. */
			pthread_join(own_bus, NULL);
			struct sigaction cur;
			sigaction(SIGBUS, NULL, &cur);
			printf("ownbus faults=%d\n", (int)own_faults);
			if (!own_faults || cur.sa_sigaction != own_sigbus)
				die("ownbus: %s%s", "the program's handler lost its faults or its place", "");
		} else if (!strcmp(op, "dup3limits")) {
			/* dup3limits:PATH — as a program that dup3()s a fresh open of the limits file PATH
			 * over every descriptor of it that it finds in /proc/self/fd (the shim's): the same
			 * file, another open file description. */
			int n = 0;
			for (int fd = 3; fd < 4096; fd++) {
				char self[64], to[4096];
				snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
				ssize_t l = readlink(self, to, sizeof(to) - 1);
				if (l <= 0)
					continue;
				to[l] = 0;
				/* A directory (the ledger's): every file of it. */
				size_t dl = strlen(a[1]);
				if (strcmp(to, a[1]) && !(strncmp(to, a[1], dl) == 0 && to[dl] == '/'))
					continue;
				int fresh = open(to, O_RDONLY);
				if (fresh < 0 || dup3(fresh, fd, O_CLOEXEC) != fd)
					die("dup3 %s%s", a[1], "");
				close(fresh);
				n++;
			}
			if (!n)
				die("dup3limits: no descriptor of %s%s", a[1], "");
		} else if (!strcmp(op, "readfile")) {
			/* readfile:PATH — opens PATH, reads it and closes it (as a program reading the limits file). */
			char buf[256];
			int fd = open(a[1], O_RDONLY | O_CLOEXEC);
			if (fd < 0 || read(fd, buf, sizeof(buf)) < 0)
				die("readfile %s%s", a[1], "");
			close(fd);
		} else if (!strcmp(op, "sleep")) {
			usleep((useconds_t)atoi(a[1]) * 1000);
		} else if (!strcmp(op, "waitfile")) {
			while (access(a[1], F_OK) != 0)
				usleep(2000);
		} else if (!strcmp(op, "touch")) {
			FILE *f = fopen(a[1], "w");
			if (f)
				fclose(f);
		} else if (!strcmp(op, "where")) {
			/* where:NAME — which library dlsym(libcuda, NAME) resolves to. */
			void *h = libcuda ? libcuda : dlopen("libcuda.so.1", RTLD_NOW);
			void *q = dlsym(h, a[1]);
			printf("where %s %s %s\n", a[1], owner(q), symname(q));
		} else if (!strcmp(op, "where225")) {
			void *h = libcuda ? libcuda : dlopen("libcuda.so.1", RTLD_NOW);
			void *q = dlsym_2_2_5(h, a[1]);
			printf("where225 %s %s %s\n", a[1], owner(q), symname(q));
		} else if (!strcmp(op, "driverself")) {
			int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakecudaSelfLookup");
			if (!f || f() != 1)
				die("the driver's own dlsym got a wrapper%s%s", "", "");
		} else if (!strcmp(op, "wheredef")) {
			void *q = dlsym(RTLD_DEFAULT, a[1]);
			printf("wheredef %s %s %s\n", a[1], owner(q), symname(q));
		} else if (!strcmp(op, "calllegacy")) {
			/* calllegacy:NAME — what a caller that asked for NAME at 2000 gets, called
			 * (cuCtxAttach: one the shim leaves alone; the fake aborts). */
			void *q = NULL;
			CUdriverProcAddressQueryResult st;
			if (gpa5)
				gpa5(a[1], &q, 2000, 0, &st);
			else
				gpa4(a[1], &q, 2000, 0);
			if (!q)
				die("no legacy %s%s", a[1], "");
			((CUresult(*)(CUdeviceptr *, size_t))q)(&p, 1);
			die("legacy %s returned%s", a[1], "");
		} else if (!strcmp(op, "gpa")) {
			/* gpa:NAME:VERSION:FLAGS — what cuGetProcAddress(_v2) returns. */
			void *q = NULL;
			CUdriverProcAddressQueryResult st = -1;
			if (gpa5)
				rc = gpa5(a[1], &q, atoi(a[2]), (cuuint64_t)atoi(a[3]), &st);
			else
				rc = gpa4(a[1], &q, atoi(a[2]), (cuuint64_t)atoi(a[3]));
			printf("gpa %s %s rc=%d status=%d %s %s\n", a[1], a[2], rc, st, owner(q), symname(q));
		} else {
			die("unknown op %s%s", op, "");
		}
	}
}
