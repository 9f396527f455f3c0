# Ledger slots (src/ledger.c): processes that share one limits file from different pid
# namespaces (the containers of a pod sharing a DRA claim), sourced by run.sh.

OWN_AT=$(((1 << 62) + (1 << 54))) # a slot's ownership byte: OWN_AT + slot
ID_AT=$((OWN_AT + (1 << 22)))     # its identity byte: ID_AT + slot
HELD_AT=$(((1 << 57) + (1 << 56))) # GPU 0's held reports: HELD_AT + slot * 2^31, in units of 64 KiB

# in_ns OFFSET NAME CMD... — CMD as pid 1 of a new pid namespace (with its own /proc) whose pids
# fake NVML reports as pid + OFFSET, in the background; its pid there lands in $T/NAME.nspid,
# its pid here in $T/NAME.hostpid once it runs.
in_ns() {
	local off=$1 name=$2
	shift 2
	FAKECUDA_PIDNS_OFFSET=$off LD_PRELOAD=$SHIM unshare --pid --fork --mount-proc sh -c \
		'echo $$ >"$1.nspid"; shift; exec "$@"' sh "$T/$name" "$@" \
		>"$T/$name.out" 2>"$T/$name.err" &
	local u=$!
	waitfor "$T/$name.nspid" $u || return 1
	local c
	for _ in $(seq 200); do
		c=$(cat /proc/$u/task/$u/children 2>/dev/null | tr -d ' ')
		[ -n "$c" ] && break
		sleep 0.05
	done
	echo "$c" >"$T/$name.hostpid"
}

# exact_rest BYTES — a fresh process can take exactly BYTES more and not one byte beyond: every
# process's lease is counted (none hides under another's in a shared slot).
exact_rest() {
	run init alloc:"$1" alloc:1:2
}

test_slots_same_pid_two_namespaces() {
	# Two processes with one pid, each pid 1 of its own pid namespace, share the limits file:
	# both allocate, and together they stay within the limit (64 MiB: A holds 40, B's 40 is
	# refused, its 20 passes, A's 8 more is refused then).
	setup $((64 * MiB))
	in_ns 1000000 a "$PROG" init alloc:40MiB touch:"$T/a.held" waitfile:"$T/b.held" alloc:8MiB:2 \
		touch:"$T/a.done" waitfile:"$T/end"
	waitfor "$T/a.held" || { cat "$T/a.out" "$T/a.err"; return 1; }
	in_ns 2000000 b "$PROG" init alloc:40MiB:2 alloc:20MiB touch:"$T/b.held" waitfile:"$T/end"
	waitfor "$T/a.done" || { cat "$T/a.out" "$T/a.err" "$T/b.out" "$T/b.err"; return 1; }
	expect "pids in their namespaces" "$(cat "$T/a.nspid") $(cat "$T/b.nspid")" "1 1"
	exact_rest $((4 * MiB))
	touch "$T/end"
	wait
	# Each says only that its quota was exceeded, once: nothing about the ledger.
	expect "A's stderr" "$(grep -c . "$T/a.err") $(grep -c 'quota exceeded' "$T/a.err")" "1 1"
	expect "B's stderr" "$(grep -c . "$T/b.err") $(grep -c 'quota exceeded' "$T/b.err")" "1 1"
}

