/*
 * CUDA graphs in the fake libcuda.so.1 (test only): graphs of kernel, child
 * graph, memory allocation and memory free nodes, built with the node API or
 * by stream capture; executable graphs whose launch queues their kernels on
 * the device's timeline (fakecuda.c), so utilisation sees what a graph runs;
 * and graph memory as the CUDA programming guide ("Graph Memory Nodes")
 * describes it. What this model relies on from there:
 *
 *  - an allocation node gets its virtual address when it is created (node
 *    API or a captured cuMemAllocAsync); no physical memory is taken then;
 *  - physical memory comes from a per-device graph memory pool of the
 *    process when an executable graph is uploaded or launched, whichever is
 *    first; the pool grows to what the graph needs beyond what it already
 *    holds unused;
 *  - an allocation the graph does not free stays live after the launch until
 *    cuMemFree/cuMemFreeAsync, a free node of another graph, or the next
 *    launch with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH; launching
 *    again while it is live is an error;
 *  - freed graph memory stays reserved by the pool; destroying a graph or an
 *    executable graph returns nothing to the device either; only
 *    cuDeviceGraphMemTrim does, for what no live allocation and no graph
 *    still running needs;
 *  - cuDeviceGetGraphMemAttribute reports used (live allocations) and
 *    reserved (the pool) bytes, current and high-water; only the high-water
 *    marks can be set, and only to 0;
 *  - a free node (or a captured cuMemFreeAsync) may only free a graph
 *    allocation. FAKECUDA_CAPTURE_FREE_ANY=1 makes a captured free of other
 *    memory a node that frees it when the graph runs instead, for a driver
 *    that would accept it (not documented either way).
 *
 * Simplifications: dependencies (edges) are accepted and ignored; a graph
 * needs the sum of its allocations, without reuse inside it; the legacy and
 * per-thread default streams cannot be captured; capture modes are not
 * enforced.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"
#include "fakegraph.h"
#include "fakestate.h"

#define EXPORT __attribute__((visibility("default")))

/* A graph allocation: its address lives as long as the process here. */
struct galloc {
	struct galloc *next;
	CUdeviceptr dptr;
	uint64_t bytes;
	int dev;
	int live; /* allocated by a launch and not freed yet */
};

struct CUgraphNode_st {
	int type;
	CUDA_KERNEL_NODE_PARAMS_v2 k; /* kernel nodes */
	struct galloc *alloc;         /* allocation nodes */
	CUdeviceptr freed;            /* free nodes */
	CUgraph child;                /* child graph nodes: a copy */
};

struct CUgraph_st {
	CUgraphNode *nodes;
	size_t n, cap;
};

struct CUgraphExec_st {
	struct CUgraphExec_st *next;
	uint64_t *kernels; /* grid blocks of each kernel */
	size_t nk;
	CUgraphNode *knodes;  /* ... the node each came from (for the per-node setters) */
	CUgraphNode *kparent; /* ... the top-level child graph node it lies in, or NULL */
	unsigned char *koff;  /* ... disabled (cuGraphNodeSetEnabled) */
	struct galloc **allocs; /* allocations made by a launch */
	int *freed_inside;      /* ... and whether the graph frees them too */
	size_t na;
	CUdeviceptr *frees; /* addresses a launch frees */
	size_t nf;
	unsigned long long flags;
	int64_t running_until; /* when its last launch's kernels end */
};

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static struct galloc *gallocs;
static struct CUgraphExec_st *execs;
static CUdeviceptr next_va = 0x7e0000000000ull;
/* The graph memory pool of this process, per device. */
static uint64_t pool_used[FK_MAX_DEV], pool_used_high[FK_MAX_DEV];
static uint64_t pool_reserved[FK_MAX_DEV], pool_reserved_high[FK_MAX_DEV];

#define GRID(x, y, z) ((uint64_t)(x) * (y) * (z))

/* ---- graphs and nodes ------------------------------------------------------------ */

