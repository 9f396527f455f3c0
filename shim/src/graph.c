/*
 * CUDA graphs: what an executable graph runs (for the SM limiter) and the
 * device memory graph memory nodes hold (for the memory quota).
 *
 * Graph memory, as the CUDA programming guide describes it ("Graph Memory
 * Nodes"): an allocation node gets its address when the node is created,
 * by cuGraphAddMemAllocNode or a cuMemAllocAsync captured from a stream,
 * but no memory; the memory comes from a per-device graph memory pool of the
 * process when the executable graph is uploaded or launched, and stays in
 * that pool after the allocation is freed, and after the graph is destroyed,
 * until cuDeviceGraphMemTrim. The pool's size is what the driver reports as
 * CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, and that is what the shim counts:
 *
 *  - before an upload or launch of a graph with memory nodes, the memory it
 *    may add to the pool (its allocations less what the pool holds unused)
 *    is reserved against the quota; over it the caller gets
 *    CUDA_ERROR_OUT_OF_MEMORY and the driver is not called;
 *  - after the call, and after a trim or the destruction of such a graph,
 *    the count follows the pool's reported size, up or down, and the
 *    reservation made ahead is given back.
 *
 * So graph memory is charged when the driver backs it and given back when the
 * driver releases it, whichever calls make it do so. Stream-ordered
 * allocations and frees made while their stream captures are left alone
 * (mem.c asks vgpu_graph_capturing): they become nodes, not memory.
 *
 * Not handled: a context destroyed with graph memory in it keeps its count
 * until the next graph call on that device re-reads the pool; two threads
 * launching different graphs at the same moment can each find the pool's
 * unused memory enough, and the growth is then counted after the fact,
 * past the quota if need be (nothing is held across the launch, which may
 * block); cuStreamBeginCaptureToGraph (12.3) is not hooked, so captures it
 * starts are charged as plain stream-ordered allocations until the free;
 * a conditional node (12.3+) runs its body an unknown number of times: it
 * is charged a fixed, large amount of work (below) rather than read.
 *
 * The work of an executable graph follows cuGraphExecUpdate[_v2] and the
 * per-node changes of its top-level kernel and child graph nodes: their
 * grids (cuGraphExecKernelNodeSetParams[_v2], cuGraphExecNodeSetParams), a
 * child's graph (cuGraphExecChildGraphNodeSetParams, cuGraphExecNodeSetParams)
 * and whether they run (cuGraphNodeSetEnabled); each such node's work is
 * kept apart from the rest of the graph's for that. Every executable-graph
 * setter that can change what a launch runs is one of these; the others
 * (memcpy, memset, host, event, external semaphore, batch memory op nodes)
 * change no kernel's grid, and memory nodes cannot be changed in an
 * executable graph (nor put in a child graph): the driver refuses it.
 * Changes to a graph (cuGraphKernelNodeSetParams, cuGraphNodeSetParams, ...)
 * reach a launch only through an instantiation or update, read then.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "core.h"
#include "graph.h"
#include "lifecycle.h"
#include "log.h"
#include "quota.h"
#include "real.h"

#define GDEV 64 /* CUDA device ordinals whose graph memory is followed */
/* Waves a conditional node is charged a launch: its body may run any number
 * of times, unseen. A constant overcharge is corrected by the limiter's
 * steering (measured share against the target); charging nothing would
 * make a while loop over a large body free between two measurements. */
#define CONDITIONAL_WAVES 1024

/* ---- driver calls the shim makes for itself (none of them hooked) ----------------- */

static void *plain(const char *name, void **cache)
{
	void *p = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
	if (p)
		return p;
	void *h = vgpu_lib_handle(LIB_CUDA);
	p = h ? vgpu_real_dlsym(h, name) : NULL;
	if (p)
		__atomic_store_n(cache, p, __ATOMIC_RELEASE);
	return p;
}

/* Calls driver function name of type type, or yields CUDA_ERROR_NOT_FOUND when absent. */
#define DRV(name, type, ...)                                            \
	({                                                              \
		static void *c_;                                        \
		__typeof__(type) f_ = (__typeof__(type))plain(name, &c_); \
		f_ ? f_(__VA_ARGS__) : (CUresult)CUDA_ERROR_NOT_FOUND;  \
	})

