# Tests of paths around the quota: forged host pid claims, a memory pool past
# the limit, limits without a host pid, multicast on an unknown device, graph
# node changes, a claim taken after the program read the limits (sourced by
# run.sh; uses its helpers and those of t_nvmlprocs.sh and t_pools.sh).

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
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
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

test_harden_limit_unknown_host_pid() {
	# Whose host pid stays unknown (NVML's list failed at its first context, in a pid namespace)
	# cannot have its footprint measured; cuCtxSetLimit is charged from the value asked all the
	# same: the heap and FIFO their size, the stack its size x 2048 threads x 132 SMs (1 KiB:
	# 264 MiB); past the quota it is refused; set back, it is given back; set twice, counted once.
	setup $((512 * MiB))
	pidns $PIDNS
	export FAKECUDA_FAIL=nvmlDeviceGetComputeRunningProcesses:1
	run init setlimit:2:256MiB alloc:256MiB alloc:1:2
	run init setlimit:0:1KiB alloc:248MiB alloc:1:2
	run init setlimit:1:200MiB setlimit:1:200MiB alloc:312MiB alloc:1:2
	run init alloc:1MiB setlimit:2:512MiB:2 alloc:511MiB
	run init setlimit:2:256MiB setlimit:2:0 alloc:512MiB
	# The process's slot shows no host pid: it really was unknown.
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init setlimit:2:64MiB touch:"$T/held" waitfile:"$T/go" >"$T/out" 2>"$T/err" &
	waitfor "$T/held" $!
	expect "used while the heap is set" "$(used)" $((64 * MiB))
	expect "host pids known" "$(hostpids | awk '$2 > 0' | wc -l)" 0
	touch "$T/go"
	wait
}
t harden_limit_unknown_host_pid test_harden_limit_unknown_host_pid

test_harden_multicast_unknown_device() {
	local m
	for m in "-m direct" "-m rt12"; do
		setup $((64 * MiB))
		# The driver cannot say which device a handle bound with cuMulticastBindMem (v1) is on:
		# an unbind of another device leaves it bound and charged; it goes once every device
		# (two here) has unbound the range.
		# shellcheck disable=SC2086
		FAKECUDA_NO_ALLOC_PROPS=1 run $m init create:0:64MiB mccreate:64MiB mcbind:64MiB free alloc:1:2 \
			mcunbind:1:64MiB alloc:1:2 mcunbind:0:64MiB alloc:64MiB
		# Known by the time of the unbind (the handle not yet released), the device is asked
		# anew: its own unbind releases the bind, and the release then frees the memory.
		touch "$T/noprops"
		# shellcheck disable=SC2086
		FAKECUDA_NO_ALLOC_PROPS=$T/noprops LD_PRELOAD=$SHIM timeout 60 "$PROG" $m init create:0:64MiB \
			mccreate:64MiB mcbind:64MiB touch:"$T/bound" waitfile:"$T/go" mcunbind:0:64MiB free alloc:64MiB \
			>"$T/out" 2>"$T/err" &
		waitfor "$T/bound" $!
		rm "$T/noprops"
		touch "$T/go"
		wait $! || { echo "    cudaprog failed"; cat "$T/out" "$T/err"; return 1; }
		expect "$m used" "$(used)" 0
	done
}
t harden_multicast_unknown_device test_harden_multicast_unknown_device

test_harden_graph_node_changes() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB)) 100 hard debug
		# Per-node changes of an executable graph change what a launch runs, and what the SM
		# limiter charges for it: 100 + 264 blocks at instantiation (1 + 2 waves of 132 SMs);
		# the second kernel set to 660 (5 waves); the first disabled; set to 132 while disabled
		# (still not run); enabled again; the second set to 1 block through the generic setter.
		# The launch then runs 132 + 1 blocks: 2 waves of 1 ms on the fake GPU.
		# shellcheck disable=SC2086
		grun $m init graph kernel:100 kernel:264 inst setk:1:660 enable:0:0 setk1:0:132 enable:0:1 setnode:1:1 \
			launch sync busy:2000000
		local got
		got=$(sed -n 's/.*graph exec 0x[0-9a-f]*\( changed\)*: \([0-9]*\) thread blocks a launch.* \([0-9]*\) waves.*/\2:\3/p' "$T/err" | paste -sd' ' -)
		expect "$m blocks:waves after each change" "$got" "364:3 760:6 660:5 660:5 792:6 133:2"
		# A conditional node runs its body an unknown number of times: charged 1024 waves.
		# shellcheck disable=SC2086
		grun $m init graph kernel:1 cond inst
		grep -q 'graph exec 0x[0-9a-f]*: 135169 thread blocks a launch, 0 bytes of graph memory, 1025 waves' "$T/err"
	done
}
t harden_graph_node_changes test_harden_graph_node_changes

test_harden_claim_after_program_reads_limits() {
	# A program that reads the limits file itself closes a descriptor of it, which drops every
	# process-associated lock of the process on it, its host pid claim included. The claim is
	# taken again (here by the SM limiter's watcher, which writes it every 100 ms): nvidia-smi
	# in the container still matches the process with NVML's entry (a graphics client here,
	# listed only when matched).
	setup $GiB 50
	FAKECUDA_PROC_KIND=graphics LD_PRELOAD=$SHIM "$PROG" init alloc:64MiB launch:1 readfile:"$T/limits" \
		sleep:1000 touch:"$T/held" waitfile:"$T/go" >"$T/out" 2>"$T/err" &
	local p=$!
	waitfor "$T/held" $p
	np_smi 0
	touch "$T/go"
	wait $p
	np_expect GraphicsRunningProcesses "$p:$((64 * MiB))"
}
t harden_claim_after_program_reads_limits test_harden_claim_after_program_reads_limits
