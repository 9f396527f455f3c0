/*
 * Test helper for the usage region.
 *   regiondump FILE                      print header, devices (with their
 *                                         peak and throttled_ns) and live slots
 *   regiondump forge FILE PID START IDX BYTES
 *                                         write a slot as a (possibly stale)
 *                                         process would have left it
 *   regiondump hold LIMITS PID IDX BYTES READY [held]
 *                                         publish BYTES on limits index IDX in
 *                                         the ledger (src/ledger.c): a lease
 *                                         of the pool from PID * 4096 on (or,
 *                                         with "held", what slot PID holds),
 *                                         touch READY, wait to be killed (a
 *                                         forged ledger entry)
 *   regiondump ledger LIMITS PID IDX     print "lease=N held=M": every lease
 *                                         on limits index IDX (the pool and
 *                                         the overflow, whoever holds them)
 *                                         and what slot PID says it holds (a
 *                                         process's slot is its pid unless
 *                                         another process holds that one)
 *   regiondump overflow LIMITS IDX       print the bytes of limits index IDX's
 *                                         overflow interval anyone holds
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "region.h"

/*
 * The ledger's lock space, written out here from its description in
 * src/ledger.c rather than taken from it: GPU d's pool at d * 2^58 (as long
 * as the limit), its overflow at d * 2^58 + 2^48 (2^47 long); held below.
 */
static int hold(int argc, char **argv)
{
	if (argc != 7 && !(argc == 8 && !strcmp(argv[7], "held"))) {
		fprintf(stderr, "usage: regiondump hold LIMITS PID IDX BYTES READY [held]\n");
		return 2;
	}
	/* Gone with whoever started it (a test that execs over its shell leaves no one to kill it). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	int fd = open(argv[2], O_RDONLY);
	if (fd < 0) {
		perror(argv[2]);
		return 1;
	}
	long long pid = atoll(argv[3]), d = atoll(argv[4]);
	unsigned long long bytes = strtoull(argv[5], NULL, 10);
	off_t hi = (off_t)(d << 58) + (off_t)(pid << 12), lo = hi + (off_t)bytes;
	unsigned long long unit = 1;
	if (argc == 8) { /* the held ranges, described at ledger() below */
		off_t hb = (off_t)(d << 58) + ((off_t)1 << 57) + ((off_t)1 << 56);
		hi = hb + (off_t)(pid << 31);
		lo = hb + ((off_t)1 << 53) + (off_t)(pid << 16);
		unit = 65536;
	}
	struct flock a = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = hi, .l_len = (off_t)(bytes / unit)};
	struct flock b = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = lo, .l_len = unit == 1 ? 0 : (off_t)(bytes % unit)};
	if ((a.l_len && fcntl(fd, F_OFD_SETLK, &a) != 0) || (b.l_len && fcntl(fd, F_OFD_SETLK, &b) != 0)) {
		perror("F_OFD_SETLK");
		return 1;
	}
	int r = open(argv[6], O_WRONLY | O_CREAT, 0644);
	if (r < 0) {
		perror(argv[6]);
		return 1;
	}
	close(r);
	for (;;)
		pause();
}

/* The length of the lock another description holds at start (0: none). */
static long long lock_len(int fd, off_t start, off_t span)
{
	struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = span};
	if (fcntl(fd, F_OFD_GETLK, &q) != 0) {
		perror("F_OFD_GETLK");
		exit(1);
	}
	return q.l_type == F_UNLCK ? 0 : (long long)q.l_len;
}

/* The bytes of [lo, hi) under another description's lock (the union), one query per lock and gap. */
static long long covered(int fd, off_t lo, off_t hi)
{
	if (lo >= hi)
		return 0;
	struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = lo, .l_len = hi - lo};
	if (fcntl(fd, F_OFD_GETLK, &q) != 0) {
		perror("F_OFD_GETLK");
		exit(1);
	}
	if (q.l_type == F_UNLCK)
		return 0;
	off_t s = q.l_start > lo ? q.l_start : lo, e = q.l_len && q.l_start + q.l_len < hi ? q.l_start + q.l_len : hi;
	return (long long)(e - s) + covered(fd, lo, s) + covered(fd, e, hi);
}

/* argv[2], the limits file, opened for a command of want arguments: the
 * descriptor, or minus the exit status (2: usage, 1: no file). */
static int open_limits(int argc, int want, char **argv, const char *usage)
{
	if (argc != want) {
		fprintf(stderr, "usage: regiondump %s\n", usage);
		return -2;
	}
	int fd = open(argv[2], O_RDONLY);
	if (fd < 0) {
		perror(argv[2]);
		return -1;
	}
	return fd;
}

/*
 * The limits file's ledger.shards (0: none), and shard j's descriptor: the
 * file j of $NRI_VGPU_LEDGER_DIR (the limits file itself without shards).
 */
