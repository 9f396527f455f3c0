/* Prototypes of every exported wrapper (their ABI, as the driver/NVML declare it). */
#ifndef VGPU_PROTOS_H
#define VGPU_PROTOS_H

#include "../include/cuda_abi.h"

#define API __attribute__((visibility("default")))

API CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status);
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem);
API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes);
API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
			     unsigned int elem);
API CUresult cuMemFree(CUdeviceptr_v1 p);
API CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *a);
API CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *a);
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags);
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s);
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s);
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s);
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
API CUresult cuMemPoolDestroy(CUmemoryPool pool);
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
API CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type);
API CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type);
API CUresult cuMemSetMemPool(CUmemLocation *loc, int type, CUmemoryPool pool);
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value);
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
API CUresult cuCtxSynchronize(void);
API CUresult cuCtxSynchronize_v2(CUcontext ctx);
API CUresult cuStreamSynchronize(CUstream s);
API CUresult cuStreamSynchronize_ptsz(CUstream s);
API CUresult cuEventSynchronize(CUevent e);
API CUresult cuMemFree_v2(CUdeviceptr p);
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s);
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes, const CUmemAllocationProp *prop,
			 unsigned long long flags);
API CUresult cuMemRelease(CUmemGenericAllocationHandle h);
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr);
API CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		      unsigned long long flags);
API CUresult cuMemUnmap(CUdeviceptr va, size_t size);
API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *a);
API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *a);
API CUresult cuImportExternalMemory(CUexternalMemory *ext, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc);
API CUresult cuDestroyExternalMemory(CUexternalMemory ext);
API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, int type);
API CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_off, CUmemGenericAllocationHandle mem,
				size_t mem_off, size_t size, unsigned long long flags);
API CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off,
				   CUmemGenericAllocationHandle mem, size_t mem_off, size_t size, unsigned long long flags);
API CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_off, CUdeviceptr va, size_t size,
				 unsigned long long flags);
API CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off, CUdeviceptr va,
				    size_t size, unsigned long long flags);
API CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_off, size_t size);
API CUresult cuArrayDestroy(CUarray arr);
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *a, unsigned levels);
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray m);
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
API CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
API CUresult cuDevicePrimaryCtxReset(CUdevice dev);
API CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev);
API CUresult cuCtxCreate_v3(CUcontext *ctx, void *affinity, int n, unsigned flags, CUdevice dev);
API CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned flags, CUdevice dev);
API CUresult cuCtxDestroy_v2(CUcontext ctx);
API CUresult cuCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev);
API CUresult cuCtxDestroy(CUcontext ctx);
API CUresult cuGLCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev);
API CUresult cuGLCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev);
/* VdpDevice is a uint32_t, VdpGetProcAddress * a function pointer. */
API CUresult cuVDPAUCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice dev, uint32_t vdp, void *get_proc);
API CUresult cuVDPAUCtxCreate(CUcontext *ctx, unsigned flags, CUdevice dev, uint32_t vdp, void *get_proc);
API CUresult cuGreenCtxCreate(CUgreenCtx *g, CUdevResourceDesc desc, CUdevice dev, unsigned flags);
API CUresult cuGreenCtxDestroy(CUgreenCtx g);
API CUresult cuMemGetInfo_v2(size_t *free_out, size_t *total_out);
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
API CUresult cuMemGetInfo(unsigned int *free_out, unsigned int *total_out);
API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m);
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m);
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
			    unsigned bz, unsigned shm, CUstream s, void **params, void **extra);
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				 unsigned bz, unsigned shm, CUstream s, void **params, void **extra);
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params);
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
					    unsigned by, unsigned bz, unsigned shm, CUstream s, void **params);
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
API CUresult cuLaunch(CUfunction f);
API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned flags);
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags);
API CUresult cuIpcCloseMemHandle(CUdeviceptr p);
API CUresult cuMemPoolImportPointer(CUdeviceptr *p, CUmemoryPool pool, CUmemPoolPtrExportData *data);
API CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned n, CUstream s);
API CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned n, CUstream s);
API CUresult cuLaunchGrid(CUfunction f, int grid_w, int grid_h);
API CUresult cuLaunchGridAsync(CUfunction f, int grid_w, int grid_h, CUstream s);
API CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags);
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s);
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s);
API CUresult cuModuleLoad(CUmodule *m, const char *fname);
API CUresult cuModuleLoadData(CUmodule *m, const void *image);
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *opts, void **vals);
API CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin);
API CUresult cuModuleUnload(CUmodule m);
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
API CUresult cuLibraryLoadData(CUlibrary *l, const void *code, CUjit_option *jo, void **jv, unsigned nj,
			       CUlibraryOption *lo, void **lv, unsigned nl);
API CUresult cuLibraryLoadFromFile(CUlibrary *l, const char *file, CUjit_option *jo, void **jv, unsigned nj,
				   CUlibraryOption *lo, void **lv, unsigned nl);
API CUresult cuLibraryUnload(CUlibrary l);
API CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l);
API CUresult cuKernelGetFunction(CUfunction *f, CUkernel k);
API CUresult cuCtxSetLimit(CUlimit limit, size_t value);

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out);
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v2_t *out);
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *out);
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out);
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v2_t *out);
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *out);
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out);
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned *count,
							    nvmlProcessInfo_v2_t *out);
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_t *out);
API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t dev, nvmlProcessDetailList_v1_t *l);
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s, unsigned *count,
						 unsigned long long since);
API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t dev, nvmlProcessesUtilizationInfo_v1_t *u);
API nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned len);
API nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t dev, unsigned *count, unsigned *pids);
API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t dev, unsigned pid, nvmlAccountingStats_t *stats);

/* CUDA graphs (graph.c) */
API CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz);
API CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz);
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
API CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
API CUresult cuGraphUpload(CUgraphExec g, CUstream s);
API CUresult cuGraphUpload_ptsz(CUgraphExec g, CUstream s);
API CUresult cuGraphExecDestroy(CUgraphExec g);
API CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, int *result);
API CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info);
API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
API CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
API CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p);
API CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child);
API CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned enabled);
API CUresult cuDeviceGraphMemTrim(CUdevice dev);
API CUresult cuStreamBeginCapture(CUstream s);
API CUresult cuStreamBeginCapture_ptsz(CUstream s);
API CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode);
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g);
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);

#undef API
#endif
