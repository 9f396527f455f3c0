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

t primary_ctx_v1 test_primary_ctx_v1
t report_32bit test_report_32bit
