# Ledger shards (src/ledger.c): the ledger's locks spread over the files of a directory, the
# pool cut into one sub-pool per shard. Sourced by run.sh.

test_shards_previous_layout() {
	# A record of the previous release: no ledger.shards key, no directory. The ledger lives on
	# the limits file alone and still holds the quota across processes: A holds 40 MiB, a second
	# process gets exactly the 24 MiB left, and A's locks are on the limits file.
	SHARDS=0
	setup $((64 * MiB))
	rm -rf "$T/ledger"
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:40MiB touch:"$T/held" waitfile:"$T/end" >"$T/out.a" 2>&1 &
	local a=$! r=0
	waitfor "$T/held" $a || { cat "$T/out.a"; return 1; }
	sleep 0.3 # A's unused lease goes back when it is quiet
	expect "A's lease on the limits file" "$("$DUMP" ledger "$T/limits" "$(pgrep -P $a)" 0)" \
		"lease=$((40 * MiB)) held=$((40 * MiB))" || r=1
	run init alloc:24MiB alloc:1:2 || r=1
	touch "$T/end"
	wait $a || r=1
	return $r
}

test_shards_search_lost() {
	# Two processes searching the same sub-pools at the same moment can each make the other give
	# up every place it set, so that both come up short while the pool has room (the test build
	# makes the process's first searches come up empty that way). The grant searches again: a
	# process whose first three searches are lost still gets 48 MiB and then 16 MiB of its empty
	# 64 MiB quota, and the quota still holds (a byte more is refused). One whose every search is
	# lost is refused, and says so, instead of searching without end.
	setup $((64 * MiB))
	local r=0
	NRI_VGPU_TEST_LOST_SEARCHES=3 LD_PRELOAD=$B/testhooks/libvgpu-shim.so timeout 60 "$PROG" \
		init alloc:48MiB alloc:16MiB alloc:1:2 >"$T/out" 2>"$T/err" || r=1
	expect "three searches lost" "$(cat "$T/out")" ok || { cat "$T/err"; r=1; }
	NRI_VGPU_TEST_LOST_SEARCHES=1000 LD_PRELOAD=$B/testhooks/libvgpu-shim.so timeout 60 "$PROG" \
		init alloc:1MiB:2 >"$T/out" 2>"$T/err" || r=1
	expect "every search lost" "$(cat "$T/out")" ok || r=1
	grep -q "quota exceeded.*1048576 bytes requested" "$T/err" || { cat "$T/err"; r=1; }
	return $r
}

# shard_case NAME SETUP — in a vGPU container whose limits file names one ledger shard, SETUP
# (bash, in the container's mount namespace) makes /run/nri-vgpu/ledger; a process then tries
# a context and an allocation. Output in $T/out.NAME, $T/err.NAME.
shard_case() {
	in_container_ns 'mkdir -p /run/nri-vgpu/region
		printf "version=1\ngpu.0.uuid=%s\ngpu.0.memory=%s\ngpu.0.cores=100\nledger.shards=1\n" '"$UUID0 $((64 * MiB))"' \
			>/run/nri-vgpu/limits
		'"$2"'
		LD_PRELOAD=/usr/local/nri-vgpu/libvgpu-shim.so timeout 20 "$PROG" $OPS >"$T/out.'"$1"'" 2>"$T/err.'"$1"'"' ||
		{ echo "    $1: $(cat "$T/out.$1" "$T/err.$1")"; return 1; }
}

test_shards_fail_closed() {
	# A limits file that names ledger shards and a directory or shard that is not what the host
	# makes (missing, a FIFO, a symbolic link, a directory, on another file system): in a vGPU
	# container every allocation is refused, with one line saying why. Never the ledger on the
	# limits file instead: two layouts in one container would not see each other's leases.
	if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
		echo "    needs root and unshare -m"
		return 1
	fi
	setup $((64 * MiB))
	export SHIM PROG T OPS
	local r=0 c
	# The shards as the host makes them: the quota, to the byte.
	OPS="init alloc:64MiB alloc:1:2"
	shard_case good 'mkdir /run/nri-vgpu/ledger && : >/run/nri-vgpu/ledger/0 && chmod 0444 /run/nri-vgpu/ledger/0'
	expect "shards as made: out" "$(cat "$T/out.good")" ok || r=1
	grep -q "quota exceeded.*1 bytes requested" "$T/err.good" || { cat "$T/err.good"; r=1; }
	# Without the directory the shim fails closed as a whole: no context either.
	OPS="cuinit primary:0:2 newctx:0:2 alloc:1MiB:2"
	shard_case nodir ''
	shard_case otherfs 'mkdir /run/nri-vgpu/ledger && mount -t tmpfs t /run/nri-vgpu/ledger && : >/run/nri-vgpu/ledger/0'
	OPS="init alloc:1MiB:2"
	shard_case missing 'mkdir /run/nri-vgpu/ledger'
	shard_case fifo 'mkdir /run/nri-vgpu/ledger && mkfifo /run/nri-vgpu/ledger/0'
	shard_case symlink 'mkdir /run/nri-vgpu/ledger && : >/run/nri-vgpu/x && ln -s ../x /run/nri-vgpu/ledger/0'
	shard_case dir 'mkdir -p /run/nri-vgpu/ledger/0'
	: >"$T/shard0"
	shard_case device 'mkdir /run/nri-vgpu/ledger && : >/run/nri-vgpu/ledger/0 && mount --bind "$T/shard0" /run/nri-vgpu/ledger/0'
	for c in nodir otherfs; do
		expect "$c: out" "$(cat "$T/out.$c")" ok || r=1
		expect "$c: stderr lines" "$(grep -c . "$T/err.$c")" 1 || r=1
		grep -q 'names 1 ledger shards, but /run/nri-vgpu/ledger is not a directory on its file system' "$T/err.$c" ||
			{ echo "    $c: $(cat "$T/err.$c")"; r=1; }
	done
	for c in missing:'No such file' fifo:'not a regular file' symlink:'Too many levels' dir:'not a regular file' \
		device:"not on the limits file's file system"; do
		expect "${c%%:*}: out" "$(cat "$T/out.${c%%:*}")" ok || r=1
		grep -q "ledger shard /run/nri-vgpu/ledger/0: ${c#*:}" "$T/err.${c%%:*}" ||
			{ echo "    ${c%%:*}: $(cat "$T/err.${c%%:*}")"; r=1; }
	done
	[ ! -e /usr/local/nri-vgpu ] && [ ! -e /run/nri-vgpu ] || r=1
	return $r
}

