/* The admission and release steps of mem.c, for the allocation hooks kept
 * in files of their own (legacy.c, pool.c, import.c). */
#ifndef VGPU_MEM_H
#define VGPU_MEM_H

#include <stdint.h>

#include "shim.h"

/* What an admission decided: forward uncounted, counted (bytes reserved:
 * the caller must track them or give them back), or refuse. */
enum { GO_FORWARD, GO_COUNTED, GO_REFUSE };

/* Decides an allocation of bytes on the current context's device; *idx gets
 * its limits index. */
int vgpu_mem_admit_current(uint64_t bytes, int *idx);
/* Decides an allocation of bytes on limits index idx (vgpu_device_index). */
int vgpu_mem_admit_index(int idx, uint64_t bytes);
/* After the driver call: tracks key (kind from track.h) under the current
 * context on success, gives the reservation back on failure; returns rc. */
CUresult vgpu_mem_settle(CUresult rc, int go, int kind, uint64_t key, uint64_t bytes, int idx);
/* Frees key through call(arg) and gives back what it held when that succeeds. */
CUresult vgpu_mem_release(int kind, uint64_t key, CUresult (*call)(void *), void *arg);
/* Bytes an array of w x h x d elements of CUarray_format fmt takes (counted). */
uint64_t vgpu_array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch);
/* VMM handles imported from a shareable handle (import.c): their size is
 * known at their first mapping, which is charged it. Before cuMemMap of h:
 * GO_FORWARD when h is no such handle (or nothing is counted), GO_COUNTED
 * with size reserved on *idx, or GO_REFUSE. */
int vgpu_vmm_import_map_begin(uint64_t h, uint64_t size, int *idx);
/* After it: on success h is tracked as a cuMemCreate handle of size bytes. */
void vgpu_vmm_import_map_end(uint64_t h, CUresult rc, int go, uint64_t size, int idx);
/* A successful cuMemRelease of h: an imported handle never mapped is forgotten. */
void vgpu_vmm_import_release(uint64_t h);
/* A sparse array is gone: the handles mapped into it lose those mappings (import.c). */
void vgpu_array_maps_gone(void *res);
/* A fork child forgets the parent's multicast binds (import.c). */

#endif
