/* import.c: memory held without an allocation call of its own (imported
 * VMM handles, multicast binds, sparse arrays' mappings), for mem.c's hooks. */
#ifndef VGPU_IMPORT_H
#define VGPU_IMPORT_H

#include <stdint.h>

#include "common.h"

/* VMM handles imported from a shareable handle: their size is
 * known at their first mapping, which is charged it. Before cuMemMap of h:
 * GO_FORWARD when h is no such handle (or nothing is counted), GO_COUNTED
 * with size reserved on *idx, or GO_REFUSE. */
int vgpu_vmm_import_map_begin(uint64_t h, uint64_t size, int *idx);
/* After it: on success h is tracked as a cuMemCreate handle of size bytes. */
void vgpu_vmm_import_map_end(uint64_t h, CUresult rc, int go, uint64_t size, int idx);
/* A successful cuMemRelease of h: an imported handle never mapped is forgotten. */
void vgpu_vmm_import_release(uint64_t h);
/* A sparse array is gone: the handles mapped into it lose those mappings. */
void vgpu_array_maps_gone(void *res);

#endif
