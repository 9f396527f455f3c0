# Entry points that hold or report device memory and were reached around the
# shim: the pre-11.0 primary-context ABIs cudart asks for, the 32-bit
# cuMemGetInfo / cuDeviceTotalMem, cuLibraryGetModule, VMM imports, pools of
# a destroyed context, NVML's accounting. Sourced by run.sh.

test_primary_ctx_v1() {
	# cudart 11.8 and 12.4 ask for cuDevicePrimaryCtxRelease / Reset at 7000: the pre-11.0
	# ABIs. Releasing the last reference or resetting gives back what the context held,
	# whichever ABI did it and however it was reached.
	setup $((64 * MiB))
	local m
	for m in direct rt11 rt12; do
		run -m $m init alloc:48MiB info:16MiB:64MiB relv1:0 ctx:0 info:64MiB:64MiB alloc:64MiB alloc:1:2 ||
			{ echo "    $m: release"; return 1; }
		run -m $m init alloc:48MiB resetv1:0 info:64MiB:64MiB alloc:64MiB alloc:1:2 ||
			{ echo "    $m: reset (pre-11.0)"; return 1; }
		run -m $m init alloc:48MiB reset:0 info:64MiB:64MiB alloc:64MiB alloc:1:2 ||
			{ echo "    $m: reset"; return 1; }
	done
}


test_report_32bit() {
	# The pre-3.2 cuMemGetInfo and cuDeviceTotalMem report the container's slice like the
	# _v2s, however they are reached; past 4 GiB they saturate at 4 GiB - 1 (4294967295).
	setup $((64 * MiB))
	local m
	for m in direct rt11 rt12; do
		run -m $m init alloc:16MiB info32:48MiB:64MiB total32:0:64MiB || { echo "    $m"; return 1; }
	done
	# A GPU the limits file does not list is reported as the driver reports it (8 GiB: saturated).
	run init total32:1:4294967295
	setup $((6 * GiB))
	run init alloc:1GiB info32:4294967295:4294967295 total32:0:4294967295 alloc:5GiB info32:0:4294967295
	# Without the shim the fake answers its own 16 GiB, saturated: the numbers above are the shim's.
	timeout 60 "$PROG" init info32:-:4294967295 >"$T/out" 2>"$T/err"
}

test_library_get_module() {
	# With lazy loading a library's code goes into the context when its module is asked
	# for (cuLibraryGetModule, 32 MiB here): counted at once, as any library call.
	setup $((256 * MiB))
	export CUDA_MODULE_LOADING=LAZY FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_MODULE_BYTES=$((32 * MiB))
	run init modload:lib info:192MiB:256MiB getmodule info:160MiB:256MiB alloc:160MiB alloc:1:2
}

test_nvml_accounting() { # [PIDNS_OFFSET]
	# NVML's accounting, inside the container: only its own processes, under their own pids,
	# each with its stats; another container's or the host's pid is not found (6).
	setup $GiB
	pidns "${1:-0}"
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	np_worker ours a1 0 $((64 * MiB))
	np_worker other b 0 $((32 * MiB))
	np_worker bare x 0 $((48 * MiB))
	np_worker ours a2 0 $((96 * MiB))
	local a1 a2 b x off=${1:-0}
	a1=$(np_pid a1) a2=$(np_pid a2) b=$(($(np_pid b) + off)) x=$(($(np_pid x) + off))
	# Without the shim NVML accounts for all four, in its numbering.
	SMI_ACCT=1 SMI_ACCT_PROBE=$b np_smi 0 ""
	expect "accounted without the shim" "$(grep '^acct ' "$T/smi.out" | wc -w)" 5
	expect "another container's stats without the shim" "$(grep '^acctprobe' "$T/smi.out")" "acctprobe 0"
	local want
	want=$(printf '%s\n' "$a1:$((80 * MiB))" "$a2:$((112 * MiB))" | sort -t: -k1,1n | paste -sd' ' -)
	SMI_ACCT=1 SMI_ACCT_PROBE=$b np_smi 0
	expect "accounting" "$(grep '^acct ' "$T/smi.out")" "acct $want"
	expect "another container's stats" "$(grep '^acctprobe' "$T/smi.out")" "acctprobe 6"
	SMI_ACCT=1 SMI_ACCT_PROBE=$x np_smi 0
	expect "the host's stats" "$(grep '^acctprobe' "$T/smi.out")" "acctprobe 6"
	np_end
}

