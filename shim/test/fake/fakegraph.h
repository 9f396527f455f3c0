/*
 * Between the fake driver's core (fakecuda.c) and its graph model
 * (fakegraph.c), both linked into the fake libcuda.so.1 (test only).
 */
#ifndef FAKEGRAPH_H
#define FAKEGRAPH_H

#include <stdint.h>

#include "cuda_abi.h"

/* fakecuda.c: queues one kernel of `blocks` thread blocks on the current
 * context's device, as cuLaunchKernel does. */
CUresult fk_run_kernel(uint64_t blocks);
/* fakecuda.c: frees a cuMemAlloc*-made pointer of this process. */
CUresult fk_free_ptr(CUdeviceptr p);

/*
 * fakegraph.c: stream capture. Each returns 1 when stream s is capturing
 * (the operation became a node of the capture's graph, *rc says how that
 * went) and 0 when the caller must run it as usual.
 */
int fg_capture_alloc(CUstream s, uint64_t bytes, int dev, CUdeviceptr *p, CUresult *rc);
int fg_capture_free(CUstream s, CUdeviceptr p, CUresult *rc);
int fg_capture_kernel(CUstream s, unsigned gx, unsigned gy, unsigned gz, CUresult *rc);
/* A free outside any graph: returns 1 when p is a graph allocation (*rc:
 * success if it was live), 0 when it is not one. */
int fg_free(CUdeviceptr p, CUresult *rc);

/* In a fork child: graphs, like every CUDA object, are the parent's. */
void fg_after_fork(void);

#endif
