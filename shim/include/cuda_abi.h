/*
 * Hand-declared subset of the CUDA driver API and NVML ABI (Linux x86_64).
 *
 * No CUDA headers are available at build time, and the shim must not depend
 * on them: every type below is declared from the public ABI and the layouts
 * are pinned with static assertions so a wrong declaration fails the build
 * instead of corrupting a caller's memory.
 */
#ifndef VGPU_CUDA_ABI_H
#define VGPU_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ---- driver API basic types ------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
/* Green contexts (CUDA 12.4): opaque handles. Not in the ABI notes; signatures
 * as the driver API reference gives them, unverified here:
 *   cuGreenCtxCreate(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned) @12040,
 *   cuGreenCtxDestroy(CUgreenCtx) @12040,
 *   cuCtxFromGreenCtx(CUcontext *, CUgreenCtx) @12040. */
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
/* Modules and libraries (context footprint): opaque handles, 8 bytes (ABI notes ✔✔). */
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
/* CUjit_option, CUlibraryOption and CUlimit are C enums: 4-byte ints on x86_64.
 * Limit values from the driver API reference (not in the ABI notes: unverified). */
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef int CUlimit;
#define CU_LIMIT_STACK_SIZE 0
#define CU_LIMIT_PRINTF_FIFO_SIZE 1
#define CU_LIMIT_MALLOC_HEAP_SIZE 2

typedef struct {
	char bytes[16];
} CUuuid;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
/* Unverified against the ABI notes: 39 per the driver API reference's CUdevice_attribute. */
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
/* PCI location attributes (ABI notes, both sources): the fake driver hashes them for cudart. */
#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50

/* cuGetProcAddress flags and query results. */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
typedef int CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* ---- memory structures ------------------------------------------------ */

#define CU_MEM_LOCATION_TYPE_DEVICE 1
/* Host memory locations (not GPU memory): HOST, HOST_NUMA, HOST_NUMA_CURRENT. */
#define CU_MEM_LOCATION_TYPE_HOST 2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
/* No preferred location (managed pools, CUDA 13): INVALID's value, unverified. */
#define CU_MEM_LOCATION_TYPE_NONE 0
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
/* CUDA 13 managed pools; value from cuda-python's 13.0 declarations (one source). */
#define CU_MEM_ALLOCATION_TYPE_MANAGED 2

typedef struct CUevent_st *CUevent;

/* CUmemPool_attribute (ABI notes, two sources). RESERVED_* / USED_* values are cuuint64_t. */
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 8

typedef struct {
	int type; /* CUmemLocationType */
	int id;
} CUmemLocation;