static CUresult mem_attr(int dev, int attr, uint64_t *v)
{
	return DRV("cuDeviceGetGraphMemAttribute", CUresult(*)(CUdevice, int, void *), dev, attr, v);
}

/* ---- what an executable graph runs and allocates ------------------------------------- */

/* A top-level kernel node: what a per-node change of the executable graph names. */
struct knode {
	CUgraphNode node;
	uint64_t blocks;
	int off; /* disabled in the executable graph (cuGraphNodeSetEnabled) */
};

/* A top-level child graph node: its graph's work, read at instantiation and
 * again when a setter gives the node another graph. */
struct cnode {
	CUgraphNode node;
	uint64_t work, waves;
	int off;
};

struct gexec {
	struct gexec *next;
	CUgraphExec exec;
	uint64_t work;          /* thread blocks of one launch */
	uint64_t waves;         /* ... in waves: each kernel's blocks over the SM count, rounded up */
	uint64_t fixed_work;    /* ... of which not from the top-level kernel nodes below */
	uint64_t fixed_waves;
	struct knode *kn;       /* top-level kernel nodes */
	size_t nkn;
	struct cnode *cn;       /* top-level child graph nodes */
	size_t ncn;
	int sms;                /* SMs of the device it was instantiated on (1: unknown) */
	int mem;                /* has memory nodes (even of a size it could not learn) */
	int launched;           /* launched before: its unfreed allocations may be live */
	uint64_t need[GDEV];    /* bytes its allocations take from each device's pool */
	uint64_t unfreed[GDEV]; /* ... of which it leaves live after a launch */
};

/* What inspecting a graph collects besides the totals: allocation addresses
 * and the addresses its free nodes free. */
struct scan {
	struct gexec *x;
	struct {
		CUdeviceptr p;
		uint64_t bytes;
		int dev;
	} *al;
	size_t nal;
	CUdeviceptr *fr;
	size_t nfr;
};

#define NBUCKETS 1024
static struct gexec *table[NBUCKETS];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
/* Some graph with memory nodes was instantiated: launches must look. */
static int any_memory;

static unsigned bucket(CUgraphExec e)
{
	uint64_t k = (uint64_t)(uintptr_t)e * 0x9e3779b97f4a7c15ull;
	return (unsigned)(k >> 54) & (NBUCKETS - 1);
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t waves_of(uint64_t blocks, int sms)
{
	return blocks ? (blocks - 1) / (uint64_t)sms + 1 : 1;
}

/* work and waves from the fixed part and the enabled top-level kernel nodes. */
static void recount(struct gexec *x)
{
	x->work = x->fixed_work;
	x->waves = x->fixed_waves;
	for (size_t i = 0; i < x->nkn; i++)
		if (!x->kn[i].off) {
			x->work = add_sat(x->work, x->kn[i].blocks);
			x->waves = add_sat(x->waves, waves_of(x->kn[i].blocks, x->sms));
		}
	for (size_t i = 0; i < x->ncn; i++)
		if (!x->cn[i].off) {
			x->work = add_sat(x->work, x->cn[i].work);
			x->waves = add_sat(x->waves, x->cn[i].waves);
		}
}

static void gexec_free(struct gexec *x)
{
	if (x) {
		free(x->kn);
		free(x->cn);
	}
	free(x);
}

static void inspect_kernel(CUgraphNode n, struct gexec *x, int top)
{
	/* _v2 (12.0+) first: a node made from a CUkernel may have no v1 form.
	 * The grid sits at the same offsets in both layouts. */
	CUDA_KERNEL_NODE_PARAMS_v2 k;
	memset(&k, 0, sizeof(k));
	CUresult rc = DRV("cuGraphKernelNodeGetParams_v2", CUresult(*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *), n, &k);
	if (rc != CUDA_SUCCESS)
		rc = DRV("cuGraphKernelNodeGetParams", CUresult(*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1 *), n,
			 (CUDA_KERNEL_NODE_PARAMS_v1 *)&k);
	if (rc == CUDA_SUCCESS) {
		uint64_t blocks = (uint64_t)k.gridDimX * k.gridDimY * k.gridDimZ;
		struct knode *v = top ? realloc(x->kn, (x->nkn + 1) * sizeof(*v)) : NULL;
		if (v) {
			x->kn = v;
			x->kn[x->nkn++] = (struct knode){n, blocks, 0};
			return;
		}
		x->fixed_work = add_sat(x->fixed_work, blocks);
		/* A kernel holds the GPU for its waves, however few blocks the last
		 * one has: twelve 1-block kernels are twelve waves, not one. */
		x->fixed_waves = add_sat(x->fixed_waves, waves_of(blocks, x->sms));
	}
}

static void inspect_alloc(CUgraphNode n, struct scan *sc)
{
	CUDA_MEM_ALLOC_NODE_PARAMS p;
	memset(&p, 0, sizeof(p));
	sc->x->mem = 1;
	if (DRV("cuGraphMemAllocNodeGetParams", CUresult(*)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *), n, &p) !=
	    CUDA_SUCCESS)
		return; /* size unknown: counted after the launch, from the pool */
	int d = p.poolProps.location.id;
	if (p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || d < 0 || d >= GDEV)
		return;
	sc->x->need[d] = add_sat(sc->x->need[d], p.bytesize);
	__typeof__(sc->al) v = realloc(sc->al, (sc->nal + 1) * sizeof(*v));
	if (!v)
		return;
	sc->al = v;
	sc->al[sc->nal].p = p.dptr;
	sc->al[sc->nal].bytes = p.bytesize;
	sc->al[sc->nal++].dev = d;
}

