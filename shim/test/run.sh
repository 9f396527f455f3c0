#!/usr/bin/env bash
# C-level tests of libvgpu-shim.so against the fake driver (make -C shim test).
# Each test gets a temp dir with its own fake-GPU state, limits file and
# usage region, passed through the overrides NRI_VGPU_LIMITS /
# NRI_VGPU_REGION_DIR (honoured only while /run/nri-vgpu/limits does not
# exist, and only outside a vGPU container: the shim here is loaded from
# its build path, never from /usr/local/nri-vgpu/libvgpu-shim.so, and
# nothing here creates /run/nri-vgpu or /etc/ld.so.preload on the host;
# container_fails_closed plays the container in a mount namespace of its
# own). Ends with "shim: N passed, M failed".
# ONLY=REGEX runs only the tests whose name matches.
set -u
B=${B:?build dir}
SHIM=$B/libvgpu-shim.so
PROG=$B/cudaprog
DUMP=$B/regiondump
HERE=$(cd "$(dirname "$0")" && pwd)
UUID0=GPU-11111111-2222-3333-4444-555555555555
UUID1=GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee
MiB=1048576
GiB=1073741824
# FAKECUDA_PIDNS_OFFSET for the tests that simulate a container's pid
# namespace: fake NVML reports every process as pid+PIDNS.
PIDNS=1000000
# What a context is charged when NVML cannot measure it: VGPU_FP_BOUND in src/footprint.h, documented
# in README.md ("Context footprint").
FP_BOUND=$GiB
pass=0
fail=0
failed=()

if [ -e /run/nri-vgpu/limits ]; then
	echo "shim tests: /run/nri-vgpu/limits exists; the overrides would be ignored" >&2
	exit 1
fi

# Ledger shards the tests' containers have (0: the ledger on the limits file alone, as a record
# of the previous release has it). A test sets SHARDS before setup to change it.
SHARDS=64

