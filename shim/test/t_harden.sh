# Tests of faults a review found in the shim's newer code (sourced by run.sh; uses its helpers
# and those of t_nvmlprocs.sh and t_pools.sh).

# forge_claim KIND CLAIMER HOSTPID NAME — a process that takes one read lock of length 1 on the
# read-only limits file where pid CLAIMER's host pid claim would be (2^62 + CLAIMER * 2^32 +
# HOSTPID), until $T/end exists. KIND: posix (a lock of the process; CLAIMER "self": its own
# pid) or ofd (an open file description's lock).
forge_claim() {
	python3 - "$T/limits" "$1" "$2" "$3" "$T/$4.forged" "$T/end" <<'PY' &
import fcntl, os, struct, sys, time
path, kind, claimer, hp, ready, end = sys.argv[1:]
claimer = os.getpid() if claimer == "self" else int(claimer)
fd = os.open(path, os.O_RDONLY)
off = (1 << 62) + claimer * (1 << 32) + int(hp)
if kind == "posix":
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, off)
else:  # F_OFD_SETLK = 37; struct flock: type, whence, start, len, pid
    fcntl.fcntl(fd, 37, struct.pack("hhxxxxqqixxxx", fcntl.F_RDLCK, os.SEEK_SET, off, 1, 0))
open(ready, "w").close()
while not os.path.exists(end):
    time.sleep(0.05)
PY
	waitfor "$T/$4.forged" $!
}

test_harden_forged_claims() {
	# A process of the container cannot make another container's process appear in its NVML
	# lists by claiming that process's host pid: not under a pid that does not exist, not under
	# a process of the container that holds its own claim, not with a lock of an open file
	# description (whose holder the kernel does not name). The container's own process is still
	# listed, with its bytes, and only it has utilisation samples.
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	np_worker ours a1 0 $((64 * MiB)) launch
	np_worker other b 0 $((32 * MiB)) launch
	local a1 b
	a1=$(np_pid a1)
	b=$(np_pid b)
	forge_claim posix 4242 "$b" f1
	forge_claim posix "$a1" "$b" f2
	forge_claim ofd self "$b" f3
	SMI_UTIL=1 np_smi 0
	np_expect ComputeRunningProcesses "$a1:$((80 * MiB))"
	np_expect ComputeRunningProcesses_v3 "$a1:$((80 * MiB))"
	np_expect DetailList/mode0 "$a1:$((80 * MiB))"
	local call
	for call in ProcessUtilization ProcessesUtilizationInfo; do
		expect "$call samples of" "$(sed -n "s/^util $call //p" "$T/smi.out" | tr , '\n' | sort -u | paste -sd, -)" "$a1"
	done
	np_end
}
t harden_forged_claims test_harden_forged_claims

test_harden_pool_over_limit() {
	local m
	for m in "-m direct" "-m rt12"; do
		setup $((512 * MiB))
		# The driver grows the pool by more than the shim reserved ahead (a 1 GiB grain here; on
		# hardware: alignment, reuse policies, fragmentation): the container is charged the
		# 1 GiB, past its 512 MiB, and from then on nothing is admitted, not even what fits in
		# what the pool holds by the shim's count, nor a plain allocation.
		# shellcheck disable=SC2086
		FAKECUDA_POOL_GRAIN=$GiB held over $m init async:1MiB async:400MiB:2 async:400MiB:2 async:1:2 alloc:1MiB:2
		expect "$m used after a 1 GiB growth" "$(used)" $GiB
		release over
		# Freed and given back at the synchronisation, the pool serves again.
		# shellcheck disable=SC2086
		FAKECUDA_POOL_GRAIN=$GiB run $m init async:1MiB async:400MiB:2 free sync async:400MiB free sync alloc:512MiB
		# Under the quota a pool that keeps what is freed (PyTorch's) is reused to the limit.
		# shellcheck disable=SC2086
		run $m init threshold:max async:512MiB free async:256MiB async:256MiB alloc:1:2 free free async:512MiB
	done
}
t harden_pool_over_limit test_harden_pool_over_limit