static void inspect_free(CUgraphNode n, struct scan *sc)
{
	CUdeviceptr p;
	if (DRV("cuGraphMemFreeNodeGetParams", CUresult(*)(CUgraphNode, CUdeviceptr *), n, &p) != CUDA_SUCCESS)
		return;
	CUdeviceptr *v = realloc(sc->fr, (sc->nfr + 1) * sizeof(*v));
	if (!v)
		return;
	sc->fr = v;
	sc->fr[sc->nfr++] = p;
}

static void inspect(CUgraph g, struct scan *sc, int depth);

/* Child graph node n of a graph at depth, holding graph child: a top-level
 * one's work is kept apart (a setter may give it another graph). */
static void inspect_child(CUgraphNode n, CUgraph child, struct scan *sc, int depth)
{
	struct gexec *x = sc->x;
	uint64_t work = x->fixed_work, waves = x->fixed_waves;
	inspect(child, sc, depth + 1);
	if (depth != 0)
		return;
	struct cnode *v = realloc(x->cn, (x->ncn + 1) * sizeof(*v));
	if (!v)
		return; /* stays in the fixed part */
	x->cn = v;
	x->cn[x->ncn++] = (struct cnode){n, x->fixed_work - work, x->fixed_waves - waves, 0};
	x->fixed_work = work;
	x->fixed_waves = waves;
}

/* Adds what graph g holds to sc; child graphs too, up to a sane depth. */
static void inspect(CUgraph g, struct scan *sc, int depth)
{
	size_t n = 0;
	if (!g || depth > 16 ||
	    DRV("cuGraphGetNodes", CUresult(*)(CUgraph, CUgraphNode *, size_t *), g, NULL, &n) != CUDA_SUCCESS || !n)
		return;
	CUgraphNode *v = malloc(n * sizeof(*v));
	if (!v)
		return;
	if (DRV("cuGraphGetNodes", CUresult(*)(CUgraph, CUgraphNode *, size_t *), g, v, &n) != CUDA_SUCCESS)
		n = 0;
	for (size_t i = 0; i < n; i++) {
		int type = -1;
		CUgraph child = NULL;
		if (DRV("cuGraphNodeGetType", CUresult(*)(CUgraphNode, int *), v[i], &type) != CUDA_SUCCESS)
			continue;
		if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
			inspect_kernel(v[i], sc->x, depth == 0);
		} else if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
			sc->x->fixed_waves = add_sat(sc->x->fixed_waves, CONDITIONAL_WAVES);
			sc->x->fixed_work = add_sat(sc->x->fixed_work, (uint64_t)CONDITIONAL_WAVES * (uint64_t)sc->x->sms);
		}
		else if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
			inspect_alloc(v[i], sc);
		else if (type == CU_GRAPH_NODE_TYPE_MEM_FREE)
			inspect_free(v[i], sc);
		else if (type == CU_GRAPH_NODE_TYPE_GRAPH &&
			 DRV("cuGraphChildGraphNodeGetGraph", CUresult(*)(CUgraphNode, CUgraph *), v[i], &child) ==
				 CUDA_SUCCESS)
			inspect_child(v[i], child, sc, depth);
	}
	free(v);
}