typedef struct {
	int type;                 /* CUmemAllocationType */
	int requestedHandleTypes; /* CUmemAllocationHandleType bitmask */
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

/*
 * Memory pool properties (cuMemPoolCreate): 88 bytes in every CUDA release;
 * 11.x had reserved[64] from offset 24, 12.x/13.x put maxSize and usage
 * there. The shim reads only location.
 */
typedef struct {
	int allocType;   /* CUmemAllocationType */
	int handleTypes; /* CUmemAllocationHandleType bitmask */
	CUmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CUmemPoolProps;

/* Special stream handles (never dereferenced): they name a stream of the
 * calling thread's current context, as NULL (the default stream) does. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/*
 * Driver functions the shim calls or hooks to find the device of
 * stream-ordered memory, with their ABI. From the ABI notes:
 *   cuCtxPushCurrent_v2(CUcontext) @4000, cuCtxPopCurrent_v2(CUcontext *) @4000,
 *   cuCtxGetDevice_v2(CUdevice *, CUcontext) (CUDA 13.0; optional).
 * NOT in the ABI notes (signatures and versions as the CUDA driver API
 * reference gives them, unverified here; each is resolved lazily and the
 * shim falls back when one is absent):
 *   cuStreamGetCtx(CUstream, CUcontext *) @9020,
 *   cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *) @11020,
 *   cuMemPoolDestroy(CUmemoryPool) @11020,
 *   cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice) @11020,
 *   cuDeviceGetMemPool(CUmemoryPool *, CUdevice) @11020,
 *   cuMemPoolSetAttribute / cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute, void *) @11020,
 *   cuMemPoolTrimTo(CUmemoryPool, size_t) @11020 (the last two also in the ABI notes),
 *   cuCtxSynchronize(void) @2000, cuCtxSynchronize_v2(CUcontext) @13000 (ABI notes),
 *   cuStreamSynchronize(CUstream) @2000 (_ptsz @7000),
 *   cuEventSynchronize(CUevent) @2000 (these three in the ABI notes),
 *   CUDA 13.0 (cuda-python's 13.0 loader asks for them at 13000):
 *   cuMemGetDefaultMemPool(CUmemoryPool *, CUmemLocation *, CUmemAllocationType),
 *   cuMemGetMemPool(CUmemoryPool *, CUmemLocation *, CUmemAllocationType),
 *   cuMemSetMemPool(CUmemLocation *, CUmemAllocationType, CUmemoryPool).
 */
typedef CUresult (*PFN_cuStreamGetCtx)(CUstream, CUcontext *);
typedef CUresult (*PFN_cuCtxGetDevice_v2)(CUdevice *, CUcontext);
typedef CUresult (*PFN_cuCtxPushCurrent_v2)(CUcontext);
typedef CUresult (*PFN_cuCtxPopCurrent_v2)(CUcontext *);

typedef struct {
	size_t Width;
	size_t Height;
	int Format; /* CUarray_format */
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
	size_t Width;
	size_t Height;
	size_t Depth;
	int Format; /* CUarray_format */
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/*
 * The pre-3.2 ABIs exported under the bare names (cuMemAlloc, cuMemFree,
 * cuMemAllocPitch, cuArrayCreate, cuArray3DCreate): 32-bit device pointers
 * and sizes. Types from the legacy section of cuda.h and cudaTypedefs.h
 * (PFN_cuMemAlloc_v2000 ...); not in the ABI notes.
 */
typedef unsigned int CUdeviceptr_v1;

typedef struct {
	unsigned int Width;
	unsigned int Height;
	int Format; /* CUarray_format */
	unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct {
	unsigned int Width;
	unsigned int Height;
	unsigned int Depth;
	int Format; /* CUarray_format */
	unsigned int NumChannels;
	unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/*
 * External memory (another API's allocation imported into CUDA) and
 * multicast objects. Not in the ABI notes: layouts from cuda-python's 13.0
 * declarations, one source, unverified (sizes computed here).
 *   cuImportExternalMemory(CUexternalMemory *, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *) @10000
 *   cuDestroyExternalMemory(CUexternalMemory) @10000
 *   cuExternalMemoryGetMappedBuffer(CUdeviceptr *, CUexternalMemory, const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *) @10000
 *   cuMulticastCreate(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *) @12010
 *   cuMulticastBindMem(mc, size_t mcOffset, CUmemGenericAllocationHandle mem, size_t memOffset, size_t size,
 *                      unsigned long long flags) @12010; _v2 adds CUdevice dev after mc
 *   cuMulticastBindAddr(mc, size_t mcOffset, CUdeviceptr memptr, size_t size, unsigned long long flags) @12010;
 *                      _v2 adds CUdevice dev after mc (the _v2s are in the 13.4 reference; the
 *                      version they appeared in is not known here, 13010 is a guess)
 *   cuMulticastUnbind(mc, CUdevice dev, size_t mcOffset, size_t size) @12010
 *   cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *, CUmemGenericAllocationHandle) @10020
 */
typedef struct CUextMemory_st *CUexternalMemory;

typedef struct {
	int type; /* CUexternalMemoryHandleType: OPAQUE_FD 1 ... NVSCIBUF 8 */
	union {
		int fd;
		struct {
			void *handle;
			const void *name;
		} win32;
		const void *nvSciBufObject;
	} handle;
	unsigned long long size;
	unsigned int flags;
	unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_HANDLE_DESC;

typedef struct {
	unsigned long long offset;
	unsigned long long size;
	unsigned int flags;
	unsigned int reserved[16];
} CUDA_EXTERNAL_MEMORY_BUFFER_DESC;

#define CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD 1

/* IPC handles, passed by value (64 opaque bytes each; not in the ABI notes; test use only):
 *   cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr) @4010,
 *   cuIpcOpenMemHandle(CUdeviceptr *, CUipcMemHandle, unsigned) @4010 and _v2 @11000,
 *   cuIpcCloseMemHandle(CUdeviceptr) @4010,
 *   cuMemPoolExportPointer(CUmemPoolPtrExportData *, CUdeviceptr) @11020,
 *   cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *) @11020. */
typedef struct {
	char reserved[64];
} CUipcMemHandle;

typedef struct {
	unsigned char reserved[64];
} CUmemPoolPtrExportData;

typedef struct {
	unsigned int numDevices;
	size_t size;
	unsigned long long handleTypes;
	unsigned long long flags;
} CUmulticastObjectProp;

#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04
/* Arrays whose memory is mapped into them later (cuMemMapArrayAsync): none of their own. */
#define CUDA_ARRAY3D_SPARSE 0x40
#define CUDA_ARRAY3D_DEFERRED_MAPPING 0x80

/*
 * cuMemMapArrayAsync(CUarrayMapInfo *, unsigned count, CUstream) @11010 (and
 * _ptsz): maps tiles of cuMemCreate allocations into sparse arrays, or unmaps
 * them. Layout as the driver API reference and cuda-python's 13.0
 * declarations give it (two sources; offsets computed here); not in the ABI
 * notes.
 */
#define CU_MEM_OPERATION_TYPE_MAP 1
#define CU_MEM_OPERATION_TYPE_UNMAP 2
#define CU_MEM_HANDLE_TYPE_GENERIC 0
typedef struct {
	int resourceType; /* CUresourcetype: 0 array, 1 mipmapped array */
	void *resource;   /* the CUarray or CUmipmappedArray */
	int subresourceType;
	union {
		unsigned int sparseLevel[8]; /* level, layer, offsetX/Y/Z, extentWidth/Height/Depth */
		struct {
			unsigned int layer;
			unsigned long long offset, size;
		} miptail;
	} subresource;
	int memOperationType;
	int memHandleType;
	CUmemGenericAllocationHandle memHandle;
	unsigned long long offset;
	unsigned int deviceBitMask;
	unsigned int flags;
	unsigned int reserved[2];
} CUarrayMapInfo;
_Static_assert(sizeof(CUarrayMapInfo) == 96, "CUarrayMapInfo");
_Static_assert(offsetof(CUarrayMapInfo, subresource) == 24 && offsetof(CUarrayMapInfo, memOperationType) == 56 &&
		       offsetof(CUarrayMapInfo, memHandle) == 64,
	       "CUarrayMapInfo offsets");

typedef struct {
	int id; /* CUlaunchAttributeID */
	char pad[4];
	union {
		char pad[64];
	} value;
} CUlaunchAttribute;

typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

/* cuLaunchCooperativeKernelMultiDevice (9.0, deprecated): one entry per device. */
typedef struct {
	CUfunction function;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void **kernelParams;
} CUDA_LAUNCH_PARAMS;

_Static_assert(sizeof(CUresult) == 4, "CUresult");
_Static_assert(sizeof(CUdeviceptr) == 8, "CUdeviceptr");
_Static_assert(sizeof(CUuuid) == 16 && _Alignof(CUuuid) == 1, "CUuuid");
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "prop.location");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "prop.allocFlags");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps");
_Static_assert(offsetof(CUmemPoolProps, location) == 8, "pool.location");
_Static_assert(offsetof(CUmemPoolProps, maxSize) == 24, "pool.maxSize");
_Static_assert(offsetof(CUmemPoolProps, usage) == 32, "pool.usage");
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR) == 24, "CUDA_ARRAY_DESCRIPTOR");
_Static_assert(offsetof(CUDA_ARRAY_DESCRIPTOR, NumChannels) == 20, "ad.NumChannels");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR");
_Static_assert(offsetof(CUDA_ARRAY3D_DESCRIPTOR, Format) == 24, "a3d.Format");
_Static_assert(offsetof(CUDA_ARRAY3D_DESCRIPTOR, Flags) == 32, "a3d.Flags");
_Static_assert(sizeof(CUdeviceptr_v1) == 4, "CUdeviceptr_v1");
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR_v1) == 16, "CUDA_ARRAY_DESCRIPTOR_v1");
_Static_assert(offsetof(CUDA_ARRAY_DESCRIPTOR_v1, Format) == 8, "ad1.Format");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR_v1) == 24, "CUDA_ARRAY3D_DESCRIPTOR_v1");
_Static_assert(offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, Format) == 12, "a3d1.Format");
_Static_assert(sizeof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC) == 104, "CUDA_EXTERNAL_MEMORY_HANDLE_DESC");
_Static_assert(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, handle) == 8, "emhd.handle");
_Static_assert(offsetof(CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size) == 24, "emhd.size");
_Static_assert(sizeof(CUDA_EXTERNAL_MEMORY_BUFFER_DESC) == 88, "CUDA_EXTERNAL_MEMORY_BUFFER_DESC");
_Static_assert(sizeof(CUmulticastObjectProp) == 32, "CUmulticastObjectProp");
_Static_assert(offsetof(CUmulticastObjectProp, size) == 8, "mcprop.size");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "lc.hStream");
_Static_assert(offsetof(CUlaunchConfig, numAttrs) == 48, "lc.numAttrs");
_Static_assert(sizeof(CUDA_LAUNCH_PARAMS) == 56, "CUDA_LAUNCH_PARAMS");
_Static_assert(offsetof(CUDA_LAUNCH_PARAMS, hStream) == 40, "lp.hStream");