static CUresult add_node(CUgraph g, CUgraphNode n, CUgraphNode *out)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		CUgraphNode *v = realloc(g->nodes, cap * sizeof(*v));
		if (!v)
			return CUDA_ERROR_OUT_OF_MEMORY;
		g->nodes = v;
		g->cap = cap;
	}
	g->nodes[g->n++] = n;
	if (out)
		*out = n;
	return CUDA_SUCCESS;
}

static CUgraphNode new_node(int type)
{
	CUgraphNode n = calloc(1, sizeof(*n));
	if (n)
		n->type = type;
	return n;
}

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags)
{
	if (!g || flags)
		return CUDA_ERROR_INVALID_VALUE;
	*g = calloc(1, sizeof(**g));
	return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void graph_free(CUgraph g)
{
	/* Live allocations outlive their graph (the guide's note on graph
	 * destruction): the galloc entries stay. */
	for (size_t i = 0; i < g->n; i++) {
		if (g->nodes[i]->child)
			graph_free(g->nodes[i]->child);
		free(g->nodes[i]);
	}
	free(g->nodes);
	free(g);
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	graph_free(g);
	return CUDA_SUCCESS;
}

static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUDA_KERNEL_NODE_PARAMS_v2 *k)
{
	if (!out || !g || !k || !k->gridDimX || !k->gridDimY || !k->gridDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_KERNEL);
	if (!n)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->k = *k;
	return add_node(g, n, out);
}

EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				     const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
	(void)deps, (void)ndeps;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUDA_KERNEL_NODE_PARAMS_v2 k = {0};
	memcpy(&k, p, sizeof(*p));
	return add_kernel(out, g, &k);
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
					const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
	(void)deps, (void)ndeps;
	return add_kernel(out, g, p);
}

EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
	if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_KERNEL)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(p, &n->k, sizeof(*p));
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
	if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_KERNEL)
		return CUDA_ERROR_INVALID_VALUE;
	*p = n->k;
	return CUDA_SUCCESS;
}

static CUgraph graph_copy(CUgraph g)
{
	CUgraph c = calloc(1, sizeof(*c));
	for (size_t i = 0; c && i < g->n; i++) {
		CUgraphNode n = new_node(g->nodes[i]->type);
		if (!n)
			break;
		*n = *g->nodes[i];
		if (n->child)
			n->child = graph_copy(n->child);
		add_node(c, n, NULL);
	}
	return c;
}

/* Graphs with memory nodes cannot be child graphs (driver API reference). */
static int has_memory_nodes(CUgraph g)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
		    (g->nodes[i]->child && has_memory_nodes(g->nodes[i]->child)))
			return 1;
	return 0;
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
					 CUgraph child)
{
	(void)deps, (void)ndeps;
	if (!out || !g || !child || has_memory_nodes(child))
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_GRAPH);
	if (!n)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->child = graph_copy(child);
	return add_node(g, n, out);
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *child)
{
	if (!n || !child || n->type != CU_GRAPH_NODE_TYPE_GRAPH)
		return CUDA_ERROR_INVALID_VALUE;
	*child = n->child;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps)
{
	(void)deps, (void)ndeps;
	if (!out || !g)
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_EMPTY);
	return n ? add_node(g, n, out) : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
	if (!g || !n)
		return CUDA_ERROR_INVALID_VALUE;
	if (nodes) {
		/* As documented: at most *n are written, *n becomes how many were. */
		size_t k = *n < g->n ? *n : g->n;
		memcpy(nodes, g->nodes, k * sizeof(*nodes));
		*n = k;
	} else {
		*n = g->n;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, int *type)
{
	if (!n || !type)
		return CUDA_ERROR_INVALID_VALUE;
	*type = n->type;
	return CUDA_SUCCESS;
}

/* ---- memory nodes -------------------------------------------------------------- */

static struct galloc *galloc_find_locked(CUdeviceptr p)
{
	for (struct galloc *a = gallocs; a; a = a->next)
		if (a->dptr == p)
			return a;
	return NULL;
}