test_slots_reports_two_namespaces() {
	# What each namespace sees: used = both processes' bytes (cuMemGetInfo and NVML); NVML's
	# compute list in one namespace names only its own process, under its pid there, and never
	# the other's host pid; the bytes of the process it cannot name go to the one it lists, so
	# the list adds up to used.
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	in_ns 1000000 a "$NPROG" worker 0 $((64 * MiB)) "$T/a.pid" "$T/end"
	waitfor "$T/a.pid" || { cat "$T/a.out"; return 1; }
	in_ns 2000000 b "$NPROG" worker 0 $((32 * MiB)) "$T/b.pid" "$T/end"
	waitfor "$T/b.pid" || { cat "$T/b.out"; return 1; }
	expect "pids in their namespaces" "$(cat "$T/a.pid") $(cat "$T/b.pid")" "1 1"
	local used=$((128 * MiB)) v ns off
	for ns in a b; do
		off=1000000
		[ $ns = b ] && off=2000000
		nsenter -t "$(cat "$T/$ns.hostpid")" -p -m env FAKECUDA_PIDNS_OFFSET=$off LD_PRELOAD="$SHIM" \
			"$NPROG" smi 0 >"$T/smi.out" 2>"$T/smi.err" || { cat "$T/smi.out" "$T/smi.err"; return 1; }
		expect "used seen from $ns" "$(grep '^used ' "$T/smi.out")" "used $used"
		for v in "" _v2 _v3; do
			np_expect ComputeRunningProcesses$v "1:$used"
		done
		if grep -q "[^0-9]2000001:\|[^0-9]1000001:" "$T/smi.out"; then
			echo "    a host pid is named in $ns: $(grep '^list Compute' "$T/smi.out" | head -1)"
			return 1
		fi
		nsenter -t "$(cat "$T/$ns.hostpid")" -p -m env FAKECUDA_PIDNS_OFFSET=$off LD_PRELOAD="$SHIM" \
			timeout 60 "$PROG" init info:-:$GiB nvml:0:$GiB:$((used + 16 * MiB)):- \
			>"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err"; return 1; }
	done
	np_end
}

# race_start N DIR OFFSET — N processes started by one shell (so their pids follow one another in
# its namespace) that take a context once all N are started (a thread made earlier, such as the
# shim's keeper when a racer finds the region busy at its start, would take a pid between two of
# them), wait for $T/go, allocate 1 MiB, then wait for $T/end.
race_start() {
	local n=$1 dir=$2
	mkdir -p "$T/$dir"
	in_ns "$3" "$dir.sh" sh -c 'for i in $(seq "$1"); do
		"$2" waitfile:"$3/forked" init touch:"$3/ready.$i" waitfile:"$4/go" alloc:1MiB touch:"$3/held.$i" \
			waitfile:"$4/end" >"$3/out.$i" 2>"$3/err.$i" &
	done; touch "$3/forked"; wait' race "$n" "$PROG" "$T/$dir" "$T"
}

nspids() { # nspids PID — the pids of PID's children in their own namespace, sorted
	local c
	for c in $(pgrep -P "$1"); do awk '/^NSpid/ {print $NF}' /proc/"$c"/status; done | sort -n | paste -sd' '
}

race_wait() { # race_wait FILE_PREFIX N — until N files FILE_PREFIX.* exist
	local i
	for i in $(seq 1200); do
		[ "$(ls "$1".* 2>/dev/null | wc -l)" -ge "$2" ] && return 0
		sleep 0.05
	done
	echo "    timed out: $(ls "$1".* 2>/dev/null | wc -l) of $2 $1.*"
	return 1
}

test_slots_race() { # NAMESPACES
	# 64 processes take their slots at once, all in one pid namespace or half in each of two
	# (where the two halves have the same pids): none is refused below the quota and each
	# lease is counted on its own, so a 65th process finds exactly the rest.
	setup $GiB
	local per=$((64 / $1)) k
	for k in $(seq "$1"); do
		race_start $per r$k $((k * 1000000))
	done
	for k in $(seq "$1"); do
		race_wait "$T/r$k/ready" $per
	done
	touch "$T/go"
	for k in $(seq "$1"); do
		race_wait "$T/r$k/held" $per || { cat "$T"/r$k/err.* | sort | uniq -c | head; return 1; }
	done
	if [ "$1" = 2 ]; then
		# The racers' pids in their namespaces: the same in both.
		local k1 k2
		k1=$(nspids "$(cat "$T/r1.sh.hostpid")")
		k2=$(nspids "$(cat "$T/r2.sh.hostpid")")
		expect "racers' pids in the second namespace" "$k2" "$k1"
		expect "racers in the first" "$(echo $k1 | wc -w)" $per
	fi
	sleep 0.3 # the racers' unused leases go back when they are quiet
	# The report lists every racer once, whichever namespace it is in.
	expect "region slots" "$(slots)" 64
	expect "region used" "$(used)" $((64 * MiB))
	exact_rest $((GiB - 64 * MiB))
	expect "refusals" "$(cat "$T"/r*/err.* | sort | uniq -c)" ""
	touch "$T/end"
	wait
}