/* ---- CUDA graphs (graph.c; the fake driver's fakegraph.c) ------------------ */

/*
 * From the CUDA driver API reference and public header copies (cuda-python's
 * generated bindings, ROCm's hipify tables); NOT in the ABI notes, so
 * unverified here beyond those sources:
 *   cuGraphCreate(CUgraph *, unsigned) @10000, cuGraphDestroy(CUgraph) @10000,
 *   cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
 *     const CUDA_KERNEL_NODE_PARAMS_v1 *) @10000, _v2 (..._v2 *) @12000,
 *   cuGraphKernelNodeGetParams(CUgraphNode, params *) @10000, _v2 @12000,
 *   cuGraphGetNodes(CUgraph, CUgraphNode *, size_t *) @10000,
 *   cuGraphNodeGetType(CUgraphNode, CUgraphNodeType *) @10000,
 *   cuGraphChildGraphNodeGetGraph(CUgraphNode, CUgraph *) @10000,
 *   cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
 *     CUDA_MEM_ALLOC_NODE_PARAMS *) @11040 (seen requested by cudart 11.8),
 *   cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
 *     CUdeviceptr) @11040, cuGraphMemAllocNodeGetParams(CUgraphNode,
 *     CUDA_MEM_ALLOC_NODE_PARAMS *) @11040,
 *   cuGraphInstantiate (v1 @10000, _v2 @11000; both CUgraphExec *, CUgraph,
 *     CUgraphNode *errNode, char *log, size_t logSize: ABI notes),
 *   cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long) @11040,
 *   cuGraphInstantiateWithParams(CUgraphExec *, CUgraph,
 *     CUDA_GRAPH_INSTANTIATE_PARAMS *) @12000 (+_ptsz),
 *   cuGraphUpload(CUgraphExec, CUstream) @11010 (+_ptsz: ABI notes),
 *   cuGraphExecDestroy(CUgraphExec) @10000,
 *   cuDeviceGraphMemTrim(CUdevice) @11040,
 *   cuDeviceGetGraphMemAttribute / cuDeviceSetGraphMemAttribute(CUdevice,
 *     CUgraphMem_attribute, void *value: a cuuint64_t) @11040,
 *   cuStreamBeginCapture(CUstream) @10000 (+_ptsz),
 *   cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode) @10010 (+_ptsz),
 *   cuStreamEndCapture(CUstream, CUgraph *) @10000 (+_ptsz),
 *   cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *errNode,
 *     CUgraphExecUpdateResult *) @10020, _v2(CUgraphExec, CUgraph,
 *     CUgraphExecUpdateResultInfo *) @12000,
 *   cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *) @10000 (+_ptsz),
 *   cuStreamGetCaptureInfo(CUstream, CUstreamCaptureStatus *, cuuint64_t *id)
 *     @10010 (+_ptsz), _v2 (+ CUgraph *, const CUgraphNode **, size_t *) @11030.
 */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
