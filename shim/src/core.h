/*
 * core.c: lazy initialisation and the mapping of devices to entries of the
 * limits file.
 */
#ifndef VGPU_CORE_H
#define VGPU_CORE_H

#include "common.h"
#include "limits.h"

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
/* Limits index of a CUDA device ordinal; -1 when the device is not listed. */
int vgpu_device_index(CUdevice dev);
/* Limits index of an NVML handle; -1 when not listed. */
int vgpu_nvml_index(nvmlDevice_t dev);
/* Formats a CUuuid the way NVML prints it ("GPU-xxxxxxxx-xxxx-..."). */
void vgpu_format_uuid(const CUuuid *u, char out[VGPU_UUID_LEN]);

#endif
