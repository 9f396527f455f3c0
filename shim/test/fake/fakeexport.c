/*
 * What NVIDIA's own libcudart (11.8.89 and 12.4.127, as Debian ships them)
 * needs from a driver beyond the public API, so that the real runtime comes
 * up on the fake driver: the private tables it fetches with
 * cuGetExportTable(&table, &uuid) while initialising.
 *
 * Found by tracing both runtimes on this fake (FAKECUDA_TRACE, below: every
 * table request and every call into a slot), with the slot meanings taken
 * from the public reverse-engineering of these tables (ZLUDA's "dark API"
 * notes) and checked against the disassembly of the two runtimes. Neither
 * runtime calls more than this to run cudaMalloc, cudaMallocAsync,
 * cudaMallocManaged, memory pools and cudaMemGetInfo. A slot nobody has
 * seen called is a trap: it names the table and slot on stderr and aborts,
 * so a runtime that needs more fails loudly at the exact place.
 *
 * None of this is verified against a real driver (it cannot be: the real
 * driver is the thing being imitated); docs/validation.md records it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fakeexport.h"

#define EXPORT __attribute__((visibility("default")))

/* fakecuda.c's public entry points used here. */
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d);
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d);
CUresult cuCtxGetCurrent(CUcontext *c);

/* ---- trace ($FAKECUDA_TRACE=FILE) ---------------------------------------------- */

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...)
{
	const char *path = getenv("FAKECUDA_TRACE");
	if (!path)
		return;
	FILE *f = fopen(path, "a");
	if (!f)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fclose(f);
}

void fkx_trace_proc(int nargs, const char *sym, int ver, cuuint64_t flags, int result)
{
	/* The empty name (cudart 12 probes cuGetProcAddress_v2 with it) is written as "". */
	trace("proc%d %s %d %llu %d\n", nargs, sym && *sym ? sym : "\"\"", ver, (unsigned long long)flags, result);
}

/* ---- the tables ----------------------------------------------------------------- */

enum { T_CUDART, T_HOOKS, T_TLS, T_CLS, T_CTXCHECK, T_INTEGRITY, NTABLES };
#define MAXSLOTS 13

struct table {
	const char *name;
	unsigned char uuid[16]; /* as the bytes of the CUuuid the runtime passes */
	int nslots;
	int sized; /* slot 0 holds the table's size in bytes, not a function */
};

/* Slot counts are the ones the public notes give; the runtimes were not
 * seen to check them except the integrity table's (see integrity()). */