/* Only passed through by the shim: its layout does not matter here. */
typedef struct CUgraphExecUpdateResultInfo_st CUgraphExecUpdateResultInfo;

/* CUgraphNodeType */
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_GRAPH_NODE_TYPE_GRAPH 4
#define CU_GRAPH_NODE_TYPE_EMPTY 5
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define CU_GRAPH_NODE_TYPE_MEM_FREE 11
/* 12.3+: a node that runs its body graph(s) zero, one or many times. Unverified (API reference). */
#define CU_GRAPH_NODE_TYPE_CONDITIONAL 13

/* CUgraphMem_attribute (values are cuuint64_t bytes) */
#define CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0
#define CU_GRAPH_MEM_ATTR_USED_MEM_HIGH 1
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH 3

/* CUgraphInstantiate_flags */
#define CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH 1
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2

/* CUstreamCaptureStatus / CUstreamCaptureMode */
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0

/* Stream-capture results (CUresult). */
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

/* 12.0+: v1 plus a CUkernel and a context; the grid stays where v1 has it. */
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
	void *kern; /* CUkernel */
	CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

/*
 * Per-node changes of an executable graph (the API reference; unverified):
 *   cuGraphExecKernelNodeSetParams(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v1 *) @10010,
 *     _v2 (..._v2 *) @12000; cuGraphNodeSetEnabled(CUgraphExec, CUgraphNode, unsigned) @11060;
 *   cuGraphExecNodeSetParams(CUgraphExec, CUgraphNode, CUgraphNodeParams *) @12020;
 *   cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *) @12020;
 *   cuGraphExecChildGraphNodeSetParams(CUgraphExec, CUgraphNode, CUgraph) @11010 (? the API
 *     reference gives CUDA 11.1; not in the ABI notes).
 * CUgraphNodeParams: the node type, 12 reserved bytes, a 232-byte union (a kernel node's
 * CUDA_KERNEL_NODE_PARAMS_v3, laid out as _v2 up to its context: only the grid is read here;
 * a child graph node's CUDA_CHILD_GRAPH_NODE_PARAMS, whose first member is the CUgraph (?:
 * the API reference, 12.2+; 12.9 adds an ownership field after it)), 8 reserved bytes: 256 bytes.
 */
