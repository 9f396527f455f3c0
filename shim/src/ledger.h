/*
 * ledger.c: what each process leases and holds, as locks on the limits file
 * where the tenant cannot write; the process's mutex.
 */
#ifndef VGPU_LEDGER_H
#define VGPU_LEDGER_H

#include <stdint.h>

/* fd moved to a high number (closed; the new one returned), or fd itself when
 * it cannot be: a program that closes or reuses the low descriptors it did
 * not open is then unlikely to meet ours. */
int vgpu_high_fd(int fd);

/* Takes over limits_fd (the limits file, open for reading; path to reopen it).
 * nshards > 0: the ledger's shards are files 0..nshards-1 of ledger_dir; 0:
 * the ledger lives on the limits file alone. */
void vgpu_ledger_init(int limits_fd, const char *limits_path, const char *ledger_dir, int nshards);
/* Takes lease on limits index idx (what this process holds or may allocate
 * without asking again) from the container's pool: at least least bytes and
 * up to want, as much as the pool has where it looks, in *got. 0, or -1 with
 * errno and nothing taken (EDQUOT: the pool has no room for least; *short_by:
 * how much more the others would have to give back). force: memory the
 * driver already handed out, taken past the limit where it must be. */
int vgpu_ledger_grow(int idx, uint64_t least, uint64_t want, int force, uint64_t *got, uint64_t *short_by);
/* Gives back bytes of this process's lease on idx (at most what it holds): its debt first. */
void vgpu_ledger_shrink(int idx, uint64_t bytes);
/* This process's debt on idx: bytes counted by force that neither the pool nor the
 * overflow had room for (locks forged over both), published apart and counted by
 * every grant of the container until placed. */
uint64_t vgpu_ledger_owed(int idx);
/* Places what this process owes on idx where the pool or the overflow has room now. */
void vgpu_ledger_settle(int idx);
/* Publishes bytes as what this process holds on idx (a report, never more
 * than its lease): 0, or -1 with errno. */
int vgpu_ledger_publish_held(int idx, uint64_t bytes);
/* Reopens the limits file and publishes everything again if the program
 * closed the descriptor: 0, or -1 with errno. */
int vgpu_ledger_check(void);
/* Whether the descriptor still reaches the limits file (for readers, without
 * the process's mutex): 1 or 0. */
int vgpu_ledger_readable(void);
/* The process's mutex: every change to the ledger, the leases (quota.c) and
 * the region's state (region.c) is made under it. trylock: 0 when taken. */
void vgpu_ledger_lock(void);
void vgpu_ledger_unlock(void);
int vgpu_ledger_trylock(void);
/* Before reading the ledger without the process's mutex (reports, the SM
 * limiter, quota checks outside a grant): a descriptor the program closed,
 * perhaps reusing its number for a file whose locks would read as nobody's,
 * is opened again and everything published again, under the mutex like
 * every change to the ledger. 0, or -1 with errno. */
int vgpu_ledger_reader(void);

/* The union of the container's other processes' leases on idx: 0, or -1 with errno. */
int vgpu_ledger_others(int idx, uint64_t *bytes);
/* What the other processes say they hold on idx (the report). */
int vgpu_ledger_others_held(int idx, uint64_t *bytes);
/* Publishes this process's host pid (0 withdraws it): 0, or -1 with errno. */
int vgpu_ledger_claim_host_pid(int32_t hp);
/* What our locks publish now: held bytes on limits index d; the host pid claimed (0: none). */
uint64_t vgpu_ledger_held(int d);
int32_t vgpu_ledger_claimed(void);
/* Whether another process reading our held report on d since the last mark
 * may have read bytes (a rebuild of the region writes what it read into our
 * slot); the mark, at each write of our slot, from what our locks say and
 * also. Caller holds the process's mutex. */
int vgpu_ledger_held_seen(int d, uint64_t bytes);
void vgpu_ledger_held_mark(int d, uint64_t also);
/* Calls fn for each (pid, bytes held) another process publishes on idx, under its pid
 * here; a process this pid namespace cannot see is not named (its bytes are still
 * in vgpu_ledger_others_held). */
int vgpu_ledger_scan_held(int idx, void (*fn)(int32_t pid, int idx, uint64_t bytes, void *arg), void *arg);
/* Calls fn for each (pid, host pid) claim that the owner of the slot it lies in holds itself,
 * under that owner's pid here (this process's included; other pid namespaces' are not named). */
int vgpu_ledger_scan_claims(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg);
/* The host pids the container's other processes claim. */
#define VGPU_HP_RANGES 1024
struct vgpu_hp_set {
	int n, all;
	struct {
		uint32_t lo, hi;
	} r[VGPU_HP_RANGES];
};
/* Every host pid the container's processes claim into set; of those claimed by
 * processes this pid namespace cannot name (the container's processes in
 * another one, whose NVML samples the driver may not show here), the host
 * pids into hidden and the SM use they publish on GPU d, summed, in *util
 * (percent). 0, or -1 with errno. */
int vgpu_ledger_host_pids(int d, struct vgpu_hp_set *set, struct vgpu_hp_set *hidden, unsigned *util);
/* Publishes percent as the SM use this process last measured for itself on
 * GPU idx (0..100; the SM limiter's watcher), taking the process's mutex
 * (logged when it cannot). */
void vgpu_ledger_publish_util(int idx, unsigned percent);
/* Both in one scan: fn as vgpu_ledger_scan_claims, every claimed host pid into set. */
int vgpu_ledger_scan_claims_all(void (*fn)(int32_t pid, int32_t hp, void *arg), void *arg, struct vgpu_hp_set *set);
int vgpu_hp_set_has(const struct vgpu_hp_set *set, unsigned pid);

#endif