static const struct table tables[NTABLES] = {
	[T_CUDART] = {"cudart interface",
		      {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
		      13, 1},
	[T_HOOKS] = {"tools runtime callback hooks",
		     {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
		     7, 1},
	[T_TLS] = {"tools thread-local storage",
		   {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
		   4, 1},
	[T_CLS] = {"context-local storage",
		   {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
		   4, 0},
	[T_CTXCHECK] = {"context checks",
			{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
			4, 1},
	[T_INTEGRITY] = {"integrity check",
			 {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
			 3, 1},
};

/* What cuGetExportTable hands out: filled once, never changed after. */
static void *slots[NTABLES][MAXSLOTS];

__attribute__((noreturn)) static void trap(int t, int s)
{
	trace("trap %s %d\n", tables[t].name, s);
	fprintf(stderr, "fakecuda: the runtime called slot %d of the private table '%s', which the fake does not model\n",
		s, tables[t].name);
	abort();
}

#define TRAP(t, s) \
	static void trap_##t##_##s(void) { trap(t, s); }
#define TRAPS(t)                                                                                            \
	TRAP(t, 0) TRAP(t, 1) TRAP(t, 2) TRAP(t, 3) TRAP(t, 4) TRAP(t, 5) TRAP(t, 6) TRAP(t, 7) TRAP(t, 8) \
	TRAP(t, 9) TRAP(t, 10) TRAP(t, 11) TRAP(t, 12)
TRAPS(0) TRAPS(1) TRAPS(2) TRAPS(3) TRAPS(4) TRAPS(5)
#define TRAPROW(t)                                                                                         \
	{ trap_##t##_0, trap_##t##_1, trap_##t##_2, trap_##t##_3, trap_##t##_4, trap_##t##_5, trap_##t##_6, \
	  trap_##t##_7, trap_##t##_8, trap_##t##_9, trap_##t##_10, trap_##t##_11, trap_##t##_12 }
static void (*const traps[NTABLES][MAXSLOTS])(void) = {TRAPROW(0), TRAPROW(1), TRAPROW(2),
							  TRAPROW(3), TRAPROW(4), TRAPROW(5)};
_Static_assert(NTABLES == 6, "one TRAPS/TRAPROW line per table");

/* ---- cudart interface: the primary context, not retained ------------------------ */

/* Slot 2: the device's primary context without taking a reference (the
 * runtime retains it itself with cuDevicePrimaryCtxRetain before use). */
static CUresult rt_primary_ctx(CUcontext *ctx, CUdevice dev)
{
	trace("call %s 2 dev=%d\n", tables[T_CUDART].name, dev);
	if (!ctx)
		return CUDA_ERROR_INVALID_VALUE;
	void *c = fk_primary_ctx(dev);
	if (!c)
		return CUDA_ERROR_INVALID_DEVICE;
	*ctx = c;
	return CUDA_SUCCESS;
}

/* ---- tools callback hooks: two buffers the runtime records into ----------------- */

/* Slots 2 and 6 hand out a buffer and its length in 32-bit words. The
 * runtime compares the first length with 0x3ff to pick the newer integrity
 * protocol (below), so the length is not arbitrary. */
static uint32_t hook_buf1[1024], hook_buf2[14];

static void hooks_buf1(void **p, size_t *n)
{
	trace("call %s 2\n", tables[T_HOOKS].name);
	*p = hook_buf1;
	*n = sizeof(hook_buf1) / sizeof(hook_buf1[0]);
}

static void hooks_buf2(void **p, size_t *n)
{
	trace("call %s 6\n", tables[T_HOOKS].name);
	*p = hook_buf2;
	*n = sizeof(hook_buf2) / sizeof(hook_buf2[0]);
}

/* ---- context-local storage: (context, key) -> value ----------------------------- */

#define CLS_MAX 256
static struct {
	CUcontext ctx;
	void *key;
	void *val;
} cls[CLS_MAX];
static pthread_mutex_t cls_mu = PTHREAD_MUTEX_INITIALIZER;

/* A NULL context means the calling thread's current one. */
static CUcontext cls_ctx(CUcontext c)
{
	if (!c)
		cuCtxGetCurrent(&c);
	return c;
}

/* Slot 0. The destructor would run when the context goes; the runtime's
 * entries live as long as the process here, so it is not kept. */
static CUresult cls_put(CUcontext c, void *key, void *val, void (*dtor)(CUcontext, void *, void *))
{
	(void)dtor;
	c = cls_ctx(c);
	trace("call %s 0\n", tables[T_CLS].name);
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&cls_mu);
	int slot = -1;
	for (int i = 0; i < CLS_MAX; i++) {
		if (cls[i].key == key && cls[i].ctx == c) {
			slot = i;
			break;
		}
		if (slot < 0 && !cls[i].key)
			slot = i;
	}
	if (slot >= 0) {
		cls[slot].ctx = c;
		cls[slot].key = key;
		cls[slot].val = val;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&cls_mu);
	return rc;
}

/* Slot 1. */
static CUresult cls_delete(CUcontext c, void *key)
{
	c = cls_ctx(c);
	trace("call %s 1\n", tables[T_CLS].name);
	pthread_mutex_lock(&cls_mu);
	for (int i = 0; i < CLS_MAX; i++)
		if (cls[i].key == key && cls[i].ctx == c)
			cls[i].key = NULL;
	pthread_mutex_unlock(&cls_mu);
	return CUDA_SUCCESS;
}

/* Slot 2: CUDA_ERROR_INVALID_HANDLE when nothing is stored, which is how
 * the runtime learns that a context is new to it. */
static CUresult cls_get(void **val, CUcontext c, void *key)
{
	c = cls_ctx(c);
	trace("call %s 2\n", tables[T_CLS].name);
	CUresult rc = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&cls_mu);
	for (int i = 0; i < CLS_MAX; i++)
		if (cls[i].key == key && cls[i].ctx == c) {
			*val = cls[i].val;
			rc = CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&cls_mu);
	return rc;
}

/* ---- context checks (12.x): nothing to report ------------------------------------ */

static CUresult ctx_check(CUcontext c, uint32_t *flags, void **extra)
{
	(void)c, (void)extra;
	trace("call %s 2\n", tables[T_CTXCHECK].name);
	if (flags)
		*flags = 0;
	return CUDA_SUCCESS;
}

static uint32_t ctx_check3(void)
{
	trace("call %s 3\n", tables[T_CTXCHECK].name);
	return 0;
}

/* ---- integrity check ------------------------------------------------------------- */

/*
 * The runtime calls slot 1 as (version, unix seconds, uint64_t out[2]) three
 * times, with version = its own CUDA version + 0, 1 and 2 (11.8: 11080,
 * 11081, 11082), and compares the answers with what it computes itself:
 *  - ...0: a fixed value;
 *  - ...1: the same value with its top byte replaced by the low byte of the
 *    integrity table's size slot (so the table must be 3 slots, 24 bytes);
 *  - ...2: HMAC-MD2 (RFC 2104 over RFC 1319, block and digest 16 bytes) under
 *    a fixed key of a 48-byte record {driver version, version, pid, low 32
 *    bits of pthread_self(), the cudart-interface table, the integrity table,
 *    the integrity function, unix seconds} followed by one 28-byte record
 *    per device {UUID, PCI domain, bus, device}.
 * The constants come from the public notes; the record layout was checked
 * against the 11.8 runtime's disassembly and both runtimes accept the result.
 */
static const uint64_t integrity_fixed[2] = {0x3341181c03cb675cull, 0x8ed383aa1f4cd1e8ull};
static const uint8_t integrity_key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
					  0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

/* MD2's substitution table: the digits of pi (RFC 1319). */
static const uint8_t md2_pi[256] = {
	41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
	115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
	138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
	121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
	53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
	170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
	100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
	97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
	44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
	171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
	59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
	80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20,
};

struct md2 {
	uint8_t x[48], sum[16], block[16];
	unsigned n;
};

static void md2_put(struct md2 *m, uint8_t byte)
{
	m->block[m->n++] = byte;
	if (m->n < 16)
		return;
	m->n = 0;
	uint8_t l = m->sum[15];
	for (int j = 0; j < 16; j++) {
		m->x[16 + j] = m->block[j];
		m->x[32 + j] = m->block[j] ^ m->x[j];
		l = m->sum[j] ^= md2_pi[m->block[j] ^ l];
	}
	uint8_t t = 0;
	for (int round = 0; round < 18; round++) {
		for (int k = 0; k < 48; k++)
			t = m->x[k] ^= md2_pi[t];
		t = (uint8_t)(t + round);
	}
}

static void md2_write(struct md2 *m, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		md2_put(m, ((const uint8_t *)p)[i]);
}

static void md2_end(struct md2 *m, uint8_t out[16])
{
	uint8_t pad = (uint8_t)(16 - m->n), sum[16];
	for (int i = 0; i < pad; i++)
		md2_put(m, pad);
	memcpy(sum, m->sum, sizeof(sum));
	md2_write(m, sum, sizeof(sum));
	memcpy(out, m->x, 16);
}

struct integrity_record {
	uint32_t driver_version, version, pid, thread;
	const void *cudart_table, *integrity_table, *integrity_fn;
	uint64_t unix_seconds;
};
_Static_assert(sizeof(struct integrity_record) == 48, "integrity record");

struct integrity_device {
	CUuuid uuid;
	int32_t pci_domain, pci_bus, pci_device; /* order unverified: all 0 on the fake */
};
_Static_assert(sizeof(struct integrity_device) == 28, "integrity device record");

static CUresult integrity(uint32_t version, uint64_t unix_seconds, uint64_t out[2]);

static void integrity_hmac(uint32_t version, uint64_t unix_seconds, uint64_t out[2])
{
	int drv = 0, n = 0;
	cuDriverGetVersion(&drv);
	struct integrity_record r = {
		.driver_version = (uint32_t)drv,
		.version = version,
		.pid = (uint32_t)getpid(),
		.thread = (uint32_t)pthread_self(),
		.cudart_table = slots[T_CUDART],
		.integrity_table = slots[T_INTEGRITY],
		.integrity_fn = (const void *)integrity,
		.unix_seconds = unix_seconds,
	};
	struct md2 m = {0};
	for (int i = 0; i < 16; i++)
		md2_put(&m, integrity_key[i] ^ 0x36);
	md2_write(&m, &r, sizeof(r));
	cuDeviceGetCount(&n);
	for (int d = 0; d < n; d++) {
		struct integrity_device dev = {0};
		cuDeviceGetUuid(&dev.uuid, d);
		cuDeviceGetAttribute(&dev.pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
		cuDeviceGetAttribute(&dev.pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
		cuDeviceGetAttribute(&dev.pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
		md2_write(&m, &dev, sizeof(dev));
	}
	uint8_t inner[16], digest[16];
	md2_end(&m, inner);
	m = (struct md2){0};
	for (int i = 0; i < 16; i++)
		md2_put(&m, integrity_key[i] ^ 0x5c);
	md2_write(&m, inner, sizeof(inner));
	md2_end(&m, digest);
	memcpy(out, digest, sizeof(digest));
}

static CUresult integrity(uint32_t version, uint64_t unix_seconds, uint64_t out[2])
{
	trace("call %s 1 version=%u\n", tables[T_INTEGRITY].name, version);
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	switch (version % 10) {
	case 0:
		memcpy(out, integrity_fixed, sizeof(integrity_fixed));
		break;
	case 1:
		out[0] = (integrity_fixed[0] & 0x00ffffffffffffffull) |
			 (uint64_t)((uintptr_t)slots[T_INTEGRITY][0] & 0xff) << 56;
		out[1] = integrity_fixed[1];
		break;
	default:
		integrity_hmac(version, unix_seconds, out);
	}
	return CUDA_SUCCESS;
}

/* ---- cuGetExportTable ------------------------------------------------------------ */

static void fill(void)
{
	slots[T_CUDART][2] = (void *)rt_primary_ctx;
	slots[T_HOOKS][2] = (void *)hooks_buf1;
	slots[T_HOOKS][6] = (void *)hooks_buf2;
	slots[T_CLS][0] = (void *)cls_put;
	slots[T_CLS][1] = (void *)cls_delete;
	slots[T_CLS][2] = (void *)cls_get;
	slots[T_CTXCHECK][2] = (void *)ctx_check;
	slots[T_CTXCHECK][3] = (void *)ctx_check3;
	slots[T_INTEGRITY][1] = (void *)integrity;
	for (int t = 0; t < NTABLES; t++) {
		if (tables[t].sized)
			slots[t][0] = (void *)(uintptr_t)(tables[t].nslots * sizeof(void *));
		for (int s = tables[t].sized; s < tables[t].nslots; s++)
			if (!slots[t][s])
				slots[t][s] = (void *)traps[t][s];
	}
}

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	if (!table || !id)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&once, fill);
	char hex[33];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->bytes[i]);
	for (int t = 0; t < NTABLES; t++)
		if (!memcmp(tables[t].uuid, id->bytes, 16)) {
			trace("export %s %s\n", hex, tables[t].name);
			*table = slots[t];
			return CUDA_SUCCESS;
		}
	trace("export %s unknown\n", hex);
	return CUDA_ERROR_INVALID_VALUE;
}

/* Entry points fakecuda.c's cuGetProcAddress table lacks. */
static const struct {
	const char *name;
	int ver;
	void *fn;
} extra[] = {
	{"cuGetExportTable", 3000, (void *)cuGetExportTable},
};

int fkx_lookup(const char *sym, int ver, void **pfn, int known)
{
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		if (!strcmp(extra[i].name, sym)) {
			if (extra[i].ver > ver)
				break;
			*pfn = extra[i].fn;
			return 0;
		}
	*pfn = NULL;
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
		known |= !strcmp(extra[i].name, sym);
	return known ? 2 : 1;
}