typedef struct {
	int type; /* CUgraphNodeType */
	int reserved0[3];
	union {
		long long reserved1[29];
		CUDA_KERNEL_NODE_PARAMS_v2 kernel;
		CUgraph graph; /* CU_GRAPH_NODE_TYPE_GRAPH */
	} u;
	long long reserved2;
} CUgraphNodeParams;

/* ABI notes: location @0, flags @8, 12 bytes. */
typedef struct {
	CUmemLocation location;
	int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct {
	CUmemPoolProps poolProps; /* location: where the memory lives */
	const CUmemAccessDesc *accessDescs;
	size_t accessDescCount;
	size_t bytesize;
	CUdeviceptr dptr; /* out: the allocation's fixed address */
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
	cuuint64_t flags;
	CUstream hUploadStream;
	CUgraphNode hErrNode_out;
	int result_out; /* CUgraphInstantiateResult */
} CUDA_GRAPH_INSTANTIATE_PARAMS;

_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v1) == 56, "CUDA_KERNEL_NODE_PARAMS_v1");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v1, gridDimX) == 8, "kn.gridDimX");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v1, kernelParams) == 40, "kn.kernelParams");
_Static_assert(sizeof(CUDA_KERNEL_NODE_PARAMS_v2) == 72, "CUDA_KERNEL_NODE_PARAMS_v2");
_Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS_v2, kern) == 56, "kn2.kern");
_Static_assert(sizeof(CUgraphNodeParams) == 256 && offsetof(CUgraphNodeParams, u) == 16, "CUgraphNodeParams");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104, "man.bytesize");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112, "man.dptr");
_Static_assert(sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS) == 32, "CUDA_GRAPH_INSTANTIATE_PARAMS");
_Static_assert(offsetof(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out) == 24, "gip.result_out");

