/* hostpid.c: this process's pid as NVML reports it. */
#ifndef VGPU_HOSTPID_H
#define VGPU_HOSTPID_H

#include "common.h"

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

#endif