ROOT=$(mktemp -d /tmp/shimtest.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT

# setup LIMIT_BYTES [CORES] [POLICY] [LOG_LEVEL] — a fresh container: one 16 GiB, 132-SM fake GPU
# (and an 8 GiB, 108-SM one that the limits file does not list).
setup() {
	T=$(mktemp -d "$ROOT/t.XXXXXX")
	mkdir -p "$T/region" "$T/state"
	export FAKECUDA_STATE=$T/state
	# Where a dlopen of libcuda.so.1 / libnvidia-ml.so.1 finds the fake driver.
	export LD_LIBRARY_PATH=$B/fake
	export FAKECUDA_DEVICES="$UUID0:16GiB:132,$UUID1:8GiB:108"
	export NRI_VGPU_LIMITS=$T/limits NRI_VGPU_REGION_DIR=$T/region NRI_VGPU_LEDGER_DIR=$T/ledger
	ledger_dir "$T/ledger"
	unset FAKECUDA_FAIL FAKECUDA_CTX_BYTES FAKECUDA_KERNEL_US FAKECUDA_SAMPLE_MS FAKECUDA_PIDNS_OFFSET \
		FAKECUDA_CTX_SLEEP_MS
	limits "${1:-$GiB}" "${2:-100}" "${3:-hard}" "${4:-warn}"
}

# ledger_dir DIR — DIR with $SHARDS empty shards, as the host makes it (none when SHARDS=0).
ledger_dir() {
	if [ "$SHARDS" -gt 0 ]; then
		mkdir -p "$1"
		(cd "$1" && touch $(seq 0 $((SHARDS - 1))) && chmod 0444 -- *)
	fi
}

# The limits file's ledger.shards line, when the container has shards.
shards_key() { if [ "$SHARDS" -gt 0 ]; then echo "ledger.shards=$SHARDS"; fi; }

limits() { # limits LIMIT_BYTES CORES POLICY [LOG_LEVEL]
	cat >"$T/limits" <<-EOF
		# written by the test
		version=1
		gpu.0.uuid=$UUID0
		gpu.0.memory=$1
		gpu.0.cores=$2
		cores.policy=$3
		log.level=${4:-warn}
		$(shards_key)
	EOF
}

# pidns OFFSET — from now on this test's processes live in a simulated pid
# namespace (OFFSET 0: the host's).
pidns() {
	if [ "$1" != 0 ]; then export FAKECUDA_PIDNS_OFFSET=$1; fi
}

# hostpids — "pid host_pid" of every live slot in this test's region.
hostpids() { "$DUMP" "$T/region/usage" | sed -n 's/^proc pid=\([0-9]*\) host_pid=\([0-9-]*\) .*/\1 \2/p'; }

# expect_hostpids N OFFSET — N slots, each with host pid = pid + OFFSET.
expect_hostpids() {
	local got bad
	got=$(hostpids)
	expect "slots" "$(printf '%s\n' "$got" | grep -c .)" "$1"
	bad=$(printf '%s\n' "$got" | awk -v o="$2" '$2 != $1 + o')
	expect "slots whose host pid is not pid+$2 (pid host_pid)" "$bad" ""
}

# run [cudaprog args...] — the program with the shim preloaded; output in $T/out.
run() {
	if ! LD_PRELOAD=$SHIM timeout 60 "$PROG" "$@" >"$T/out" 2>"$T/err"; then
		echo "    cudaprog $*"
		tail -n 5 "$T/out" "$T/err" | sed 's/^/    /'
		return 1
	fi
}

used() { "$DUMP" "$T/region/usage" | sed -n 's/^dev 0 .*used=\([0-9]*\).*/\1/p'; }
slots() { "$DUMP" "$T/region/usage" | grep -c '^proc ' || true; }

# write_locker FILE SECONDS — holds an OFD write lock on all of FILE for SECONDS (as a process
# stopped while holding it would), touching FILE.locked once it has it; run in the background
# ($! is the holder itself).
write_locker() {
	exec python3 - "$1" "$2" <<-'EOF'
		import fcntl, os, struct, sys, time
		fd = os.open(sys.argv[1], os.O_RDWR)
		fcntl.fcntl(fd, 38, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLKW
		open(sys.argv[1] + '.locked', 'w').close()
		time.sleep(float(sys.argv[2]))
	EOF
}

waitfor() { # waitfor FILE [PID] — up to 30 s, or until PID is gone
	local i
	for i in $(seq 600); do
		[ -e "$1" ] && return 0
		if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then
			echo "    process $2 ended before $1 appeared"
			return 1
		fi
		sleep 0.05
	done
	echo "    timed out waiting for $1"
	return 1
}

expect() { # expect WHAT GOT WANT
	if [ "$2" != "$3" ]; then
		echo "    $1: got '$2', want '$3'"
		return 1
	fi
}

t() { # t NAME FUNCTION — runs one test (only those whose name matches $ONLY, when set)
	local name=$1
	shift
	if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return 0; fi
	# Not inside "if" or "||": there bash would ignore set -e in the subshell.
	(
		set -e
		"$@"
	) >"$ROOT/log" 2>&1
	local rc=$?
	if [ $rc -eq 0 ]; then
		pass=$((pass + 1))
		echo "ok   $name"
		grep '^    info: ' "$ROOT/log" || true
	else
		fail=$((fail + 1))
		failed+=("$name")
		echo "FAIL $name"
		sed 's/^/    /' "$ROOT/log" | tail -n 30
		[ -n "${T:-}" ] && [ -f "$T/out" ] && { echo "    --- stdout"; tail -n 15 "$T/out" | sed 's/^/    /'; }
		[ -n "${T:-}" ] && [ -f "$T/err" ] && { echo "    --- stderr"; tail -n 15 "$T/err" | sed 's/^/    /'; }
	fi
	rm -f "$ROOT/log"
}

# ---- the library itself --------------------------------------------------------

test_glibc_versions() {
	# Referenced (UND) versions must all be <= GLIBC_2.17.
	local bad
	bad=$(objdump -T "$SHIM" | awk '$0 ~ /\*UND\*/' | grep -o 'GLIBC_[0-9.]*' | sort -u |
		awk -F'[_.]' '{ if ($2 > 2 || ($2 == 2 && $3 > 17)) print }')
	expect "glibc versions newer than 2.17" "$bad" ""
	objdump -T "$SHIM" | grep -q 'GLIBC_2.2.5 *dlsym\|(GLIBC_2.2.5) *dlsym'
	objdump -T "$SHIM" | grep -q 'GLIBC_2.34 *dlsym'
}

test_exports() {
	local got
	got=$(objdump -T "$SHIM" | awk '$0 !~ /\*UND\*/ && $0 !~ /\*ABS\*/ && / DF /{print $NF}' | sort -u)
	expect "exported symbols" "$got" "$(sort -u "$HERE/../exports.txt")"
	if objdump -p "$SHIM" | grep NEEDED | grep -q 'libcuda\|libnvidia-ml'; then
		echo "    links a driver library"
		return 1
	fi
}

test_harmless_load() {
	setup
	# No GPU use: nothing loaded, nothing created, output unchanged.
	out=$(LD_PRELOAD=$SHIM bash -c 'echo hello; grep -c "libcuda\|libnvidia-ml" /proc/$$/maps || true')
	expect "bash output" "$out" "hello
0"
	if command -v python3 >/dev/null; then
		out=$(LD_PRELOAD=$SHIM python3 -c 'print(6*7)')
		expect "python output" "$out" "42"
	fi
	expect "region files" "$(ls "$T/region")" ""
}

# ---- limits file -----------------------------------------------------------------------

test_limits_parser() {
	setup
	local f=$T/l
	ok() { printf "$1" >"$f"; "$B/limits_check" "$f" >"$T/out" || { echo "    rejected: $1"; cat "$T/out"; return 1; }; }
	bad() { printf "$1" >"$f"; if "$B/limits_check" "$f" >"$T/out"; then echo "    accepted: $1"; return 1; fi; }
	ok "# comment\n\n  version = 1  \ngpu.0.uuid=$UUID0\ngpu.0.memory=0 # none\ngpu.0.cores=100\n"
	grep -q "gpu 0 $UUID0 0 100" "$T/out"
	ok "version=1\ngpu.1.uuid=b\ngpu.1.memory=2\ngpu.1.cores=1\ngpu.0.uuid=a\ngpu.0.memory=18446744073709551615\ngpu.0.cores=50\ncores.policy=burst\nlog.level=debug\n"
	grep -q "ok gpus=2 policy=1 level=3 shards=0" "$T/out"
	grep -q "gpu 0 a 18446744073709551615 50" "$T/out"
	ok "version=1\t# tab\ngpu.0.uuid=MIG-x/1.2:3_a\ngpu.0.memory=1\ngpu.0.cores=1 # caf\xc3\xa9\n"
	bad ""
	bad "version=1\n"
	bad "version=1\r\ngpu.0.uuid=a\r\ngpu.0.memory=1\r\ngpu.0.cores=1\r\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=1\n\0\n"
	bad "version=1\ngpu.0.uuid=a::b\ngpu.0.memory=1\ngpu.0.cores=1\n"
	bad "version=1\ngpu.0.uuid=a:\ngpu.0.memory=1\ngpu.0.cores=1\n"
	bad "version=1\ngpu.0.uuid=a*\ngpu.0.memory=1\ngpu.0.cores=1\n"
	bad "# only a comment\n"
	bad "version=2\n"
	bad "gpu.0.uuid=a\nversion=1\n"
	bad "version=1\nversion=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=1\n"
	bad "version=1\ngpu.1.uuid=a\ngpu.1.memory=1\ngpu.1.cores=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=-1\ngpu.0.cores=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=18446744073709551616\ngpu.0.cores=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=01\ngpu.0.cores=1\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=0\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=101\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1GiB\ngpu.0.cores=1\n"
	bad "version=1\ngpu.16.uuid=a\n"
	bad "version=1\ngpu.00.uuid=a\n"
	bad "version=1\ngpu.0.name=a\n"
	bad "version=1\ncores.policy=soft\n"
	bad "version=1\nlog.level=trace\n"
	bad "version=1\nlog.level=warn\nlog.level=warn\n"
	bad "version=1\nfoo=bar\n"
	bad "version=1\njust text\n"
	bad "version=1\ngpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=1\ngpu.1.uuid=a\ngpu.1.memory=1\ngpu.1.cores=1\n"
	bad "version=1\ngpu.0.uuid=a b\ngpu.0.memory=1\ngpu.0.cores=1\n"
	# ledger.shards: 1..256, once; absent is 0 (the ledger on the limits file alone).
	local g="gpu.0.uuid=a\ngpu.0.memory=1\ngpu.0.cores=1\n"
	ok "version=1\n${g}ledger.shards=1\n"
	grep -q "shards=1$" "$T/out"
	ok "version=1\nledger.shards = 64\n$g"
	grep -q "shards=64$" "$T/out"
	ok "version=1\n${g}ledger.shards=256\n"
	grep -q "shards=256$" "$T/out"
	for v in 0 257 064 -1 x "" 18446744073709551617; do
		bad "version=1\n${g}ledger.shards=$v\n"
		grep -q "line 5: ledger.shards must be 1..256" "$T/out" || { echo "    ledger.shards=$v: $(cat "$T/out")"; return 1; }
	done
	bad "version=1\n${g}ledger.shards=8\nledger.shards=8\n"
	grep -q "line 6: duplicate key ledger.shards" "$T/out"
	# 4096 bytes is the most.
	{ echo "version=1"; echo "gpu.0.uuid=a"; echo "gpu.0.memory=1"; echo "gpu.0.cores=1"; head -c 4043 /dev/zero | tr '\0' '#'; echo; } >"$f"
	expect "size of the 4096-byte file" "$(stat -c %s "$f")" 4096
	"$B/limits_check" "$f" >/dev/null
	{ echo "version=1"; head -c 4044 /dev/zero | tr '\0' '#'; echo; } >"$f"
	if "$B/limits_check" "$f" >/dev/null; then echo "    accepted 4097 bytes"; return 1; fi
	# 16 GPUs is the most (17 is an index error).
	{ echo "version=1"; for i in $(seq 0 15); do echo "gpu.$i.uuid=u$i"; echo "gpu.$i.memory=1"; echo "gpu.$i.cores=1"; done; } >"$f"
	"$B/limits_check" "$f" | grep -q "gpus=16"
}

test_invalid_limits_fail_closed() {
	setup
	printf 'version=1\ngpu.0.uuid=%s\ngpu.0.memory=lots\ngpu.0.cores=50\n' "$UUID0" >"$T/limits"
	# No context either (nothing would count its own memory), no allocation.
	run cuinit primary:0:2 newctx:0:2 newctxv1:0:2 green:0:2 alloc:1MiB:2 managed:1MiB:2 alloc:1:2
	expect "stderr lines" "$(grep -c . "$T/err")" 1
	grep -q "invalid limits file .*gpu.0.memory must be a byte count" "$T/err"
}

# in_container_ns SCRIPT — runs SCRIPT (bash) as root in a private mount
# namespace where the built shim is at its container path,
# /usr/local/nri-vgpu/libvgpu-shim.so (on a tmpfs over /usr/local), and /run
# is a tmpfs of its own: nothing is mounted or made on the host.
in_container_ns() {
	unshare -m --propagation private bash -euc '
		mount -t tmpfs nri-vgpu-test /usr/local
		mkdir -p /usr/local/nri-vgpu
		: >/usr/local/nri-vgpu/libvgpu-shim.so
		mount --bind "$SHIM" /usr/local/nri-vgpu/libvgpu-shim.so
		mount -t tmpfs nri-vgpu-test /run
		'"$1"
}

test_container_fails_closed() {
	if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
		echo "    needs root and unshare -m"
		return 1
	fi
	setup $((64 * MiB))
	export SHIM PROG T
	# A tenant moved /run/nri-vgpu away (nothing at the fixed path) and set
	# the overrides to a valid file of its own: the shim, loaded from its
	# container path, ignores them and refuses every context and allocation.
	in_container_ns 'LD_PRELOAD=/usr/local/nri-vgpu/libvgpu-shim.so timeout 20 "$PROG" cuinit primary:0:2 		newctx:0:2 alloc:1MiB:2 >"$T/out" 2>"$T/err"'
	grep -q '^ok$' "$T/out"
	expect "stderr lines" "$(grep -c . "$T/err")" 1
	grep -q 'limits file /run/nri-vgpu/limits is missing, but the shim was loaded from /usr/local/nri-vgpu/libvgpu-shim.so' \
		"$T/err"
	expect "override region used" "$(ls "$T/region")" ""
	# The limits file there, the region directory gone: refused too.
	in_container_ns 'mkdir -p /run/nri-vgpu && cp "$T/limits" /run/nri-vgpu/limits
		LD_PRELOAD=/usr/local/nri-vgpu/libvgpu-shim.so timeout 20 "$PROG" cuinit primary:0:2 alloc:1MiB:2 		>"$T/out" 2>"$T/err"'
	grep -q '^ok$' "$T/out"
	grep -q 'usage region directory /run/nri-vgpu/region is missing' "$T/err"
	# Both there: the fixed files rule (64 MiB), the override's 1 GiB does not.
	limits $GiB 100 hard
	in_container_ns 'mkdir -p /run/nri-vgpu/region
		printf "version=1\ngpu.0.uuid=%s\ngpu.0.memory=%s\ngpu.0.cores=100\n" '"$UUID0 $((64 * MiB))"' \
			>/run/nri-vgpu/limits
		LD_PRELOAD=/usr/local/nri-vgpu/libvgpu-shim.so timeout 20 "$PROG" init alloc:64MiB alloc:1:2 		>"$T/out" 2>"$T/err"'
	grep -q '^ok$' "$T/out"
	# Loaded first under another path (the same file), the preload file still
	# says where the container has it: fails closed all the same.
	in_container_ns 'mount -t tmpfs nri-vgpu-test /etc
		echo /usr/local/nri-vgpu/libvgpu-shim.so >/etc/ld.so.preload
		LD_PRELOAD=$SHIM timeout 20 "$PROG" cuinit primary:0:2 alloc:1MiB:2 >"$T/out" 2>"$T/err"'
	grep -q '^ok$' "$T/out"
	grep -q 'limits file /run/nri-vgpu/limits is missing' "$T/err"
	# Outside a container (the shim at its build path) the old rule holds:
	# the override (1 GiB) counts.
	run init alloc:1GiB alloc:1:2
	# Nothing left on the host.
	[ ! -e /usr/local/nri-vgpu ] && [ ! -e /run/nri-vgpu ] && [ ! -e /etc/ld.so.preload ]
}

test_absent_limits_pass_through() {
	setup
	rm "$T/limits"
	run init alloc:4GiB info:12GiB:16GiB nvml:0:16GiB:4GiB:12GiB freeall
	expect "stderr" "$(cat "$T/err")" ""
	expect "region files" "$(ls "$T/region")" ""
}

test_override_ignored_when_fixed_path_exists() {
	# A copy of the shim built with its fixed paths under $B/fixedroot.
	setup $GiB
	local fixed=$B/fixedroot
	rm -rf "$fixed"
	mkdir -p "$fixed/region"
	printf 'version=1\ngpu.0.uuid=%s\ngpu.0.memory=%s\ngpu.0.cores=100\n' $UUID0 $((64 * MiB)) >"$fixed/limits"
	# The fixed files exist: the environment (1 GiB, another region) is ignored.
	LD_PRELOAD=$B/fixedpath/libvgpu-shim.so timeout 60 "$PROG" init alloc:64MiB alloc:1:2 >"$T/out" 2>"$T/err"
	expect "override region used" "$(ls "$T/region")" ""
	[ -e "$fixed/region/usage" ]
	# Fixed limits gone: now the override counts (fixed region dir still wins).
	rm "$fixed/limits"
	LD_PRELOAD=$B/fixedpath/libvgpu-shim.so timeout 60 "$PROG" init alloc:1GiB alloc:1:2 >"$T/out" 2>"$T/err"
	rm -rf "$fixed"
}

# ---- memory quota -------------------------------------------------------------------------

test_boundary() {
	local m
	for m in "-m direct" "-m rt12" "-m rt11" "-m rt12 -p" "-p"; do
		setup $GiB
		# shellcheck disable=SC2086
		run $m init alloc:1GiB alloc:1:2 free alloc:1023MiB alloc:1048575 alloc:1 alloc:1:2 free alloc:2:2 \
			alloc:1 freeall alloc:1GiB touch:"$T/full" waitfile:"$T/exit" &
		waitfor "$T/full"
		expect "$m region used while held" "$(used)" $GiB
		touch "$T/exit"
		wait
		grep -q '^ok$' "$T/out"
		# One line per refusal, and the slot is given back at exit.
		expect "$m stderr lines" "$(grep -c 'quota exceeded' "$T/err")" 3
		expect "$m region used after exit" "$(used)" 0
		# World-writable whatever the umask, so processes of any uid can join.
		expect "$m region mode" "$(stat -c %a "$T/region/usage")" 666
	done
}

test_every_counted_api() {
	local m k
	for m in "-m direct" "-m rt12 -p" "-m rt11"; do
		setup $((64 * MiB))
		# Each API fills the quota exactly, is refused one byte more, and its free gives it all back.
		for k in "alloc:64MiB" "managed:64MiB" "async:64MiB" "pool:64MiB" "create:0:64MiB" "pitch:1000:65536" \
			"array:4096:4096" "array3d:1024:1024:16" "mipmap:4096:4096:1"; do
			# shellcheck disable=SC2086
			run $m init "$k" alloc:1:2 free alloc:64MiB free
			expect "$m $k used after free" "$(used)" 0
		done
		# pitch counts the real pitch (1000 -> 1024 bytes) times the height.
		run $m init pitch:1000:65536:0 alloc:1:2
		run $m init pitch:1000:65537:2
		# A mipmap counts every level: 2048x1024 floats = 8 MiB, +2 MiB, +0.5 MiB...
		run $m init mipmap:2048:1024:3 alloc:53.5MiB alloc:1:2
		# cuMemCreate on the other GPU (not in the limits file) is refused.
		run $m init create:1:1MiB:2
	done
}

# limits2 MEM0 MEM1 — both fake GPUs listed, with their own memory limits.
limits2() {
	cat >"$T/limits" <<-EOF
		version=1
		gpu.0.uuid=$UUID0
		gpu.0.memory=$1
		gpu.0.cores=100
		gpu.1.uuid=$UUID1
		gpu.1.memory=$2
		gpu.1.cores=100
		$(shards_key)
	EOF
}

used1() { "$DUMP" "$T/region/usage" | sed -n 's/^dev 1 .*used=\([0-9]*\).*/\1/p'; }

test_stream_ordered_device() {
	# The calling thread's current context is on GPU 0 (256 MiB), the memory
	# lands on GPU 1 (32 MiB): a stream of GPU 1, or a pool located there.
	# GPU 1's quota is charged and refuses one byte more, GPU 0's stays whole,
	# and the free gives it back to GPU 1.
	local m k
	for m in "-m direct" "-m rt12 -p" "-m rt11"; do
		setup
		limits2 $((256 * MiB)) $((32 * MiB))
		for k in "ctx:1 stream ctx:0 async" "ctx:1 poolcreate:1 ctx:0 pool" "ctx:1 stream poolcreate:1 ctx:0 pool" \
			"defpool:1 pool" "curpool:1 pool" "ctx:1 stream ctx:0 defpool:1 pool"; do
			# shellcheck disable=SC2086
			run $m init $k:32MiB ${k##* }:1:2 alloc:256MiB alloc:1:2 free free ${k##* }:32MiB free
		done
		# Held: the region shows it on GPU 1, nothing on GPU 0.
		# Freed blocks stay in their pools (release threshold 0) until the sync.
		# shellcheck disable=SC2086
		run $m init ctx:1 stream ctx:0 async:16MiB nostream poolcreate:1 pool:16MiB touch:"$T/held" \
			waitfile:"$T/go" freeall sync touch:"$T/freed" waitfile:"$T/end" &
		waitfor "$T/held"
		expect "$m GPU 1 used while held" "$(used1)" $((32 * MiB))
		expect "$m GPU 0 used while held" "$(used)" 0
		touch "$T/go"
		waitfor "$T/freed"
		expect "$m GPU 1 used after the frees" "$(used1)" 0
		touch "$T/end"
		wait
		rm -f "$T/held" "$T/go" "$T/freed" "$T/end"
	done
	# Same-device streams and the current device's pools count as before.
	setup $((64 * MiB))
	run init stream async:64MiB async:1:2 free defpool:0 pool:64MiB pool:1:2 free alloc:64MiB
}

test_vmm_release_while_mapped() {
	local m
	for m in "-m direct" "-m rt12" "-m rt11"; do
		setup $((64 * MiB))
		# Released while mapped: the memory lives until the unmap.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB map:64MiB free alloc:1:2 unmap:64MiB alloc:64MiB
		# A retained reference keeps it after the mapping is gone, until released too.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB map:64MiB retain free alloc:1:2 unmap:64MiB alloc:1:2 free alloc:64MiB
		# Unmapped before the release: freed at the release, as before.
		# shellcheck disable=SC2086
		run $m init create:0:64MiB map:64MiB unmap:64MiB alloc:1:2 free alloc:64MiB
		expect "$m used" "$(used)" 0
	done
}

test_array_formats() {
	setup $((64 * MiB))
	# UNORM_INT16X1 (0xc3) is 2 bytes an element: 4096x4096 = 32 MiB, not 16.
	run init arrayfmt:0xc3:1:4096:4096 alloc:32MiB alloc:1:2
	# SNORM_INT16X1 (0xc9) likewise.
	run init arrayfmt:0xc9:1:4096:4096 alloc:32MiB alloc:1:2
	# UNORM_INT8X4 (0xc2) with 4 channels is 4 bytes an element (16 MiB), not 16 bytes;
	# with NumChannels 1 still 4 bytes (the format names its size).
	run init arrayfmt:0xc2:4:4096:1024 alloc:48MiB alloc:1:2
	run init arrayfmt:0xc2:1:4096:1024 alloc:48MiB alloc:1:2
	# Formats past any small table (packed, BC, planar) are counted, never overflow.
	run init arrayfmt:0x50:1:1024:1024 arrayfmt:0x91:1:1024:1024 arrayfmt:0xb0:1:1024:1024 freeall
	expect "used after free" "$(used)" 0
}

test_driver_failure_gives_back() {
	setup $((64 * MiB))
	FAKECUDA_FAIL=cuMemAlloc_v2:1 run init alloc:64MiB:2 alloc:64MiB
	expect "used" "$(used)" 0
	FAKECUDA_FAIL=cuMemCreate:1 run init create:0:64MiB:2 create:0:64MiB
	expect "used" "$(used)" 0
}

test_context_footprint() { # [PIDNS_OFFSET]
	setup $((256 * MiB))
	pidns "${1:-0}"
	export FAKECUDA_CTX_BYTES=$((64 * MiB))
	run init alloc:192MiB alloc:1:2 info:0:256MiB
	run init newctx:0 alloc:128MiB alloc:1:2 delctx ctx:0 alloc:192MiB alloc:1:2
	# The same through the pre-3.2 cuCtxCreate / cuCtxDestroy (asked for at 2000).
	run -m rt12 init newctxv1:0 alloc:128MiB alloc:1:2 delctxv1 ctx:0 alloc:192MiB alloc:1:2
	run init release:0 ctx:0 alloc:192MiB
}

# ---- reported memory ------------------------------------------------------------------------------

test_reported_memory() {
	setup $((3 * GiB))
	run init alloc:1GiB info:2GiB:3GiB infonull:2GiB:3GiB total:0:3GiB total:1:8GiB nvml:0:3GiB:1GiB:2GiB
	# Limit above the card: the card's size. Limit 0: no limit, the real values.
	limits $((32 * GiB)) 100 hard
	run init alloc:1GiB info:15GiB:16GiB total:0:16GiB nvml:0:16GiB:1GiB:15GiB
	limits 0 100 hard
	run init alloc:1GiB info:15GiB:16GiB total:0:16GiB
	# Another process's usage counts (the container's, not the caller's), and used above the
	# limit (a module loaded after the quota filled is counted even past it: 64 MiB here, as are
	# the contexts, 64 MiB each) saturates free at 0 rather than wrapping.
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_MODULE_BYTES=$((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:896MiB touch:"$T/held" waitfile:"$T/end" >"$T/out.a" 2>&1 &
	waitfor "$T/held"
	run init modload:data info:0:1GiB nvml:0:1GiB:1088MiB:0 alloc:1:2
	unset FAKECUDA_MODULE_BYTES
	touch "$T/end"
	wait
	# Real free below the slice's: min(slice free, real free).
	setup $((16 * GiB))
	LD_PRELOAD= timeout 60 "$PROG" init alloc:15GiB sleep:2000 >/dev/null &
	sleep 0.5
	run init info:1GiB:16GiB nvml:0:16GiB:0:1GiB
	wait
}

test_threads_without_context() {
	setup $GiB
	run init alloc:1GiB thread alloc:1:2 alloc:1:2
}

# ---- interception ----------------------------------------------------------------------------------

test_names_exact() {
	setup
	run -m rt12 init where:cuMemAlloc_v2 where:cuMemAlloc where:cuInit where:cudnnCreate wheredef:cudnnCreate \
		where:cuMemAllocX where:nvmlDeviceGetMemoryInfo where:cuGetProcAddress where:cuGetProcAddress_v2 \
		gpa:cuMemAlloc:3020:0 gpa:cuMemAlloc:2000:0 gpa:cuLaunchKernel:7000:2 gpa:cuLaunchKernel:7000:0 \
		gpa:cuLaunchKernel:4000:2 gpa:cuCtxCreate:3020:0 gpa:cuCtxCreate:11040:0 gpa:cuCtxCreate:12050:0 \
		gpa:cuGetProcAddress:11030:0 gpa:cuGetProcAddress:12000:0 gpa:cuNoSuchThing:12000:0 \
		gpa:cuMemAllocAsync:11000:0 gpa:cuMemAllocAsync:11020:2 gpa:cuDeviceGetName:2000:0
	o=$T/out
	grep -q '^where cuMemAlloc_v2 libvgpu-shim.so cuMemAlloc_v2$' "$o"
	grep -q '^where cuMemAlloc libvgpu-shim.so cuMemAlloc$' "$o"
	grep -q '^where cuInit libcuda.so.1 cuInit$' "$o"
	grep -q '^where cudnnCreate NULL' "$o"
	grep -q '^wheredef cudnnCreate NULL' "$o"
	grep -q '^where cuMemAllocX NULL' "$o"
	grep -q '^where cuGetProcAddress libvgpu-shim.so cuGetProcAddress$' "$o"
	grep -q '^where cuGetProcAddress_v2 libvgpu-shim.so cuGetProcAddress_v2$' "$o"
	grep -q '^gpa cuMemAlloc 3020 rc=0 status=0 libvgpu-shim.so cuMemAlloc_v2$' "$o"
	grep -q '^gpa cuMemAlloc 2000 rc=0 status=0 libvgpu-shim.so cuMemAlloc$' "$o"
	grep -q '^gpa cuLaunchKernel 7000 rc=0 status=0 libvgpu-shim.so cuLaunchKernel_ptsz$' "$o"
	grep -q '^gpa cuLaunchKernel 7000 rc=0 status=0 libvgpu-shim.so cuLaunchKernel$' "$o"
	grep -q '^gpa cuLaunchKernel 4000 rc=0 status=0 libvgpu-shim.so cuLaunchKernel$' "$o"
	grep -q '^gpa cuCtxCreate 3020 rc=0 status=0 libvgpu-shim.so cuCtxCreate_v2$' "$o"
	grep -q '^gpa cuCtxCreate 11040 rc=0 status=0 libvgpu-shim.so cuCtxCreate_v3$' "$o"
	grep -q '^gpa cuCtxCreate 12050 rc=0 status=0 libvgpu-shim.so cuCtxCreate_v4$' "$o"
	grep -q '^gpa cuGetProcAddress 11030 rc=0 status=0 libvgpu-shim.so cuGetProcAddress$' "$o"
	grep -q '^gpa cuGetProcAddress 12000 rc=0 status=0 libvgpu-shim.so cuGetProcAddress_v2$' "$o"
	grep -q '^gpa cuNoSuchThing 12000 rc=0 status=1 NULL' "$o"
	grep -q '^gpa cuMemAllocAsync 11000 rc=0 status=2 NULL' "$o"
	grep -q '^gpa cuMemAllocAsync 11020 rc=0 status=0 libvgpu-shim.so cuMemAllocAsync_ptsz$' "$o"
	grep -q '^gpa cuDeviceGetName 2000 rc=0 status=0 libcuda.so.1 cuDeviceGetName$' "$o"
	# Binaries built against glibc < 2.34 call dlsym@GLIBC_2.2.5: hooked the same.
	run -m rt12 init where225:cuMemAlloc_v2 where225:cudnnCreate where225:cuInit driverself
	grep -q '^where225 cuMemAlloc_v2 libvgpu-shim.so cuMemAlloc_v2$' "$T/out"
	grep -q '^where225 cudnnCreate NULL' "$T/out"
	grep -q '^where225 cuInit libcuda.so.1 cuInit$' "$T/out"
	# The 4-argument ABI: unknown names fail with CUDA_ERROR_NOT_FOUND, untouched.
	run -m rt11 init gpa:cuNoSuchThing:11030:0 gpa:cuMemAlloc:3020:0
	grep -q '^gpa cuNoSuchThing 11030 rc=500 status=-1 NULL' "$T/out"
	grep -q '^gpa cuMemAlloc 3020 rc=0 status=-1 libvgpu-shim.so cuMemAlloc_v2$' "$T/out"
	# A legacy entry point the shim does not need is passed through unwrapped (the fake makes
	# the call loud); the pre-3.2 cuCtxCreate is the shim's.
	if LD_PRELOAD=$SHIM timeout 20 "$PROG" -m rt12 init calllegacy:cuCtxAttach >"$T/out" 2>"$T/err"; then
		echo "    calling the legacy cuCtxAttach did not abort"
		return 1
	fi
	grep -q "legacy ABI cuCtxAttach called" "$T/err"
	run -m rt12 init gpa:cuCtxCreate:2000:0 gpa:cuCtxDestroy:2000:0 gpa:cuGLCtxCreate:2000:0 gpa:cuVDPAUCtxCreate:3010:0
	grep -q '^gpa cuCtxCreate 2000 rc=0 status=0 libvgpu-shim.so cuCtxCreate$' "$T/out"
	grep -q '^gpa cuCtxDestroy 2000 rc=0 status=0 libvgpu-shim.so cuCtxDestroy$' "$T/out"
	grep -q '^gpa cuGLCtxCreate 2000 rc=0 status=0 libvgpu-shim.so cuGLCtxCreate$' "$T/out"
	grep -q '^gpa cuVDPAUCtxCreate 3010 rc=0 status=0 libvgpu-shim.so cuVDPAUCtxCreate$' "$T/out"
	# Every launch entry point through each access path.
	run init launchall
	run -p init launchall
	run -m rt12 -p init launchall
}

test_stacked_interposer() {
	setup $((64 * MiB))
	# As in a container: LD_PRELOAD is loaded before /etc/ld.so.preload, so a
	# tenant's interposer comes before the shim. Its RTLD_NEXT lookup finds
	# the shim's wrapper: each call goes through it once, counted once.
	LD_PRELOAD="$B/libinterposer.so $SHIM" timeout 20 "$PROG" init alloc:64MiB alloc:1:2 info:0 \
		>"$T/out" 2>"$T/err"
	grep -q "interposer: 2 calls" "$T/err"
	expect "used" "$(used)" 0
	# Loaded after the shim, its RTLD_NEXT lookup gets the shim's wrapper
	# too (not the driver's function), and the shim's wrappers never forward
	# to it: no loop, nothing uncounted, and it is not called.
	LD_PRELOAD="$SHIM $B/libinterposer.so" timeout 20 "$PROG" init alloc:64MiB alloc:1:2 info:0 \
		>"$T/out" 2>"$T/err"
	grep -q "interposer: 0 calls" "$T/err"
}

test_next_lookup_wrapped() {
	local m
	for m in link dl; do
		setup $((64 * MiB))
		# A library after the preloaded shim (linked before libcuda, or
		# dlopened with libcuda as its own dependency) asks dlsym(RTLD_NEXT)
		# for cuMemAlloc_v2 and allocates 16 MiB eight times: it gets the
		# shim's wrapper, and only 4 fit in the 64 MiB quota.
		LD_PRELOAD=$SHIM timeout 20 "$B/nextprog" 8 $m >"$T/out" 2>"$T/err" || { cat "$T/err"; return 1; }
		grep -qx 'next cuMemAlloc_v2 libvgpu-shim.so' "$T/out"
		grep -qx 'next cuMemFree_v2 libvgpu-shim.so' "$T/out"
		grep -qx 'allocated 4' "$T/out"
		# dlvsym finds no unversioned definition (none of the driver's names
		# has a version), so it is no way around the hook.
		grep -qx 'vnext cuMemAlloc_v2 none' "$T/out"
		# Names the shim does not hook still resolve relative to the caller.
		grep -qx 'next cuDeviceGet libcuda.so.1' "$T/out"
	done
}

# ---- cross-process ----------------------------------------------------------------------------------------

test_16_racers() {
	setup $((100 * MiB))
	local i
	for i in $(seq 1 16); do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" waitfile:"$T/go" init fill:1MiB touch:"$T/done.$i" waitfile:"$T/end" \
			>"$T/racer.$i" 2>"$T/err.$i" &
	done
	sleep 0.3
	touch "$T/go"
	for i in $(seq 1 16); do
		waitfor "$T/done.$i"
	done
	# Starting together, they made one region file between them, and said nothing but the
	# refusal that ended each one's fill.
	expect "stderr but the refusals" "$(cat "$T"/err.* | grep -v 'GPU memory quota exceeded' || true)" ""
	local total
	total=$(cat "$T"/racer.* | awk '/^filled /{s += $2} END {print s}')
	expect "allocations across 16 processes" "$total" 100
	expect "region used" "$(used)" $((100 * MiB))
	expect "slots" "$(slots)" 16
	touch "$T/end"
	wait
	expect "used after all exit" "$(used)" 0
	expect "slots after all exit" "$(slots)" 0
}

test_sigkill_mid_allocation() {
	setup $((64 * MiB))
	# The second allocation sleeps inside the (fake) driver, already reserved.
	FAKECUDA_FAIL=cuMemAlloc_v2:2:60000 LD_PRELOAD=$SHIM "$PROG" init alloc:16MiB alloc:32MiB >/dev/null 2>&1 &
	local pid=$!
	local i
	for i in $(seq 100); do [ "$(used)" = $((48 * MiB)) ] && break; sleep 0.05; done
	expect "reserved before the driver returned" "$(used)" $((48 * MiB))
	kill -9 $pid
	wait $pid 2>/dev/null || true
	# Neither wedged nor leaked: the whole quota is available to the next process.
	timeout 10 env LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:64MiB >"$T/out" 2>"$T/err"
	# Killed while holding the lock: an OFD lock dies with its holder.
	python3 - "$T/region/usage" <<-'EOF' &
		import fcntl, os, sys, time
		fd = os.open(sys.argv[1], os.O_RDWR)
		import struct
		# struct flock: short type, short whence, off_t start, off_t len, pid_t pid
		fl = struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0)
		fcntl.fcntl(fd, 38, fl)  # F_OFD_SETLKW
		open(sys.argv[1] + '.locked', 'w').close()
		time.sleep(60)
	EOF
	local lk=$!
	for i in $(seq 100); do [ -e "$T/region/usage.locked" ] && break; sleep 0.05; done
	kill -9 $lk
	wait $lk 2>/dev/null || true
	timeout 10 env LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:64MiB >"$T/out" 2>"$T/err"
}

test_nvml_absent_no_search() {
	# No NVML beside the driver (a copy of libcuda in a directory without libnvidia-ml, first
	# on LD_LIBRARY_PATH): the shim never asks the loader to search for it (it looks only
	# beside libcuda, by path), charges the context the bound and allocates to the byte
	# beyond it.
	setup $((FP_BOUND + 64 * MiB))
	mkdir "$T/cudaonly"
	cp "$B/fake/libcuda.so.1" "$T/cudaonly/libcuda.so.1"
	LD_LIBRARY_PATH=$T/cudaonly LD_DEBUG=libs LD_DEBUG_OUTPUT=$T/ld LD_PRELOAD=$SHIM timeout 60 \
		"$PROG" init alloc:64MiB alloc:1:2 ctx:0 >"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err"; return 1; }
	expect "loader searches for NVML" "$(cat "$T"/ld.* | grep -c 'find library=libnvidia-ml.so.1' || true)" 0
	# With NVML where the loader looks: found, and used (the slot's host pid is NVML's).
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/held" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local a=$!
	waitfor "$T/held" $a || { cat "$T/out" "$T/err"; return 1; }
	expect_hostpids 1 0
	touch "$T/end"
	wait $a
}

test_slot_rebuilt_ahead() {
	# A process's report waits for the region's lock (its grant is in the ledger already) and
	# another's periodic rebuild writes the ledger's figures into its slot first: when it gets
	# to its slot it finds what it would have written, not a tampered slot.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/c" waitfile:"$T/go2" alloc:1MiB \
		touch:"$T/c2" waitfile:"$T/end" >"$T/out.c" 2>"$T/err.c" &
	local c=$!
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/a" waitfile:"$T/go" alloc:2MiB \
		touch:"$T/b" waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/c" $c && waitfor "$T/a" $a || return 1
	write_locker "$T/region/usage" 120 &
	local lk=$! p
	waitfor "$T/region/usage.locked" $lk || return 1
	touch "$T/go"
	waitfor "$T/b" $a || { kill $lk; return 1; }
	p=$(pgrep -P $a)
	kill -STOP "$p" # its keeper too: the rebuild comes first
	kill -9 $lk
	wait $lk 2>/dev/null || true
	sleep 1.1 # the other's last rebuild is a second old: its next report rebuilds
	touch "$T/go2"
	waitfor "$T/c2" $c || { kill -CONT "$p"; return 1; }
	kill -CONT "$p"
	for i in $(seq 60); do [ "$(used)" = $((5 * MiB)) ] && break; sleep 0.05; done
	sleep 0.3 # its keeper's pass: it checks its slot
	expect "region used" "$(used)" $((5 * MiB))
	expect "stderr of the process whose slot was rebuilt ahead of it" "$(cat "$T/err.a")" ""
	touch "$T/end"
	wait $a $c
}

test_slot_rebuilt_then_changed() {
	# As above, and then the process's report changes again before it gets to its slot (a free
	# after the grant, both reports left to its keeper while the lock is held): at its next
	# report its slot holds what the ledger said for it in between, which is no tampering either.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/c" waitfile:"$T/go2" alloc:1MiB \
		touch:"$T/c2" waitfile:"$T/end" >"$T/out.c" 2>"$T/err.c" &
	local c=$!
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/a" waitfile:"$T/go" alloc:2MiB \
		touch:"$T/b" waitfile:"$T/go3" free touch:"$T/b2" waitfile:"$T/go4" alloc:1MiB touch:"$T/b3" \
		waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/c" $c && waitfor "$T/a" $a || return 1
	write_locker "$T/region/usage" 120 &
	local lk=$! p
	waitfor "$T/region/usage.locked" $lk || return 1
	touch "$T/go"
	waitfor "$T/b" $a || { kill $lk; return 1; }
	p=$(pgrep -P $a)
	kill -STOP "$p"
	kill -9 $lk
	wait $lk 2>/dev/null || true
	rm -f "$T/region/usage.locked"
	sleep 1.1 # the other's last rebuild is a second old: its next report rebuilds
	touch "$T/go2"
	waitfor "$T/c2" $c || { kill -CONT "$p"; return 1; }
	write_locker "$T/region/usage" 120 &
	lk=$!
	waitfor "$T/region/usage.locked" $lk || { kill -CONT "$p"; return 1; }
	kill -CONT "$p"
	touch "$T/go3"
	waitfor "$T/b2" $a || { kill $lk; return 1; }
	sleep 0.3 # its keeper publishes the free in the ledger; the region waits for the lock
	kill -9 $lk
	wait $lk 2>/dev/null || true
	touch "$T/go4" # its next report checks its slot
	waitfor "$T/b3" $a || return 1
	for i in $(seq 60); do [ "$(used)" = $((4 * MiB)) ] && break; sleep 0.05; done
	expect "region used" "$(used)" $((4 * MiB))
	expect "stderr of the process whose slot was rebuilt ahead of it" "$(cat "$T/err.a")" ""
	touch "$T/end"
	wait $a $c
}

test_exit_beside_stopped_holder() {
	# A process stopped while it holds the region's lock does not hold up the others' exits:
	# one with a slot and memory held exits (its slot left to the next rebuild) within a second.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 10 "$PROG" init alloc:8MiB touch:"$T/a" waitfile:"$T/go" >"$T/out" 2>"$T/err" &
	local a=$! st t0 t1 rc=0
	waitfor "$T/a" $a || { cat "$T/out" "$T/err"; return 1; }
	expect "slots" "$(slots)" 1
	python3 - "$T/region/usage" <<-'EOF' &
		import fcntl, os, signal, struct, sys
		fd = os.open(sys.argv[1], os.O_RDWR)
		fcntl.fcntl(fd, 38, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLKW
		open(sys.argv[1] + '.locked', 'w').close()
		os.kill(os.getpid(), signal.SIGSTOP)
	EOF
	st=$!
	waitfor "$T/region/usage.locked" $st || return 1
	t0=$(date +%s%N)
	touch "$T/go"
	wait $a || rc=$?
	t1=$(date +%s%N)
	kill -9 $st
	wait $st 2>/dev/null || true
	expect "its exit status (124: still there after 10 s)" $rc 0
	expect "exit within a second" "$((t1 - t0 < 1000000000))" 1 || { echo "    took $(((t1 - t0) / 1000000)) ms"; return 1; }
	run init alloc:64MiB alloc:1:2 # its memory went with it
}

test_hostpid_from_proc() {
	# A process of another pid namespace that sees this namespace's /proc (and has no NVML to
	# ask) records its pid here (the outermost NSpid entry) as its host pid; with a /proc of
	# its own it can name none (0).
	setup $((FP_BOUND + 64 * MiB)) # without NVML the context is charged the bound
	mkdir "$T/cudaonly"
	cp "$B/fake/libcuda.so.1" "$T/cudaonly/libcuda.so.1"
	local mp u p want
	for mp in "" --mount-proc; do
		rm -f "$T/held" "$T/end"
		LD_LIBRARY_PATH=$T/cudaonly LD_PRELOAD=$SHIM timeout 60 unshare --pid --fork $mp \
			"$PROG" init alloc:1MiB touch:"$T/held" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
		u=$!
		waitfor "$T/held" $u || { cat "$T/out" "$T/err"; return 1; }
		p=$(pgrep -P "$(pgrep -P $u)")
		want=$(awk '/^NSpid/ {print $2, $3}' /proc/"$p"/status) # here, there
		if [ -z "$mp" ]; then want="${want#* } ${want% *}"; else want="${want#* } 0"; fi
		expect "slot (pid host_pid) with /proc ${mp:-of the parent namespace}" "$(hostpids)" "$want"
		touch "$T/end"
		wait $u
	done
}

test_region_truncated_in_use() {
	# The region file is the tenant's to write: a loop truncates it to nothing and grows it back
	# as fast as it can while 8 processes allocate and free at random for 3 s. Accesses that
	# race with a truncation fault (SIGBUS), which must kill no one: every process exits 0, and
	# the quota holds (the region is only a report; the fake GPU's peak stays within it).
	setup $((48 * MiB))
	local i pids=() bad=0
	# Half of them have a SIGBUS handler of their own, and a thread that faults in a mapping of
	# their own all along: those faults reach the program's handler (the default action would
	# kill), and it is still installed at the end.
	for i in $(seq 1 8); do
		local own=""
		if [ $((i % 2)) = 0 ]; then own="ownbus:3000"; fi
		# shellcheck disable=SC2086
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init waitfile:"$T/go" $own churn:3000:8MiB:$i ${own:+ownbusjoin} \
			>"$T/churn.$i" 2>"$T/err.$i" &
		pids+=($!)
	done
	waitfor "$T/region/usage"
	python3 - "$T/region/usage" 3.5 >"$T/truncs" <<-'EOF' &
		import os, sys, time
		path, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
		size, n = os.stat(path).st_size, 0
		while time.monotonic() < until:
		    try:
		        os.truncate(path, 0)
		        os.truncate(path, size)
		        n += 1
		    except OSError:
		        pass
		print(n)
	EOF
	local tr=$!
	touch "$T/go"
	for i in $(seq 1 8); do
		wait "${pids[$((i - 1))]}" || { echo "    process $i: exit $?"; bad=1; }
	done
	wait $tr
	expect "processes that churned" "$(cat "$T"/churn.* | grep -c '^churn ok=')" 8 || bad=1
	expect "programs whose own handler saw their faults" "$(cat "$T"/churn.* | grep -c '^ownbus faults=[1-9]')" 4 || bad=1
	LD_PRELOAD= timeout 20 "$PROG" peak:0:$((48 * MiB)) >"$T/out" 2>"$T/err" || { cat "$T/out"; bad=1; }
	echo "    info: $(cat "$T/truncs") truncations"
	return $bad
}

test_region_lock_held() {
	# The region is a report: while another process holds its lock (one stopped inside it, or
	# the tenant), a process of the container allocates and is refused without waiting for it
	# (its report is left to its keeper thread), and a new process starts (it maps the file
	# without the lock; both hung there before); the quota holds all the same. Once the lock
	# is free the keeper writes what was left, and a process's exit gives its slot back.
	setup $((64 * MiB))
	# Its first grant comes while the lock is held: no chunk, so no keeper but the one the
	# report it could not write starts.
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init ctx:0 touch:"$T/a" waitfile:"$T/go" alloc:17MiB \
		alloc:48MiB:2 touch:"$T/b" waitfile:"$T/end" free >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/a" $a || return 1
	write_locker "$T/region/usage" 120 &
	local lk=$! i
	waitfor "$T/region/usage.locked" $lk || return 1
	touch "$T/go"
	waitfor "$T/b" $a || { cat "$T/out.a" "$T/err.a"; kill $lk; return 1; }
	expect "stderr: the refusal alone" "$(grep -vc 'quota exceeded' "$T/err.a")" 0
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:47MiB alloc:1:2 >"$T/out" 2>"$T/err" ||
		{ cat "$T/out" "$T/err"; kill $lk; return 1; }
	expect "stderr: the refusal alone" "$(grep -vc 'quota exceeded' "$T/err")" 0
	kill -9 $lk
	wait $lk 2>/dev/null || true
	for i in $(seq 60); do [ "$(used)" = $((17 * MiB)) ] && break; sleep 0.05; done
	expect "region used once the lock is free (the keeper's report)" "$(used)" $((17 * MiB))
	expect "slots" "$(slots)" 1
	touch "$T/end"
	wait $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	expect "region used after its exit" "$(used)" 0
	run init alloc:64MiB alloc:1:2
}

test_slot_made_for_it() {
	# An entry for a process that another's rebuild made from the ledger before the process's
	# first report (here forged, with its pid and start time, holding nothing): the process
	# takes that entry rather than a second one.
	setup $((64 * MiB))
	run init # creates the region
	LD_PRELOAD=$SHIM timeout 60 "$PROG" cuinit touch:"$T/a" waitfile:"$T/go" ctx:0 alloc:8MiB touch:"$T/b" \
		waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local a=$! pa
	waitfor "$T/a" $a || return 1
	pa=$(pgrep -P $a | head -n 1)
	"$DUMP" forge "$T/region/usage" "$pa" "$(awk '{print $22}' /proc/"$pa"/stat)" 0 0 >/dev/null
	touch "$T/go"
	waitfor "$T/b" $a || { cat "$T/out" "$T/err"; return 1; }
	expect "entries of the process (used0)" \
		"$("$DUMP" "$T/region/usage" | sed -n "s/^proc pid=$pa .* used0=\([0-9]*\) .*/\1/p")" $((8 * MiB))
	touch "$T/end"
	wait $a
}

test_pid_reuse() {
	# Slots are a report, not the accounting: one forged for a live process (this shell, with its
	# real start time), one for a reused pid (the same pid, another start time) and one for a
	# process that is gone take no quota, and the process that registers next corrects them from
	# the ledger: the live one holds nothing, the other two are dropped.
	setup $((64 * MiB))
	run init # creates the region
	local gone st
	sleep 0 &
	gone=$!
	wait $gone
	st=$(awk '{print $22}' /proc/$$/stat)
	"$DUMP" forge "$T/region/usage" $$ "$st" 0 $((64 * MiB)) >/dev/null
	"$DUMP" forge "$T/region/usage" $$ 12345 0 $((64 * MiB)) >/dev/null
	"$DUMP" forge "$T/region/usage" $gone 1 0 $((64 * MiB)) >/dev/null
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:64MiB alloc:1:2 touch:"$T/held" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	waitfor "$T/held"
	expect "slots of this shell (start used0)" \
		"$("$DUMP" "$T/region/usage" | sed -n "s/^proc pid=$$ host_pid=[0-9]* start=\([0-9]*\) used0=\([0-9]*\) .*/\1 \2/p")" "$st 0"
	expect "slots of the gone process" "$("$DUMP" "$T/region/usage" | grep -c "^proc pid=$gone " || true)" 0
	expect "slots holding memory (used0)" "$("$DUMP" "$T/region/usage" | sed -n 's/^proc .* used0=\([1-9][0-9]*\) .*/\1/p')" \
		$((64 * MiB))
	expect "region used" "$(used)" $((64 * MiB))
	touch "$T/end"
	wait
}

test_fork() {
	setup $((300 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:100MiB fork:150MiB:"$T/go" sleep:300 alloc:50MiB alloc:1:2 \
		touch:"$T/mid" waitfile:"$T/go" wait alloc:150MiB alloc:1:2 >"$T/out" 2>"$T/err" &
	local pid=$!
	waitfor "$T/mid"
	expect "slots while the child runs" "$(slots)" 2
	expect "used while the child runs" "$(used)" $((300 * MiB))
	touch "$T/go"
	wait $pid
	grep -q "child .* alloc 0" "$T/out"
}

test_fork_during_init() {
	# A thread is inside the shim's first initialisation (held there by the
	# test build's hook, build/testhooks) when the main thread forks, while
	# another thread keeps taking the tracker's lock. The children must find
	# no lock left held (the fork handler is in place from the start of the
	# initialisation), and since glibc's pthread_once lets a child run the
	# initialisation itself rather than wait for a thread it does not have,
	# the last child initialises, allocates and is counted in a slot of its own.
	setup $((64 * MiB))
	run init # creates the region
	NRI_VGPU_TEST_INIT_HOLD=$T/release LD_PRELOAD=$B/testhooks/libvgpu-shim.so timeout 60 "$PROG" cuinit \
		forkinit:"$T/forked":300:40 touch:"$T/held" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local pid=$!
	waitfor "$T/forked"
	sleep 0.3 # the child is initialising too, held at the same place
	touch "$T/release"
	waitfor "$T/held"
	grep -q '^forkinit ok$' "$T/out"
	# Two slots: the parent's with its 1 MiB, and the child's own (its 1 MiB allocation succeeded,
	# or the child would have failed; what its slot says depends on whether a rebuild of the slots
	# saw it after its exit, when it held nothing any more).
	expect "slots (pid)" "$("$DUMP" "$T/region/usage" | sed -n 's/^proc pid=\([0-9]*\) .*/\1/p' | sort)" \
		"$(sed -n "s/^forked \([0-9]*\) from \([0-9]*\)$/\1\n\2/p" "$T/out" | sort)"
	expect "the parent's used0" \
		"$("$DUMP" "$T/region/usage" | sed -n "s/^proc pid=$(sed -n 's/^forked [0-9]* from //p' "$T/out") .* used0=\([0-9]*\) .*/\1/p")" $MiB
	expect "stderr" "$(cat "$T/err")" ""
	touch "$T/end"
	wait $pid
}

# ---- a tenant who writes the usage region ---------------------------------------------------------------
# The region is writable from inside the container, by any process, with no capabilities:
# nothing written there may give the container more than its quota. Offsets from
# shim/include/region.h: a 64-byte header (magic at 0, version 8, size 16), 16 devices of 144
# bytes at 64 (device 0: limit at 160, used at 168), 1024 process slots of 272 bytes at 2368
# (pid +0, host_pid +4, start_time +8, used[0] +16); 280896 bytes in all.
REGION_SIZE=280896
PROCS_AT=2368
SLOT_SIZE=272

# put FILE OFFSET BYTES (printf escapes) — overwrite in place, as `dd conv=notrunc` does.
put() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# zero FILE OFFSET LENGTH
zero() { dd if=/dev/zero of="$1" bs="$3" count=1 seek="$2" oflag=seek_bytes conv=notrunc status=none; }

tamper_zero_limit() { zero "$1" 160 8; }
tamper_zero_used() { # the device's counter and every slot's used[0]; the slots stay
	local i
	zero "$1" 168 8
	for i in $(seq 0 15); do zero "$1" $((PROCS_AT + i * SLOT_SIZE + 16)) 8; done
}
tamper_zero_slots() { zero "$1" 168 8 && zero "$1" $PROCS_AT $((REGION_SIZE - PROCS_AT)); }
tamper_truncate() { truncate -s 0 "$1"; }
tamper_truncate_partial() { truncate -s 4096 "$1"; }
tamper_garbage() { dd if=/dev/urandom of="$1" bs=$REGION_SIZE count=1 iflag=fullblock conv=notrunc status=none; }
tamper_bad_header() { put "$1" 0 'NOTVGPU!\x63\x00\x00\x00'; }
tamper_huge() {
	# Impossible values: used and limit at 2^64-1, and a slot of a live process (this shell, with
	# its real start time) that claims 2^63 bytes.
	local slot=$((PROCS_AT + 5 * SLOT_SIZE)) st
	st=$(awk '{print $22}' /proc/$$/stat)
	put "$1" 160 '\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff'
	python3 - "$1" "$slot" "$$" "$st" <<-'EOF'
		import struct, sys
		f = open(sys.argv[1], "r+b")
		f.seek(int(sys.argv[2]))
		f.write(struct.pack("<iiQQ", int(sys.argv[3]), 0, int(sys.argv[4]), 1 << 63))
	EOF
}
tamper_delete() { rm "$1"; }
tamper_symlink() {
	# A symlink to a file elsewhere (of the region's size): the shim must neither follow nor write it.
	head -c $REGION_SIZE /dev/zero >"$T/elsewhere"
	rm "$1" && ln -s "$T/elsewhere" "$1"
}
tamper_smaller_file() { rm "$1" && head -c 4096 /dev/zero >"$1"; }
tamper_larger_file() { rm "$1" && head -c $((2 * REGION_SIZE)) /dev/urandom >"$1"; }
tamper_fifo() { rm "$1" && mkfifo "$1"; }
tamper_directory() { rm "$1" && mkdir "$1"; }

# test_tenant TAMPER — of a 64 MiB quota, process A holds 40 MiB and process H 8 MiB; the tenant
# applies TAMPER to the region. Then A still gets exactly the 16 MiB left and no more, a new
# process B too (no fresh quota), and A's own accounting is intact (after its free it gets back
# exactly its 40 MiB). Where the region can be rebuilt, it shows the truth again, H included,
# which does nothing after the damage.
test_tenant() {
	local tamper=$1 f
	setup $((64 * MiB))
	f=$T/region/usage
	said() { sed "s/^/    $1: /" "$T/out.$1" "$T/err.$1"; return 1; }
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:8MiB touch:"$T/hheld" waitfile:"$T/end" >"$T/out.h" 2>"$T/err.h" &
	local h=$!
	waitfor "$T/hheld" $h || said h
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:40MiB touch:"$T/held" waitfile:"$T/go" alloc:32MiB:2 alloc:16MiB \
		free touch:"$T/checked" waitfile:"$T/go2" alloc:1:2 free alloc:40MiB alloc:1:2 touch:"$T/adone" \
		waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/held" $a || said a
	"tamper_$tamper" "$f"
	touch "$T/go"
	waitfor "$T/checked" $a || said a
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:32MiB:2 alloc:16MiB alloc:1:2 touch:"$T/bheld" \
		waitfile:"$T/end" >"$T/out.b" 2>"$T/err.b" &
	local b=$!
	waitfor "$T/bheld" $b || said b
	touch "$T/go2"
	waitfor "$T/adone" $a || said a
	if [ "$tamper" != directory ]; then
		# Rebuilt from what the tenant cannot write: H's 8 MiB, B's 16 MiB, A's 40 MiB.
		[ -f "$f" ] && [ ! -L "$f" ]
		expect "region header" "$("$DUMP" "$f" | head -n 1 | cut -d' ' -f1-3)" "magic=ok version=2 size=$REGION_SIZE"
		# The peak restarted at the rebuild (at the 48 MiB held then) and rose with A's and B's
		# grants to the quota; nothing is throttled at cores=100.
		expect "device 0" "$("$DUMP" "$f" | grep '^dev 0 ' | sed 's/ uuid=[^ ]*//')" \
			"dev 0 limit=$((64 * MiB)) used=$((64 * MiB)) cores=100 peak=$((64 * MiB)) throttled_ns=0"
		# (A slot forged for a live process stays, saying what it holds: nothing.)
		expect "slots holding memory (used0)" \
			"$("$DUMP" "$f" | sed -n 's/^proc .* used0=\([1-9][0-9]*\) .*/\1/p' | sort -n | tr '\n' ' ')" \
			"$((8 * MiB)) $((16 * MiB)) $((40 * MiB)) "
	fi
	if [ "$tamper" = symlink ]; then
		expect "bytes written through the symlink" "$(tr -d '\0' <"$T/elsewhere" | wc -c)" 0
	fi
	touch "$T/end"
	wait $a || said a
	wait $b || said b
	wait $h || said h
}

# racers_tampered TAMPER... — 16 processes fill a 100 MiB quota 1 MiB at a time while a tenant loop
# applies each TAMPER to the region, over and over. Prints the MiB they got in all.
racers_tampered() {
	setup $((100 * MiB))
	run init # creates the region
	local i
	for i in $(seq 1 16); do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init waitfile:"$T/go" fill:1MiB touch:"$T/done.$i" waitfile:"$T/end" \
			>"$T/racer.$i" 2>/dev/null &
	done
	(
		while [ ! -e "$T/end" ]; do
			for tamper in "$@"; do "tamper_$tamper" "$T/region/usage" 2>/dev/null || true; done
		done
	) &
	sleep 0.3
	touch "$T/go"
	for i in $(seq 1 16); do
		waitfor "$T/done.$i"
	done
	cat "$T"/racer.* | awk '/^filled /{s += $2} END {print s}' >"$T/total"
	touch "$T/end"
	wait
}

test_racers_region_zeroed() {
	# Zeroing leaves the file (and its lock) in place: the processes still take turns, so
	# exactly the quota is handed out.
	racers_tampered zero_slots
	expect "MiB allocated across 16 processes" "$(cat "$T/total")" 100
}

# racers_within_quota MODE WHAT: the racers under racers_tampered MODE hand out some memory,
# and never more than the 100 MiB quota.
racers_within_quota() {
	racers_tampered "$1"
	local total
	total=$(cat "$T/total")
	echo "    info: $total MiB of 100 allocated $2"
	[ "$total" -le 100 ] && [ "$total" -gt 0 ]
}

test_racers_region_deleted() {
	# Deleted over and over, the processes may lock different files for a moment and then
	# both refuse; never do they hand out more than the quota.
	racers_within_quota delete "while the region was deleted over and over"
}

test_racers_region_unusable() {
	# No region file at all (a directory in its place): no lock makes the processes take turns,
	# and still they never hand out more than the quota (each publishes before it measures the
	# others, so of two at once the later sees the earlier).
	racers_within_quota directory "with no region file"
}

test_ledger_unusable_fails_closed() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# Where the shim cannot record what the process holds (here another process holds a write
	# lock on the limits file, which the read-only mount rules out in a container), GPU memory is
	# refused with one clear line, and allowed again once it can.
	setup $((64 * MiB))
	write_locker "$T/limits" 60 &
	local lk=$!
	waitfor "$T/limits.locked"
	run init alloc:1MiB:2 managed:1MiB:2 info:0:64MiB
	expect "stderr lines" "$(grep -c . "$T/err")" 1
	grep -q "cannot record GPU memory" "$T/err"
	kill $lk
	wait $lk 2>/dev/null || true
	run init alloc:64MiB alloc:1:2
}

test_ledger_forged_entries() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# The tenant can add to the ledger, never take away: an entry forged for another pid is
	# counted, to the byte (16 MiB and 123 bytes leave 48 MiB less 123). Entries forged in a
	# process's own slot: t_slots.sh.
	setup $((64 * MiB))
	"$DUMP" hold "$T/limits" 1 0 $((16 * MiB + 123)) "$T/held1" &
	local h1=$!
	waitfor "$T/held1" $h1
	run init alloc:$((48 * MiB - 123)) alloc:1:2 info:0:64MiB
	kill $h1
	wait $h1 2>/dev/null || true
	run init alloc:64MiB
}

test_descriptors_closed() {
	# A program that closes every descriptor it did not open, and reuses the numbers, drops the
	# locks that published its usage: at its next allocation the shim opens the limits file
	# again and publishes everything again, so the quota holds for it and for the next process.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:48MiB closefds alloc:16MiB alloc:1:2 touch:"$T/held" \
		waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$!
	waitfor "$T/held" $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	run init alloc:1:2
	expect "region used" "$(used)" $((64 * MiB))
	touch "$T/end"
	wait $a
	grep -q "descriptor was closed or replaced by the program" "$T/err.a"
}

test_descriptor_replaced() {
	# A program that dup3()s a fresh open of the limits file over the shim's descriptor: the
	# same file (fstat cannot tell), but the description holding the process's leases, slot and
	# host pid claim is closed with every lock on it. At its next grant the shim sees its slot's
	# locks gone, opens the file again and takes everything again, so a sibling finds the
	# container full: 32 + 16 + 16 MiB, never more.
	setup $((64 * MiB))
	local carrier=$T/limits
	if [ "$SHARDS" -gt 0 ]; then carrier=$T/ledger; fi
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:32MiB dup3limits:"$carrier" alloc:16MiB touch:"$T/held" \
		waitfile:"$T/end" >"$T/out.a" 2>"$T/err.a" &
	local a=$! r=0
	waitfor "$T/held" $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	run init alloc:16MiB alloc:1:2 peak:0:64MiB || r=1
	expect "region used after the sibling" "$(used)" $((48 * MiB)) || r=1
	touch "$T/end"
	wait $a || r=1
	grep -q "descriptor was closed or replaced by the program" "$T/err.a" || r=1
	return $r
}

test_grant_checks_descriptor_once() {
	# A grant checks that the shim's descriptor is still its own description (a query of the
	# slot's identity byte, which this process holds: the query names it) once, and the report
	# of what the process holds, published right after under the same hold of the process's
	# mutex, rests on that check instead of asking again. One start and one allocation: the
	# slot is taken at the context, so the grant asks once; twice is the check repeated.
	command -v strace >/dev/null || { echo "    strace is missing (hack/deps.sh installs it)"; return 1; }
	setup $GiB
	LD_PRELOAD=$SHIM timeout 60 strace -f -o "$T/trace" -e trace=fcntl "$PROG" init alloc:1MiB \
		>"$T/out" 2>"$T/err" || { cat "$T/out" "$T/err"; return 1; }
	local n
	n=$(grep -c "F_OFD_GETLK, {l_type=F_RDLCK, l_whence=SEEK_SET, l_start=[0-9]*, l_len=1, l_pid=[1-9]" "$T/trace")
	expect "queries finding this process's identity byte" "$n" 1
}

test_descriptors_closed_reports() {
	# A program that closes the shim's descriptor and opens other files under its number: what
	# it then reads of the container (cuMemGetInfo, and the quota checks outside a grant that
	# read the same) still comes from the limits file, not from whatever file got the number,
	# whose locks would read as nobody's: another process's 32 MiB stay counted.
	setup $((64 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:32MiB touch:"$T/held" waitfile:"$T/end" \
		>"$T/out.a" 2>"$T/err.a" &
	local a=$! r=0
	waitfor "$T/held" $a || { cat "$T/out.a" "$T/err.a"; return 1; }
	run init alloc:4MiB closefds info:28MiB:64MiB || r=1
	touch "$T/end"
	wait $a || r=1
	return $r
}

test_sm_share_hostpids_forged() { # [PIDNS_OFFSET]
	# The tenant keeps zeroing the host pids in the region: the SM limiter must still see the
	# container's processes and hold their share.
	setup $GiB 30 hard
	pidns "${1:-0}"
	export FAKECUDA_KERNEL_US=500 FAKECUDA_SAMPLE_MS=166
	run init # creates the region
	python3 - "$T/region/usage" "$T/stop" <<-'EOF' &
		import mmap, os, sys, time
		with open(sys.argv[1], "r+b") as f:
		    while not os.path.exists(sys.argv[2]):
		        try:
		            m = mmap.mmap(f.fileno(), 280896)
		            for i in range(16):
		                m[2368 + i * 272 + 4:2368 + i * 272 + 8] = b"\0\0\0\0"
		            m.close()
		        except (ValueError, OSError):
		            pass
		        time.sleep(0.002)
	EOF
	local z=$!
	# Two processes of the container, launching flat out: each must count the other's share.
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init launchfor:5:2.5:132 >"$T/out.1" 2>&1 &
	local p1=$!
	run init launchfor:5:2.5:132
	wait $p1
	touch "$T/stop"
	wait $z
	local s
	s=$(cat "$T/out.1" "$T/out" | awk '/^share /{s += $2} END {print s}')
	echo "    info: share of two processes with host pids zeroed $s (limit 30)"
	awk -v s="$s" 'BEGIN { exit !(s >= 25 && s <= 35) }'
}

test_context_footprint_claims_forged() {
	# Before a process starts, the tenant fills the region with slots of a live process that
	# claim the host pid the new process will have: its own host pid must still be found, and
	# its context counted.
	setup $((256 * MiB))
	pidns $PIDNS
	export FAKECUDA_CTX_BYTES=$((64 * MiB))
	run init # creates the region
	local st
	st=$(awk '{print $22}' /proc/$$/stat)
	LD_PRELOAD=$SHIM timeout 60 bash -c '
		python3 - "$1" "$2" "$3" "$$" "$4" <<-"EOF"
			import struct, sys
			f = open(sys.argv[1], "r+b")
			owner, start, me, off = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
			for i in range(8):
			    f.seek(2368 + i * 272)
			    f.write(struct.pack("<iiQ", owner, me + off, start))
		EOF
		exec "$5" init alloc:192MiB alloc:1:2 info:0:256MiB' \
		forge "$T/region/usage" $$ "$st" $PIDNS "$PROG" >"$T/out" 2>"$T/err"
}

# ---- host pids (NVML's numbering) ---------------------------------------------------------------------

test_fork_nvml_threads() {
	setup $GiB
	# Threads read NVML memory info while the main thread forks; every child's
	# own read must return (no in-process lock left held by a parent thread).
	run nvmlfork:300
}

test_hostpid_discovery() {
	local off
	for off in 0 $PIDNS; do
		setup
		pidns $off
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/ready" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
		waitfor "$T/ready"
		expect_hostpids 1 $off
		touch "$T/end"
		wait
	done
}

test_hostpid_no_namespace_lookup() {
	# A start whose context is the one new process in NVML's list takes that pid as its host pid
	# without asking /proc for its pid namespace (a lookup there costs every start some
	# microseconds; only several new processes at once need what /proc knows), and it is
	# still its own, in the container's pid namespace and in the initial one.
	command -v strace >/dev/null || { echo "    strace is missing (hack/deps.sh installs it)"; return 1; }
	local off
	for off in 0 $PIDNS; do
		setup
		pidns $off
		LD_PRELOAD=$SHIM timeout 60 strace -f -o "$T/trace" -e trace=readlink,readlinkat "$PROG" init alloc:1MiB \
			touch:"$T/ready" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
		waitfor "$T/ready"
		expect_hostpids 1 $off
		touch "$T/end"
		wait
		expect "pid namespace lookups (offset $off)" "$(grep -c '/proc/self/ns/pid' "$T/trace")" 0
	done
}

test_hostpid_same_namespace_concurrent() {
	# Two processes of one container create their first contexts at the same
	# time, each taking 0.3 s before and after it shows in NVML's list.
	setup
	pidns $PIDNS
	export FAKECUDA_CTX_SLEEP_MS=300
	local i
	for i in 1 2; do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB touch:"$T/ready.$i" waitfile:"$T/end" \
			>"$T/out.$i" 2>"$T/err.$i" &
	done
	waitfor "$T/ready.1"
	waitfor "$T/ready.2"
	expect_hostpids 2 $PIDNS
	touch "$T/end"
	wait
}

# two_containers OPS... — this test's container ($T) and a second one ($T2,
# same fake GPU and limits) each run cudaprog OPS at the same moment, with
# context creation slow enough that both see two new pids in NVML's list.
# Each holds until $T/end exists; output in DIR/out and DIR/err.
two_containers() {
	export FAKECUDA_CTX_SLEEP_MS=300
	T2=$(mktemp -d "$ROOT/t.XXXXXX")
	mkdir -p "$T2/region"
	cp "$T/limits" "$T2/limits"
	ledger_dir "$T2/ledger"
	local d
	for d in "$T" "$T2"; do
		NRI_VGPU_LIMITS=$d/limits NRI_VGPU_REGION_DIR=$d/region NRI_VGPU_LEDGER_DIR=$d/ledger LD_PRELOAD=$SHIM \
			timeout 60 "$PROG" \
			"$@" touch:"$d/ready" waitfile:"$T/end" >"$d/out" 2>"$d/err" &
	done
	waitfor "$T/ready"
	waitfor "$T2/ready"
}

test_hostpid_other_container_concurrent() {
	# Two containers (two regions) start contexts at the same moment: a probe
	# allocation tells their processes apart.
	setup $GiB 100 hard debug
	pidns $PIDNS
	two_containers init alloc:1MiB
	local d
	for d in "$T" "$T2"; do
		T=$d expect_hostpids 1 $PIDNS
		grep -q "in NVML's process list (probe allocation)" "$d/err" ||
			{ echo "    $d: not told apart by a probe:"; cat "$d/err"; return 1; }
	done
	# The probes were given back: the device holds the two 1 MiB allocations.
	LD_PRELOAD= timeout 60 "$PROG" nvml:0:16GiB:2MiB >"$T/out" 2>"$T/err"
	touch "$T/end"
	wait
}

test_hostpid_ambiguous_stays_unknown() {
	# As above on a GPU too full for any probe: neither process can tell which
	# new pid is its own, so both leave the host pid unknown rather than guess.
	setup $GiB 50 hard debug
	pidns $PIDNS
	export FAKECUDA_DEVICES="$UUID0:1MiB:132"
	two_containers init launch:1
	local d
	for d in "$T" "$T2"; do
		expect "$d slots" "$(T=$d hostpids | wc -l)" 1
		expect "$d host pid" "$(T=$d hostpids | cut -d' ' -f2)" 0
		grep -q "host pid of [0-9]* not found .*no probe told them apart.*left unknown" "$d/err" ||
			{ echo "    $d: no debug line for the unknown host pid:"; cat "$d/err"; return 1; }
	done
	touch "$T/end"
	wait
}

test_hostpid_initial_namespace() {
	# Processes of the initial pid namespace whose contexts start at the same moment, on a GPU
	# too full for a probe: each knows its pid in NVML's numbering is getpid() and takes it
	# from among the new pids, with no probe (the case above leaves them unknown).
	setup $GiB 50 hard debug
	export FAKECUDA_DEVICES="$UUID0:1MiB:132"
	two_containers init launch:1
	local d
	for d in "$T" "$T2"; do
		T=$d expect_hostpids 1 0
		grep -q "in NVML's process list (the pid /proc shows)" "$d/err" ||
			{ echo "    $d: not found without a probe:"; cat "$d/err"; return 1; }
	done
	touch "$T/end"
	wait
}

test_hostpid_queries_at_start() {
	# What a process's start costs the driver in NVML process lists (hundreds of processes of
	# the node make them in turn): two, one before its first context and one after, which
	# also gives the footprint; 300 processes listed make no list ask twice.
	local off
	for off in 0 $PIDNS; do
		setup
		pidns $off
		export FAKECUDA_NVML_EXTRA_PROCS=300 FAKECUDA_NVML_LOG=$T/nvml.log
		run init alloc:1MiB
		expect "NVML process lists a start asks for (offset $off)" "$(grep -c '^list ' "$T/nvml.log")" 2
		unset FAKECUDA_NVML_EXTRA_PROCS FAKECUDA_NVML_LOG
	done
}

test_hostpid_region_busy() {
	# A process finds its host pid at its first context while another holds the region's lock
	# (a process stopped inside it): it goes on without the lock, and its keeper gives its slot
	# the host pid once the lock is free.
	setup $((64 * MiB))
	run init
	write_locker "$T/region/usage" 120 &
	local lk=$! i
	waitfor "$T/region/usage.locked" $lk || return 1
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/a" waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	local a=$!
	waitfor "$T/a" $a || { cat "$T/out" "$T/err"; kill $lk; return 1; }
	kill -9 $lk
	wait $lk 2>/dev/null || true
	for i in $(seq 60); do [ -n "$(hostpids | awk '$2 > 0 && $1 == $2')" ] && break; sleep 0.05; done
	expect_hostpids 1 0
	touch "$T/end"
	wait $a
}

test_hostpid_fork_child() {
	# A fork child's context is its own: it finds its own host pid.
	setup
	pidns $PIDNS
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init alloc:1MiB forkctx:"$T/ready":"$T/end" waitfile:"$T/end" wait \
		>"$T/out" 2>"$T/err" &
	waitfor "$T/ready"
	expect_hostpids 2 $PIDNS
	touch "$T/end"
	wait
}

# ---- SM limiter -------------------------------------------------------------------------------------------------

test_sm_shares() { # [PIDNS_OFFSET]
	# Two containers on one simulated 132-SM GPU, 30 % and 70 %, both launching flat out.
	setup $GiB 30 hard
	pidns "${1:-0}"
	local a=$T
	export FAKECUDA_KERNEL_US=500
	# NVML's per-process samples arrive about every 1/6 s, as on hardware.
	export FAKECUDA_SAMPLE_MS=166
	local state=$FAKECUDA_STATE
	NRI_VGPU_LIMITS=$a/limits NRI_VGPU_REGION_DIR=$a/region LD_PRELOAD=$SHIM \
		timeout 60 "$PROG" init launchfor:6:2.5:132 >"$a/out.a" 2>&1 &
	local pa=$!
	T=$(mktemp -d "$ROOT/t.XXXXXX")
	mkdir -p "$T/region"
	ledger_dir "$T/ledger"
	limits $GiB 70 hard
	FAKECUDA_STATE=$state NRI_VGPU_LIMITS=$T/limits NRI_VGPU_REGION_DIR=$T/region NRI_VGPU_LEDGER_DIR=$T/ledger \
		LD_PRELOAD=$SHIM \
		timeout 60 "$PROG" init launchfor:6:2.5:132 >"$T/out.b" 2>&1
	wait $pa
	local sa sb
	sa=$(sed -n 's/^share //p' "$a/out.a")
	sb=$(sed -n 's/^share //p' "$T/out.b")
	echo "    info: shares $sa (limit 30), $sb (limit 70)"
	awk -v a="$sa" -v b="$sb" 'BEGIN { exit !(a >= 25 && a <= 35 && b >= 65 && b <= 75) }'
}

test_sm_burst() {
	# Alone on the GPU, burst may use what nobody else wants; hard may not.
	setup $GiB 30 burst
	export FAKECUDA_KERNEL_US=500 FAKECUDA_SAMPLE_MS=166
	run init launchfor:3:1.5:132
	local s
	s=$(sed -n 's/^share //p' "$T/out")
	echo "    info: burst share alone $s (limit 30)"
	awk -v s="$s" 'BEGIN { exit !(s >= 60) }'
	limits $GiB 30 hard
	run init launchfor:3:1.5:132 touch:"$T/done" &
	waitfor "$T/done"
	s=$(sed -n 's/^share //p' "$T/out")
	echo "    info: hard share alone $s (limit 30)"
	awk -v s="$s" 'BEGIN { exit !(s >= 25 && s <= 35) }'
	wait
}

test_sm_launch_counters() {
	setup $GiB 50 hard
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init launch:20 touch:"$T/done" waitfile:"$T/end" >"$T/out" 2>&1 &
	waitfor "$T/done"
	# Counted privately; the limiter's watcher writes them to the region every 100 ms.
	local i
	for i in $(seq 40); do
		"$DUMP" "$T/region/usage" | grep -q '^proc .* launches0=20$' && break
		sleep 0.05
	done
	"$DUMP" "$T/region/usage" | grep -q '^proc .* launches0=20$'
	touch "$T/end"
	wait
}

test_sm_unlimited_no_thread() {
	setup $GiB 100 hard
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init launch:5 sleep:300 >"$T/out" 2>&1 &
	local pid=$!
	sleep 0.2
	expect "threads at cores=100" "$(ls /proc/$pid/task | wc -l)" 1
	wait $pid
}

test_fuzz_limits_parser() {
	if ! command -v clang >/dev/null; then
		echo "    clang is needed for the libFuzzer target (Debian: apt-get install clang)"
		return 1
	fi
	make -s -C "$HERE/.." fuzz FUZZTIME=${FUZZTIME:-3} >"/tmp/shimfuzz.$$" 2>&1 || { tail -n 30 "/tmp/shimfuzz.$$"; rm -f "/tmp/shimfuzz.$$"; return 1; }
	grep -q 'Done [0-9]* runs' "/tmp/shimfuzz.$$"
	rm -f "/tmp/shimfuzz.$$"
}

t glibc_versions test_glibc_versions
t exports test_exports
t harmless_load test_harmless_load
t limits_parser test_limits_parser
t invalid_limits_fail_closed test_invalid_limits_fail_closed
t absent_limits_pass_through test_absent_limits_pass_through
t override_rule test_override_ignored_when_fixed_path_exists
t container_fails_closed test_container_fails_closed
t boundary test_boundary
t every_counted_api test_every_counted_api
t array_formats test_array_formats
t stream_ordered_device test_stream_ordered_device
t vmm_release_while_mapped test_vmm_release_while_mapped
t driver_failure_gives_back test_driver_failure_gives_back
t context_footprint test_context_footprint
t context_footprint_pidns test_context_footprint $PIDNS
t reported_memory test_reported_memory
t threads_without_context test_threads_without_context
t names_exact test_names_exact
t stacked_interposer test_stacked_interposer
t next_lookup_wrapped test_next_lookup_wrapped
t 16_racers test_16_racers
t sigkill_mid_allocation test_sigkill_mid_allocation
t nvml_absent_no_search test_nvml_absent_no_search
t slot_rebuilt_ahead test_slot_rebuilt_ahead
t slot_rebuilt_then_changed test_slot_rebuilt_then_changed
t exit_beside_stopped_holder test_exit_beside_stopped_holder
t hostpid_from_proc test_hostpid_from_proc
t region_lock_held test_region_lock_held
t region_truncated_in_use test_region_truncated_in_use
t slot_made_for_it test_slot_made_for_it
t pid_reuse test_pid_reuse
t fork test_fork
t fork_nvml_threads test_fork_nvml_threads
t fork_during_init test_fork_during_init
t tenant_zero_limit test_tenant zero_limit
t tenant_zero_used test_tenant zero_used
t tenant_zero_slots test_tenant zero_slots
t tenant_truncate test_tenant truncate
t tenant_truncate_partial test_tenant truncate_partial
t tenant_garbage test_tenant garbage
t tenant_bad_header test_tenant bad_header
t tenant_huge_values test_tenant huge
t tenant_delete test_tenant delete
t tenant_symlink test_tenant symlink
t tenant_smaller_file test_tenant smaller_file
t tenant_larger_file test_tenant larger_file
t tenant_fifo test_tenant fifo
t tenant_directory test_tenant directory
t racers_region_zeroed test_racers_region_zeroed
t racers_region_deleted test_racers_region_deleted
t racers_region_unusable test_racers_region_unusable
t ledger_unusable_fails_closed test_ledger_unusable_fails_closed
t ledger_forged_entries test_ledger_forged_entries
t descriptors_closed test_descriptors_closed
t descriptors_closed_reports test_descriptors_closed_reports
t descriptor_replaced test_descriptor_replaced
t grant_checks_descriptor_once test_grant_checks_descriptor_once
t context_footprint_claims_forged test_context_footprint_claims_forged
t hostpid_discovery test_hostpid_discovery
t hostpid_no_namespace_lookup test_hostpid_no_namespace_lookup
t hostpid_same_namespace_concurrent test_hostpid_same_namespace_concurrent
t hostpid_other_container_concurrent test_hostpid_other_container_concurrent
t hostpid_ambiguous_stays_unknown test_hostpid_ambiguous_stays_unknown
t hostpid_initial_namespace test_hostpid_initial_namespace
t hostpid_region_busy test_hostpid_region_busy
t hostpid_queries_at_start test_hostpid_queries_at_start
t hostpid_fork_child test_hostpid_fork_child
t sm_unlimited_no_thread test_sm_unlimited_no_thread
t sm_shares_30_70 test_sm_shares
t sm_shares_30_70_pidns test_sm_shares $PIDNS
t sm_burst test_sm_burst
t sm_share_hostpids_forged test_sm_share_hostpids_forged
t sm_share_hostpids_forged_pidns test_sm_share_hostpids_forged $PIDNS
t sm_launch_counters test_sm_launch_counters
t fuzz_limits_parser test_fuzz_limits_parser

. "$HERE/t_nvmlprocs.sh"
. "$HERE/t_cudart.sh"
. "$HERE/t_pools.sh"
. "$HERE/t_footprint.sh"
. "$HERE/t_graphs.sh"
. "$HERE/t_limiter.sh"
. "$HERE/t_limiter2.sh"
. "$HERE/t_gaps.sh"
. "$HERE/t_hotpath.sh"
. "$HERE/t_views.sh"
. "$HERE/t_shards.sh"
. "$HERE/t_harden.sh"
. "$HERE/t_slots.sh"
. "$HERE/t_nvmlown.sh"
. "$HERE/t_validate.sh"
. "$HERE/t_usage.sh"

echo "shim: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