/* ---- NVML --------------------------------------------------------------- */

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_NO_DATA = 21,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999,
};

typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
	unsigned int gpu;
	unsigned int memory;
} nvmlUtilization_t;

typedef struct {
	unsigned int pid;
	unsigned long long timeStamp; /* microseconds */
	unsigned int smUtil;
	unsigned int memUtil;
	unsigned int encUtil;
	unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

#define NVML_DEVICE_UUID_BUFFER_SIZE 96
/* usedGpuMemory when the driver cannot tell (always under WDDM / WSL2): nvml.h's
 * NVML_VALUE_NOT_AVAILABLE, (-1) as unsigned long long (NVML API reference). */
#define NVML_VALUE_NOT_AVAILABLE (~0ull)

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(offsetof(nvmlMemory_v2_t, total) == 8, "m2.total");
_Static_assert(offsetof(nvmlMemory_v2_t, used) == 32, "m2.used");
_Static_assert(nvmlMemory_v2 == 0x02000028u, "nvmlMemory_v2 version");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "sample");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, smUtil) == 16, "sample.smUtil");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == 8, "pi1.usedGpuMemory");
_Static_assert(sizeof(CUmodule) == 8 && sizeof(CUlibrary) == 8 && sizeof(CUkernel) == 8, "module handles");
_Static_assert(sizeof(CUlimit) == 4 && sizeof(CUjit_option) == 4 && sizeof(CUlibraryOption) == 4, "enums");

/*
 * NVML process lists (nvmlprocs.c). From the ABI notes: the v1 record is
 * {pid, usedGpuMemory} (16 bytes); _v2 and _v3 both fill the 24-byte
 * nvmlProcessInfo_v2_t (= nvmlProcessInfo_t), which adds the MIG GPU and
 * compute instance ids (0xFFFFFFFF when not MIG). Compute, graphics and MPS
 * lists share the records and the (device, unsigned *count, records) ABI.
 * usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (all ones) where the driver
 * cannot tell (WDDM).
 */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef nvmlProcessInfo_v2_t nvmlProcessInfo_t;

/*
 * NOT in the ABI notes (layouts from NVML's public header, NVML 12.x/13.x,
 * as NVIDIA/go-nvml carries it; unverified on hardware):
 *   nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t, nvmlProcessDetailList_t *)
 *   nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t, nvmlProcessesUtilizationInfo_t *)
 *   nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length)
 * Versioned structs carry sizeof | (version << 24) in their first field.
 */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
	unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

