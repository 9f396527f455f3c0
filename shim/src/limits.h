/*
 * The limits file (Contract 4): a strict parser shared by the shim and its
 * fuzz target. It matches the Go writer in pkg/limits: anything the writer
 * cannot produce is rejected, because a file we misread would silently give
 * a container the wrong quota.
 */
#ifndef VGPU_LIMITS_H
#define VGPU_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "../include/region.h"

#define VGPU_LIMITS_MAX_SIZE 4096
/* The fixed paths (Contract 3/4). Overridable at build time only so the tests
 * can build a copy that proves the fixed path beats the environment. */
#ifndef VGPU_LIMITS_PATH
#define VGPU_LIMITS_PATH "/run/nri-vgpu/limits"
#endif
#ifndef VGPU_REGION_DIR
#define VGPU_REGION_DIR "/run/nri-vgpu/region"
#endif
#ifndef VGPU_LEDGER_DIR
#define VGPU_LEDGER_DIR "/run/nri-vgpu/ledger"
#endif
/* Where a vGPU container has the shim (Contract 3), and the file that makes
 * the loader preload it there. Loaded from that path, the shim is in a vGPU
 * container: it ignores the overrides and fails closed without its files. */
#define VGPU_SHIM_PATH "/usr/local/nri-vgpu/libvgpu-shim.so"
#ifndef VGPU_PRELOAD_FILE
#define VGPU_PRELOAD_FILE "/etc/ld.so.preload"
#endif

enum vgpu_policy { VGPU_POLICY_HARD = 0, VGPU_POLICY_BURST = 1 };
enum vgpu_level { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 1, VGPU_LOG_INFO = 2, VGPU_LOG_DEBUG = 3 };

struct vgpu_gpu_limit {
	char uuid[VGPU_UUID_LEN];
	uint64_t memory; /* bytes; 0 = no memory limit */
	int cores;       /* 1..100 */
};

struct vgpu_limits {
	int ngpu;
	struct vgpu_gpu_limit gpu[VGPU_MAX_DEVICES];
	int policy;    /* enum vgpu_policy */
	int log_level; /* enum vgpu_level */
	int shards;    /* ledger.shards: 0 = absent (the ledger on the limits file alone) */
};

/* The most ledger shards a limits file may name. */
#define VGPU_LEDGER_MAX_SHARDS 256

/*
 * Parses len bytes of buf (need not be NUL-terminated). Returns 0 on success;
 * -1 with a one-line reason in err (naming the line) otherwise.
 */
int vgpu_limits_parse(const char *buf, size_t len, struct vgpu_limits *out, char *err, size_t errlen);

#endif
