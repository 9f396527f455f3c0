/*
 * What this process holds: device pointers, VMM handles, arrays and mipmapped
 * arrays, each with its size, limits index and context, so every free,
 * release or destroy gives back exactly what its allocation took, and a
 * destroyed context gives back everything allocated in it.
 */
#include "glibc_compat.h"

#include <pthread.h>
#include <stdlib.h>

#include "lifecycle.h"
#include "quota.h"
#include "track.h"

#define NBUCKETS 4096

struct entry {
	struct entry *next;
	uint64_t key;
	uint64_t bytes;
	CUcontext ctx;
	int kind;
	int idx;
	int refs;        /* TRACK_HANDLE: references (cuMemCreate + retains) */
	int maps;        /* TRACK_HANDLE: live mappings */
	uint64_t handle; /* TRACK_MAP: the handle mapped at key */
};

static struct entry *buckets[NBUCKETS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* Entries given back by vgpu_track_take, for the next vgpu_track_add: a
 * malloc and a free per allocation were a quarter of what the shim adds to
 * an allocation and its free. Under mu; at most SPARE_MAX kept. */
#define SPARE_MAX 256
static struct entry *spare;
static int nspare;
static uint64_t ipc_bytes[VGPU_MAX_DEVICES]; /* TRACK_IPC and TRACK_POOL_IMPORT entries' bytes per index; under mu */

/* Keeps ipc_bytes in step as entry e comes (sign 1) or goes (-1); caller holds mu. */
static void ipc_count_locked(const struct entry *e, int sign)
{
	if ((e->kind == TRACK_IPC || e->kind == TRACK_POOL_IMPORT) && e->idx >= 0 && e->idx < VGPU_MAX_DEVICES)
		ipc_bytes[e->idx] += sign > 0 ? e->bytes : -e->bytes;
}

uint64_t vgpu_track_ipc_bytes(int idx)
{
	if (idx < 0 || idx >= VGPU_MAX_DEVICES)
		return 0;
	pthread_mutex_lock(&mu);
	uint64_t b = ipc_bytes[idx];
	pthread_mutex_unlock(&mu);
	return b;
}

static unsigned hash(int kind, uint64_t key)
{
	key ^= (uint64_t)kind << 61;
	key *= 0x9e3779b97f4a7c15ull;
	return (unsigned)(key >> 52) & (NBUCKETS - 1);
}

int vgpu_track_add(int kind, uint64_t key, uint64_t bytes, int idx, CUcontext ctx)
{
	pthread_mutex_lock(&mu);
	struct entry *e = spare;
	if (e) {
		spare = e->next;
		nspare--;
	} else {
		pthread_mutex_unlock(&mu);
		if (!(e = malloc(sizeof(*e))))
			return -1;
		pthread_mutex_lock(&mu);
	}
	e->key = key;
	e->kind = kind;
	e->bytes = bytes;
	e->idx = idx;
	e->ctx = ctx;
	e->refs = 1;
	e->maps = 0;
	e->handle = 0;
	unsigned h = hash(kind, key);
	e->next = buckets[h];
	buckets[h] = e;
	ipc_count_locked(e, 1);
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
			ipc_count_locked(e, -1);
			out->bytes = e->bytes;
			out->idx = e->idx;
			out->ctx = e->ctx;
			if (nspare < SPARE_MAX) {
				e->next = spare;
				spare = e;
				nspare++;
				e = NULL;
			}
			pthread_mutex_unlock(&mu);
			free(e);
			return 0;
		}
	}
	pthread_mutex_unlock(&mu);
	return -1;
}

/* The handle entry for h that can lose drefs/dmaps; caller holds mu. */
static struct entry **find_handle_locked(uint64_t h, int drefs, int dmaps)
{
	for (struct entry **pp = &buckets[hash(TRACK_HANDLE, h)]; *pp; pp = &(*pp)->next) {
		struct entry *e = *pp;
		/* A value reused by a newer handle has no mapping yet: an unmap
		 * (dmaps < 0) must not be charged to it. */
		if (e->kind == TRACK_HANDLE && e->key == h && (dmaps >= 0 || e->maps > 0) &&
		    (drefs >= 0 || e->refs > 0))
			return pp;
	}
	return NULL;
}

/* Applies the adjustment; returns the entry, unlinked, when nothing holds it any more. */
static struct entry *adjust_locked(struct entry **pp, int drefs, int dmaps)
{
	struct entry *e = *pp;
	e->refs += drefs;
	e->maps += dmaps;
	if (e->refs > 0 || e->maps > 0)
		return NULL;
	*pp = e->next;
	return e;
}

int vgpu_track_handle_adjust(uint64_t h, int drefs, int dmaps, struct vgpu_tracked *out)
{
	pthread_mutex_lock(&mu);
	struct entry **pp = find_handle_locked(h, drefs, dmaps);
	struct entry *gone = pp ? adjust_locked(pp, drefs, dmaps) : NULL;
	pthread_mutex_unlock(&mu);
	if (!pp)
		return -1;
	if (!gone)
		return 0;
	if (out) {
		out->bytes = gone->bytes;
		out->idx = gone->idx;
		out->ctx = gone->ctx;
	}
	free(gone);
	return 1;
}

int vgpu_track_map_add(uint64_t va, uint64_t h)
{
	struct entry *e = calloc(1, sizeof(*e));
	if (!e)
		return -1;
	/* No context: a mapping outlives the context it was made in, and
	 * dropping it with one would keep its handle counted forever. */
	e->kind = TRACK_MAP;
	e->key = va;
	e->handle = h;
	unsigned b = hash(TRACK_MAP, va);
	pthread_mutex_lock(&mu);
	e->next = buckets[b];
	buckets[b] = e;
	pthread_mutex_unlock(&mu);
	return 0;
}

void vgpu_track_unmap(uint64_t va, uint64_t len, uint64_t freed[VGPU_MAX_DEVICES])
{
	uint64_t end = va + len < va ? UINT64_MAX : va + len;
	pthread_mutex_lock(&mu);
	for (int b = 0; b < NBUCKETS; b++)
		for (struct entry **pp = &buckets[b]; *pp;) {
			struct entry *e = *pp;
			if (e->kind != TRACK_MAP || e->key < va || e->key >= end) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			struct entry **hp = find_handle_locked(e->handle, 0, -1);
			struct entry *gone = hp ? adjust_locked(hp, 0, -1) : NULL;
			if (gone) {
				freed[gone->idx] += gone->bytes;
				free(gone);
			}
			free(e);
		}
	pthread_mutex_unlock(&mu);
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
				ipc_count_locked(e, -1);
				freed[e->idx] += e->bytes;
				free(e);
			} else {
				pp = &e->next;
			}
		}
	pthread_mutex_unlock(&mu);
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		vgpu_quota_uncharge(d, freed[d]);
}

static void after_fork(void)
{
	/* The child owns none of the parent's device memory (CUDA state does not
	 * survive fork); its accounting starts empty. Entries leak on purpose: a
	 * parent thread may have been mid-update. */
	for (int h = 0; h < NBUCKETS; h++)
		buckets[h] = NULL;
	for (int d = 0; d < VGPU_MAX_DEVICES; d++)
		ipc_bytes[d] = 0;
	spare = NULL;
	nspare = 0;
	pthread_mutex_init(&mu, NULL);
}

VGPU_LIFECYCLE(track, .order = VGPU_ORDER_TRACK, .after_fork = after_fork);
