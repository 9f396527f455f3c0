/*
 * Lazy initialisation (first hooked call, via pthread_once; never in a
 * constructor) and the mapping from CUDA devices and NVML handles to entries
 * of the limits file. Devices are matched by UUID, never by index: the
 * container's CUDA ordinals need not match the host's.
 */
#include "glibc_compat.h"

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "core.h"
#include "ledger.h"
#include "lifecycle.h"
#include "limits.h"
#include "log.h"
#include "real.h"
#include "region.h"

struct vgpu_state vgpu;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* An override from the environment counts only when the fixed path is absent:
 * a container must not be able to point the shim at a file of its own. */
static const char *pick_path(const char *fixed, const char *env)
{
	if (access(fixed, F_OK) == 0 || errno != ENOENT)
		return fixed;
	const char *e = getenv(env);
	return e && *e ? e : fixed;
}

/* Whether the preload file names path as one of its entries (whitespace-
 * or colon-separated, as the loader reads it). */
static int preload_names(const char *file, const char *path)
{
	char buf[4096];
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	size_t len = strlen(path);
	for (char *p = buf; (p = strstr(p, path)) != NULL; p += len) {
		int starts = p == buf || strchr(" \t\n:", p[-1]);
		int ends = !p[len] || strchr(" \t\n:", p[len]);
		if (starts && ends)
			return 1;
	}
	return 0;
}

/*
 * Whether this process runs in a vGPU container: the shim was loaded from its
 * container path (Contract 3). Either sign is enough, and both are asked:
 *  - the path the loader loaded us from (dladdr of our own symbol): what
 *    /etc/ld.so.preload makes it, and nothing the tenant can change in a
 *    process that already has us;
 *  - /etc/ld.so.preload naming the container path: a tenant who preloads the
 *    same file first under another path (LD_PRELOAD comes before the preload
 *    file, and the loader then takes the preload file's entry for the object
 *    it already has) changes the first, not this read-only mount.
 * A tenant who defeats both (renames /etc and /usr/local/nri-vgpu away) has
 * no shim preloaded in new processes at all, a gap of the preload itself.
 * Not asked: the environment, which the tenant sets.
 */
static int in_container(void)
{
	Dl_info info;
	if (dladdr((void *)&in_container, &info) && info.dli_fname && !strcmp(info.dli_fname, VGPU_SHIM_PATH))
		return 1;
	return preload_names(VGPU_PRELOAD_FILE, VGPU_SHIM_PATH);
}

/* Returns the bytes read, -1 when the file does not exist, -2 on any other
 * error. On success *fdp is the open descriptor (the ledger keeps it). */
static ssize_t read_small(const char *path, char *buf, size_t cap, int *err, int *fdp)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		*err = errno;
		return errno == ENOENT ? -1 : -2;
	}
	size_t n = 0;
	while (n < cap) {
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			*err = errno;
			close(fd);
			return -2;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*fdp = fd;
	return (ssize_t)n;
}

static pthread_mutex_t nvml_mu = PTHREAD_MUTEX_INITIALIZER;

static void after_fork(void)
{
	/* Single-threaded here: a parent thread may have held the NVML cache lock. */
	pthread_mutex_init(&nvml_mu, NULL);
}
VGPU_LIFECYCLE(core, .order = VGPU_ORDER_CORE, .after_fork = after_fork);

/* Set once in the process that first initialises and inherited by its fork
 * children, so a re-run of init_once in a child registers nothing twice. */
static int atfork_registered;

#ifdef VGPU_TEST_HOOKS
/* Test builds only (build/testhooks): the initialisation waits here until the
 * file NRI_VGPU_TEST_INIT_HOLD names exists, so that a test can fork while a
 * thread is inside it (nothing in it waits for anything otherwise). */
