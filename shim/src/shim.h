/* Internal interfaces of libvgpu-shim.so. Nothing here is exported. */
#ifndef VGPU_SHIM_H
#define VGPU_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../include/cuda_abi.h"
#include "../include/region.h"
#include "limits.h"
#include "protos.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* a + b, UINT64_MAX where that overflows. */
static inline uint64_t vgpu_sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

/* CLOCK_MONOTONIC_COARSE in ns: a vDSO read, cheap enough for the allocation path. */
static inline int64_t vgpu_coarse_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* ---- real.c: the libraries we wrap, opened lazily -------------------------- */

enum vgpu_lib { LIB_CUDA = 0, LIB_NVML = 1 };

enum vgpu_hook_id {
#define HOOK(lib, name, base, ver, ptsz) HOOK_##name,
#include "hooks.def"
#undef HOOK
	HOOK_COUNT
};

struct vgpu_hook {
	const char *name;
	const char *base;
	int lib;
	int version;
	int ptsz;
};
extern const struct vgpu_hook vgpu_hooks[HOOK_COUNT];
/* Our exported wrapper for each hook (wrappers.c). */
extern void *const vgpu_wrappers[HOOK_COUNT];

/* glibc's dlsym (the GLIBC_2.2.5 one, or the next interposer's). */
void *vgpu_real_dlsym(void *handle, const char *name);
/* The dlsym to forward to, for a tail call that keeps the caller's return address. */
void *(*vgpu_real_dlsym_fn(void))(void *, const char *);
#define vgpu_real_dlsym_tail(h, n) (vgpu_real_dlsym_fn()((h), (n)))
/* The real library's own definition of a hooked name (not a stacked interposer's). */
void *vgpu_lib_sym(int id);
/* Handle of the real library, opened on first use; NULL if it cannot be. */
void *vgpu_lib_handle(int lib);
/* The function a wrapper forwards to: the library's own definition. */
void *vgpu_next(int id);
/* Hook id of an exported name, or -1. */
int vgpu_hook_find(const char *name);
/* Whether addr lies in the real libcuda/libnvidia-ml (driver-internal calls). */
int vgpu_addr_in_driver(const void *addr);
/* Whether addr lies in this library. */
int vgpu_addr_in_self(const void *addr);

/* Forwarding helper: typed pointer to the next implementation of a hook. */
/* Inline: a launch at cores = 100 costs only this and a flag test. */
extern void *vgpu_next_fn[HOOK_COUNT];
static inline void *vgpu_next_fast(int id)
{
	void *p = __atomic_load_n(&vgpu_next_fn[id], __ATOMIC_ACQUIRE);
	return likely(p) ? p : vgpu_next(id);
}
#define NEXT(name) ((__typeof__(&name))vgpu_next_fast(HOOK_##name))

/* Plain (non-hooked) driver calls the shim makes for itself. */
CUresult vgpu_cu_ctx_get_device(CUdevice *dev);
CUresult vgpu_cu_device_uuid(CUdevice dev, CUuuid *uuid);
CUresult vgpu_cu_device_attr(int *value, int attr, CUdevice dev);
CUresult vgpu_cu_ctx_get_current(CUcontext *ctx);
CUresult vgpu_cu_ctx_set_current(CUcontext ctx);
/* cuCtxFromGreenCtx; CUDA_ERROR_NOT_FOUND when the driver lacks it. */
CUresult vgpu_cu_ctx_from_green(CUcontext *ctx, CUgreenCtx g);
/* The context a (non-special) stream belongs to; CUDA_ERROR_NOT_FOUND when
 * the driver lacks cuStreamGetCtx. */
CUresult vgpu_cu_stream_get_ctx(CUstream s, CUcontext *ctx);
/* The device of any context, current or not. */
CUresult vgpu_cu_ctx_device(CUcontext ctx, CUdevice *dev);
/* The UUID of a handle the program got from the NVML it loaded (the reporting hooks). */
nvmlReturn_t vgpu_nvml_device_uuid(nvmlDevice_t dev, char *buf, unsigned len);
/* The rest are the shim's own NVML reads, from the libnvidia-ml.so.1 beside the
 * driver's libcuda.so.1 only (never the loader's search, which the tenant steers). */
