# CUDA graphs: the work a graph launch runs, and graph memory against the
# quota (sourced by run.sh; uses its setup/expect/t).

GPROG=$B/graphprog
GMODES=("-m direct" "-m direct -p" "-m rt12" "-m rt12 -p")

# grun [graphprog args...] — graphprog with the shim preloaded; output in $T/out, $T/err.
grun() {
	if ! LD_PRELOAD=$SHIM timeout 60 "$GPROG" "$@" >"$T/out" 2>"$T/err"; then
		echo "    graphprog $*"
		tail -n 5 "$T/out" "$T/err" | sed 's/^/    /'
		return 1
	fi
}

test_graph_work() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB)) 100 hard debug
		# Kernel nodes (the _v2 and the v1 API) and a child graph's:
		# 7 + 100 + 66*200 + 3*2*1 thread blocks. On the 132-SM fake GPU at
		# 1 ms a wave the launch runs 1 + 1 + 100 + 1 waves: 103 ms of GPU time.
		# shellcheck disable=SC2086
		grun $m init graph kernel:7 child kernel:100 kernel:66:200 kernel1:3:2:1 inst launch sync busy:103000000
		grep -q 'graph exec 0x[0-9a-f]*: 13313 thread blocks a launch, 0 bytes of graph memory' "$T/err"
		# Captured launches become kernel nodes: 200 + 25 blocks, none run yet.
		# shellcheck disable=SC2086
		grun $m init capture launchk:200 launchk:25 busy:0 endcapture inst
		grep -q 'graph exec 0x[0-9a-f]*: 225 thread blocks a launch' "$T/err"
		# An update takes the new graph's grids: 264 + 132*2 blocks (4 waves
		# of 1 ms), then with the v1 API 132*5 (5 more); an update that adds
		# a memory node fails.
		# shellcheck disable=SC2086
		grun $m init graph kernel:100 inst graph kernel:264 kernel:132:2 update launch sync busy:4000000 \
			graph kernel:660 update1 launch sync busy:9000000 graph galloc:1MiB update:910
		grep -q 'graph exec 0x[0-9a-f]*: 100 thread blocks a launch' "$T/err"
		grep -q 'graph exec 0x[0-9a-f]* updated: 528 thread blocks a launch, 4 waves$' "$T/err"
		grep -q 'graph exec 0x[0-9a-f]* updated: 660 thread blocks a launch, 5 waves$' "$T/err"
	done
}

test_graph_child_set() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB)) 100 hard debug
		# A child graph of one 1-block kernel beside a 1-block kernel (2
		# waves); then the child node is given a graph of one 1320-block
		# kernel (10 waves on 132 SMs), then one of 264 blocks (2 waves):
		# what a launch runs and is charged is the new child's, by either
		# setter. The fake runs it: 11 ms, then 3 ms more.
		# shellcheck disable=SC2086
		grun $m init graph kernel:1 child kernel:1 inst graph kernel:1320 setchild:0 launch sync \
			busy:11000000 graph kernel:264 setchildnode:0 launch sync busy:14000000 \
			graph kernel:5 kernel:5 setchild:0:1
		grep -q 'graph exec 0x[0-9a-f]*: 2 thread blocks a launch' "$T/err"
		grep -q 'graph exec 0x[0-9a-f]* changed: 1321 thread blocks a launch, 11 waves$' "$T/err"
		grep -q 'graph exec 0x[0-9a-f]* changed: 265 thread blocks a launch, 3 waves$' "$T/err"
		# A graph of another topology is refused, and changes nothing.
		expect "$m changes" "$(grep -c 'changed:' "$T/err")" 2
	done
}

test_graph_memory_backed() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB))
		# Nothing is charged when the graph is made or instantiated; the
		# upload backs it (48 MiB into the graph pool), the launch adds
		# nothing. A second graph needs 70 MiB, 22 more than the pool has
		# spare: refused before the driver sees it (the pool stays 48 MiB).
		# Destroying both keeps the pool (and the charge) until the trim.
		# shellcheck disable=SC2086
		grun $m init graph galloc:48MiB gfree inst meminfo:64MiB attr:reserved:0 upload attr:reserved:48MiB \
			meminfo:16MiB launch sync meminfo:16MiB \
			graph galloc:70MiB gfree inst launch:2 upload:2 attr:reserved:48MiB \
			graph galloc:60MiB gfree inst launch attr:reserved:60MiB meminfo:4MiB \
			execdestroy execdestroy execdestroy meminfo:4MiB trim attr:reserved:0 meminfo:64MiB
		grep -q 'a CUDA graph needs 23068672 more bytes of graph memory' "$T/err"
	done
	# Graph memory on a GPU the limits file does not list is refused at launch.
	setup $((64 * MiB))
	grun init graph galloc:1MiB:0:1 inst launch:2 attr:reserved:0
	grep -q 'graph memory refused: device 1 is not among the container' "$T/err"
	# The fake's high-water marks: reset to 0 only (the driver API reference).
	grun init graph galloc:16MiB inst launch graph galloc:8MiB inst launch attr:usedhigh:24MiB \
		attr:reservedhigh:24MiB free trim attr:reserved:16MiB attr:reservedhigh:24MiB resethigh:reserved \
		attr:reservedhigh:0 resethigh:used:1:1MiB attr:usedhigh:24MiB resethigh:used attr:usedhigh:0
	# Without a limits file nothing is refused.
	setup $((64 * MiB))
	rm "$T/limits"
	grun init graph galloc:70MiB gfree inst launch attr:reserved:70MiB
}