static void test_hold(void)
{
	const char *f = getenv("NRI_VGPU_TEST_INIT_HOLD");
	struct timespec ts = {0, 1000000};
	while (f && access(f, F_OK) != 0)
		nanosleep(&ts, NULL);
}
#else
static void test_hold(void)
{
}
#endif

/*
 * Fork during initialisation: glibc's pthread_once stores the fork
 * generation with its in-progress mark, so a child forked while another
 * thread was in here does not wait for that thread (which it does not have)
 * but runs init_once again itself. init_once is therefore written to be
 * re-run over a half-done initialisation: the fork handler is registered
 * first (a child forked at any later point gets its locks and slot reset),
 * and every field it sets is reset before it is set again.
 */
static void init_once(void)
{
	if (!atfork_registered) {
		/* Every mode: pass-through processes use the tracker's lock too. */
		pthread_atfork(NULL, NULL, vgpu_lifecycle_after_fork);
		atfork_registered = 1;
	}
	vgpu.mode = VGPU_PASSTHROUGH;
	vgpu.throttled = 0;

	/* In a vGPU container the fixed paths only, and their absence is not
	 * "no limits": the tenant can rename the directory runc made to hold
	 * the mounts (/run/nri-vgpu) and make an empty one in its place. */
	int container = in_container();
	const char *lpath = container ? VGPU_LIMITS_PATH : pick_path(VGPU_LIMITS_PATH, "NRI_VGPU_LIMITS");
	const char *rdir = container ? VGPU_REGION_DIR : pick_path(VGPU_REGION_DIR, "NRI_VGPU_REGION_DIR");
	char buf[VGPU_LIMITS_MAX_SIZE + 1], why[256];
	int err = 0, lfd = -1;
	struct stat st;

	ssize_t n = read_small(lpath, buf, sizeof(buf), &err, &lfd);
	if (n == -1 && !container) {
		vgpu.mode = VGPU_PASSTHROUGH; /* not a vGPU container: stay out of the way */
		return;
	}
	if (n == -1) {
		vgpu.mode = VGPU_FAIL_CLOSED;
		LOGE("limits file %s is missing, but the shim was loaded from %s (a vGPU container); every GPU "
		     "context and memory allocation will fail", lpath, VGPU_SHIM_PATH);
		return;
	}
	if (n == -2) {
		snprintf(why, sizeof(why), "cannot read it: %s", strerror(err));
	} else if (container && (syscall(SYS_stat, rdir, &st) != 0 || !S_ISDIR(st.st_mode))) {
		/* stat through syscall(2): glibc >= 2.33 exports stat@GLIBC_2.33. */
		close(lfd);
		vgpu.mode = VGPU_FAIL_CLOSED;
		LOGE("usage region directory %s is missing, but the shim was loaded from %s (a vGPU container); "
		     "every GPU context and memory allocation will fail", rdir, VGPU_SHIM_PATH);
		return;
	} else if (vgpu_limits_parse(buf, (size_t)n, &vgpu.limits, why, sizeof(why)) == 0) {
		vgpu.mode = VGPU_ENFORCE;
		vgpu_log_level = vgpu.limits.log_level;
		for (int i = 0; i < vgpu.limits.ngpu; i++)
			if (vgpu.limits.gpu[i].cores < 100)
				vgpu.throttled = 1;
		/* The read-only limits file also carries the ledger (ledger.c), or
		 * names the directory of its shards: the same override terms as
		 * the limits file's, and no ledger without the directory. */
		const char *ldir = NULL;
		if (vgpu.limits.shards) {
			struct stat lst;
			ldir = container ? VGPU_LEDGER_DIR : pick_path(VGPU_LEDGER_DIR, "NRI_VGPU_LEDGER_DIR");
			if (syscall(SYS_stat, ldir, &st) != 0 || !S_ISDIR(st.st_mode) ||
			    syscall(SYS_fstat, lfd, &lst) != 0 || st.st_dev != lst.st_dev) {
				close(lfd);
				vgpu.mode = VGPU_FAIL_CLOSED;
				LOGE("limits file %s names %d ledger shards, but %s is not a directory on its file system; "
				     "every GPU context and memory allocation will fail",
				     lpath, vgpu.limits.shards, ldir);
				return;
			}
		}
		vgpu_ledger_init(lfd, lpath, ldir, vgpu.limits.shards);
		test_hold();
		vgpu_region_open(rdir, &vgpu.limits); /* says itself when it cannot: quotas do not depend on it */
		LOGD("limits from %s: %d GPU(s)", lpath, vgpu.limits.ngpu);
		return;
	}
	if (lfd >= 0)
		close(lfd);
	/* Fail closed: a broken limits file must not mean "unlimited". */
	vgpu.mode = VGPU_FAIL_CLOSED;
	LOGE("invalid limits file %s: %s; every GPU context and memory allocation will fail", lpath, why);
}