# subpool_forger READY FIRST LAST — the tenant (root, its own descriptors on the shards) holds
# read locks over the whole of GPU 0's sub-pools FIRST..LAST (1 MiB each: 64 MiB over 64 shards)
# until killed; touches READY once it holds them.
subpool_forger() {
	python3 - "$T/ledger" "$1" "$2" "$3" <<-'EOF' &
		import fcntl, os, struct, sys, time
		fds = []
		for j in range(int(sys.argv[3]), int(sys.argv[4]) + 1):
		    fd = os.open("%s/%d" % (sys.argv[1], j), os.O_RDONLY)
		    fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 1 << 20, 0))  # F_OFD_SETLK
		    fds.append(fd)
		open(sys.argv[2], "w").close()
		time.sleep(120)
	EOF
}

test_shards_forged_subpools() {
	# Locks forged over whole sub-pools make the container look fuller, never let anyone past
	# the limit: with half of them forged a process gets exactly the other half, with all of
	# them nothing; once the forger is gone, the whole quota.
	setup $((64 * MiB))
	local f r=0
	subpool_forger "$T/half" 0 31
	f=$!
	waitfor "$T/half" $f || return 1
	run init alloc:32MiB alloc:1:2 info:0:64MiB || r=1
	kill $f
	wait $f 2>/dev/null || true
	subpool_forger "$T/all" 0 63
	f=$!
	waitfor "$T/all" $f || return 1
	run init alloc:1:2 || r=1
	kill $f
	wait $f 2>/dev/null || true
	run init alloc:64MiB alloc:1:2 || r=1
	return $r
}

test_shards_race() {
	# 32 processes fill the quota at once in 768 KiB allocations (sub-pools are 1 MiB: grants
	# cross them): what they hold together, counted from their own "filled" lines and from the
	# fake GPU's peak (neither the ledger's), never passes the 64 MiB limit, and they fill it.
	setup $((64 * MiB))
	local k n=32 r=0
	for k in $(seq $n); do
		LD_PRELOAD=$SHIM timeout 120 "$PROG" init touch:"$T/ready.$k" waitfile:"$T/go" fill:768KiB \
			touch:"$T/done.$k" waitfile:"$T/end" >"$T/out.$k" 2>"$T/err.$k" &
	done
	for k in $(seq $n); do waitfor "$T/ready.$k" || return 1; done
	touch "$T/go"
	for k in $(seq $n); do waitfor "$T/done.$k" || { cat "$T/out.$k" "$T/err.$k"; return 1; }; done
	local filled
	filled=$(sed -n 's/^filled //p' "$T"/out.* | awk '{ s += $1 } END { print s }')
	echo "    info: $filled allocations of 768 KiB"
	[ $((filled * 768 * 1024)) -le $((64 * MiB)) ] || { echo "    $filled x 768 KiB passes 64 MiB"; r=1; }
	# Filled: no more than one allocation's room per process short of the limit.
	[ $((filled * 768 * 1024)) -gt $((64 * MiB - n * 768 * 1024)) ] || { echo "    only $filled"; r=1; }
	LD_PRELOAD= timeout 20 "$PROG" peak:0:$((64 * MiB)) >"$T/out.peak" 2>&1 || { cat "$T/out.peak"; r=1; }
	touch "$T/end"
	wait
	return $r
}

t shards_previous_layout test_shards_previous_layout
t shards_fail_closed test_shards_fail_closed
t shards_forged_subpools test_shards_forged_subpools
t shards_race test_shards_race
t shards_search_lost test_shards_search_lost