# forger — writes $T/forge.py: LIMITS KIND START LEN READY holds a read lock on LIMITS until
# killed, KIND ofd (an open file description's) or posix (a process's: readers see its holder).
forger() {
	cat >"$T/forge.py" <<-'EOF'
		import fcntl, os, struct, sys, time
		fd = os.open(sys.argv[1], os.O_RDONLY)
		cmd = 37 if sys.argv[2] == "ofd" else fcntl.F_SETLK  # 37: F_OFD_SETLK
		fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, int(sys.argv[3]), int(sys.argv[4]), 0))
		open(sys.argv[5], "w").close()
		time.sleep(120)
	EOF
}

test_slots_forged() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A lock forged on a process's pid slot before it starts (on the ownership byte, on the
	# identity byte, in its held range) costs only that slot: the process takes another, says
	# nothing, and the quota is what it was (a held report is a report, not a lease).
	setup $((64 * MiB))
	forger
	local n=0 kind base mult len
	for spec in "ofd $OWN_AT 1 1" "posix $ID_AT 1 1" "ofd $HELD_AT $((1 << 31)) 1"; do
		read -r kind base mult len <<<"$spec"
		n=$((n + 1))
		# The shell's pid is the program's (exec): forge on it first.
		LD_PRELOAD=$SHIM timeout 60 bash -c 'python3 "$1" "$2" "$3" $(($4 + $$ * $5)) "$6" "$7" &
			while [ ! -e "$7" ]; do sleep 0.01; done
			shift 7
			exec "$@"' forge "$T/forge.py" "$T/limits" "$kind" "$base" "$mult" "$len" "$T/forged.$n" \
			"$PROG" init alloc:40MiB touch:"$T/held.$n" waitfile:"$T/end.$n" >"$T/out" 2>"$T/err" &
		local p=$!
		waitfor "$T/held.$n" $p || { cat "$T/out" "$T/err"; return 1; }
		expect "stderr ($kind lock at $base + pid * $mult)" "$(cat "$T/err")" ""
		exact_rest $((24 * MiB))
		touch "$T/end.$n"
		wait $p
		pkill -f "$T/forged.$n" || true
	done
}

test_slots_forged_after() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A lock forged over the whole pool after a process took its lease, its own stretch included:
	# what it holds stays its own (1 MiB, and it frees and takes it again), every byte beyond is
	# refused (self-harm: its container's only), and once the forger is gone the quota is whole.
	setup $((64 * MiB))
	forger
	LD_PRELOAD=$SHIM "$PROG" init alloc:1MiB touch:"$T/held" waitfile:"$T/forged" sleep:300 \
		alloc:32MiB:2 alloc:1:2 >"$T/out" 2>"$T/err" &
	local p=$!
	waitfor "$T/held" $p
	python3 "$T/forge.py" "$T/limits" ofd 0 $((64 * MiB)) "$T/forged" &
	local f=$!
	wait $p || { cat "$T/out" "$T/err"; kill $f; return 1; }
	run init alloc:1:2 || { kill $f; return 1; }
	kill $f
	wait $f 2>/dev/null || true
	exact_rest $((64 * MiB))
}

