# Leases (src/quota.c): a process takes GPU memory from its container's quota in
# chunks and allocates inside them without the region's lock. Sourced by run.sh.

# ledger_of PID — "lease=N held=M" that process PID publishes on GPU 0.
ledger_of() { "$DUMP" ledger "$T/limits" "$1" 0; }

# child_of PID — the program that timeout PID runs.
child_of() { pgrep -P "$1" | head -n 1; }

test_lease_used_not_inflated() {
	# Two 4 MiB allocations: the second grant leases a chunk more (1 MiB, the first chunk; the
	# first grant takes none) but reports, to itself, to the region and to another process, the
	# 8 MiB it holds; the chunk is free to it (56 MiB) and not to the other process.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:4MiB alloc:4MiB nvml:0:64MiB:8MiB:56MiB info:56MiB:64MiB \
		touch:"$T/held" waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/held" $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	local pa
	pa=$(child_of $a)
	expect "region used" "$(used)" $((8 * MiB))
	expect "slot used0" "$("$DUMP" "$T/region/usage" | sed -n "s/^proc pid=$pa .* used0=\([0-9]*\) .*/\1/p")" $((8 * MiB))
	# The other process sees 8 MiB used whenever it looks (the chunk may be back by then).
	run init nvml:0:64MiB:8MiB:-
	touch "$T/end"
	wait $a
}

test_lease_idle_return() {
	# A process that allocates and then goes quiet gives its unused lease back within a few
	# keeper periods: its lease comes down to what it holds, and another process can then take
	# the rest of the quota at once.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:4MiB touch:"$T/held" waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$! i got pa
	waitfor "$T/held" $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	pa=$(child_of $a)
	for i in $(seq 60); do
		got=$(ledger_of "$pa")
		[ "$got" = "lease=$((4 * MiB)) held=$((4 * MiB))" ] && break
		sleep 0.05
	done
	expect "ledger of the quiet process" "$got" "lease=$((4 * MiB)) held=$((4 * MiB))"
	run init alloc:60MiB alloc:1:2
	expect "region used" "$(used)" $((4 * MiB))
	touch "$T/end"
	wait $a
}

test_lease_racers_never_exceed() {
	# 24 processes allocate and free at random (64 KiB to 8 MiB, up to 64 at a time each) for
	# two seconds against a 48 MiB quota: leases, their chunks, their returns and refusals
	# interleave, and the fake GPU's peak use across all of them never passes the quota. The
	# quota was under pressure (refusals) and well used (peak at least half of it).
	setup $((48 * MiB))
	local i
	for i in $(seq 1 24); do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init waitfile:"$T/go" churn:2000:8MiB:$i >"$T/churn.$i" 2>"$T/err.$i" &
	done
	sleep 0.3
	touch "$T/go"
	wait
	cat "$T"/churn.* | grep -q .
	local ok refused bad
	ok=$(cat "$T"/churn.* | sed -n 's/^churn ok=\([0-9]*\) .*/\1/p' | awk '{s += $1} END {print s}')
	refused=$(cat "$T"/churn.* | sed -n 's/^churn .*refused=\([0-9]*\)/\1/p' | awk '{s += $1} END {print s}')
	bad=$(grep -l FAIL "$T"/churn.* || true)
	expect "failed processes" "$bad" ""
	expect "processes that churned" "$(cat "$T"/churn.* | grep -c '^churn ok=')" 24
	LD_PRELOAD= timeout 20 "$PROG" peak:0:$((48 * MiB)) >"$T/out" 2>"$T/err"
	local peak
	peak=$(sed -n 's/^peak //p' "$T/out")
	echo "    info: $ok allocations, $refused refused, peak $((peak / MiB)) MiB of 48"
	[ "$refused" -gt 0 ] && [ "$ok" -gt 100 ] && [ "$peak" -ge $((24 * MiB)) ] && [ "$peak" -le $((48 * MiB)) ]
}

test_lease_fragmented_pool() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A lease is a set of stretches of a pool as long as the limit (src/ledger.c). With locks
	# forged at four places of a 64 MiB pool (4 MiB each at 8, 24, 40 and 56 MiB), a process
	# still gets exactly the 48 MiB left, from five holes, in one allocation or in three, and not
	# one byte more; once the forgers are gone, all 64 MiB.
	setup $((64 * MiB))
	local at pids=""
	for at in 8 24 40 56; do
		# regiondump hold: a lease from PID * 4096 on
		"$DUMP" hold "$T/limits" $((at * MiB / 4096)) 0 $((4 * MiB)) "$T/held.$at" &
		pids="$pids $!"
		waitfor "$T/held.$at" $! || return 1
	done
	run init alloc:$((48 * MiB)) alloc:1:2
	run init alloc:16MiB alloc:16MiB alloc:16MiB alloc:1:2
	# shellcheck disable=SC2086 # one pid per word
	kill $pids
	wait
	run init alloc:64MiB alloc:1:2
}

