# Readers of the ledger. Views (src/quota.c): what cuMemGetInfo and NVML's memory figures
# report of the other processes comes from the process's last measurement of the ledger, at
# most a keeper period old, while every decision measures afresh. The SM limiter's host pids
# (src/limiter.c): enumerated again only when the samples name a process not known at the
# last enumeration, or a second on. Sourced by run.sh.

# fcntl_between LOG M1 M2 — fcntl and fstat calls the traced program's first thread made between
# its opens of the files M1 and M2 (strace -f -o LOG: each line starts with the thread's id).
fcntl_between() {
	awk -v m1="$2" -v m2="$3" '
		NR == 1 { main = $1 }
		$1 != main { next }
		index($0, m1) { on = 1; next }
		index($0, m2) { on = 0 }
		on && /(^| )(fcntl|fstat|newfstatat)\(/ { n++ }
		END { print n + 0 }' "$1"
}

test_view_loop_no_syscall() {
	# A program that asks for free memory in a loop (a framework planning each step) makes no
	# system call for it: the view is measured at most once a keeper period, not per call (each
	# measurement is a few queries of the limits file, more with every process in the container).
	command -v strace >/dev/null || { echo "    strace is missing (hack/deps.sh installs it)"; return 1; }
	setup $GiB
	LD_PRELOAD=$SHIM timeout 60 strace -f -o "$T/trace" -e trace=fcntl,fstat,newfstatat,openat \
		"$PROG" init alloc:1MiB info:1023MiB:1GiB touch:"$T/m1" infoloop:2000 touch:"$T/m2" \
		info:1023MiB:1GiB >"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err"; return 1; }
	local ms n
	ms=$(sed -n 's/^infoloop ms=//p' "$T/out")
	n=$(fcntl_between "$T/trace" "$T/m1" "$T/m2")
	# At most one measurement (five calls) a started keeper period of the loop, and one more.
	if [ "$n" -gt $(((ms / 90 + 2) * 5)) ]; then
		echo "    2000 cuMemGetInfo calls in $ms ms made $n fcntl/fstat calls"
		return 1
	fi
}

test_view_catches_up() {
	# Another process allocates after this one looked: a keeper period later this one's
	# cuMemGetInfo and NVML report it (the view is never older than that).
	setup $GiB
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/b.ready" waitfile:"$T/a.looked" alloc:64MiB \
		touch:"$T/b.held" waitfile:"$T/end" >"$T/out.b" 2>"$T/err.b" &
	local b=$!
	waitfor "$T/b.ready" $b || { cat "$T/out.b" "$T/err.b"; return 1; }
	run init alloc:1MiB info:1023MiB:1GiB nvml:0:1GiB:1MiB:1023MiB touch:"$T/a.looked" \
		waitfile:"$T/b.held" sleep:100 info:959MiB:1GiB nvml:0:1GiB:65MiB:959MiB || {
		touch "$T/end"
		wait $b
		return 1
	}
	touch "$T/end"
	wait $b
}

test_view_refusal_fresh() {
	# The tenant's strongest play against a view: another process fills the container right
	# after this one looked (its view still says 1 MiB used). This process's next grant measures
	# its view again: NVML says 50 MiB used, not 2 (free depends on whether the grant found room
	# for a chunk beside its stretch). Its next allocation is refused (a grant never reads a
	# view); what it leased but did not use goes back with the refusal: 14 MiB free.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/b.ready" waitfile:"$T/a.looked" alloc:48MiB \
		touch:"$T/b.held" waitfile:"$T/end" >"$T/out.b" 2>"$T/err.b" &
	local b=$! r=0
	waitfor "$T/b.ready" $b || { cat "$T/out.b" "$T/err.b"; return 1; }
	run init alloc:1MiB info:63MiB:64MiB touch:"$T/a.looked" waitfile:"$T/b.held" alloc:1MiB \
		nvml:0:64MiB:50MiB:- alloc:32MiB:2 info:14MiB:64MiB || r=1
	touch "$T/end"
	wait $b || r=1
	return $r
}

test_view_pool_decision_fresh() {
	# A pool serving from what it already holds decides on the container's use outside a grant
	# (src/pool.c): that reading is measured afresh, never taken from the view. Another process
	# carries the container past its limit (a module, counted even past it) right after this one
	# looked; this one's next pool allocation, which its pool could serve, is refused.
	setup $((256 * MiB))
	export FAKECUDA_MODULE_BYTES=$((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/b.ready" waitfile:"$T/a.looked" alloc:200MiB \
		modload:data touch:"$T/b.held" waitfile:"$T/end" >"$T/out.b" 2>"$T/err.b" &
	local b=$! r=0
	unset FAKECUDA_MODULE_BYTES
	waitfor "$T/b.ready" $b || { cat "$T/out.b" "$T/err.b"; return 1; }
	run init threshold:max async:48MiB free info:208MiB:256MiB touch:"$T/a.looked" waitfile:"$T/b.held" \
		async:16MiB:2 || r=1
	touch "$T/end"
	wait $b || r=1
	return $r
}

test_sm_hostpids_enumerated_rarely() {
	# A process launching flat out at a 50 % share, NVML sampling every 20 ms (each of the
	# watcher's ticks sees fresh samples): it alone in its container, and no other process on
	# the GPU, its watcher enumerates the container's host pid claims (the first query of each
	# enumeration: below) at its start and then once a second, not at every
	# tick; the share still holds. Each enumeration asks once for the part of the claims' ranges
	# below the first claim, which starts where the ranges start and holds none.
	command -v strace >/dev/null || { echo "    strace is missing (hack/deps.sh installs it)"; return 1; }
	setup $GiB 50 hard
	FAKECUDA_SAMPLE_MS=20 LD_PRELOAD=$SHIM timeout 60 strace -f -o "$T/trace" -e trace=fcntl \
		"$PROG" init launchfor:2:0:1 >"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err"; return 1; }
	# With ledger shards an enumeration asks that query once on each shard: count the
	# queries on each descriptor, and take the most any one of them saw.
	local n
	n=$(grep "F_OFD_GETLK, {l_type=F_UNLCK, l_whence=SEEK_SET, l_start=$((1 << 62))," "$T/trace" |
		sed -n 's/^[0-9]* *fcntl(\([0-9]*\),.*/\1/p' | sort | uniq -c | sort -rn | awk 'NR == 1 { print $1 }')
	n=${n:-0}
	echo "    info: $n enumerations of the host pid claims in 2 s of launches"
	if [ "$n" -lt 1 ] || [ "$n" -gt 4 ]; then
		echo "    host pid claims enumerated $n times in 2 s (want 1 to 4)"
		return 1
	fi
	share_in "$T/out" 40 60
}

t view_loop_no_syscall test_view_loop_no_syscall
t view_catches_up test_view_catches_up
t view_refusal_fresh test_view_refusal_fresh
t view_pool_decision_fresh test_view_pool_decision_fresh
t sm_hostpids_enumerated_rarely test_sm_hostpids_enumerated_rarely