/* Whether that NVML is there and nvmlInit_v2 succeeded (tried once per process;
 * when not, says once at warn what the shim does instead). */
int vgpu_nvml_usable(void);
/* NVML has no handle for a GPU of the limits file: says so once, as above. */
void vgpu_nvml_unknown_gpu(const char *uuid);
/* What a new context is charged as its own memory when NVML cannot measure it
 * (footprint.c says why this much). */
#define VGPU_FP_BOUND (1024ull << 20)
nvmlReturn_t vgpu_nvml_handle_by_uuid(const char *uuid, nvmlDevice_t *dev);
nvmlReturn_t vgpu_nvml_process_utilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
					   unsigned *count, unsigned long long since);
nvmlReturn_t vgpu_nvml_compute_procs(nvmlDevice_t dev, unsigned *count, nvmlProcessInfo_v1_t *out);
nvmlReturn_t vgpu_nvml_init(void);

/* ---- log.c ------------------------------------------------------------------ */

extern int vgpu_log_level;
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOGE(...) vgpu_log(VGPU_LOG_ERROR, __VA_ARGS__)
#define LOGW(...) vgpu_log(VGPU_LOG_WARN, __VA_ARGS__)
#define LOGI(...) vgpu_log(VGPU_LOG_INFO, __VA_ARGS__)
#define LOGD(...) vgpu_log(VGPU_LOG_DEBUG, __VA_ARGS__)

/* ---- core.c: lazy initialisation and the device table ----------------------------- */

enum vgpu_mode {
	VGPU_PASSTHROUGH = 0, /* no limits file: the shim only forwards */
	VGPU_ENFORCE = 1,
	VGPU_FAIL_CLOSED = 2, /* limits file unreadable or invalid: refuse GPU memory */
};

struct vgpu_state {
	int mode;
	struct vgpu_limits limits;
	int throttled;              /* some GPU has cores < 100 */
};
extern struct vgpu_state vgpu;

/* Initialises once (pthread_once); cheap after the first call. */
void vgpu_init_slow(void);
extern int vgpu_ready; /* set once the initialisation is done */
static inline void vgpu_init(void)
{
	if (likely(__atomic_load_n(&vgpu_ready, __ATOMIC_ACQUIRE)))
		return;
	vgpu_init_slow();
}
/* Limits index of the current context's device: >= 0, or -1 (no limits
 * entry for it: refused unless pass-through), or -2 (no current context). */
int vgpu_current_index(CUdevice *dev_out);
/* Limits index and ordinal of the device stream s belongs to (pool.c). */
int vgpu_stream_index(CUstream s, CUdevice *dev);
/* Limits index of a CUDA device ordinal; -1 when the device is not listed. */
int vgpu_device_index(CUdevice dev);
/* Limits index of an NVML handle; -1 when not listed. */
int vgpu_nvml_index(nvmlDevice_t dev);
/* Formats a CUuuid the way NVML prints it ("GPU-xxxxxxxx-xxxx-..."). */
void vgpu_format_uuid(const CUuuid *u, char out[VGPU_UUID_LEN]);

/* ---- quota.c: this process's share of the container's memory quota ------------------ */

/* Reserves bytes on limits index idx for this process: 0, VGPU_OVER_QUOTA, or
 * VGPU_UNRECORDED (the ledger cannot take it; logged once by the callee). */
#define VGPU_OVER_QUOTA (-1)
#define VGPU_UNRECORDED (-2)
int vgpu_quota_reserve(int idx, uint64_t bytes);
/* Counts bytes even past the limit (memory the driver already handed out): 0, or
 * VGPU_UNRECORDED when the ledger could not record it (counted by this process only). */