/* What g holds, read before it is instantiated; NULL when out of memory. */
static struct gexec *inspect_graph(CUgraph g)
{
	vgpu_init();
	struct scan sc = {.x = calloc(1, sizeof(struct gexec))};
	if (!sc.x)
		return NULL;
	/* The graph runs on the current context's device. */
	CUdevice dev;
	int sms = 0;
	if (vgpu_cu_ctx_get_device(&dev) != CUDA_SUCCESS ||
	    vgpu_cu_device_attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || sms <= 0)
		sms = 1; /* every block a wave: an overcharge the limiter's steering absorbs */
	sc.x->sms = sms;
	inspect(g, &sc, 0);
	recount(sc.x);
	for (size_t i = 0; i < sc.nal; i++) {
		size_t j = 0;
		while (j < sc.nfr && sc.fr[j] != sc.al[i].p)
			j++;
		if (j == sc.nfr)
			sc.x->unfreed[sc.al[i].dev] = add_sat(sc.x->unfreed[sc.al[i].dev], sc.al[i].bytes);
	}
	free(sc.al);
	free(sc.fr);
	return sc.x;
}

static void table_put(struct gexec *x)
{
	unsigned b = bucket(x->exec);
	pthread_mutex_lock(&table_mu);
	x->next = table[b];
	table[b] = x;
	if (x->mem)
		__atomic_store_n(&any_memory, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&table_mu);
}

static struct gexec *table_take(CUgraphExec e)
{
	struct gexec *x = NULL;
	pthread_mutex_lock(&table_mu);
	for (struct gexec **pp = &table[bucket(e)]; *pp; pp = &(*pp)->next)
		if ((*pp)->exec == e) {
			x = *pp;
			*pp = x->next;
			break;
		}
	pthread_mutex_unlock(&table_mu);
	return x;
}

/* Copies e's entry into *out; 0 when e is not known. */
static int table_get(CUgraphExec e, struct gexec *out)
{
	int found = 0;
	pthread_mutex_lock(&table_mu);
	for (struct gexec *x = table[bucket(e)]; x; x = x->next)
		if (x->exec == e) {
			*out = *x;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&table_mu);
	return found;
}

uint64_t vgpu_graph_exec_waves(CUgraphExec g)
{
	uint64_t w = 0;
	pthread_mutex_lock(&table_mu);
	for (struct gexec *x = table[bucket(g)]; x; x = x->next)
		if (x->exec == g) {
			w = x->waves;
			break;
		}
	pthread_mutex_unlock(&table_mu);
	return w;
}

/* After an instantiation: remembers x for the new executable graph. */
static CUresult keep(CUresult rc, CUgraphExec *e, struct gexec *x)
{
	if (rc != CUDA_SUCCESS || !e || !*e || !x) {
		gexec_free(x);
		return rc;
	}
	x->exec = *e;
	uint64_t bytes = 0;
	for (int d = 0; d < GDEV; d++)
		bytes = add_sat(bytes, x->need[d]);
	LOGD("graph exec %p: %llu thread blocks a launch, %llu bytes of graph memory, %llu waves on %d SMs",
	     (void *)x->exec, (unsigned long long)x->work, (unsigned long long)bytes, (unsigned long long)x->waves,
	     x->sms);
	table_put(x);
	return rc;
}

/* ---- graph memory against the quota ---------------------------------------------------- */

