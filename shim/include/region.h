/*
 * The usage region (Contract 5): THE layout of <region dir>/usage.
 *
 * Every process of a container maps this file MAP_SHARED and updates it
 * under an fcntl OFD write lock on the whole file; `nri-vgpu status` and the
 * metrics endpoint read it (Go mirror: pkg/region, whose test compares the
 * offsets below with its own). All fields are fixed-width, little-endian and
 * naturally aligned; the layout only ever grows by bumping the version.
 *
 * The container can write this file, so it is a report and never the
 * accounting: the shim decides on what each process publishes in the ledger
 * (src/ledger.c) and on the limits file, and rebuilds this file from them
 * when it finds it damaged (src/region.c).
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stddef.h>
#include <stdint.h>

#define VGPU_REGION_MAGIC 0x3147455255504756ull /* the bytes "VGPUREG1", little-endian */
/* Version 2 gave each device its peak and throttled_ns, in bytes version 1
 * reserved: nothing moved, and readers accept both (pkg/region). */
#define VGPU_REGION_VERSION 2u
#define VGPU_REGION_FILE "usage"
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_PROCS 1024
#define VGPU_UUID_LEN 96 /* NUL-padded; NVML's MIG-era UUID buffer size */

struct vgpu_region_device {
	char uuid[VGPU_UUID_LEN];
	uint64_t limit; /* bytes; 0 = no memory limit */
	uint64_t used;  /* bytes held by the container: sum of the slots' used[] */
	uint32_t cores; /* percent of SM time, 1..100 */
	uint32_t reserved0;
	/* Reports, like every field here (the container can write them), never
	 * read back by the shim to decide anything. */
	/* v2: the most bytes `used` has reached since the region was created or
	 * rebuilt (a rebuild starts it at the rebuilt `used`); raised before
	 * `used`, so that an unlocked reader never sees used > peak. */
	uint64_t peak;
	/* v2: ns during which launches of the container's processes waited on
	 * the SM limiter (src/limiter.c), summed over processes, each adding at
	 * most its wall time; only ever grows, but a rebuild starts it at 0. */
	uint64_t throttled_ns;
	uint64_t reserved[1];
};

struct vgpu_region_proc {
	int32_t pid;         /* in the container's pid namespace; 0 = free slot */
	int32_t host_pid;    /* as NVML reports it (src/hostpid.c); 0 = unknown */
	uint64_t start_time; /* /proc/<pid>/stat field 22, clock ticks since boot */
	uint64_t used[VGPU_MAX_DEVICES];     /* bytes held per device */
	uint64_t launches[VGPU_MAX_DEVICES]; /* kernel launches per device */
};

struct vgpu_region_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;  /* offsetof(struct vgpu_region, procs) */
	uint64_t size;         /* sizeof(struct vgpu_region) */
	uint32_t device_count; /* entries of devices[] in use */
	uint32_t proc_slots;   /* VGPU_MAX_PROCS */
	uint8_t reserved[32];
};

struct vgpu_region {
	struct vgpu_region_header hdr;
	struct vgpu_region_device devices[VGPU_MAX_DEVICES];
	struct vgpu_region_proc procs[VGPU_MAX_PROCS];
};

_Static_assert(sizeof(struct vgpu_region_header) == 64, "header size");
_Static_assert(sizeof(struct vgpu_region_device) == 144, "device size");
_Static_assert(sizeof(struct vgpu_region_proc) == 272, "proc size");
_Static_assert(offsetof(struct vgpu_region, devices) == 64, "devices offset");
_Static_assert(offsetof(struct vgpu_region, procs) == 64 + 16 * 144, "procs offset");
_Static_assert(sizeof(struct vgpu_region) == 64 + 16 * 144 + 1024 * 272, "region size");

#endif
