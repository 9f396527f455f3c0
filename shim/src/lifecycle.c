/*
 * Runs the fork and exit handlers each part of the shim declares
 * (lifecycle.h), in their order. The linker gathers the declarations into
 * one section and names its bounds; the order comes from the declarations,
 * not from where the linker put them: a walk per step over a dozen
 * entries, with no allocation (a fork child may not have a usable malloc).
 */
#include "glibc_compat.h"

#include <limits.h>
#include <stddef.h>

#include "lifecycle.h"

extern const struct vgpu_lifecycle __start_vgpu_lifecycle[] __attribute__((visibility("hidden")));
extern const struct vgpu_lifecycle __stop_vgpu_lifecycle[] __attribute__((visibility("hidden")));

/* The entry with the lowest order above after (descending: the highest below
 * before); NULL when none is left. */
static const struct vgpu_lifecycle *next_up(int after)
{
	const struct vgpu_lifecycle *best = NULL;
	for (const struct vgpu_lifecycle *l = __start_vgpu_lifecycle; l < __stop_vgpu_lifecycle; l++)
		if (l->order > after && (!best || l->order < best->order))
			best = l;
	return best;
}

static const struct vgpu_lifecycle *next_down(int before)
{
	const struct vgpu_lifecycle *best = NULL;
	for (const struct vgpu_lifecycle *l = __start_vgpu_lifecycle; l < __stop_vgpu_lifecycle; l++)
		if (l->order < before && (!best || l->order > best->order))
			best = l;
	return best;
}

void vgpu_lifecycle_after_fork(void)
{
	for (const struct vgpu_lifecycle *l = next_up(INT_MIN); l; l = next_up(l->order))
		if (l->after_fork)
			l->after_fork();
}

/* Not a constructor: nothing runs at load time. */
__attribute__((destructor)) static void at_exit(void)
{
	for (const struct vgpu_lifecycle *l = next_down(INT_MAX); l; l = next_down(l->order))
		if (l->at_exit)
			l->at_exit();
}