static int shards_of(int lfd)
{
	char buf[4097];
	ssize_t n = pread(lfd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	const char *k = strstr(buf, "ledger.shards=");
	return k ? atoi(k + strlen("ledger.shards=")) : 0;
}

static int shard_fd(int lfd, int k, int j)
{
	const char *dir = getenv("NRI_VGPU_LEDGER_DIR");
	if (!k)
		return lfd;
	char p[4200];
	snprintf(p, sizeof(p), "%s/%d", dir ? dir : "", j);
	int f = open(p, O_RDONLY);
	if (f < 0) {
		perror(p);
		exit(1);
	}
	return f;
}

/*
 * Lease: the pool and the overflow above; with K shards, the pool is cut in
 * K sub-pools, sub-pool j at the same place on shard j, and a slot's ranges
 * lie on shard slot % K. Held, in units of 2^16: d * 2^58 +
 * 2^57 + 2^56 + pid * 2^31 (bytes / 65536), and + 2^53 + pid * 2^16 (bytes %
 * 65536).
 */
static int ledger(int argc, char **argv)
{
	int fd = open_limits(argc, 5, argv, "ledger LIMITS PID IDX");
	if (fd < 0)
		return -fd;
	long long pid = atoll(argv[3]), d = atoll(argv[4]);
	off_t base = (off_t)(d << 58), hb = base + ((off_t)1 << 57) + ((off_t)1 << 56);
	int k = shards_of(fd);
	long long lease = covered(fd, base + ((off_t)1 << 48), base + ((off_t)1 << 48) + ((off_t)1 << 47));
	for (int j = 0; j < (k ? k : 1); j++)
		lease += covered(shard_fd(fd, k, j), base, base + ((off_t)1 << 47));
	int hf = shard_fd(fd, k, k ? (int)(pid % k) : 0);
	long long held = lock_len(hf, hb + (off_t)(pid << 31), (off_t)1 << 31) * 65536 +
			 lock_len(hf, hb + ((off_t)1 << 53) + (off_t)(pid << 16), 65536);
	printf("lease=%lld held=%lld\n", lease, held);
	return 0;
}

static int overflow(int argc, char **argv)
{
	int fd = open_limits(argc, 4, argv, "overflow LIMITS IDX");
	if (fd < 0)
		return -fd;
	off_t over = ((off_t)atoll(argv[3]) << 58) + ((off_t)1 << 48);
	printf("%lld\n", covered(fd, over, over + ((off_t)1 << 47)));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "overflow"))
		return overflow(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "hold"))
		return hold(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "ledger"))
		return ledger(argc, argv);
	int forge = argc == 7 && !strcmp(argv[1], "forge");
	const char *path = forge ? argv[2] : argv[1];
	if (argc < 2 || (!forge && argc != 2)) {
		fprintf(stderr, "usage: regiondump FILE | regiondump forge FILE PID START IDX BYTES\n");
		return 2;
	}
	int fd = open(path, forge ? O_RDWR : O_RDONLY);
	if (fd < 0) {
		perror(path);
		return 1;
	}
	struct flock fl = {.l_type = forge ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET};
	fcntl(fd, F_OFD_SETLKW, &fl);
	struct vgpu_region *r = mmap(NULL, sizeof(*r), forge ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	if (r == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	if (forge) {
		int idx = atoi(argv[5]);
		unsigned long long bytes = strtoull(argv[6], NULL, 10);
		for (int i = 0; i < VGPU_MAX_PROCS; i++)
			if (!r->procs[i].pid) {
				r->procs[i].pid = atoi(argv[3]);
				r->procs[i].start_time = strtoull(argv[4], NULL, 10);
				r->procs[i].used[idx] = bytes;
				r->devices[idx].used += bytes;
				printf("forged slot %d\n", i);
				return 0;
			}
		return 1;
	}
	printf("magic=%s version=%u size=%llu devices=%u slots=%u\n",
	       r->hdr.magic == VGPU_REGION_MAGIC ? "ok" : "BAD", r->hdr.version, (unsigned long long)r->hdr.size,
	       r->hdr.device_count, r->hdr.proc_slots);
	for (unsigned d = 0; d < r->hdr.device_count && d < VGPU_MAX_DEVICES; d++)
		printf("dev %u uuid=%s limit=%llu used=%llu cores=%u peak=%llu throttled_ns=%llu\n", d,
		       r->devices[d].uuid, (unsigned long long)r->devices[d].limit,
		       (unsigned long long)r->devices[d].used, r->devices[d].cores,
		       (unsigned long long)r->devices[d].peak, (unsigned long long)r->devices[d].throttled_ns);
	for (int i = 0; i < VGPU_MAX_PROCS; i++)
		if (r->procs[i].pid)
			printf("proc pid=%d host_pid=%d start=%llu used0=%llu launches0=%llu\n", r->procs[i].pid, r->procs[i].host_pid,
			       (unsigned long long)r->procs[i].start_time, (unsigned long long)r->procs[i].used[0],
			       (unsigned long long)r->procs[i].launches[0]);
	return 0;
}