static struct galloc *galloc_new(uint64_t bytes, int dev)
{
	struct galloc *a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	pthread_mutex_lock(&gmu);
	a->dptr = next_va;
	next_va += (bytes + 0x1fffff) / 0x200000 * 0x200000 + 0x200000;
	a->bytes = bytes;
	a->dev = dev;
	a->next = gallocs;
	gallocs = a;
	pthread_mutex_unlock(&gmu);
	return a;
}

static CUresult add_alloc(CUgraphNode *out, CUgraph g, uint64_t bytes, int dev, CUdeviceptr *dptr)
{
	if (!g || !bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
	if (!n || !(n->alloc = galloc_new(bytes, dev))) {
		free(n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*dptr = n->alloc->dptr;
	return add_node(g, n, out);
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				       CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	(void)deps, (void)ndeps;
	if (!out || !p || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	return add_alloc(out, g, p->bytesize, p->poolProps.location.id, &p->dptr);
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		return CUDA_ERROR_INVALID_VALUE;
	memset(p, 0, sizeof(*p));
	p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->poolProps.location.id = n->alloc->dev;
	p->bytesize = n->alloc->bytes;
	p->dptr = n->alloc->dptr;
	return CUDA_SUCCESS;
}

static CUresult add_free(CUgraphNode *out, CUgraph g, CUdeviceptr p, int any)
{
	pthread_mutex_lock(&gmu);
	int known = galloc_find_locked(p) != NULL;
	pthread_mutex_unlock(&gmu);
	if (!g || (!known && !any)) /* only an allocation node's address can be freed by a node */
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_MEM_FREE);
	if (!n)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->freed = p;
	return add_node(g, n, out);
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				      CUdeviceptr p)
{
	(void)deps, (void)ndeps;
	return out ? add_free(out, g, p, 0) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode n, CUdeviceptr *p)
{
	if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE)
		return CUDA_ERROR_INVALID_VALUE;
	*p = n->freed;
	return CUDA_SUCCESS;
}

/* ---- the graph memory pool ------------------------------------------------------- */

/* Grows the pool of dev by bytes of device memory (caller holds gmu). */
static CUresult pool_grow_locked(int dev, uint64_t bytes)
{
	fk_lock();
	struct fk_dev *d = &fk->dev[dev];
	if (d->total - d->used < bytes)
		fk_reap();
	if (d->total - d->used < bytes) {
		fk_unlock();
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	d->used += bytes;
	fk_me()->used[dev] += bytes;
	fk_unlock();
	pool_reserved[dev] += bytes;
	if (pool_reserved[dev] > pool_reserved_high[dev])
		pool_reserved_high[dev] = pool_reserved[dev];
	return CUDA_SUCCESS;
}

static void pool_shrink_locked(int dev, uint64_t bytes)
{
	fk_lock();
	struct fk_dev *d = &fk->dev[dev];
	struct fk_proc *p = fk_me();
	d->used = d->used > bytes ? d->used - bytes : 0;
	p->used[dev] = p->used[dev] > bytes ? p->used[dev] - bytes : 0;
	fk_unlock();
	pool_reserved[dev] -= bytes;
}

static void mark_freed_locked(struct galloc *a)
{
	a->live = 0;
	pool_used[a->dev] -= a->bytes;
}

/* What a launch of e needs from the pool of each device, at its peak. */
static void exec_need(const struct CUgraphExec_st *e, uint64_t need[FK_MAX_DEV])
{
	memset(need, 0, sizeof(uint64_t) * FK_MAX_DEV);
	for (size_t i = 0; i < e->na; i++)
		need[e->allocs[i]->dev] += e->allocs[i]->bytes;
}

/* Backs e's allocations: the pool of each device then holds, unused, at
 * least what e needs (caller holds gmu). */
static CUresult back_locked(const struct CUgraphExec_st *e)
{
	uint64_t need[FK_MAX_DEV];
	exec_need(e, need);
	for (int d = 0; d < fk->ndev && d < FK_MAX_DEV; d++) {
		uint64_t spare = pool_reserved[d] - pool_used[d];
		if (need[d] > spare) {
			CUresult rc = pool_grow_locked(d, need[d] - spare);
			if (rc != CUDA_SUCCESS)
				return rc;
		}
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
	if (dev < 0 || dev >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	int64_t now = fk_now();
	pthread_mutex_lock(&gmu);
	/* Live allocations and graphs still running keep what they use. */
	uint64_t keep = pool_used[dev], need[FK_MAX_DEV];
	for (struct CUgraphExec_st *e = execs; e; e = e->next)
		if (e->running_until > now) {
			exec_need(e, need);
			keep += need[dev];
		}
	if (pool_reserved[dev] > keep)
		pool_shrink_locked(dev, pool_reserved[dev] - keep);
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
	if (dev < 0 || dev >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t v;
	pthread_mutex_lock(&gmu);
	switch (attr) {
	case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: v = pool_used[dev]; break;
	case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: v = pool_used_high[dev]; break;
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: v = pool_reserved[dev]; break;
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: v = pool_reserved_high[dev]; break;
	default:
		pthread_mutex_unlock(&gmu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&gmu);
	/* FAKECUDA_FAIL=cuDeviceGetGraphMemAttribute:N:MS: the Nth answer is
	 * MS late, as from a thread descheduled after the driver read it. */
	if (fk_fault("cuDeviceGetGraphMemAttribute"))
		return CUDA_ERROR_UNKNOWN;
	memcpy(value, &v, sizeof(v));
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
	uint64_t v;
	if (dev < 0 || dev >= fk->ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&v, value, sizeof(v));
	if (v != 0 || (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
		pool_used_high[dev] = 0;
	else
		pool_reserved_high[dev] = 0;
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

/* A free outside any graph (cuMemFree, or cuMemFreeAsync not captured). */
int fg_free(CUdeviceptr p, CUresult *rc)
{
	pthread_mutex_lock(&gmu);
	struct galloc *a = galloc_find_locked(p);
	if (a) {
		*rc = a->live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		if (a->live)
			mark_freed_locked(a);
	}
	pthread_mutex_unlock(&gmu);
	return a != NULL;
}

/* ---- executable graphs ----------------------------------------------------------- */

static int push(void **v, size_t *n, size_t elem)
{
	void *w = realloc(*v, (*n + 1) * elem);
	if (!w)
		return -1;
	*v = w;
	(*n)++;
	return 0;
}

/* Flattens g (child graphs included) into e; top: the top-level child graph
 * node g lies in (NULL for the graph itself). */
static int flatten_in(struct CUgraphExec_st *e, CUgraph g, CUgraphNode top)
{
	for (size_t i = 0; i < g->n; i++) {
		CUgraphNode n = g->nodes[i];
		switch (n->type) {
		case CU_GRAPH_NODE_TYPE_KERNEL:
			if (push((void **)&e->kernels, &e->nk, sizeof(*e->kernels)))
				return -1;
			e->kernels[e->nk - 1] = GRID(n->k.gridDimX, n->k.gridDimY, n->k.gridDimZ);
			{
				CUgraphNode *kv = realloc(e->knodes, e->nk * sizeof(*kv));
				if (kv)
					e->knodes = kv;
				CUgraphNode *pv = kv ? realloc(e->kparent, e->nk * sizeof(*pv)) : NULL;
				if (pv)
					e->kparent = pv;
				unsigned char *ov = pv ? realloc(e->koff, e->nk) : NULL;
				if (!ov)
					return -1;
				e->koff = ov;
				kv[e->nk - 1] = n;
				pv[e->nk - 1] = top;
				ov[e->nk - 1] = 0;
			}
			break;
		case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
			if (push((void **)&e->allocs, &e->na, sizeof(*e->allocs)))
				return -1;
			e->allocs[e->na - 1] = n->alloc;
			break;
		case CU_GRAPH_NODE_TYPE_MEM_FREE:
			if (push((void **)&e->frees, &e->nf, sizeof(*e->frees)))
				return -1;
			e->frees[e->nf - 1] = n->freed;
			break;
		case CU_GRAPH_NODE_TYPE_GRAPH:
			if (flatten_in(e, n->child, top ? top : n))
				return -1;
			break;
		}
	}
	return 0;
}

static int flatten(struct CUgraphExec_st *e, CUgraph g)
{
	if (flatten_in(e, g, NULL))
		return -1;
	e->freed_inside = calloc(e->na ? e->na : 1, sizeof(int));
	if (!e->freed_inside)
		return -1;
	for (size_t i = 0; i < e->na; i++)
		for (size_t j = 0; j < e->nf; j++)
			if (e->frees[j] == e->allocs[i]->dptr)
				e->freed_inside[i] = 1;
	return 0;
}

static void exec_free(struct CUgraphExec_st *e)
{
	free(e->kernels);
	free(e->knodes);
	free(e->kparent);
	free(e->koff);
	free(e->allocs);
	free(e->freed_inside);
	free(e->frees);
	free(e);
}

static CUresult instantiate(CUgraphExec *out, CUgraph g, unsigned long long flags, CUstream upload)
{
	if (!out || !g)
		return CUDA_ERROR_INVALID_VALUE;
	if (fk_fault("cuGraphInstantiate"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct CUgraphExec_st *e = calloc(1, sizeof(*e));
	if (!e || flatten(e, g)) {
		if (e)
			exec_free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	e->flags = flags;
	pthread_mutex_lock(&gmu);
	CUresult rc = CUDA_SUCCESS;
	if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) {
		(void)upload;
		rc = back_locked(e);
	}
	if (rc == CUDA_SUCCESS) {
		e->next = execs;
		execs = e;
	}
	pthread_mutex_unlock(&gmu);
	if (rc != CUDA_SUCCESS) {
		exec_free(e);
		return rc;
	}
	*out = e;
	return CUDA_SUCCESS;
}

/* Exported functions here never call each other: a preloaded interposer
 * would see such a call as a second one from the application. */
static CUresult instantiate_log(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz)
{
	if (err)
		*err = NULL;
	if (log && logsz)
		log[0] = '\0';
	return instantiate(e, g, 0, NULL);
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz)
{
	return instantiate_log(e, g, err, log, logsz);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz)
{
	return instantiate_log(e, g, err, log, logsz);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	/* The upload flag belongs to ...WithParams, which names the stream. */
	if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
		return CUDA_ERROR_INVALID_VALUE;
	return instantiate(e, g, flags, NULL);
}

static CUresult with_params(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = instantiate(e, g, p->flags, p->hUploadStream);
	p->hErrNode_out = NULL;
	p->result_out = rc == CUDA_SUCCESS ? 0 : 1; /* CUDA_GRAPH_INSTANTIATE_SUCCESS / _ERROR */
	return rc;
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return with_params(e, g, p);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return with_params(e, g, p);
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	struct CUgraphExec_st **pp = &execs;
	while (*pp && *pp != e)
		pp = &(*pp)->next;
	if (*pp)
		*pp = e->next;
	pthread_mutex_unlock(&gmu);
	/* Its memory stays in the pool until cuDeviceGraphMemTrim. */
	exec_free(e);
	return CUDA_SUCCESS;
}

static CUresult upload(CUgraphExec e, CUstream s)
{
	(void)s;
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	CUresult rc = back_locked(e);
	pthread_mutex_unlock(&gmu);
	return rc;
}

/* Takes g's kernel parameters; g must have e's allocation and free nodes. */
static CUresult update(CUgraphExec e, CUgraph g)
{
	if (!e || !g)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraphExec_st *n = calloc(1, sizeof(*n));
	if (!n || flatten(n, g)) {
		if (n)
			exec_free(n);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	int same = n->na == e->na && n->nf == e->nf;
	for (size_t i = 0; same && i < n->na; i++)
		same = n->allocs[i] == e->allocs[i];
	for (size_t i = 0; same && i < n->nf; i++)
		same = n->frees[i] == e->frees[i];
	if (!same) {
		exec_free(n);
		return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
	}
	pthread_mutex_lock(&gmu);
	uint64_t *k = e->kernels;
	CUgraphNode *kn = e->knodes, *kp = e->kparent;
	unsigned char *ko = e->koff;
	e->kernels = n->kernels;
	e->knodes = n->knodes;
	e->kparent = n->kparent;
	e->koff = n->koff;
	e->nk = n->nk;
	n->kernels = k;
	n->knodes = kn;
	n->kparent = kp;
	n->koff = ko;
	pthread_mutex_unlock(&gmu);
	exec_free(n);
	return CUDA_SUCCESS;
}

/* ---- per-node changes of an executable graph; cuGraphAddNode ------------------------------ */

/* Node n's kernel in e: its grid becomes blocks (blocks 0: unchanged), it runs unless off (-1: unchanged). */
static CUresult exec_node(CUgraphExec e, CUgraphNode n, uint64_t blocks, int off)
{
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	if (!e || !n)
		return rc;
	pthread_mutex_lock(&gmu);
	for (size_t i = 0; i < e->nk; i++)
		if (e->knodes && e->knodes[i] == n) {
			if (blocks)
				e->kernels[i] = blocks;
			if (off >= 0)
				e->koff[i] = (unsigned char)off;
			rc = CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&gmu);
	return rc;
}

EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
	if (!p || !p->gridDimX || !p->gridDimY || !p->gridDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	return exec_node(e, n, GRID(p->gridDimX, p->gridDimY, p->gridDimZ), -1);
}

EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
	if (!p || !p->gridDimX || !p->gridDimY || !p->gridDimZ)
		return CUDA_ERROR_INVALID_VALUE;
	return exec_node(e, n, GRID(p->gridDimX, p->gridDimY, p->gridDimZ), -1);
}

/*
 * The child graph node n of e runs child's parameters from now on. As the
 * driver requires, child has the topology of the graph in n (here: as many
 * kernel nodes, in the same order) and no memory nodes.
 */
EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child)
{
	if (!e || !n || !child || n->type != CU_GRAPH_NODE_TYPE_GRAPH || has_memory_nodes(child))
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraphExec_st *t = calloc(1, sizeof(*t));
	if (!t || flatten_in(t, child, NULL)) {
		if (t)
			exec_free(t);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&gmu);
	size_t have = 0;
	for (size_t i = 0; i < e->nk; i++)
		have += e->kparent && e->kparent[i] == n;
	if (have != t->nk)
		rc = CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0, j = 0; rc == CUDA_SUCCESS && i < e->nk; i++)
		if (e->kparent[i] == n)
			e->kernels[i] = t->kernels[j++];
	pthread_mutex_unlock(&gmu);
	exec_free(t);
	return rc;
}

EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p)
{
	if (p && p->type == CU_GRAPH_NODE_TYPE_GRAPH)
		return cuGraphExecChildGraphNodeSetParams(e, n, p->u.graph);
	if (!p || p->type != CU_GRAPH_NODE_TYPE_KERNEL)
		return CUDA_ERROR_NOT_SUPPORTED; /* only kernel and child graph nodes here */
	return cuGraphExecKernelNodeSetParams_v2(e, n, &p->u.kernel);
}

EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned enabled)
{
	return exec_node(e, n, 0, !enabled);
}

/* Kernel nodes, and conditional nodes: those run nothing here (their body is not modelled). */
EXPORT CUresult cuGraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraphNodeParams *p)
{
	(void)deps;
	(void)ndeps;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->type == CU_GRAPH_NODE_TYPE_KERNEL)
		return add_kernel(out, g, &p->u.kernel);
	if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!out || !g)
		return CUDA_ERROR_INVALID_VALUE;
	CUgraphNode n = new_node(CU_GRAPH_NODE_TYPE_CONDITIONAL);
	return n ? add_node(g, n, out) : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, int *result)
{
	CUresult rc = update(e, g);
	if (err)
		*err = NULL;
	if (result)
		*result = rc == CUDA_SUCCESS ? 0 : 1; /* CU_GRAPH_EXEC_UPDATE_SUCCESS / _ERROR */
	return rc;
}

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, void *info)
{
	(void)info; /* the result record is not modelled */
	return update(e, g);
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
	return upload(e, s);
}

EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s)
{
	return upload(e, s);
}

static CUresult launch(CUgraphExec e, CUstream s)
{
	(void)s;
	if (!e)
		return CUDA_ERROR_INVALID_VALUE;
	if (fk_fault("cuGraphLaunch"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&gmu);
	for (size_t i = 0; i < e->na; i++) {
		struct galloc *a = e->allocs[i];
		if (!a->live)
			continue;
		if (!(e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)) {
			pthread_mutex_unlock(&gmu);
			return CUDA_ERROR_INVALID_VALUE; /* its allocation from the last launch is still live */
		}
		mark_freed_locked(a);
	}
	CUresult rc = back_locked(e);
	if (rc != CUDA_SUCCESS) {
		pthread_mutex_unlock(&gmu);
		return rc;
	}
	/* At its peak the launch uses everything it allocates; afterwards what
	 * it does not free stays live, and it frees what other graphs left. */
	uint64_t need[FK_MAX_DEV];
	exec_need(e, need);
	for (int d = 0; d < FK_MAX_DEV; d++)
		if (pool_used[d] + need[d] > pool_used_high[d])
			pool_used_high[d] = pool_used[d] + need[d];
	for (size_t i = 0; i < e->na; i++)
		if (!e->freed_inside[i]) {
			e->allocs[i]->live = 1;
			pool_used[e->allocs[i]->dev] += e->allocs[i]->bytes;
		}
	CUdeviceptr other[e->nf + 1];
	size_t nother = 0;
	for (size_t j = 0; j < e->nf; j++) {
		struct galloc *a = galloc_find_locked(e->frees[j]);
		int inside = 0;
		for (size_t i = 0; i < e->na; i++)
			inside |= e->allocs[i] == a;
		if (a && a->live && !inside)
			mark_freed_locked(a);
		if (!a)
			other[nother++] = e->frees[j]; /* FAKECUDA_CAPTURE_FREE_ANY */
	}
	pthread_mutex_unlock(&gmu);
	for (size_t j = 0; j < nother; j++)
		fk_free_ptr(other[j]);
	/* The kernels run on the device's timeline like any other launch. */
	for (size_t i = 0; i < e->nk; i++)
		if (!(e->koff && e->koff[i]) && (rc = fk_run_kernel(e->kernels[i])) != CUDA_SUCCESS)
			return rc;
	pthread_mutex_lock(&gmu);
	e->running_until = fk_now() + 1; /* conservatively: queued kernels may still run */
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
	return launch(e, s);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
	return launch(e, s);
}

/* ---- stream capture -------------------------------------------------------------- */

#define MAX_CAPTURES 64
static struct {
	CUstream s;
	CUgraph g;
	uint64_t id;
} caps[MAX_CAPTURES];
static uint64_t capture_ids;

static int special(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The graph s is capturing into, or NULL (caller holds gmu). */
static CUgraph capturing_locked(CUstream s, uint64_t *id)
{
	for (int i = 0; i < MAX_CAPTURES && !special(s); i++)
		if (caps[i].s == s) {
			if (id)
				*id = caps[i].id;
			return caps[i].g;
		}
	return NULL;
}

static CUresult begin_capture(CUstream s)
{
	if (special(s))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* not modelled here */
	CUgraph g = calloc(1, sizeof(*g));
	CUresult rc = g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&gmu);
	int slot = -1;
	for (int i = 0; i < MAX_CAPTURES; i++) {
		if (caps[i].s == s)
			rc = CUDA_ERROR_ILLEGAL_STATE; /* already capturing */
		if (!caps[i].s && slot < 0)
			slot = i;
	}
	if (rc == CUDA_SUCCESS && slot < 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	if (rc == CUDA_SUCCESS) {
		caps[slot].s = s;
		caps[slot].g = g;
		caps[slot].id = ++capture_ids;
	}
	pthread_mutex_unlock(&gmu);
	if (rc != CUDA_SUCCESS)
		free(g);
	return rc;
}

EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
	return begin_capture(s);
}

EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return begin_capture(s);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	(void)mode;
	return begin_capture(s);
}

EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
	(void)mode;
	return begin_capture(s);
}

static CUresult end_capture(CUstream s, CUgraph *g)
{
	if (!g)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
	pthread_mutex_lock(&gmu);
	for (int i = 0; i < MAX_CAPTURES && !special(s); i++)
		if (caps[i].s == s) {
			*g = caps[i].g;
			caps[i].s = NULL;
			rc = CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&gmu);
	return rc;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	return end_capture(s, g);
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	return end_capture(s, g);
}

static CUresult is_capturing(CUstream s, int *status)
{
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	*status = capturing_locked(s, NULL) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status)
{
	return is_capturing(s, status);
}

EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status)
{
	return is_capturing(s, status);
}

static CUresult capture_info(CUstream s, int *status, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
			     size_t *ndeps)
{
	uint64_t cid = 0;
	pthread_mutex_lock(&gmu);
	CUgraph cg = capturing_locked(s, &cid);
	pthread_mutex_unlock(&gmu);
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	*status = cg ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
	if (id && cg)
		*id = cid;
	if (g && cg)
		*g = cg;
	if (deps && cg)
		*deps = NULL; /* edges are not modelled */
	if (ndeps && cg)
		*ndeps = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream s, int *status, cuuint64_t *id, CUgraph *g,
					  const CUgraphNode **deps, size_t *ndeps)
{
	return capture_info(s, status, id, g, deps, ndeps);
}

EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, int *status, cuuint64_t *id, CUgraph *g,
					       const CUgraphNode **deps, size_t *ndeps)
{
	return capture_info(s, status, id, g, deps, ndeps);
}

