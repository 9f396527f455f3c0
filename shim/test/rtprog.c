/*
 * Test program for NVIDIA's own libcudart (11.8 and 12.4 from Debian's
 * non-free archive, unpacked by hack/cudart.sh): dlopens the library named
 * on the command line and runs a script of runtime calls, checking each
 * result. No CUDA headers: the few runtime calls used are declared here by
 * hand from the CUDA Runtime API reference (every one returns cudaError_t,
 * a 4-byte enum; cudaSuccess 0, cudaErrorMemoryAllocation 2).
 *
 *   rtprog LIBCUDART OP...
 *
 * Operations (SIZE accepts KiB/MiB/GiB; ERR is the expected cudaError_t,
 * default 0):
 *   count:N              cudaGetDeviceCount finds N devices
 *   malloc:SIZE[:ERR]    cudaMalloc
 *   managed:SIZE[:ERR]   cudaMallocManaged (cudaMemAttachGlobal)
 *   async:SIZE[:ERR]     cudaMallocAsync on the legacy default stream
 *   defpool:SIZE[:ERR]   cudaDeviceGetDefaultMemPool(0) + cudaMallocFromPoolAsync
 *   pool:SIZE[:ERR]      cudaMemPoolCreate (device 0, once) + cudaMallocFromPoolAsync
 *   free                 frees the newest held allocation the way it was made
 *                        (cudaFree, or cudaFreeAsync + cudaStreamSynchronize)
 *   info:FREE:TOTAL      cudaMemGetInfo ('-' skips a check)
 *   driver:BYTES         the fake driver's own count of device 0's used bytes
 * Any mismatch prints "FAIL: ..." and exits 1; the last line is "rtprog ok".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;

/* struct cudaMemPoolProps: 88 bytes in 11.8 (reserved[64] after the
 * pointer) and 12.x (maxSize, usage, reserved[54]); the same layout as the
 * driver's CUmemPoolProps (include/cuda_abi.h). */
struct rt_pool_props {
	int allocType;   /* cudaMemAllocationTypePinned = 1 */
	int handleTypes; /* cudaMemHandleTypeNone = 0 */
	struct {
		int type; /* cudaMemLocationTypeDevice = 1 */
		int id;
	} location;
	void *win32SecurityAttributes;
	unsigned char rest[64];
};
_Static_assert(sizeof(struct rt_pool_props) == 88, "cudaMemPoolProps");

static struct {
	cudaError_t (*GetDeviceCount)(int *);
	cudaError_t (*Malloc)(void **, size_t);
	cudaError_t (*MallocManaged)(void **, size_t, unsigned);
	cudaError_t (*MallocAsync)(void **, size_t, cudaStream_t);
	cudaError_t (*MallocFromPoolAsync)(void **, size_t, cudaMemPool_t, cudaStream_t);
	cudaError_t (*Free)(void *);
	cudaError_t (*FreeAsync)(void *, cudaStream_t);
	cudaError_t (*StreamSynchronize)(cudaStream_t);
	cudaError_t (*MemGetInfo)(size_t *, size_t *);
	cudaError_t (*MemPoolCreate)(cudaMemPool_t *, const struct rt_pool_props *);
	cudaError_t (*DeviceGetDefaultMemPool)(cudaMemPool_t *, int);
	const char *(*GetErrorName)(cudaError_t);
} rt;

static void fail(const char *fmt, const char *a, long long b)
{
	printf("FAIL: ");
	printf(fmt, a, b);
	printf("\n");
	exit(1);
}

static void *need(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (!p)
		fail("%s: not in the cudart library%lld", name, 0);
	return p;
}

static unsigned long long size_arg(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (!strcmp(end, "KiB"))
		v *= 1024;
	else if (!strcmp(end, "MiB"))
		v *= 1024 * 1024;
	else if (!strcmp(end, "GiB"))
		v *= 1024.0 * 1024 * 1024;
	else if (*end)
		fail("bad size '%s'%lld", s, 0);
	return (unsigned long long)v;
}

static void check(const char *what, cudaError_t got, const char *want)
{
	int w = want ? atoi(want) : 0;
	printf("%s -> %d (%s)\n", what, got, rt.GetErrorName(got));
	if (got != w)
		fail("%s: want error %lld", what, w);
}

static void check_val(const char *what, unsigned long long got, const char *want)
{
	if (want && strcmp(want, "-") && got != size_arg(want)) {
		printf("%s = %llu, want %s\n", what, got, want);
		fail("%s: got %lld", what, (long long)got);
	}
}

