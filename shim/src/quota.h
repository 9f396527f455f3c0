/* quota.c: this process's share of the container's memory quota. */
#ifndef VGPU_QUOTA_H
#define VGPU_QUOTA_H

#include <stdint.h>

/* Reserves bytes on limits index idx for this process: 0, VGPU_OVER_QUOTA, or
 * VGPU_UNRECORDED (the ledger cannot take it; logged once by the callee). */
#define VGPU_OVER_QUOTA (-1)
#define VGPU_UNRECORDED (-2)
int vgpu_quota_charge(int idx, uint64_t bytes);
/* Counts bytes even past the limit (memory the driver already handed out): 0, or
 * VGPU_UNRECORDED when the ledger could not record it (counted by this process only). */
int vgpu_quota_charge_force(int idx, uint64_t bytes);
/* Gives back bytes reserved earlier (saturating). */
void vgpu_quota_uncharge(int idx, uint64_t bytes);
/* Bytes the whole container holds on idx (this process's own count plus what
 * the ledger shows the others hold); the limit when that cannot be measured. */
uint64_t vgpu_quota_used(int idx);
/* used as above, and committed: this process's own count plus the others'
 * leases, what this process cannot have. 0, or -1 (both the limit) when the
 * ledger cannot be measured. Measured now: for decisions. */
int vgpu_quota_usage(int idx, uint64_t *used, uint64_t *committed);
/* The same for reports (Contract 7): the others' part may come from this
 * process's last measurement of the ledger, when it is under a keeper period
 * old and this process took, returned and was refused no lease since; its
 * own part is exact. Never for a decision. */
int vgpu_quota_view(int idx, uint64_t *used, uint64_t *committed);
/* Bytes this process holds on idx, by its own count: its counted allocations plus its
 * counted context footprint (footprint.c subtracts the latter), nothing leased ahead. */
uint64_t vgpu_quota_held(int idx);
/* What this process leases on idx (held, and reserved ahead). */
uint64_t vgpu_quota_leased(int idx);
/* Publishes bytes in the ledger as what this process holds on idx (logged
 * when it cannot). Caller holds the process's mutex. */
void vgpu_quota_publish_held(int idx, uint64_t bytes);
/* Starts the keeper thread, or wakes it: it gives unused lease back and
 * writes the reports the region was too busy for. Caller holds the process's mutex. */
void vgpu_quota_keeper_start(void);

#endif
