/*
 * Test program for CUDA graphs: runs a script of graph operations given on
 * the command line against the fake driver and checks each result, reaching
 * the driver
 *   -m direct  linked against libcuda (calls bind to the preloaded shim), or
 *   -m rt12    the cudart 12 way: dlopen + cuGetProcAddress_v2 per symbol
 *              with its ABI version (-p: the per-thread-default-stream flag,
 *              and the _ptsz twins in direct mode).
 *
 * Operations (SIZE takes KiB/MiB/GiB; RC is the expected CUresult, default
 * 0; each allocation pushes its address, each free pops one):
 *   init                     cuInit, primary context of GPU 0, one stream
 *   graph                    a new empty graph (the current one)
 *   kernel:GX[:GY[:GZ]]      kernel node (_v2 params); kernel1:... the v1 API
 *   child                    the current graph becomes a child node of a new one
 *   galloc:SIZE[:RC[:GPU]]   memory allocation node on GPU 0 (or GPU)
 *   gfree[:RC]               memory free node of the last address
 *   capture[:RC] endcapture[:RC] iscapturing:0|1
 *   alloc:SIZE[:RC]          cuMemAlloc_v2
 *   async:SIZE[:RC]          cuMemAllocAsync on the stream
 *   poolasync:SIZE[:RC]      cuMemAllocFromPoolAsync from GPU 0's default pool
 *   freeasync[:RC] free[:RC] cuMemFreeAsync on the stream / cuMemFree
 *   launchk:GX[:RC]          cuLaunchKernel on the stream
 *   inst[:RC]                cuGraphInstantiate (5-argument ABI)
 *   instflags:FLAGS[:RC]     cuGraphInstantiateWithFlags
 *   instparams:FLAGS[:RC]    cuGraphInstantiateWithParams, uploading on the stream
 *   upload[:RC] launch[:RC]  of the last executable graph
 *   execdestroy[:RC]         destroys (and forgets) the last executable graph
 *   update[:RC] update1[:RC] cuGraphExecUpdate_v2 / cuGraphExecUpdate of it from the current graph
 *   setk:I:GX setk1:I:GX setnode:I:GX  the grid of the Ith kernel node made (from 0) in the last
 *                            executable graph: cuGraphExecKernelNodeSetParams_v2 / _v1 /
 *                            cuGraphExecNodeSetParams
 *   enable:I:0|1             cuGraphNodeSetEnabled of the Ith kernel node in the last executable graph
 *   cond                     a conditional node (cuGraphAddNode) in the current graph
 *   graphdestroy trim[:RC] sync
 *   attr:used|usedhigh|reserved|reservedhigh:SIZE   graph memory of GPU 0
 *   resethigh:used|reserved[:RC[:VALUE]]  cuDeviceSetGraphMemAttribute of a high-water mark
 *   meminfo:FREE             cuMemGetInfo_v2's free (the container's slice)
 *   busy:NS                  GPU time this process's kernels ran on GPU 0
 *   bglaunch                 launches the last executable graph from another thread
 *   join                     waits for that thread (its launch must have succeeded)
 *   sleepms:MS
 *   kernels:N:GX             N kernel nodes of GX blocks each
 *   launchks:N:GX            N cuLaunchKernel of GX blocks on the stream; prints
 *                            "launchks_ms MS", how long the N calls took
 *   launchfor:SECONDS:WARMUP[:GX]  launches the last executable graph (or, with GX,
 *                            a kernel of GX blocks) on the stream for SECONDS without
 *                            synchronising; prints "share PCT", this process's
 *                            share of GPU 0's time after WARMUP seconds
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			CUstream, void **, void **);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			     CUstream, void **, void **);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS_v1 *);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
				 const CUDA_KERNEL_NODE_PARAMS_v2 *);
CUresult cuGraphAddChildGraphNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphUpload_ptsz(CUgraphExec, CUstream);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode *, int *);
CUresult cuGraphExecUpdate_v2(CUgraphExec, CUgraph, void *);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v1 *);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v2 *);
CUresult cuGraphExecNodeSetParams(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec, CUgraphNode, CUgraph);
CUresult cuGraphNodeSetEnabled(CUgraphExec, CUgraphNode, unsigned);
CUresult cuGraphAddNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
CUresult cuDeviceGraphMemTrim(CUdevice);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, int, void *);
CUresult cuDeviceSetGraphMemAttribute(CUdevice, int, void *);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuStreamIsCapturing_ptsz(CUstream, int *);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Every entry point the script reaches, as one resolution mode gives it. */
static struct {
#define API(field, name, twin, base, ver, stream, ret, args) ret(*field) args;
#include "graphprog.def"
#undef API
} api;

