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

t primary_ctx_v1 test_primary_ctx_v1
