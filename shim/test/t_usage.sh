# The usage region's version 2 fields (sourced by run.sh): each device's peak and throttled_ns.

# devfield NAME — NAME's value on device 0 of this test's region (regiondump).
devfield() { "$DUMP" "$T/region/usage" | sed -n "s/^dev 0 .* $1=\([0-9]*\).*/\1/p"; }

# until_used BYTES — waits up to 5 s for the region to show BYTES in use on device 0.
until_used() {
	local i
	for i in $(seq 100); do
		[ "$(devfield used)" = "$1" ] && return 0
		sleep 0.05
	done
	expect "used" "$(devfield used)" "$1"
}

now_ns() { date +%s%N; }

test_usage_peak() {
	# Two processes of one container: A holds 100 MiB, B 200 MiB on top (300 MiB at once), B frees
	# its 200, A takes 50 more. The peak is the 300 MiB held together, and stays when both are gone.
	setup $GiB
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:100MiB touch:"$T/a1" waitfile:"$T/go_a" alloc:50MiB \
		touch:"$T/a2" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local a=$!
	waitfor "$T/a1" $a
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:200MiB touch:"$T/b1" waitfile:"$T/go_b" free \
		touch:"$T/b2" waitfile:"$T/end" >"$T/out.b" 2>"$T/err.b" &
	local b=$!
	waitfor "$T/b1" $b
	until_used $((300 * MiB))
	expect "peak with 300 MiB held" "$(devfield peak)" $((300 * MiB))
	touch "$T/go_b"
	waitfor "$T/b2" $b
	until_used $((100 * MiB)) # B's free is in the region before A's grant is
	touch "$T/go_a"
	waitfor "$T/a2" $a
	until_used $((150 * MiB))
	expect "peak after B's free and A's 50 MiB" "$(devfield peak)" $((300 * MiB))
	touch "$T/end"
	wait $a
	wait $b
	expect "used after both exits" "$(devfield used)" 0
	expect "peak after both exits" "$(devfield peak)" $((300 * MiB))
	expect "throttled_ns at cores=100" "$(devfield throttled_ns)" 0
}

test_usage_throttled() {
	# At cores=30 a process launching flat out waits on the limiter most of the time: throttled_ns
	# grows while it launches (the watcher adds what it waited every 100 ms, a wait in progress
	# included), and in all stays within the process's wall time even with four threads waiting at
	# once (overlapping waits count once).
	setup $GiB 30 hard
	local t0 t1 mid done all
	t0=$(now_ns)
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init launchfor:1.5:0:1 touch:"$T/mid" launchthreads:4:2:0:1 \
		touch:"$T/done" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local p=$!
	waitfor "$T/mid" $p
	sleep 0.3
	mid=$(devfield throttled_ns)
	waitfor "$T/done" $p
	sleep 0.3
	done=$(devfield throttled_ns)
	touch "$T/end"
	wait $p
	t1=$(now_ns)
	all=$(devfield throttled_ns)
	echo "    info: throttled $((mid / 1000000)) ms after 1.5 s of one thread, $((done / 1000000)) ms after" \
		"2 s more of four, $((all / 1000000)) ms at exit; the process ran $(((t1 - t0) / 1000000)) ms"
	# Flat out at 30 %, a launch waits for about 70 % of the time: half of it is a safe floor.
	[ "$mid" -ge 750000000 ] || { echo "    throttled $mid ns after 1.5 s of launches, want >= 0.75 s"; return 1; }
	[ "$done" -ge $((mid + 1000000000)) ] ||
		{ echo "    throttled $done ns after 2 s more of launches, want >= $mid + 1 s"; return 1; }
	[ "$all" -ge "$done" ] || { echo "    throttled_ns went down at exit: $done -> $all"; return 1; }
	[ "$all" -le $((t1 - t0)) ] ||
		{ echo "    throttled $all ns, more than the process's wall time $((t1 - t0)) ns"; return 1; }
}

test_usage_throttled_exit() {
	# A process throttled for less than a flush period (80 ms of launches; the watcher flushes when
	# it starts and then every 100 ms): its waits reach the region only through its exit.
	setup $GiB 30 hard
	run init launchfor:0.08:0:1
	local ns
	ns=$(devfield throttled_ns)
	echo "    info: throttled $((ns / 1000000)) ms"
	[ "$ns" -ge 20000000 ] || { echo "    throttled $ns ns after 80 ms of launches, want >= 20 ms"; return 1; }
}

test_usage_unthrottled() {
	# At cores=100 nothing waits: throttled_ns stays 0 while launching and after.
	setup $GiB 100 hard
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init launchfor:1:0:1 touch:"$T/done" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local p=$!
	waitfor "$T/done" $p
	sleep 0.3
	expect "throttled_ns after 1 s of launches" "$(devfield throttled_ns)" 0
	touch "$T/end"
	wait $p
	expect "throttled_ns after the exit" "$(devfield throttled_ns)" 0
}

test_usage_rebuilt() {
	# The tenant breaks the region's header: the shim rebuilds it, and what it said of the past is
	# not believed: the peak (200 MiB, before a free) starts again at the 50 MiB held, throttled_ns
	# at 0, and both go on from there (less throttled time after than the 2 s of launches before).
	setup $GiB 30 hard
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:200MiB free alloc:50MiB launchfor:2:0:1 touch:"$T/a" \
		waitfile:"$T/go" launchfor:0.5:0:1 touch:"$T/b" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local p=$! before after
	waitfor "$T/a" $p
	sleep 0.3
	expect "peak before the damage" "$(devfield peak)" $((200 * MiB))
	before=$(devfield throttled_ns)
	put "$T/region/usage" 0 'NOTVGPU!'
	touch "$T/go"
	waitfor "$T/b" $p
	sleep 0.3
	expect "region header" "$("$DUMP" "$T/region/usage" | head -n 1 | cut -d' ' -f1-2)" "magic=ok version=2"
	expect "peak after the rebuild" "$(devfield peak)" $((50 * MiB))
	after=$(devfield throttled_ns)
	echo "    info: throttled $((before / 1000000)) ms before the damage, $((after / 1000000)) ms after"
	[ "$before" -gt 0 ] && [ "$after" -gt 0 ] && [ "$after" -lt "$before" ] ||
		{ echo "    throttled_ns $before before, $after after the rebuild: want both > 0, after < before"; return 1; }
	touch "$T/end"
	wait $p
}

t usage_peak test_usage_peak
t usage_throttled test_usage_throttled
t usage_throttled_exit test_usage_throttled_exit
t usage_unthrottled test_usage_unthrottled
t usage_rebuilt test_usage_rebuilt
