/*
 * Shared bookkeeping of the fake CUDA driver and fake NVML (test only).
 * One file under $FAKECUDA_STATE, mapped by every process, so memory use and
 * GPU time are consistent across processes and between the two libraries,
 * like the real driver's. Devices come from $FAKECUDA_DEVICES (see
 * fakestate.c for its format).
 *
 * $FAKECUDA_PIDNS_OFFSET=N simulates a container's pid namespace: fake NVML
 * reports every process as pid+N (process lists and utilisation samples),
 * the way real NVML reports host pids to a process that knows only its
 * namespace's. Read when the state file is created, so every process of one
 * fake machine agrees.
 *
 * $FAKECUDA_HOST_PIDS=1 in the CALLER of NVML's process listings and
 * utilisation samples (fk_knob: "1" or a path that exists) makes fake NVML
 * report each process by its pid in the caller's own pid namespace, as the
 * real driver reports host pids to a host process (nri-vgpu's utilisation
 * query), whatever namespace the GPU's processes run in. Each process
 * records at its slot's creation (its first context or allocation) the
 * inode of its pid namespace (/proc/self/ns/pid) and its pid in it
 * (getpid()); the caller resolves that pair by scanning its /proc: the
 * process whose /proc/<pid>/ns/pid has that inode and whose
 * /proc/<pid>/status NSpid line ends with that pid. A process of the
 * caller's own namespace is its pid; one the caller's /proc does not show
 * (gone, or in a namespace the caller cannot see) is reported as pid 0.
 * $FAKECUDA_PROC=DIR has the caller scan DIR instead of /proc: a caller in
 * a pod given the host's /proc at DIR (nri-vgpu's --host-proc) gets host
 * pids, as from the real driver.
 */
#ifndef FAKESTATE_H
#define FAKESTATE_H

#include <pthread.h>
#include <stdint.h>

#define FK_MAX_DEV 16
#define FK_MAX_PROC 1024 /* make bench starts 512 processes at once */
/* Launches a device holds queued or running, as a GPU's command queue
 * (about a thousand pending launches on hardware): the GPU works through
 * them whether or not the launching threads are scheduled. */
#define FK_QUEUE_LEN 1024

/* One launch on a device's timeline. */
struct fk_kernel {
	int32_t pid;
	int32_t pad;
	int64_t start_ns, end_ns;
};

struct fk_dev {
	char uuid[96];
	char name[96];	/* what cuDeviceGetName and nvmlDeviceGetName say */
	int32_t minor;	/* /dev/nvidia<minor> (nvmlDeviceGetMinorNumber) */
	int32_t pad0;
	uint64_t total;
	uint64_t used;
	int32_t sms;
	int32_t pad;
	int64_t busy_until_ns; /* the device runs one kernel at a time: its timeline */
	/* Launches not finished at the last look, oldest first (a ring). */
	uint32_t qhead, qlen;
	struct fk_kernel queue[FK_QUEUE_LEN];
};

struct fk_proc {
	int32_t pid;
	/* Its pid as NVML reports it: pid + its own FAKECUDA_PIDNS_OFFSET, so
	 * processes of two simulated pid namespaces with one pid stay apart. */
	int32_t nvpid;
	uint64_t used[FK_MAX_DEV];
	int32_t ctxs[FK_MAX_DEV];    /* live contexts: NVML lists a process with one */
	int64_t busy_ns[FK_MAX_DEV]; /* GPU time of its kernels, queued ones included */
	uint64_t launches[FK_MAX_DEV];
	/* FK_ALSO_* bits from $FAKECUDA_PROC_KIND at its first context: NVML
	 * also lists the process as a graphics / MPS client. */
	int32_t also;
	int32_t pad2;
	uint64_t pidns; /* inode of its pid namespace (fk_nvml_visible, FAKECUDA_HOST_PIDS) */
	/* Held by the process for its life (robust, process-shared): the kernel
	 * marks it when the holding thread is gone, the way a driver learns of a
	 * client's exit from the release of its file, with no question asked of
	 * each process at each query (fk_reap). */
	pthread_mutex_t live;
};

#define FK_ALSO_GRAPHICS 1
#define FK_ALSO_MPS 2

struct fk_state {
	uint64_t magic;
	/* The driver's own serialisation of its calls (robust, process-shared):
	 * waiters sleep and are woken one at a time, as on a kernel mutex, and a
	 * holder killed mid-call releases it (fk_lock). */
	pthread_mutex_t mu;
	int32_t ndev;
	int32_t pidns_offset; /* unused: each process's own FAKECUDA_PIDNS_OFFSET counts */
	struct fk_dev dev[FK_MAX_DEV];
	struct fk_proc proc[FK_MAX_PROC];
	uint64_t peak[FK_MAX_DEV]; /* the most dev[].used has ever been (fakecuda_peak) */
};

extern struct fk_state *fk;

void fk_init(void);
void fk_lock(void);
void fk_unlock(void);
/* This process's slot (caller holds the lock). */
struct fk_proc *fk_me(void);
/* Frees the slots (and memory) of processes that are gone. Caller holds the lock. */
void fk_reap(void);
int64_t fk_now(void);
/* Drops the launches of device d that finished by now (caller holds the lock). */
void fk_retire(int d, int64_t now);
/* GPU time process p's kernels on device d had actually run by now, i.e.
 * without the queued part still ahead (caller holds the lock). */
int64_t fk_ran_ns(const struct fk_proc *p, int d, int64_t now);
/* Resident threads per SM (CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR), as on recent GPUs. */
#define FK_THREADS_PER_SM 2048
/* The inode of this process's pid namespace (0 if unreadable). */
uint64_t fk_own_pidns(void);
/* A process's pid as fake NVML reports it (see FAKECUDA_PIDNS_OFFSET and
 * FAKECUDA_HOST_PIDS). Caller holds the lock. */
unsigned fk_nvml_pid(const struct fk_proc *p);
/* Whether NVML shows p to the calling process. With FAKECUDA_HOST_PIDNS set
 * (the inode of the host's pid namespace), a caller in another pid namespace
 * sees only its own namespace's processes, as the driver shows a container;
 * unset, every process. */
int fk_nvml_visible(const struct fk_proc *p);
/* This process's FAKECUDA_PIDNS_OFFSET: its namespace's offset to NVML's pids. */
int32_t fk_pidns_offset(void);
void fk_sleep_ns(int64_t ns);
/* Fault injection from $FAKECUDA_FAIL="name:N[:sleepMS],...": returns 1 when
 * this (the Nth) call of name must fail; sleeps first when asked. */
int fk_fault(const char *name);
/* A switch from the environment: on when $name is "1", or names a path that
 * exists now (so a test can turn it on and off while a process runs). */
int fk_knob(const char *name);
/* Memory taken and given back on device dev by this process (fakecuda.c). */
int fk_mem_take(int dev, uint64_t bytes);
void fk_mem_give(int dev, uint64_t bytes);
/* A launch of f: loads a lazily loaded function, grows local memory (fakemodule.c). */
struct CUfunc_st;
void fk_function_launched(struct CUfunc_st *f);
/* Device d's PCI bus number: 0x10 + d, so its bus id is "00000000:1d:00.0"
 * in NVML's form (fakestate.c). */
#define FK_PCI_BUS(d) (0x10 + (d))
/* Parses a GPU UUID "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes. */
void fk_uuid_bytes(const char *s, unsigned char out[16]);

#endif