int vgpu_quota_reserve_force(int idx, uint64_t bytes);
/* Gives back bytes reserved earlier (saturating). */
void vgpu_quota_release(int idx, uint64_t bytes);
/* Bytes the whole container holds on idx (this process's own count plus what
 * the ledger shows the others hold); the limit when that cannot be measured. */
uint64_t vgpu_quota_used(int idx);
/* used as above, and committed: this process's own count plus the others'
 * leases, what this process cannot have. 0, or -1 (both the limit) when the
 * ledger cannot be measured. */
int vgpu_quota_usage(int idx, uint64_t *used, uint64_t *committed);
/* Bytes this process holds on idx, by its own count: its counted allocations plus its
 * counted context footprint (footprint.c subtracts the latter), nothing leased ahead. */
uint64_t vgpu_quota_held(int idx);
/* What this process leases on idx (held, and reserved ahead). */
uint64_t vgpu_quota_leased(int idx);
/* Publishes bytes in the ledger as what this process holds on idx (logged
 * when it cannot). Caller holds the process's mutex. */
void vgpu_quota_publish_held(int idx, uint64_t bytes);
/* Starts the keeper thread, or wakes it: it gives unused lease back and
 * writes the reports the region was too busy for. Caller holds the process's mutex. */
void vgpu_quota_keeper_start(void);

/* ---- region.c: the usage region, the container's report for the host ------------------ */

/* Opens (or makes) the region file in dir: 0, or -1 when there is no usable
 * one (said on stderr; quotas hold all the same). */
int vgpu_region_open(const char *dir, const struct vgpu_limits *l);
/* Reports what this process holds on idx (quota.c) in its slot and the
 * device's total: now if the region's lock is free, else by the keeper. */
void vgpu_region_report(int idx);
/* Whether the region shows less than this process knows: a held count or
 * the host pid not written yet. */
int vgpu_region_behind(void);
/* Writes what vgpu_region_behind finds missing, waiting for the region's
 * lock at most wait_ns (the keeper). */
void vgpu_region_catch_up(int64_t wait_ns);
/* Counts one kernel launch (a relaxed atomic add on a private counter; the
 * region gets the counts with the next update, or vgpu_region_flush). */
void vgpu_count_launch(int idx);
/* Counts ns during which launches of this process on idx waited on the SM
 * limiter (a relaxed atomic add on a private counter, like the launches; the
 * region's throttled_ns gets it with vgpu_region_flush, or at exit). */
void vgpu_count_throttled(int idx, uint64_t ns);
/* Writes this process's launch counts into the region, and adds the
 * throttled time counted since the last flush, unless another process or
 * thread holds its lock (the limiter's watcher: never waits; what is not
 * written waits for the next flush). */
void vgpu_region_flush(void);
/* Reads /proc/<pid>/stat field 22; 0 when the process is gone. */
uint64_t vgpu_proc_start_time(int pid);
/* Our pid as /proc numbers it when /proc is an ancestor pid namespace's, else 0 (region.c). */
int32_t vgpu_outer_pid(void);
/* Records hp as this process's host pid: its claim in the ledger at once, its
 * slot when the region's lock can be had within a tenth of a second. */
void vgpu_region_set_host_pid(int32_t hp);

/* ---- ledger.c: what each process holds, where the tenant cannot write --------------- */

/* fd moved to a high number (closed; the new one returned), or fd itself when
 * it cannot be: a program that closes or reuses the low descriptors it did
 * not open is then unlikely to meet ours. */
int vgpu_high_fd(int fd);

/* Takes over limits_fd (the limits file, open for reading; path to reopen it). */
void vgpu_ledger_init(int limits_fd, const char *limits_path);
/* Takes lease on limits index idx (what this process holds or may allocate
 * without asking again) from the container's pool: at least least bytes and
 * up to want, as much as the pool has where it looks, in *got. 0, or -1 with
 * errno and nothing taken (EDQUOT: the pool has no room for least; *short_by:
 * how much more the others would have to give back). force: memory the
 * driver already handed out, taken past the limit where it must be. */