test_graph_memory_live() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB))
		# An allocation the graph does not free stays live after the launch
		# (a second launch is an error), cuMemFree frees it but the pool keeps
		# the memory: counted until the trim.
		# shellcheck disable=SC2086
		grun $m init graph galloc:40MiB inst launch attr:used:40MiB meminfo:24MiB launch:1 \
			free attr:used:0 meminfo:24MiB trim attr:reserved:0 meminfo:64MiB
		# With auto-free each launch frees the last one's allocation first.
		# shellcheck disable=SC2086
		grun $m init graph galloc:40MiB instflags:1 launch launch launch meminfo:24MiB \
			execdestroy meminfo:24MiB trim meminfo:24MiB attr:used:40MiB free trim meminfo:64MiB
	done
}

test_graph_memory_upload_flag() {
	setup $((64 * MiB))
	# Instantiating with the upload flag backs the graph there and then.
	grun init graph galloc:48MiB gfree instparams:2 meminfo:16MiB graph galloc:70MiB gfree instparams:2:2 \
		attr:reserved:48MiB instparams:0 meminfo:16MiB
}

test_graph_memory_capture() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB))
		# Captured cuMemAllocAsync / cuMemAllocFromPoolAsync / cuMemFreeAsync
		# calls are nodes: nothing charged or given back at capture time; the
		# launch backs 56 MiB in the pool, the trim gives it back.
		# shellcheck disable=SC2086
		grun $m init capture iscapturing:1 async:48MiB meminfo:64MiB poolasync:8MiB meminfo:64MiB freeasync \
			freeasync meminfo:64MiB endcapture iscapturing:0 inst meminfo:64MiB launch meminfo:8MiB trim \
			meminfo:64MiB
		# So a graph may be captured while its allocations would not fit:
		# its launch is what the quota refuses, until there is room.
		# shellcheck disable=SC2086
		grun $m init alloc:40MiB capture async:32MiB poolasync:32MiB freeasync freeasync endcapture inst \
			launch:2 meminfo:24MiB free launch meminfo:0
		# Outside the capture the same calls are counted as usual (the pool
		# keeps freed memory until a synchronisation, pool.c).
		# shellcheck disable=SC2086
		grun $m init async:48MiB meminfo:16MiB freeasync sync meminfo:64MiB
	done
}

test_graph_capture_free_kept() {
	local m
	for m in "${GMODES[@]}"; do
		setup $((64 * MiB))
		# A captured free of memory allocated outside any graph: the driver
		# refuses it (only graph allocations can be freed by a node) ...
		# shellcheck disable=SC2086
		grun $m init async:32MiB capture freeasync:1 meminfo:32MiB endcapture
		# ... and where a driver accepted it, it would free the memory when
		# the graph runs, which the shim cannot see: cuMemAlloc memory stays
		# counted, never given back at capture time. (Pool memory is counted
		# by what the pool holds, which the shim reads back, pool.c.)
		# shellcheck disable=SC2086
		FAKECUDA_CAPTURE_FREE_ANY=1 grun $m init alloc:32MiB capture freeasync meminfo:32MiB endcapture \
			inst launch sync meminfo:32MiB
	done
}

test_graph_memory_racing_follow() {
	setup $((64 * MiB))
	# Two threads launch a 16 MiB graph each. The first reads the pool
	# (16 MiB) and is held up 2 s before it stores that (the fake answers
	# the 3rd attribute query late); the second grows the pool to 32 MiB
	# and stores that meanwhile. The first's older reading must not stay:
	# 32 MiB counted in the end. (Under a load that delays the second thread
	# past the first, there is no race and the check holds all the same.)
	FAKECUDA_FAIL=cuDeviceGetGraphMemAttribute:3:2000 grun init graph galloc:16MiB inst bglaunch sleepms:300 \
		graph galloc:16MiB inst launch join attr:reserved:32MiB meminfo:32MiB
}

t graph_work test_graph_work
t graph_child_set test_graph_child_set
t graph_memory_backed test_graph_memory_backed
t graph_memory_live test_graph_memory_live
t graph_memory_upload_flag test_graph_memory_upload_flag
t graph_memory_racing_follow test_graph_memory_racing_follow
t graph_memory_capture test_graph_memory_capture
t graph_capture_free_kept test_graph_capture_free_kept
