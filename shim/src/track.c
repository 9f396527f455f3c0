/*
 * What this process holds: device pointers, VMM handles, arrays and mipmapped
 * arrays, each with its size, limits index and context, so every free,
 * release or destroy gives back exactly what its allocation took, and a
 * destroyed context gives back everything allocated in it.
 */
#include "glibc_compat.h"

#include <pthread.h>
#include <stdlib.h>

#include "shim.h"
#include "track.h"

#define NBUCKETS 4096

struct entry {
	struct entry *next;
	uint64_t key;
	uint64_t bytes;
	CUcontext ctx;
	int kind;
	int idx;
};

static struct entry *buckets[NBUCKETS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned hash(int kind, uint64_t key)
{
	key ^= (uint64_t)kind << 61;
	key *= 0x9e3779b97f4a7c15ull;
	return (unsigned)(key >> 52) & (NBUCKETS - 1);
}

int vgpu_track_add(int kind, uint64_t key, uint64_t bytes, int idx, CUcontext ctx)
{
	struct entry *e = malloc(sizeof(*e));
	if (!e)
		return -1;
	e->key = key;
	e->kind = kind;
	e->bytes = bytes;
	e->idx = idx;
	e->ctx = ctx;
	unsigned h = hash(kind, key);
	pthread_mutex_lock(&mu);
	e->next = buckets[h];
	buckets[h] = e;
	pthread_mutex_unlock(&mu);
	return 0;
}

int vgpu_track_take(int kind, uint64_t key, struct vgpu_tracked *out)
{
	unsigned h = hash(kind, key);
	pthread_mutex_lock(&mu);
	for (struct entry **pp = &buckets[h]; *pp; pp = &(*pp)->next) {
		struct entry *e = *pp;
		if (e->kind == kind && e->key == key) {
			*pp = e->next;
			pthread_mutex_unlock(&mu);
			out->bytes = e->bytes;
			out->idx = e->idx;
			out->ctx = e->ctx;
			free(e);
			return 0;
		}
	}
	pthread_mutex_unlock(&mu);
	return -1;
}

void vgpu_track_drop_ctx(CUcontext ctx)
{
	uint64_t freed[VGPU_MAX_DEVICES] = {0};
	pthread_mutex_lock(&mu);
	for (int h = 0; h < NBUCKETS; h++)
		for (struct entry **pp = &buckets[h]; *pp;) {
			struct entry *e = *pp;
			if (e->ctx == ctx) {
				*pp = e->next;
				freed[e->idx] += e->bytes;
				free(e);
			} else {
				pp = &e->next;
			}
		}
	pthread_mutex_unlock(&mu);
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		vgpu_unreserve(d, freed[d]);
}

void vgpu_mem_after_fork(void)
{
	/* The child owns none of the parent's device memory (CUDA state does not
	 * survive fork); its accounting starts empty. Entries leak on purpose: a
	 * parent thread may have been mid-update. */
	for (int h = 0; h < NBUCKETS; h++)
		buckets[h] = NULL;
	pthread_mutex_init(&mu, NULL);
}