int vgpu_ledger_grow(int idx, uint64_t least, uint64_t want, int force, uint64_t *got, uint64_t *short_by);
/* Gives back bytes of this process's lease on idx (at most what it holds): its debt first. */
void vgpu_ledger_shrink(int idx, uint64_t bytes);
/* This process's debt on idx: bytes counted by force that neither the pool nor the
 * overflow had room for (locks forged over both), published apart and counted by
 * every grant of the container until placed. */
uint64_t vgpu_ledger_owed(int idx);
/* Places what this process owes on idx where the pool or the overflow has room now. */
void vgpu_ledger_settle(int idx);
/* Publishes bytes as what this process holds on idx (a report, never more
 * than its lease): 0, or -1 with errno. */
int vgpu_ledger_publish_held(int idx, uint64_t bytes);
/* Reopens the limits file and publishes everything again if the program
 * closed the descriptor: 0, or -1 with errno. */
int vgpu_ledger_check(void);
/* Whether the descriptor still reaches the limits file (for readers, without
 * the process's mutex): 1 or 0. */
int vgpu_ledger_readable(void);
/* The process's mutex: every change to the ledger, the leases (quota.c) and
 * the region's state (region.c) is made under it. trylock: 0 when taken. */
void vgpu_ledger_lock(void);
void vgpu_ledger_unlock(void);
int vgpu_ledger_trylock(void);
/* Before reading the ledger without the process's mutex (reports, the SM
 * limiter, quota checks outside a grant): a descriptor the program closed,
 * perhaps reusing its number for a file whose locks would read as nobody's,
 * is opened again and everything published again, under the mutex like
 * every change to the ledger. 0, or -1 with errno. */
int vgpu_ledger_reader(void);

/* The union of the container's other processes' leases on idx: 0, or -1 with errno. */
int vgpu_ledger_others(int idx, uint64_t *bytes);
/* What the other processes say they hold on idx (the report). */
int vgpu_ledger_others_held(int idx, uint64_t *bytes);
/* Publishes this process's host pid (0 withdraws it): 0, or -1 with errno. */
int vgpu_ledger_claim_host_pid(int32_t hp);
/* What our locks publish now: held bytes on limits index d; the host pid claimed (0: none). */
uint64_t vgpu_ledger_held(int d);
int32_t vgpu_ledger_claimed(void);
/* Calls fn for each (pid, bytes held) another process publishes on idx, under its pid
 * here; a process this pid namespace cannot see is not named (its bytes are still
 * in vgpu_ledger_others_held). */
int vgpu_ledger_scan_held(int idx, void (*fn)(int32_t pid, int idx, uint64_t bytes, void *arg), void *arg);
/* Calls fn for each (pid, host pid) claim that the owner of the slot it lies in holds itself,
 * under that owner's pid here (this process's included; other pid namespaces' are not named). */
int vgpu_ledger_scan_claims(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg);
/* The host pids the container's other processes claim. */
#define VGPU_HP_RANGES 1024
struct vgpu_hp_set {
	int n, all;
	struct {
		uint32_t lo, hi;
	} r[VGPU_HP_RANGES];
};
/* Every host pid the container's processes claim into set; of those claimed by
 * processes this pid namespace cannot name (the container's processes in
 * another one, whose NVML samples the driver may not show here), the host
 * pids into hidden and the SM use they publish on GPU d, summed, in *util
 * (percent). 0, or -1 with errno. */
int vgpu_ledger_host_pids(int d, struct vgpu_hp_set *set, struct vgpu_hp_set *hidden, unsigned *util);
/* Publishes percent as the SM use this process last measured for itself on
 * GPU idx (0..100; the SM limiter's watcher), taking the process's mutex
 * (logged when it cannot). */
void vgpu_ledger_publish_util(int idx, unsigned percent);
/* Both in one scan: fn as vgpu_ledger_scan_claims, every claimed host pid into set. */
int vgpu_ledger_scan_claims_all(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg, struct vgpu_hp_set *set);
int vgpu_hp_set_has(const struct vgpu_hp_set *set, unsigned pid);