test_ledger_forced_debt() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A tenant's process holds read locks over GPU 0's whole pool and its whole overflow while
	# three processes create contexts (300 MiB each on the fake): charges the driver already
	# handed out, forced, which neither interval has room for. They are kept as each process's
	# debt (counted by every grant of the container) and placed once the forger lets go; then
	# each process fills what the quota has left in 64 MiB steps. The fake GPU's peak use,
	# contexts included, never passes the 1 GiB quota. Charges dropped by the ledger let the
	# container reach the contexts' 900 MiB plus a full quota of allocations.
	setup $GiB
	forger
	export FAKECUDA_CTX_BYTES=$((300 * MiB))
	python3 "$T/forge.py" "$T/limits" ofd 0 $GiB "$T/forged.pool" &
	local f1=$!
	python3 "$T/forge.py" "$T/limits" ofd $((1 << 48)) $((1 << 47)) "$T/forged.over" &
	local f2=$!
	waitfor "$T/forged.pool" $f1 && waitfor "$T/forged.over" $f2 || return 1
	local i pids=() r=0
	for i in 1 2 3; do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/ctx.$i" waitfile:"$T/go" fill:64MiB \
			touch:"$T/full.$i" waitfile:"$T/end" >"$T/out.$i" 2>"$T/err.$i" &
		pids+=($!)
		waitfor "$T/ctx.$i" $! || { cat "$T/err.$i"; kill $f1 $f2; return 1; }
	done
	expect "debt warnings of the first process" "$(grep -c "counted as this process's debt" "$T/err.1")" 1 || r=1
	kill $f1 $f2
	wait $f1 $f2 2>/dev/null || true
	touch "$T/go"
	for i in 1 2 3; do
		waitfor "$T/full.$i" "${pids[i - 1]}" || { cat "$T/out.$i" "$T/err.$i"; r=1; }
	done
	echo "    info: after the forger: $(cat "$T"/out.* | grep -h '^filled' | tr '\n' ' ')"
	local peak
	peak=$("$PROG" peak:0:$GiB 2>&1) || { echo "    $peak"; r=1; }
	echo "    info: fake GPU peak ${peak#peak } (quota $GiB)"
	touch "$T/end"
	wait "${pids[@]}" || r=1
	return $r
}

test_slots_none_free() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# Every ownership byte held by someone else: no slot, GPU memory refused with one line.
	setup $((64 * MiB))
	forger
	python3 "$T/forge.py" "$T/limits" ofd $OWN_AT $((1 << 22)) "$T/forged" &
	local f=$!
	waitfor "$T/forged" $f
	run init alloc:1MiB:2 managed:1MiB:2 || { kill $f; return 1; }
	kill $f
	expect "stderr lines" "$(grep -c . "$T/err")" 1
	grep -q "no free slot in the container's ledger" "$T/err"
	run init alloc:64MiB alloc:1:2
}

test_slots_sm_share_two_namespaces() { # [visible]
	# Two containers of a pod share one claim (one limits file, cores = 30), each from its own pid
	# namespace: one launches flat out, the other a steady 10 % load, below the share. Together
	# they hold 30 %, not 30 % each (the flat-out one gets the other 20). The driver's NVML shows
	# each namespace only its own processes (as a driver shows a container), so each counts the
	# other's with the SM use it publishes in the ledger. With "visible" NVML shows every process
	# everywhere: the other's is not counted twice (which would hold the pair near 20 %).
	setup $GiB 30 hard
	export FAKECUDA_KERNEL_US=500 FAKECUDA_SAMPLE_MS=166
	[ "${1:-}" = visible ] || export FAKECUDA_HOST_PIDNS="$(stat -L -c %i /proc/self/ns/pid)"
	run init # the region and the fake GPU, from the host
	in_ns 1000000 a "$PROG" init launchfor:6:2.5:132 || return 1
	in_ns 2000000 b "$PROG" init launchfor:6:2.5:132:paced:10 || return 1
	wait
	local sa sb
	sa=$(sed -n 's/^share //p' "$T/a.out")
	sb=$(sed -n 's/^share //p' "$T/b.out")
	echo "    info: shares $sa + $sb (one claim, limit 30; the second paced at 10)"
	awk -v a="$sa" -v b="$sb" 'BEGIN { exit !(a + b >= 25 && a + b <= 35 && b >= 7) }'
}

t slots_sm_share_two_namespaces test_slots_sm_share_two_namespaces
t slots_sm_share_two_namespaces_visible test_slots_sm_share_two_namespaces visible
t slots_same_pid_two_namespaces test_slots_same_pid_two_namespaces
t slots_reports_two_namespaces test_slots_reports_two_namespaces
t slots_race test_slots_race 1
t slots_race_two_namespaces test_slots_race 2
t slots_forged test_slots_forged
t slots_forged_after test_slots_forged_after
t slots_none_free test_slots_none_free
t ledger_forced_debt test_ledger_forced_debt
