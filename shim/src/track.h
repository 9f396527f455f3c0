/* Per-process table of what this process holds (track.c). */
#ifndef VGPU_TRACK_H
#define VGPU_TRACK_H

#include <stdint.h>

#include "shim.h"

enum { TRACK_PTR = 0, TRACK_HANDLE = 1, TRACK_ARRAY = 2, TRACK_MIPMAP = 3, TRACK_CTX = 4 };

struct vgpu_tracked {
	uint64_t bytes;
	int idx;
	CUcontext ctx;
};

int vgpu_track_add(int kind, uint64_t key, uint64_t bytes, int idx, CUcontext ctx);
/* Removes the entry; 0 when found. */
int vgpu_track_take(int kind, uint64_t key, struct vgpu_tracked *out);
/* Forgets and gives back everything allocated in ctx (context destroyed). */
void vgpu_track_drop_ctx(CUcontext ctx);

#endif