/* ---- hostpid.c: this process's pid as NVML reports it ----------------------------- */

/* What discovery carries across a context creation (vgpu_hostpid_before/after). */
struct vgpu_hostpid_scan {
	int active; /* 1: before[] was taken (no lock is held across the creation) */
	CUdevice dev;
	nvmlDevice_t nvml;
	nvmlProcessInfo_v1_t *before;
	unsigned nbefore;
};

/* This process's host pid; 0 = unknown. */
int32_t vgpu_host_pid(void);
/* Called before creating a context on dev. When this is the process's first
 * context there and its host pid is not known yet, takes NVML's process list
 * and returns 1; vgpu_hostpid_after must follow. Holds no lock in between. */
int vgpu_hostpid_before(CUdevice dev, struct vgpu_hostpid_scan *s);
/* Called after: ctx is the new context, or NULL when creation failed. */
void vgpu_hostpid_after(struct vgpu_hostpid_scan *s, CUcontext ctx);
/* NVML's compute processes on dev in a malloc'ed array sized from NVML's own
 * count (NVML_ERROR_INSUFFICIENT_SIZE): 0, or -1 on an error. */
int vgpu_nvml_list_procs(nvmlDevice_t dev, nvmlProcessInfo_v1_t **out, unsigned *n);
/* The same; for the first measure of a context just created (created), the
 * list host-pid discovery took right after its creation, when it took one. */
int vgpu_nvml_list_procs_at(nvmlDevice_t dev, CUcontext created, nvmlProcessInfo_v1_t **out, unsigned *n);

/* ---- mem.c: allocation bookkeeping ----------------------------------------------- */

/* The context that owns memory allocated while ctx is current: for the
 * CUcontext of a green context its device's primary context, else ctx. */
CUcontext vgpu_ctx_owner(CUcontext ctx);

/* ---- footprint.c: the driver's own memory for this process (context footprint) ---- */

/* A context was created on dev: measures its footprint and counts it under ctx.
 * Returns 1 when that grew the count and the container is now past its limit
 * on dev (the caller undoes the creation), else 0. */
int vgpu_fp_ctx_created(CUcontext ctx, CUdevice dev);
/* ctx was destroyed (or its primary context released or reset): gives back its footprint. */
void vgpu_fp_ctx_gone(CUcontext ctx);
/* After a call that may have changed the footprint (module load, set-limit): measures now. */
void vgpu_fp_changed(void);
/* Marks the footprint for measuring at the next counted allocation (a function lookup). */
void vgpu_fp_mark(void);
/* The allocation path: measures when marked or a second after the last measure; else
 * two relaxed loads and a coarse clock read, no lock. */
void vgpu_fp_poll(void);
/* The limiter's watcher, once a period (n counts them): measures every 25th. */
void vgpu_fp_watch(unsigned n);
/* cuCtxSetLimit while the host pid is unknown (no measure possible): the growth the
 * requested value implies, reserved before the call; settled after it. */
struct vgpu_fp_limit {
	CUcontext ctx;
	int idx, which;
	int64_t delta; /* bytes reserved (> 0) or to give back (< 0) once the call succeeds */
};
/* 0 (l filled, maybe with nothing to do), or -1: the growth does not fit the quota (said). */
int vgpu_fp_limit_admit(CUlimit limit, size_t value, struct vgpu_fp_limit *l);
void vgpu_fp_limit_settle(CUresult rc, const struct vgpu_fp_limit *l);

/* ---- limiter.c ---------------------------------------------------------------- */

/* Counts the waits still in progress up to now (vgpu_count_throttled), so a
 * long one reaches the region before it ends: the watcher's flush, the exit. */
void vgpu_limiter_count_waits(void);
/* Blocks until a launch of this many thread blocks on dev (limits index idx) may go. */
void vgpu_limiter_charge(int idx, CUdevice dev, uint64_t blocks);

#endif