EXPORT CUresult cuStreamGetCaptureInfo(CUstream s, int *status, cuuint64_t *id)
{
	return capture_info(s, status, id, NULL, NULL, NULL);
}

EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, int *status, cuuint64_t *id)
{
	return capture_info(s, status, id, NULL, NULL, NULL);
}

static CUgraph capture_graph(CUstream s)
{
	pthread_mutex_lock(&gmu);
	CUgraph g = capturing_locked(s, NULL);
	pthread_mutex_unlock(&gmu);
	return g;
}

int fg_capture_alloc(CUstream s, uint64_t bytes, int dev, CUdeviceptr *p, CUresult *rc)
{
	CUgraph g = capture_graph(s);
	if (!g)
		return 0;
	CUgraphNode n;
	*rc = p ? add_alloc(&n, g, bytes, dev, p) : CUDA_ERROR_INVALID_VALUE;
	return 1;
}

int fg_capture_free(CUstream s, CUdeviceptr p, CUresult *rc)
{
	CUgraph g = capture_graph(s);
	if (!g)
		return 0;
	CUgraphNode n;
	const char *any = getenv("FAKECUDA_CAPTURE_FREE_ANY");
	*rc = add_free(&n, g, p, any && *any == '1');
	return 1;
}

int fg_capture_kernel(CUstream s, unsigned gx, unsigned gy, unsigned gz, CUresult *rc)
{
	CUgraph g = capture_graph(s);
	if (!g)
		return 0;
	CUDA_KERNEL_NODE_PARAMS_v2 k = {.gridDimX = gx, .gridDimY = gy, .gridDimZ = gz,
					 .blockDimX = 1, .blockDimY = 1, .blockDimZ = 1};
	CUgraphNode n;
	*rc = add_kernel(&n, g, &k);
	return 1;
}

void fg_after_fork(void)
{
	/* Another thread may have held the lock; the parent's graphs, captures
	 * and pool are not the child's (entries leak on purpose). */
	pthread_mutex_init(&gmu, NULL);
	gallocs = NULL;
	execs = NULL;
	memset(caps, 0, sizeof(caps));
	memset(pool_used, 0, sizeof(pool_used));
	memset(pool_used_high, 0, sizeof(pool_used_high));
	memset(pool_reserved, 0, sizeof(pool_reserved));
	memset(pool_reserved_high, 0, sizeof(pool_reserved_high));
}