int vgpu_ready;

static void init_then_ready(void)
{
	init_once();
	__atomic_store_n(&vgpu_ready, 1, __ATOMIC_RELEASE);
}

void vgpu_init_slow(void)
{
	pthread_once(&once, init_then_ready);
}

void vgpu_format_uuid(const CUuuid *u, char out[VGPU_UUID_LEN])
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	snprintf(out, VGPU_UUID_LEN,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
		 b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int index_of_uuid(const char *uuid)
{
	for (int i = 0; i < vgpu.limits.ngpu; i++)
		if (strcasecmp(vgpu.limits.gpu[i].uuid, uuid) == 0)
			return i;
	return -1;
}

#define CU_CACHE 64
/* limits index + 2 per CUDA ordinal; 0 = not looked up yet. */
static signed char cu_cache[CU_CACHE];

int vgpu_device_index(CUdevice dev)
{
	if (dev >= 0 && dev < CU_CACHE) {
		int c = __atomic_load_n(&cu_cache[dev], __ATOMIC_RELAXED);
		if (likely(c))
			return c - 2;
	}
	CUuuid u;
	if (vgpu_cu_device_uuid(dev, &u) != CUDA_SUCCESS)
		return -1;
	char s[VGPU_UUID_LEN];
	vgpu_format_uuid(&u, s);
	int idx = index_of_uuid(s);
	if (idx < 0)
		LOGI("CUDA device %d (%s) is not in the limits file", dev, s);
	if (dev >= 0 && dev < CU_CACHE)
		__atomic_store_n(&cu_cache[dev], (signed char)(idx + 2), __ATOMIC_RELAXED);
	return idx;
}

int vgpu_current_index(CUdevice *dev_out)
{
	CUdevice dev;
	if (vgpu_cu_ctx_get_device(&dev) != CUDA_SUCCESS)
		return -2;
	if (dev_out)
		*dev_out = dev;
	return vgpu_device_index(dev);
}

#define NVML_CACHE 32
static struct {
	nvmlDevice_t handle;
	int idx;
} nvml_cache[NVML_CACHE];
static int nvml_cached;

int vgpu_nvml_index(nvmlDevice_t dev)
{
	int idx = -1, found = 0;
	pthread_mutex_lock(&nvml_mu);
	for (int i = 0; i < nvml_cached; i++)
		if (nvml_cache[i].handle == dev) {
			idx = nvml_cache[i].idx;
			found = 1;
		}
	pthread_mutex_unlock(&nvml_mu);
	if (found)
		return idx;
	char s[VGPU_UUID_LEN];
	if (vgpu_nvml_device_uuid(dev, s, sizeof(s)) != NVML_SUCCESS)
		return -1;
	idx = index_of_uuid(s);
	pthread_mutex_lock(&nvml_mu);
	if (nvml_cached < NVML_CACHE) {
		nvml_cache[nvml_cached].handle = dev;
		nvml_cache[nvml_cached].idx = idx;
		nvml_cached++;
	}
	pthread_mutex_unlock(&nvml_mu);
	return idx;
}