#define NVML_PROCESS_MODE_COMPUTE 0
#define NVML_PROCESS_MODE_GRAPHICS 1
#define NVML_PROCESS_MODE_MPS 2
#define NVML_PROCESS_MODE_ALL 3 /* newer headers only */

typedef struct {
	unsigned int version; /* nvmlProcessDetailList_v1 */
	unsigned int mode;    /* NVML_PROCESS_MODE_* */
	unsigned int numProcArrayEntries;
	nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t;

#define nvmlProcessDetailList_v1 ((unsigned int)(sizeof(nvmlProcessDetailList_v1_t) | (1u << 24)))

typedef struct {
	unsigned long long timeStamp; /* microseconds */
	unsigned int pid;
	unsigned int smUtil;
	unsigned int memUtil;
	unsigned int encUtil;
	unsigned int decUtil;
	unsigned int jpgUtil;
	unsigned int ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
	unsigned int version; /* nvmlProcessesUtilizationInfo_v1 */
	unsigned int processSamplesCount;
	unsigned long long lastSeenTimeStamp;
	nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;

#define nvmlProcessesUtilizationInfo_v1 ((unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1u << 24)))

_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(offsetof(nvmlProcessInfo_v2_t, usedGpuMemory) == 8, "pi2.usedGpuMemory");
_Static_assert(offsetof(nvmlProcessInfo_v2_t, gpuInstanceId) == 16, "pi2.gpuInstanceId");
_Static_assert(offsetof(nvmlProcessInfo_v2_t, computeInstanceId) == 20, "pi2.computeInstanceId");
_Static_assert(offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == 8, "pi1.usedGpuMemory");
_Static_assert(sizeof(nvmlProcessDetail_v1_t) == 32, "nvmlProcessDetail_v1_t");
_Static_assert(offsetof(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory) == 24, "pd.cc");
_Static_assert(sizeof(nvmlProcessDetailList_v1_t) == 24, "nvmlProcessDetailList_v1_t");
_Static_assert(offsetof(nvmlProcessDetailList_v1_t, procArray) == 16, "pdl.procArray");
_Static_assert(nvmlProcessDetailList_v1 == 0x01000018u, "nvmlProcessDetailList_v1 version");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t");
_Static_assert(offsetof(nvmlProcessUtilizationInfo_v1_t, pid) == 8, "pu.pid");
_Static_assert(offsetof(nvmlProcessUtilizationInfo_v1_t, ofaUtil) == 32, "pu.ofaUtil");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_v1_t) == 24, "nvmlProcessesUtilizationInfo_v1_t");
_Static_assert(offsetof(nvmlProcessesUtilizationInfo_v1_t, lastSeenTimeStamp) == 8, "psu.lastSeen");
_Static_assert(offsetof(nvmlProcessesUtilizationInfo_v1_t, procUtilArray) == 16, "psu.array");
_Static_assert(nvmlProcessesUtilizationInfo_v1 == 0x01000018u, "nvmlProcessesUtilizationInfo_v1 version");

/* Accounting (nvmlDeviceGetAccountingPids / ...Stats). Not in the ABI notes:
 * laid out as the NVML reference documents it, unverified. The shim only
 * passes it through; the fake NVML fills it. */
typedef struct {
	unsigned int gpuUtilization;
	unsigned int memoryUtilization;
	unsigned long long maxMemoryUsage;
	unsigned long long time;
	unsigned long long startTime;
	unsigned int isRunning;
	unsigned int reserved[5];
} nvmlAccountingStats_t;
_Static_assert(sizeof(nvmlAccountingStats_t) == 56, "nvmlAccountingStats_t");
_Static_assert(offsetof(nvmlAccountingStats_t, maxMemoryUsage) == 8, "as.maxMemoryUsage");

#endif
