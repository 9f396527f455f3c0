# NVIDIA's own libcudart (11.8.89 and 12.4.127 from Debian's non-free
# archive) on the fake driver, through the shim. Sourced by run.sh.
# CUDART_DIR is the cache hack/cudart.sh fills (the Makefile's test target
# runs it); run.sh run by hand fetches it here.
RTPROG=$B/rtprog
REPLAY=$B/procreplay
if [ -z "${CUDART_DIR+set}" ] && { [ -z "${ONLY:-}" ] || [[ cudart =~ $ONLY ]] || [[ $ONLY =~ cudart ]]; }; then
	CUDART_DIR=$("$HERE/../../hack/cudart.sh") || CUDART_DIR=
fi

# cudart_lib VERSION — the unpacked library, or fails naming what is missing.
cudart_lib() {
	local lib=${CUDART_DIR:-}/$1/libcudart.so.$1
	if [ -z "${CUDART_DIR:-}" ] || ! [ -f "$lib" ]; then
		echo "    no libcudart.so.$1: hack/cudart.sh failed (its error is above the test results)" >&2
		return 1
	fi
	echo "$lib"
}

# rt [rtprog args...] — rtprog with the shim preloaded; output in $T/out.
rt() {
	if ! LD_PRELOAD=$SHIM timeout 60 "$RTPROG" "$@" >"$T/out" 2>"$T/err"; then
		echo "    rtprog $*"
		tail -n 5 "$T/out" "$T/err" | sed 's/^/    /'
		return 1
	fi
}

test_cudart_memory() { # VERSION
	local lib
	lib=$(cudart_lib "$1")
	setup $((64 * MiB))
	# Without the shim the fake GPU (16 GiB) takes more than the quota: the
	# refusals below are the shim's.
	if ! timeout 60 "$RTPROG" "$lib" count:2 malloc:65MiB free >"$T/out" 2>"$T/err"; then
		echo "    without the shim, cudaMalloc of 65 MiB failed on the 16 GiB fake GPU"
		return 1
	fi
	# Each way of allocating is counted and reported by cudaMemGetInfo as the
	# slice (total = the quota), a full slice refuses each one with
	# cudaErrorMemoryAllocation (2), the driver holds exactly what was let
	# through, and every free gives back.
	rt "$lib" count:2 \
		malloc:16MiB info:48MiB:64MiB \
		managed:16MiB info:32MiB:64MiB \
		async:16MiB info:16MiB:64MiB \
		defpool:8MiB info:8MiB:64MiB \
		pool:8MiB info:0:64MiB \
		malloc:1:2 managed:1:2 async:1:2 defpool:1:2 pool:1:2 \
		driver:64MiB \
		free info:8MiB:64MiB free free free free info:64MiB:64MiB driver:0 \
		async:64MiB malloc:1:2 free malloc:64MiB
}

# cudart_requests VERSION — the runtime's cuGetProcAddress requests as the
# fake driver saw them, in the recorded file's format.
cudart_requests() {
	local lib
	lib=$(cudart_lib "$1")
	FAKECUDA_TRACE=$T/trace timeout 60 "$RTPROG" "$lib" count:2 malloc:1MiB free >"$T/out" 2>"$T/err"
	sed -n 's/^proc\([45]\) \([^ ]*\) \([0-9]*\) \([0-9]*\) [0-9]*$/\1 \2 \3 \4/p' "$T/trace" | awk '!seen[$0]++'
}

test_cudart_requests_recorded() { # VERSION
	setup
	cudart_requests "$1" >"$T/now"
	grep -v '^#' "$HERE/cudart/requests-$1.txt" >"$T/recorded"
	# Hundreds of requests, not an empty trace matching an empty file.
	[ "$(wc -l <"$T/now")" -gt 300 ]
	if ! diff "$T/recorded" "$T/now" >"$T/diff"; then
		echo "    libcudart.so.$1 no longer asks what test/cudart/requests-$1.txt records (< recorded, > now):"
		head -n 20 "$T/diff" | sed 's/^/    /'
		return 1
	fi
}

# Every request of the recorded table for an allocation or launch entry (a
# base name hooks.def lists, other than the context and lookup ones) must
# reach the shim's wrapper when asked through the shim, exactly as cudart
# asks it; a pointer to any other hooked export must be swapped for the
# wrapper of that export, and every other answer must pass through unchanged
# (test/cudart/requests.awk). Hooks added to hooks.def are checked as they come.
test_cudart_requests_hooked() { # VERSION
	local table=$HERE/cudart/requests-$1.txt bad
	setup
	"$REPLAY" <"$table" >"$T/direct"
	LD_PRELOAD=$SHIM "$REPLAY" <"$table" >"$T/shim" 2>"$T/err"
	expect "requests replayed" "$(wc -l <"$T/shim")" "$(grep -vc '^#' "$table")"
	sed -n 's/^HOOK(LIB_CUDA, *\([^,]*\), *\([^,]*\),.*/\1 \2/p' "$HERE/../src/hooks.def" >"$T/hooks"
	bad=$(awk -v info="$T/info" -f "$HERE/cudart/requests.awk" "$T/hooks" "$T/direct" "$T/shim")
	if [ -n "$bad" ]; then
		printf '%s\n' "$bad" | sed 's/^/    /'
		return 1
	fi
	if [ -s "$T/info" ]; then
		sed "s/^/    info: $1: /" "$T/info"
	fi
}

t cudart_11_memory test_cudart_memory 11.8.89
t cudart_12_memory test_cudart_memory 12.4.127
t cudart_11_requests_recorded test_cudart_requests_recorded 11.8.89
t cudart_12_requests_recorded test_cudart_requests_recorded 12.4.127
t cudart_11_requests_hooked test_cudart_requests_hooked 11.8.89
t cudart_12_requests_hooked test_cudart_requests_hooked 12.4.127