static int ptsz;

static void die(const char *what, long long got, long long want)
{
	printf("FAIL: %s: got %lld want %lld\n", what, got, want);
	fflush(stdout);
	exit(1);
}

static void load(const char *mode)
{
	if (!strcmp(mode, "direct")) {
		/* The _ptsz twins where there is one, as a program built with
		 * --default-stream per-thread binds. */
#define API(field, name, twin, base, ver, stream, ret, args) api.field = ptsz ? (void *)twin : (void *)name;
#include "graphprog.def"
#undef API
		return;
	}
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
		h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
	if (strcmp(mode, "rt12") || !gpa) {
		printf("FAIL: mode %s unavailable\n", mode);
		exit(1);
	}
#define API(field, name, twin, base, ver, stream, ret, args)                                                 \
	{                                                                                                     \
		void *p = NULL;                                                                               \
		CUdriverProcAddressQueryResult st = 1;                                                        \
		gpa(#base, &p, ver, stream && ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st); \
		if (!p) {                                                                                     \
			printf("FAIL: cannot resolve %s\n", #base);                                          \
			exit(1);                                                                              \
		}                                                                                             \
		api.field = p;                                                                                \
	}
#include "graphprog.def"
#undef API
}

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

static CUstream stream;
static CUgraph graph;
static CUgraphExec execs[256];
static int nexecs;
static CUdeviceptr ptrs[4096];
static int nptrs;

static void check(const char *op, CUresult got, const char *want)
{
	int w = want ? atoi(want) : 0;
	if (got != w)
		die(op, got, w);
}

static CUgraphExec top(void)
{
	if (!nexecs)
		die("no executable graph", 0, 1);
	return execs[nexecs - 1];
}

static CUdeviceptr pop(void)
{
	if (!nptrs)
		die("no address to free", 0, 1);
	return ptrs[--nptrs];
}

static pthread_t bg;
static CUresult bg_rc;

static void *bg_launch(void *e)
{
	bg_rc = api.Launch((CUgraphExec)e, stream);
	return NULL;
}

static CUgraphNode knodes[4096]; /* kernel nodes made, in order */
static int nknodes;
static CUgraphNode cnodes[64]; /* child graph nodes made, in order */
static int ncnodes;

static void kernel_node(int v1, unsigned gx, unsigned gy, unsigned gz)
{
	CUgraphNode n = NULL;
	CUDA_KERNEL_NODE_PARAMS_v2 k = {.gridDimX = gx, .gridDimY = gy, .gridDimZ = gz,
					 .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
	if (v1) {
		CUDA_KERNEL_NODE_PARAMS_v1 k1;
		memcpy(&k1, &k, sizeof(k1));
		check("cuGraphAddKernelNode", api.AddKernelNode1(&n, graph, NULL, 0, &k1), NULL);
	} else {
		check("cuGraphAddKernelNode_v2", api.AddKernelNode(&n, graph, NULL, 0, &k), NULL);
	}
	if (nknodes < 4096)
		knodes[nknodes++] = n;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* launchfor: the share of GPU time comes from the fake driver's accounting,
 * the window's end points taken by it too, so a descheduled launcher cannot
 * skew the window against the GPU time in it. */
static void launch_for(double total, double warm, const char *grid)
{
	long long (*busy)(int, int, long long *) = dlsym(RTLD_DEFAULT, "fakecudaBusyNs");
	if (!busy)
		die("fakecudaBusyNs", 0, 1);
	CUgraphExec e = grid ? NULL : top();
	unsigned gx = grid ? (unsigned)atoi(grid) : 0;
	long long b0 = -1, w0 = 0, w1 = 0;
	double t0 = now_s();
	while (now_s() - t0 < total) {
		if (b0 < 0 && now_s() - t0 >= warm)
			b0 = busy(getpid(), 0, &w0);
		if (e)
			check("cuGraphLaunch", api.Launch(e, stream), NULL);
		else
			check("cuLaunchKernel", api.LaunchKernel(NULL, gx, 1, 1, 128, 1, 1, 0, stream, NULL, NULL), NULL);
	}
	long long b1 = busy(getpid(), 0, &w1);
	check("cuCtxSynchronize", api.CtxSynchronize(), NULL);
	printf("share %.1f\n", (double)(b1 - b0) / (double)(w1 - w0) * 100.0);
}

static void op(char *spec)
{
	char *a[5] = {0};
	int n = 0;
	for (char *t = strtok(spec, ":"); t && n < 5; t = strtok(NULL, ":"))
		a[n++] = t;
	const char *o = a[0];
	CUgraphNode node;
	CUgraphExec e;
	if (!strcmp(o, "init")) {
		CUcontext c;
		check("cuInit", api.Init(0), NULL);
		check("cuDevicePrimaryCtxRetain", api.PrimaryCtxRetain(&c, 0), NULL);
		check("cuCtxSetCurrent", api.CtxSetCurrent(c), NULL);
		check("cuStreamCreate", api.StreamCreate(&stream, 0), NULL);
	} else if (!strcmp(o, "graph")) {
		check("cuGraphCreate", api.GraphCreate(&graph, 0), NULL);
	} else if (!strcmp(o, "kernel") || !strcmp(o, "kernel1")) {
		kernel_node(o[6] == '1', (unsigned)atoi(a[1]), a[2] ? (unsigned)atoi(a[2]) : 1,
			    a[3] ? (unsigned)atoi(a[3]) : 1);
	} else if (!strcmp(o, "child")) {
		CUgraph parent;
		check("cuGraphCreate", api.GraphCreate(&parent, 0), NULL);
		check("cuGraphAddChildGraphNode", api.AddChildGraphNode(&node, parent, NULL, 0, graph), NULL);
		check("cuGraphDestroy", api.GraphDestroy(graph), NULL);
		graph = parent;
		if (ncnodes < 64)
			cnodes[ncnodes++] = node;
	} else if (!strcmp(o, "galloc")) {
		CUDA_MEM_ALLOC_NODE_PARAMS p;
		memset(&p, 0, sizeof(p));
		p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		p.poolProps.location.id = a[3] ? atoi(a[3]) : 0;
		p.bytesize = size_arg(a[1]);
		CUresult rc = api.AddMemAllocNode(&node, graph, NULL, 0, &p);
		check("cuGraphAddMemAllocNode", rc, a[2]);
		if (rc == CUDA_SUCCESS)
			ptrs[nptrs++] = p.dptr;
	} else if (!strcmp(o, "gfree")) {
		check("cuGraphAddMemFreeNode", api.AddMemFreeNode(&node, graph, NULL, 0, ptrs[nptrs - 1]), a[1]);
	} else if (!strcmp(o, "capture")) {
		check("cuStreamBeginCapture", api.BeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), a[1]);
	} else if (!strcmp(o, "endcapture")) {
		check("cuStreamEndCapture", api.EndCapture(stream, &graph), a[1]);
	} else if (!strcmp(o, "iscapturing")) {
		int st = -1;
		check("cuStreamIsCapturing", api.IsCapturing(stream, &st), NULL);
		if (st != atoi(a[1]))
			die("capture status", st, atoi(a[1]));
	} else if (!strcmp(o, "async")) {
		CUdeviceptr p = 0;
		CUresult rc = api.MemAllocAsync(&p, size_arg(a[1]), stream);
		check("cuMemAllocAsync", rc, a[2]);
		if (rc == CUDA_SUCCESS)
			ptrs[nptrs++] = p;
	} else if (!strcmp(o, "alloc")) {
		CUdeviceptr p = 0;
		CUresult rc = api.MemAlloc(&p, size_arg(a[1]));
		check("cuMemAlloc", rc, a[2]);
		if (rc == CUDA_SUCCESS)
			ptrs[nptrs++] = p;
	} else if (!strcmp(o, "poolasync")) {
		CUdeviceptr p = 0;
		CUmemoryPool pool;
		check("cuDeviceGetDefaultMemPool", api.DeviceGetDefaultMemPool(&pool, 0), NULL);
		CUresult rc = api.MemAllocFromPoolAsync(&p, size_arg(a[1]), pool, stream);
		check("cuMemAllocFromPoolAsync", rc, a[2]);
		if (rc == CUDA_SUCCESS)
			ptrs[nptrs++] = p;
	} else if (!strcmp(o, "freeasync")) {
		check("cuMemFreeAsync", api.MemFreeAsync(pop(), stream), a[1]);
	} else if (!strcmp(o, "free")) {
		check("cuMemFree", api.MemFree(pop()), a[1]);
	} else if (!strcmp(o, "launchk")) {
		check("cuLaunchKernel", api.LaunchKernel(NULL, (unsigned)atoi(a[1]), 1, 1, 128, 1, 1, 0, stream, NULL, NULL),
		      a[2]);
	} else if (!strcmp(o, "inst") || !strcmp(o, "instflags") || !strcmp(o, "instparams")) {
		CUresult rc;
		const char *want = a[1];
		if (!strcmp(o, "inst")) {
			rc = api.Instantiate(&e, graph, NULL, NULL, 0);
		} else if (!strcmp(o, "instflags")) {
			rc = api.InstantiateWithFlags(&e, graph, strtoull(a[1], NULL, 0));
			want = a[2];
		} else {
			CUDA_GRAPH_INSTANTIATE_PARAMS p = {.flags = strtoull(a[1], NULL, 0), .hUploadStream = stream};
			rc = api.InstantiateWithParams(&e, graph, &p);
			want = a[2];
		}
		check(o, rc, want);
		if (rc == CUDA_SUCCESS)
			execs[nexecs++] = e;
	} else if (!strcmp(o, "upload")) {
		check("cuGraphUpload", api.Upload(top(), stream), a[1]);
	} else if (!strcmp(o, "launch")) {
		check("cuGraphLaunch", api.Launch(top(), stream), a[1]);
	} else if (!strcmp(o, "execdestroy")) {
		check("cuGraphExecDestroy", api.ExecDestroy(top()), a[1]);
		nexecs--;
	} else if (!strcmp(o, "update")) {
		char info[64]; /* CUgraphExecUpdateResultInfo, opaque here */
		check("cuGraphExecUpdate_v2", api.ExecUpdate(top(), graph, info), a[1]);
	} else if (!strcmp(o, "setk") || !strcmp(o, "setk1") || !strcmp(o, "setnode")) {
		CUgraphNodeParams p;
		memset(&p, 0, sizeof(p));
		p.type = CU_GRAPH_NODE_TYPE_KERNEL;
		p.u.kernel = (CUDA_KERNEL_NODE_PARAMS_v2){.gridDimX = (unsigned)atoi(a[2]), .gridDimY = 1, .gridDimZ = 1,
							  .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1};
		CUgraphNode kn = knodes[atoi(a[1])];
		if (!strcmp(o, "setk")) {
			check("cuGraphExecKernelNodeSetParams_v2", api.ExecKernelSet(top(), kn, &p.u.kernel), NULL);
		} else if (!strcmp(o, "setk1")) {
			CUDA_KERNEL_NODE_PARAMS_v1 k1;
			memcpy(&k1, &p.u.kernel, sizeof(k1));
			check("cuGraphExecKernelNodeSetParams", api.ExecKernelSet1(top(), kn, &k1), NULL);
		} else {
			check("cuGraphExecNodeSetParams", api.ExecNodeSet(top(), kn, &p), NULL);
		}
	} else if (!strcmp(o, "setchild") || !strcmp(o, "setchildnode")) {
		/* setchild:I[:RC] / setchildnode:I[:RC] — the I-th child graph node made gets the
		 * current graph, by cuGraphExecChildGraphNodeSetParams / cuGraphExecNodeSetParams. */
		CUgraphNode cn = cnodes[atoi(a[1])];
		if (!strcmp(o, "setchild")) {
			check("cuGraphExecChildGraphNodeSetParams", api.ExecChildSet(top(), cn, graph), a[2]);
		} else {
			CUgraphNodeParams p;
			memset(&p, 0, sizeof(p));
			p.type = CU_GRAPH_NODE_TYPE_GRAPH;
			p.u.graph = graph;
			check("cuGraphExecNodeSetParams", api.ExecNodeSet(top(), cn, &p), a[2]);
		}
	} else if (!strcmp(o, "enable")) {
		check("cuGraphNodeSetEnabled", api.NodeSetEnabled(top(), knodes[atoi(a[1])], (unsigned)atoi(a[2])), NULL);
	} else if (!strcmp(o, "cond")) {
		CUgraphNodeParams p;
		memset(&p, 0, sizeof(p));
		p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
		check("cuGraphAddNode", api.AddNode(&node, graph, NULL, 0, &p), NULL);
	} else if (!strcmp(o, "update1")) {
		int result = -1;
		check("cuGraphExecUpdate", api.ExecUpdate1(top(), graph, &node, &result), a[1]);
	} else if (!strcmp(o, "graphdestroy")) {
		check("cuGraphDestroy", api.GraphDestroy(graph), NULL);
		graph = NULL;
	} else if (!strcmp(o, "trim")) {
		check("cuDeviceGraphMemTrim", api.Trim(0), a[1]);
	} else if (!strcmp(o, "sync")) {
		check("cuCtxSynchronize", api.CtxSynchronize(), NULL);
	} else if (!strcmp(o, "attr")) {
		static const char *const names[] = {"used", "usedhigh", "reserved", "reservedhigh"};
		int k = 0;
		while (k < 4 && strcmp(a[1], names[k]))
			k++;
		unsigned long long v = ~0ull;
		check("cuDeviceGetGraphMemAttribute", api.GetGraphMemAttribute(0, k, &v), NULL);
		if (v != size_arg(a[2]))
			die(a[1], (long long)v, (long long)size_arg(a[2]));
	} else if (!strcmp(o, "resethigh")) {
		unsigned long long v = a[3] ? size_arg(a[3]) : 0;
		int k = !strcmp(a[1], "used") ? CU_GRAPH_MEM_ATTR_USED_MEM_HIGH : CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH;
		check("cuDeviceSetGraphMemAttribute", api.SetGraphMemAttribute(0, k, &v), a[2]);
	} else if (!strcmp(o, "meminfo")) {
		size_t f = 0, t = 0;
		check("cuMemGetInfo", api.MemGetInfo(&f, &t), NULL);
		if (f != size_arg(a[1]))
			die("free memory", (long long)f, (long long)size_arg(a[1]));
	} else if (!strcmp(o, "kernels")) {
		for (int k = atoi(a[1]); k > 0; k--)
			kernel_node(0, (unsigned)atoi(a[2]), 1, 1);
	} else if (!strcmp(o, "launchks")) {
		double t0 = now_s();
		for (int k = atoi(a[1]); k > 0; k--)
			check("cuLaunchKernel",
			      api.LaunchKernel(NULL, (unsigned)atoi(a[2]), 1, 1, 128, 1, 1, 0, stream, NULL, NULL), NULL);
		printf("launchks_ms %.1f\n", (now_s() - t0) * 1000.0);
	} else if (!strcmp(o, "launchfor")) {
		launch_for(atof(a[1]), atof(a[2]), a[3]);
	} else if (!strcmp(o, "bglaunch")) {
		if (pthread_create(&bg, NULL, bg_launch, top()) != 0)
			die("pthread_create", 1, 0);
	} else if (!strcmp(o, "join")) {
		pthread_join(bg, NULL);
		check("background cuGraphLaunch", bg_rc, a[1]);
	} else if (!strcmp(o, "sleepms")) {
		usleep((useconds_t)atoi(a[1]) * 1000);
	} else if (!strcmp(o, "busy")) {
		long long (*busy)(int, int, long long *) = dlsym(RTLD_DEFAULT, "fakecudaBusyNs");
		long long b = busy ? busy(getpid(), 0, NULL) : -1;
		if (b != atoll(a[1]))
			die("busy ns", b, atoll(a[1]));
	} else {
		die(o, 0, 0);
	}
	printf("%s ok\n", o);
}

int main(int argc, char **argv)
{
	const char *mode = "direct";
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-m") && i + 1 < argc)
			mode = argv[++i];
		else if (!strcmp(argv[i], "-p"))
			ptsz = 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	load(mode);
	for (; i < argc; i++)
		op(argv[i]);
	printf("ok\n");
	return 0;
}