/* What the shim counts of each device's graph memory pool. */
static uint64_t charged[GDEV];

/* Counts the pool of dev at the size the driver reports now. Lock-free: the
 * count always equals charged[dev]. A thread that read the pool before
 * another may store its older reading after the other's newer one: so each
 * checks, after storing, that the pool still has the size it stored, and
 * reads again if not; whichever stores last leaves the count right. */
static void follow_pool(int dev)
{
	uint64_t r, now;
	int idx = vgpu_device_index(dev);
	if (idx < 0 || mem_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r) != CUDA_SUCCESS)
		return;
	for (int tries = 0; tries < 16; tries++) {
		uint64_t old = __atomic_exchange_n(&charged[dev], r, __ATOMIC_ACQ_REL);
		if (r > old)
			vgpu_quota_charge_force(idx, r - old); /* the driver has it already */
		else if (r < old)
			vgpu_quota_uncharge(idx, old - r);
		if (mem_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) != CUDA_SUCCESS || now == r)
			return;
		r = now;
	}
}

static void give_back_est(struct vgpu_graph_backing *b)
{
	for (int i = 0; i < VGPU_MAX_DEVICES; i++)
		if (b->est[i])
			vgpu_quota_uncharge(i, b->est[i]);
	memset(b->est, 0, sizeof(b->est));
}

/* Reserves what backing x's allocations may add to the pools: 0, or -1 (refused, said why). */
static int back_begin(const struct gexec *x, struct vgpu_graph_backing *b)
{
	memset(b, 0, sizeof(*b));
	if (!x->mem || vgpu.mode == VGPU_PASSTHROUGH)
		return 0;
	if (vgpu.mode == VGPU_FAIL_CLOSED)
		return -1; /* reported once, when the limits file was read */
	b->active = 1;
	CUdevice cur;
	if (vgpu_current_index(&cur) != -2 && cur >= 0 && cur < GDEV)
		b->devs |= 1ull << cur; /* sizes it could not learn land here */
	for (int d = 0; d < GDEV; d++) {
		if (!x->need[d])
			continue;
		b->devs |= 1ull << d;
		int idx = vgpu_device_index(d);
		if (idx < 0) {
			LOGW("graph memory refused: device %d is not among the container's GPUs", d);
			give_back_est(b);
			return -1;
		}
		/* Only what the pool lacks is new device memory. What an earlier
		 * launch left live is either freed by now (then spare) or still
		 * live: then an auto-free launch frees it first, and any other
		 * launch is an error the driver reports. Either way it is not new. */
		uint64_t reserved = 0, used = 0;
		mem_attr(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved);
		mem_attr(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used);
		if (x->launched)
			used = used > x->unfreed[d] ? used - x->unfreed[d] : 0;
		uint64_t spare = reserved > used ? reserved - used : 0;
		uint64_t est = x->need[d] > spare ? x->need[d] - spare : 0;
		if (!est)
			continue;
		int rc = vgpu_quota_charge(idx, est);
		if (rc != 0) {
			if (rc == VGPU_OVER_QUOTA)
				LOGW("GPU memory quota exceeded on %s: a CUDA graph needs %llu more bytes of graph "
				     "memory, %llu of %llu in use by the container",
				     vgpu.limits.gpu[idx].uuid, (unsigned long long)est,
				     (unsigned long long)vgpu_quota_used(idx), (unsigned long long)vgpu.limits.gpu[idx].memory);
			give_back_est(b);
			return -1;
		}
		b->est[idx] += est;
	}
	return 0;
}

int vgpu_graph_back_begin(CUgraphExec g, int launch, struct vgpu_graph_backing *b)
{
	b->active = 0;
	if (likely(!__atomic_load_n(&any_memory, __ATOMIC_ACQUIRE)))
		return 0;
	struct gexec x;
	if (!table_get(g, &x))
		return 0;
	vgpu_init();
	int rc = back_begin(&x, b);
	b->exec = launch ? g : NULL;
	return rc;
}

static void set_launched(CUgraphExec e)
{
	pthread_mutex_lock(&table_mu);
	for (struct gexec *x = table[bucket(e)]; x; x = x->next)
		if (x->exec == e)
			x->launched = 1;
	pthread_mutex_unlock(&table_mu);
}

