/* CUDA graphs (graph.c): what an executable graph runs and the device memory graphs hold. */
#ifndef VGPU_GRAPH_H
#define VGPU_GRAPH_H

#include <stdint.h>

#include "common.h"

/*
 * The work one launch of g runs, in waves, what it holds the GPU for (the SM
 * limiter's charge for cuGraphLaunch): the sum over kernel nodes (child graphs
 * included) of ceil(blocks / SMs of the device g was instantiated on), as of
 * its instantiation or last update (cuGraphExecUpdate, node setters); 0 when
 * unknown (not instantiated through the shim, or the driver would not tell).
 * A hash lookup under a process-local mutex.
 */
uint64_t vgpu_graph_exec_waves(CUgraphExec g);

/*
 * Graph memory of a launch or upload of g: vgpu_graph_back_begin before the
 * driver call (nonzero: refused over the quota, return
 * CUDA_ERROR_OUT_OF_MEMORY without calling the driver), vgpu_graph_back_end
 * after it with what it returned. For a graph without memory nodes both are
 * a flag test.
 */
struct vgpu_graph_backing {
	int active;
	CUgraphExec exec;               /* the graph launched (NULL: an upload) */
	uint64_t est[VGPU_MAX_DEVICES]; /* reserved ahead, per limits index */
	uint64_t devs;                  /* CUDA devices to re-read afterwards */
};
/* launch: 1 for cuGraphLaunch, 0 for an upload. */
int vgpu_graph_back_begin(CUgraphExec g, int launch, struct vgpu_graph_backing *b);
/* rc: what the driver call returned. */
void vgpu_graph_back_end(struct vgpu_graph_backing *b, CUresult rc);

/* Whether s (the per-thread default stream when ptsz and s is NULL) is
 * capturing: its stream-ordered allocations and frees then become graph
 * nodes, which hold no memory until the graph is uploaded or launched. One
 * atomic load while no stream of the process captures. */
int vgpu_graph_capturing(CUstream s, int ptsz);

#endif