test_lease_pool_in_pieces() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A pool cut into 8192 pieces by forged locks (4 KiB free between every two): a lease
	# gathers up to 256 stretches, so 512 KiB (128 holes) is granted and 2 MiB (512) is refused
	# as over quota, with nothing said about the ledger being unusable (self-harm: the forger's
	# own container). Once the forger is gone, the whole quota.
	setup $((64 * MiB))
	python3 - "$T/limits" "$T/pieces" <<-'EOF' &
		import fcntl, os, struct, sys, time
		fd = os.open(sys.argv[1], os.O_RDONLY)
		lock = lambda at: fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, at, 4096, 0))  # F_OFD_SETLK
		[lock(i * 8192 + 4096) for i in range(8192)]
		open(sys.argv[2], "w").close()
		time.sleep(120)
	EOF
	local f=$!
	waitfor "$T/pieces" $f || return 1
	run init alloc:512KiB alloc:2MiB:2 || { kill $f; return 1; }
	kill $f
	wait $f 2>/dev/null || true
	expect "stderr" "$(grep -c 'ledger' "$T/err")" 0
	run init alloc:64MiB alloc:1:2
}

test_lease_big_lock_skipped() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# Another process's lease as one lock over all but the last MiB of an 8 GiB pool: a new
	# process that starts its search inside it jumps over it whole (a search that walked it a
	# few KiB at a time gave up long before the end and refused), gets the last MiB to the
	# byte, and not one byte more.
	setup $((8 * GiB))
	"$DUMP" hold "$T/limits" 0 0 $((8 * GiB - MiB)) "$T/big" &
	local h=$!
	waitfor "$T/big" $h || return 1
	run init alloc:4KiB alloc:$((MiB - 4096)) alloc:1:2 || { kill $h; return 1; }
	kill $h
	wait $h 2>/dev/null || true
}

test_lease_forced_in_holes() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# Memory the driver already holds (here a context's own 16 MiB) is counted in the pool
	# wherever the pool has room, and in the overflow only past it: with 1 MiB forged at the end
	# of every 8 MiB of a 64 MiB pool (holes of 7 MiB), the footprint is gathered from three
	# holes, and ten 4 MiB allocations then fill the quota to the byte (16 + 40 + 8 forged), and
	# not one byte more. Footprint put in the overflow while the pool had room made the
	# container read as past its limit, and a later grant that fitted was refused with its chunk.
	setup $((64 * MiB))
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	local at pids="" r=0
	for at in 7 15 23 31 39 47 55 63; do
		"$DUMP" hold "$T/limits" $((at * MiB / 4096)) 0 $((1 * MiB)) "$T/held.$at" &
		pids="$pids $!"
		waitfor "$T/held.$at" $! || return 1
	done
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/ctx" waitfile:"$T/go" alloc:4MiB alloc:4MiB \
		alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB \
		alloc:1:2 >"$T/out" 2>"$T/err" &
	local a=$!
	if waitfor "$T/ctx" $a; then
		expect "overflow held after the context" "$("$DUMP" overflow "$T/limits" 0)" 0 || r=1
		touch "$T/go"
		wait $a || { tail -n 3 "$T/out" "$T/err" | sed 's/^/    /'; r=1; }
	else
		r=1
	fi
	# shellcheck disable=SC2086 # one pid per word
	kill $pids
	wait
	return $r
}

test_lease_chunk_gives_way() {
	# Once any process holds overflow (here 1 MiB forged there), a grant is checked against
	# the sum of every lease instead of the pool's room, and the pool has room beyond the
	# limit. A grant that fits without all of its chunk (the 3 MiB that fill the quota to the
	# byte: 60 held, a 4 MiB chunk asked with it) is granted with less chunk, not refused.
	setup $((64 * MiB))
	"$DUMP" hold "$T/limits" $((1 << 36)) 0 $((1 * MiB)) "$T/over" &
	local h=$! r=0
	waitfor "$T/over" $h || return 1
	run init alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB \
		alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB alloc:4MiB \
		alloc:3MiB alloc:1:2 || r=1
	kill $h
	wait $h 2>/dev/null || true
	return $r
}

t lease_used_not_inflated test_lease_used_not_inflated
t lease_idle_return test_lease_idle_return
t lease_racers_never_exceed test_lease_racers_never_exceed
t lease_fragmented_pool test_lease_fragmented_pool
t lease_pool_in_pieces test_lease_pool_in_pieces
t lease_big_lock_skipped test_lease_big_lock_skipped
t lease_forced_in_holes test_lease_forced_in_holes
t lease_chunk_gives_way test_lease_chunk_gives_way