void vgpu_graph_back_end(struct vgpu_graph_backing *b, CUresult rc)
{
	if (!b->active)
		return;
	if (b->exec && rc == CUDA_SUCCESS)
		set_launched(b->exec);
	/* Count what the pools hold now first, then drop what was reserved
	 * ahead: the container never looks emptier than it is meanwhile. */
	for (int d = 0; d < GDEV; d++)
		if (b->devs & (1ull << d))
			follow_pool(d);
	give_back_est(b);
	b->active = 0;
}

/* ---- hooks: instantiation, upload, destruction, trim -------------------------------------- */

VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz)
{
	struct gexec *x = inspect_graph(g);
	return keep(NEXT(cuGraphInstantiate)(e, g, err, log, logsz), e, x);
}

VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t logsz)
{
	struct gexec *x = inspect_graph(g);
	return keep(NEXT(cuGraphInstantiate_v2)(e, g, err, log, logsz), e, x);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	struct gexec *x = inspect_graph(g);
	return keep(NEXT(cuGraphInstantiateWithFlags)(e, g, flags), e, x);
}

/* With CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD the instantiation also uploads:
 * the graph's memory is backed by this call. */
static CUresult with_params(int ptsz, CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	struct gexec *x = inspect_graph(g);
	struct vgpu_graph_backing b = {0};
	if (x && p && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) && back_begin(x, &b) != 0) {
		gexec_free(x);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	CUresult rc = ptsz ? NEXT(cuGraphInstantiateWithParams_ptsz)(e, g, p) : NEXT(cuGraphInstantiateWithParams)(e, g, p);
	vgpu_graph_back_end(&b, rc);
	return keep(rc, e, x);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return with_params(0, e, g, p);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	return with_params(1, e, g, p);
}

VGPU_EXPORT CUresult cuGraphUpload(CUgraphExec g, CUstream s)
{
	struct vgpu_graph_backing b;
	if (vgpu_graph_back_begin(g, 0, &b) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = NEXT(cuGraphUpload)(g, s);
	vgpu_graph_back_end(&b, rc);
	return rc;
}

VGPU_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec g, CUstream s)
{
	struct vgpu_graph_backing b;
	if (vgpu_graph_back_begin(g, 0, &b) != 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult rc = NEXT(cuGraphUpload_ptsz)(g, s);
	vgpu_graph_back_end(&b, rc);
	return rc;
}

VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec g)
{
	/* Forget first: once destroyed, a new executable graph may get the same handle. */
	struct gexec *x = table_take(g);
	CUresult rc = NEXT(cuGraphExecDestroy)(g);
	if (!x)
		return rc;
	if (rc != CUDA_SUCCESS) {
		table_put(x);
		return rc;
	}
	/* The guide says the pool keeps the memory until a trim; whatever this
	 * driver does, the count follows the pool. */
	if (x->mem && vgpu.mode == VGPU_ENFORCE)
		for (int d = 0; d < GDEV; d++)
			if (x->need[d])
				follow_pool(d);
	gexec_free(x);
	return rc;
}

/* An update gives the executable graph the parameters of g (same topology):
 * what a launch runs is then g's. The pool is left to the next launch. */
static CUresult updated(CUresult rc, CUgraphExec e, struct gexec *fresh)
{
	if (rc == CUDA_SUCCESS && fresh) {
		pthread_mutex_lock(&table_mu);
		for (struct gexec *x = table[bucket(e)]; x; x = x->next)
			if (x->exec == e) {
				/* The nodes are the new graph's from now on. */
				struct knode *kn = x->kn;
				size_t nkn = x->nkn;
				x->kn = fresh->kn;
				x->nkn = fresh->nkn;
				fresh->kn = kn;
				fresh->nkn = nkn;
				struct cnode *cn = x->cn;
				size_t ncn = x->ncn;
				x->cn = fresh->cn;
				x->ncn = fresh->ncn;
				fresh->cn = cn;
				fresh->ncn = ncn;
				x->fixed_work = fresh->fixed_work;
				x->fixed_waves = fresh->fixed_waves;
				recount(x);
				LOGD("graph exec %p updated: %llu thread blocks a launch, %llu waves", (void *)e,
				     (unsigned long long)x->work, (unsigned long long)x->waves);
			}
		pthread_mutex_unlock(&table_mu);
	}
	gexec_free(fresh);
	return rc;
}

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphNode *err, int *result)
{
	struct gexec *x = inspect_graph(g);
	return updated(NEXT(cuGraphExecUpdate)(e, g, err, result), e, x);
}

VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
	struct gexec *x = inspect_graph(g);
	return updated(NEXT(cuGraphExecUpdate_v2)(e, g, info), e, x);
}

/* After a successful change of node n of e: its grid is blocks (unless
 * keep_blocks), and it runs unless off (-1: unchanged). A node the shim does
 * not know (not a top-level kernel or child graph node) changes nothing. */
static void node_changed(CUgraphExec e, CUgraphNode n, int keep_blocks, uint64_t blocks, int off)
{
	pthread_mutex_lock(&table_mu);
	for (struct gexec *x = table[bucket(e)]; x; x = x->next) {
		if (x->exec != e)
			continue;
		for (size_t i = 0; i < x->nkn; i++)
			if (x->kn[i].node == n) {
				if (!keep_blocks)
					x->kn[i].blocks = blocks;
				if (off >= 0)
					x->kn[i].off = off;
			}
		for (size_t i = 0; i < x->ncn; i++)
			if (x->cn[i].node == n && off >= 0)
				x->cn[i].off = off;
		recount(x);
		LOGD("graph exec %p changed: %llu thread blocks a launch, %llu waves", (void *)e,
		     (unsigned long long)x->work, (unsigned long long)x->waves);
	}
	pthread_mutex_unlock(&table_mu);
}

#define GRID_OF(k) ((uint64_t)(k)->gridDimX * (uint64_t)(k)->gridDimY * (uint64_t)(k)->gridDimZ)

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
	if (!NEXT(cuGraphExecKernelNodeSetParams))
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = NEXT(cuGraphExecKernelNodeSetParams)(e, n, p);
	if (rc == CUDA_SUCCESS && p)
		node_changed(e, n, 0, GRID_OF(p), -1);
	return rc;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
	if (!NEXT(cuGraphExecKernelNodeSetParams_v2))
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = NEXT(cuGraphExecKernelNodeSetParams_v2)(e, n, p);
	if (rc == CUDA_SUCCESS && p)
		node_changed(e, n, 0, GRID_OF(p), -1);
	return rc;
}

/*
 * After a successful change of child graph node n of e to graph child: its
 * work is child's, read now on the SMs e was instantiated for. The driver
 * requires child's topology to be the old one's, so nothing else changes.
 * Read before the lock (the driver's calls may take time); a node the shim
 * does not know changes nothing.
 */
static void child_changed(CUgraphExec e, CUgraphNode n, CUgraph child)
{
	struct gexec probe;
	if (!table_get(e, &probe))
		return;
	struct gexec t;
	memset(&t, 0, sizeof(t));
	t.sms = probe.sms;
	struct scan sc = {.x = &t};
	inspect(child, &sc, 1);
	free(sc.al);
	free(sc.fr);
	pthread_mutex_lock(&table_mu);
	for (struct gexec *x = table[bucket(e)]; x; x = x->next) {
		if (x->exec != e)
			continue;
		for (size_t i = 0; i < x->ncn; i++)
			if (x->cn[i].node == n) {
				x->cn[i].work = t.fixed_work;
				x->cn[i].waves = t.fixed_waves;
			}
		recount(x);
		LOGD("graph exec %p changed: %llu thread blocks a launch, %llu waves", (void *)e,
		     (unsigned long long)x->work, (unsigned long long)x->waves);
	}
	pthread_mutex_unlock(&table_mu);
}

VGPU_EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraph child)
{
	if (!NEXT(cuGraphExecChildGraphNodeSetParams))
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = NEXT(cuGraphExecChildGraphNodeSetParams)(e, n, child);
	if (rc == CUDA_SUCCESS)
		child_changed(e, n, child);
	return rc;
}