/* What the program holds, newest last: a pointer and how it was made. */
static struct {
	void *p;
	int async;
} held[256];
static int nheld;

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: rtprog LIBCUDART OP...\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		fail("dlopen: %s%lld", dlerror(), 0);
	rt.GetDeviceCount = need(lib, "cudaGetDeviceCount");
	rt.Malloc = need(lib, "cudaMalloc");
	rt.MallocManaged = need(lib, "cudaMallocManaged");
	rt.MallocAsync = need(lib, "cudaMallocAsync");
	rt.MallocFromPoolAsync = need(lib, "cudaMallocFromPoolAsync");
	rt.Free = need(lib, "cudaFree");
	rt.FreeAsync = need(lib, "cudaFreeAsync");
	rt.StreamSynchronize = need(lib, "cudaStreamSynchronize");
	rt.MemGetInfo = need(lib, "cudaMemGetInfo");
	rt.MemPoolCreate = need(lib, "cudaMemPoolCreate");
	rt.DeviceGetDefaultMemPool = need(lib, "cudaDeviceGetDefaultMemPool");
	rt.GetErrorName = need(lib, "cudaGetErrorName");

	cudaMemPool_t pool = NULL;
	for (int i = 2; i < argc; i++) {
		char buf[256], *a[4] = {0};
		snprintf(buf, sizeof(buf), "%s", argv[i]);
		int n = 0;
		for (char *s = buf, *save = NULL, *t; n < 4 && (t = strtok_r(s, ":", &save)); s = NULL)
			a[n++] = t;
		const char *op = a[0] ? a[0] : "";
		void *p = NULL;
		cudaError_t rc;
		int async = 0;
		if (!strcmp(op, "count")) {
			int c = -1;
			check("cudaGetDeviceCount", rt.GetDeviceCount(&c), NULL);
			check_val("device count", (unsigned long long)c, a[1]);
			continue;
		} else if (!strcmp(op, "malloc")) {
			rc = rt.Malloc(&p, size_arg(a[1]));
		} else if (!strcmp(op, "managed")) {
			rc = rt.MallocManaged(&p, size_arg(a[1]), 1 /* cudaMemAttachGlobal */);
		} else if (!strcmp(op, "async")) {
			async = 1;
			rc = rt.MallocAsync(&p, size_arg(a[1]), NULL);
		} else if (!strcmp(op, "defpool") || !strcmp(op, "pool")) {
			cudaMemPool_t use = NULL;
			if (!strcmp(op, "defpool")) {
				check("cudaDeviceGetDefaultMemPool", rt.DeviceGetDefaultMemPool(&use, 0), NULL);
			} else {
				if (!pool) {
					struct rt_pool_props pp = {.allocType = 1, .location = {1, 0}};
					check("cudaMemPoolCreate", rt.MemPoolCreate(&pool, &pp), NULL);
				}
				use = pool;
			}
			async = 1;
			rc = rt.MallocFromPoolAsync(&p, size_arg(a[1]), use, NULL);
		} else if (!strcmp(op, "free")) {
			if (!nheld)
				fail("free: nothing held%s%lld", "", 0);
			nheld--;
			if (held[nheld].async) {
				check("cudaFreeAsync", rt.FreeAsync(held[nheld].p, NULL), NULL);
				check("cudaStreamSynchronize", rt.StreamSynchronize(NULL), NULL);
			} else {
				check("cudaFree", rt.Free(held[nheld].p), NULL);
			}
			continue;
		} else if (!strcmp(op, "info")) {
			size_t f = 0, t = 0;
			check("cudaMemGetInfo", rt.MemGetInfo(&f, &t), NULL);
			printf("info free=%zu total=%zu\n", f, t);
			check_val("cudaMemGetInfo free", f, a[1]);
			check_val("cudaMemGetInfo total", t, a[2]);
			continue;
		} else if (!strcmp(op, "driver")) {
			void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
			unsigned long long (*used)(int) = cu ? (unsigned long long (*)(int))dlsym(cu, "fakecudaDeviceUsed") : NULL;
			if (!used)
				fail("driver: the fake libcuda.so.1 is not loaded%s%lld", "", 0);
			printf("driver used=%llu\n", used(0));
			check_val("fake driver's used bytes", used(0), a[1]);
			continue;
		} else {
			fail("unknown operation '%s'%lld", op, 0);
		}
		check(op, rc, a[2]);
		if (rc == 0) {
			if (nheld == (int)(sizeof(held) / sizeof(held[0])))
				fail("too many allocations held%s%lld", "", 0);
			held[nheld].p = p;
			held[nheld++].async = async;
		}
	}
	printf("rtprog ok\n");
	return 0;
}
