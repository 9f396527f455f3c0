/*
 * region.c: the usage region (its layout: ../include/region.h, Contract 5),
 * the container's report for the host. It decides nothing.
 */
#ifndef VGPU_SRC_REGION_H
#define VGPU_SRC_REGION_H

#include <stdint.h>

#include "limits.h"

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

#endif
