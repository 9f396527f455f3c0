/*
 * What each part of the shim does when the process forks or exits, declared
 * by the part itself (VGPU_LIFECYCLE) and run by lifecycle.c: no part calls
 * another's, and nothing runs at load time.
 */
#ifndef VGPU_LIFECYCLE_H
#define VGPU_LIFECYCLE_H

/*
 * The order the handlers run in: after a fork, in the child, in ascending
 * order; at exit, in descending order (a part's exit may still use the parts
 * before it, as a part's fork reset may rely on theirs being done).
 *  - the ledger first: the process's mutex, which the quota and the region
 *    take, and the child's own description of the limits file;
 *  - the region after it, the quota after the region: at exit the quota
 *    gives its unused leases back, and the limiter counts its last waits,
 *    before the region's slot is given back with the throttled time;
 *  - the rest keep the order the shim has always reset them in.
 */
enum vgpu_lifecycle_order {
	VGPU_ORDER_CORE,      /* core.c: the NVML device cache's lock */
	VGPU_ORDER_LEDGER,    /* ledger.c */
	VGPU_ORDER_REGION,    /* region.c */
	VGPU_ORDER_QUOTA,     /* quota.c */
	VGPU_ORDER_HOSTPID,   /* hostpid.c */
	VGPU_ORDER_TRACK,     /* track.c: counted allocations */
	VGPU_ORDER_CTX,       /* mem.c: primary and green contexts */
	VGPU_ORDER_POOL,      /* pool.c */
	VGPU_ORDER_IMPORT,    /* import.c */
	VGPU_ORDER_FOOTPRINT, /* footprint.c */
	VGPU_ORDER_NVML,      /* real.c: the shim's own NVML */
	VGPU_ORDER_LIMITER,   /* limiter.c */
	VGPU_ORDER_GRAPH,     /* graph.c */
};

struct vgpu_lifecycle {
	int order; /* enum vgpu_lifecycle_order; each value at most once */
	/* In a fork child (single-threaded; pthread_atfork, registered at the
	 * first initialisation): forget the parent's state, reset the locks a
	 * parent thread may have held. NULL: nothing to do. */
	void (*after_fork)(void);
	/* At a normal exit (the library's destructor), whether or not the
	 * shim was initialised. NULL: nothing to do. */
	void (*at_exit)(void);
};

/* Declares a part's handlers: a constant in the section lifecycle.c walks. */
#define VGPU_LIFECYCLE(part, ...)                                                                          \
	static const struct vgpu_lifecycle vgpu_lifecycle_##part                                           \
		__attribute__((used, section("vgpu_lifecycle"), aligned(__alignof__(struct vgpu_lifecycle)))) = \
			{__VA_ARGS__}

/* Runs every part's after_fork handler, in order (core.c's atfork child handler). */
void vgpu_lifecycle_after_fork(void);

#endif