test_pool_ctx_gone() {
	# What was allocated from stream-ordered pools goes with the context it was allocated in
	# (destroyed, released for the last time, reset), and the pools are read again: what they
	# reserved for it is given back.
	setup $((64 * MiB))
	run init newctx:0 async:16MiB pool:8MiB info:40MiB:64MiB delctx ctx:0 info:64MiB:64MiB async:64MiB
	run init async:16MiB pool:8MiB info:40MiB:64MiB reset:0 info:64MiB:64MiB async:64MiB
	run init async:16MiB pool:8MiB relv1:0 ctx:0 info:64MiB:64MiB async:64MiB
	# A pool that keeps what is freed (release threshold: all of it) gives it back too.
	run init newctx:0 defpool:0 threshold:max async:16MiB free info:48MiB:64MiB delctx ctx:0 info:64MiB:64MiB
}

test_vmm_import() {
	# A VMM allocation imported from a shareable handle is held by the importer too: the
	# exporter may release its handle and the memory lives on. The import is charged the size
	# of its first mapping (refused there over the quota), counted like a cuMemCreate handle
	# (released while mapped, until the unmap), and costs nothing if released unmapped.
	setup $((64 * MiB))
	local m
	for m in direct rt12; do
		run -m $m init create:0:48MiB vmmexport free info:64MiB:64MiB vmmimport info:64MiB:64MiB map:48MiB \
			info:16MiB:64MiB alloc:17MiB:2 unmap:48MiB info:16MiB:64MiB free info:64MiB:64MiB ||
			{ echo "    $m"; return 1; }
	done
	# Released while mapped: still held until the unmap.
	run init create:0:48MiB vmmexport free vmmimport map:48MiB free info:16MiB:64MiB unmap:48MiB info:64MiB:64MiB
	# Over the quota (the exporter still holds its 48 MiB): the mapping is refused, and the
	# handle is charged at a later mapping that fits.
	run init create:0:48MiB vmmexport vmmimport map:48MiB:2 info:16MiB:64MiB
	# Released without a mapping: nothing was or stays charged.
	run init create:0:48MiB vmmexport vmmimport free free info:64MiB:64MiB alloc:64MiB
}

t primary_ctx_v1 test_primary_ctx_v1
t report_32bit test_report_32bit
test_sparse_arrays() {
	# A sparse array holds no memory of its own: 256 MiB of virtual texture on a 64 MiB quota
	# costs nothing. A cuMemCreate allocation mapped into it (cuMemMapArrayAsync) stays held
	# after its cuMemRelease, as after a cuMemMap: 32 MiB stay counted until the tile is
	# unmapped, or until the array is destroyed.
	local m
	for m in "-m direct" "-m rt12"; do
		setup $((64 * MiB))
		# shellcheck disable=SC2086
		run $m init sparse:8192:8192 create:0:32MiB amap free alloc:32MiB alloc:1:2 aunmap alloc:32MiB alloc:1:2
		# shellcheck disable=SC2086
		run $m init sparse:8192:8192 create:0:32MiB amap free alloc:32MiB alloc:1:2 free free alloc:64MiB alloc:1:2
	done
}

t library_get_module test_library_get_module
t nvml_accounting test_nvml_accounting
t nvml_accounting_pidns test_nvml_accounting $PIDNS
t pool_ctx_gone test_pool_ctx_gone
t vmm_import test_vmm_import
t sparse_arrays test_sparse_arrays
