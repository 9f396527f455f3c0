/* Per-process table of what this process holds (track.c). */
#ifndef VGPU_TRACK_H
#define VGPU_TRACK_H

#include <stdint.h>

#include "common.h"

enum { TRACK_PTR = 0, TRACK_HANDLE = 1, TRACK_ARRAY = 2, TRACK_MIPMAP = 3, TRACK_MAP = 5 };
/* Imported external memory, IPC-imported memory, pool pointers imported from
 * another process (import.c; the last two are IPC imports alike). */
enum { TRACK_EXTMEM = 16, TRACK_IPC = 17, TRACK_POOL_IMPORT = 18 };

struct vgpu_tracked {
	uint64_t bytes;
	int idx;
	CUcontext ctx;
};

int vgpu_track_add(int kind, uint64_t key, uint64_t bytes, int idx, CUcontext ctx);
/* Removes the entry; 0 when found. */
int vgpu_track_take(int kind, uint64_t key, struct vgpu_tracked *out);
/*
 * VMM memory lives while its handle has references (cuMemCreate, each
 * cuMemRetainAllocationHandle) or mappings. Adjusts those counts of tracked
 * handle h: returns 1 when both reached 0 (entry removed, *out filled: give
 * the bytes back), 0 while it lives on, -1 when h is not tracked (or has no
 * reference or mapping to take away).
 */
int vgpu_track_handle_adjust(uint64_t h, int drefs, int dmaps, struct vgpu_tracked *out);
/* Records that handle h is mapped at va. */
int vgpu_track_map_add(uint64_t va, uint64_t h);
/* Forgets the mappings in [va, va+len) and adds to freed[] the bytes of
 * handles that thereby lost their last reference. */
void vgpu_track_unmap(uint64_t va, uint64_t len, uint64_t freed[VGPU_MAX_DEVICES]);
/* Forgets and gives back everything allocated in ctx (context destroyed). */
void vgpu_track_drop_ctx(CUcontext ctx);
/* Bytes of IPC-imported memory (both kinds) tracked on limits index idx:
 * counted for this process although the driver's per-process figure is the
 * exporter's. */
uint64_t vgpu_track_ipc_bytes(int idx);

#endif
