/*
 * What every part of the shim uses: the driver ABI, the export and branch
 * hints, two arithmetic helpers. Nothing here is exported.
 */
#ifndef VGPU_COMMON_H
#define VGPU_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../include/cuda_abi.h"
#include "../include/region.h"

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

#endif