VGPU_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p)
{
	if (!NEXT(cuGraphExecNodeSetParams))
		return CUDA_ERROR_NOT_FOUND;
	/* Read before the call: the caller's struct is not ours to trust after it. */
	int type = p ? p->type : -1;
	CUgraph child = type == CU_GRAPH_NODE_TYPE_GRAPH ? p->u.graph : NULL;
	CUresult rc = NEXT(cuGraphExecNodeSetParams)(e, n, p);
	if (rc == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_KERNEL)
		node_changed(e, n, 0, GRID_OF(&p->u.kernel), -1);
	else if (rc == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_GRAPH)
		child_changed(e, n, child);
	return rc;
}

VGPU_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode n, unsigned enabled)
{
	if (!NEXT(cuGraphNodeSetEnabled))
		return CUDA_ERROR_NOT_FOUND;
	CUresult rc = NEXT(cuGraphNodeSetEnabled)(e, n, enabled);
	if (rc == CUDA_SUCCESS)
		node_changed(e, n, 1, 0, !enabled);
	return rc;
}

VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
	CUresult rc = NEXT(cuDeviceGraphMemTrim)(dev);
	vgpu_init();
	if (rc == CUDA_SUCCESS && vgpu.mode == VGPU_ENFORCE && dev >= 0 && dev < GDEV)
		follow_pool(dev);
	return rc;
}

/* ---- stream capture ------------------------------------------------------------------- */

/* Captures this process began and has not ended: while 0, no stream captures
 * (as far as the hooks below can see) and nothing needs asking. */
static int captures;

static int is_capturing(CUstream s, int ptsz)
{
	int st = CU_STREAM_CAPTURE_STATUS_NONE;
	/* The per-thread default stream by name: no _ptsz lookup needed. */
	CUstream q = ptsz && s == NULL ? CU_STREAM_PER_THREAD : s;
	if (DRV("cuStreamIsCapturing", CUresult(*)(CUstream, int *), q, &st) != CUDA_SUCCESS)
		return 0; /* e.g. the legacy stream while another captures: the call itself will fail */
	return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int vgpu_graph_capturing(CUstream s, int ptsz)
{
	if (likely(!__atomic_load_n(&captures, __ATOMIC_RELAXED)))
		return 0;
	return is_capturing(s, ptsz);
}

static CUresult began(CUresult rc)
{
	if (rc == CUDA_SUCCESS)
		__atomic_add_fetch(&captures, 1, __ATOMIC_RELAXED);
	return rc;
}

VGPU_EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
	return began(NEXT(cuStreamBeginCapture)(s));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
	return began(NEXT(cuStreamBeginCapture_ptsz)(s));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	return began(NEXT(cuStreamBeginCapture_v2)(s, mode));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
	return began(NEXT(cuStreamBeginCapture_v2_ptsz)(s, mode));
}

static void ended(int was)
{
	int n = __atomic_load_n(&captures, __ATOMIC_RELAXED);
	while (was && n > 0 && !__atomic_compare_exchange_n(&captures, &n, n - 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/* Ending a capture ends it even when the capture was invalidated (the call
 * then fails): count by whether the stream captured before the call. */
VGPU_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	int was = is_capturing(s, 0);
	CUresult rc = NEXT(cuStreamEndCapture)(s, g);
	ended(was && !is_capturing(s, 0));
	return rc;
}

VGPU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
	int was = is_capturing(s, 1);
	CUresult rc = NEXT(cuStreamEndCapture_ptsz)(s, g);
	ended(was && !is_capturing(s, 1));
	return rc;
}

static void after_fork(void)
{
	/* Graphs, like every CUDA object, do not survive fork; entries leak on
	 * purpose (a parent thread may have been mid-update). */
	pthread_mutex_init(&table_mu, NULL);
	memset(table, 0, sizeof(table));
	memset(charged, 0, sizeof(charged));
	any_memory = 0;
	captures = 0;
}

VGPU_LIFECYCLE(graph, .order = VGPU_ORDER_GRAPH, .after_fork = after_fork);
