# The shim's own NVML (sourced by run.sh): only the libnvidia-ml.so.1 beside the driver's
# libcuda.so.1 is asked, never one the tenant puts first on the loader's search path; without a
# usable one the shim fails closed (contexts charged a fixed bound, the SM limiter at its nominal
# rate). Each test plays the tenant: its own NVML that fails nvmlInit, one that lies (no processes,
# 0 % utilisation), or no NVML beside libcuda at all.

# nvml_as MODE — how this test's processes find NVML:
#   evil-fail  the tenant's libnvidia-ml.so.1 first on LD_LIBRARY_PATH, nvmlInit fails
#   evil-liar  the same, but it succeeds, lists no process and samples 0 %
#   absent     a copy of the driver's libcuda.so.1 in a directory without NVML (a copy, not a
#              link: the shim looks beside the real file)
nvml_as() {
	case $1 in
	evil-fail | evil-liar)
		export LD_LIBRARY_PATH=$B/evilnvml:$B/fake EVILNVML=${1#evil-}
		;;
	absent)
		mkdir -p "$T/cudaonly"
		cp "$B/fake/libcuda.so.1" "$T/cudaonly/libcuda.so.1"
		export LD_LIBRARY_PATH=$T/cudaonly
		;;
	esac
}

# nvml_mem MODE — three processes create their contexts (600 MiB each on the fake) before any
# allocates, then each fills what the quota leaves in 64 MiB steps. The fake GPU's peak use
# (contexts included) stays within the 2 GiB quota. With the tenant's NVML believed, or none and
# the contexts let be, the contexts went uncounted: 3 x 600 MiB + 2 GiB.
nvml_mem() {
	setup $((2 * GiB))
	nvml_as "$1"
	export FAKECUDA_CTX_BYTES=$((600 * MiB))
	local i pids=() live=()
	for i in 1 2 3; do
		LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/ctx.$i" waitfile:"$T/go" fill:64MiB \
			touch:"$T/full.$i" waitfile:"$T/end" >"$T/out.$i" 2>"$T/err.$i" &
		pids+=($!)
		# Its context made, or refused (the process then ends).
		local n
		for n in $(seq 600); do
			[ -e "$T/ctx.$i" ] || ! kill -0 "${pids[-1]}" 2>/dev/null && break
			sleep 0.05
		done
		[ -e "$T/ctx.$i" ] && live+=("$i")
	done
	echo "    info: $1: contexts made by processes ${live[*]:-none}"
	[ "${#live[@]}" -ge 1 ] || { cat "$T"/err.*; return 1; }
	touch "$T/go"
	for i in "${live[@]}"; do waitfor "$T/full.$i" || { cat "$T/out.$i" "$T/err.$i"; touch "$T/end"; return 1; }; done
	local peak
	peak=$("$PROG" peak:0:$((2 * GiB)) 2>&1) || { echo "    $peak"; touch "$T/end"; return 1; }
	echo "    info: $1: fake GPU peak ${peak#peak } (quota $((2 * GiB)))"
	touch "$T/end"
	wait
}

# nvml_sm MODE — one process launches 1-wave kernels flat out at a 30 % limit: its share of GPU
# time stays near 30 %, not 100 %. The tenant's NVML is never asked (steered from the real
# samples); without any NVML the bucket refills at the nominal rate, right for the fake's 1 ms
# waves.
nvml_sm() {
	setup $((2 * GiB)) 30 hard
	nvml_as "$1"
	export FAKECUDA_SAMPLE_MS=166
	run init launchfor:3:1:132 || return 1
	share_in "$T/out" 25 35 "$1: share at a 30 % limit"
}

test_nvml_tenant_fails_mem() { nvml_mem evil-fail; }
test_nvml_tenant_lies_mem() { nvml_mem evil-liar; }
test_nvml_absent_mem() {
	nvml_mem absent || return 1
	# Said once, at warn: NVML is unusable, and what the shim does instead.
	expect "warnings in the first process" "$(grep -c 'NVML is unusable (no libnvidia-ml.so.1 beside' "$T/err.1")" 1
}
test_nvml_tenant_fails_sm() { nvml_sm evil-fail; }
test_nvml_tenant_lies_sm() { nvml_sm evil-liar; }
test_nvml_absent_sm() {
	nvml_sm absent || return 1
	expect "warnings" "$(grep -c 'NVML is unusable' "$T/err")" 1
}

test_nvml_absent_bound() {
	# Without NVML a context is charged the bound, before anything of its own: at the bound plus
	# 64 MiB a process allocates 64 MiB and not a byte more; at less than the bound its context
	# is refused (CUDA_ERROR_OUT_OF_MEMORY), and given back.
	setup $((FP_BOUND + 64 * MiB))
	nvml_as absent
	run init alloc:64MiB alloc:1:2 || return 1
	limits $((FP_BOUND - MiB)) 100 hard
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init >"$T/out" 2>"$T/err" && { echo "    context made below the bound"; return 1; }
	grep -q "a new context's own memory would take the container past" "$T/err" ||
		{ cat "$T/err"; return 1; }
	expect "region used" "$(used)" 0
}

# nvml_driver_unusable KNOB WHY — the NVML beside the driver is there but unusable (KNOB: its
# nvmlInit fails, or it has no handle for the GPU): the same as none. The context is charged the
# bound (64 MiB fit beside it, not a byte more), the SM share stays near the 30 % cap, and one
# line says why (WHY).
nvml_driver_unusable() {
	setup $((FP_BOUND + 64 * MiB)) 30 hard
	export "$1"=1
	run init alloc:64MiB alloc:1:2 launchfor:3:1:132 || return 1
	share_in "$T/out" 25 35 "share with $1" || return 1
	expect "warnings" "$(grep -c "NVML is unusable ($2" "$T/err")" 1
}
test_nvml_driver_init_fails() { nvml_driver_unusable FAKECUDA_NVML_INIT_FAIL "nvmlInit_v2 failed"; }
test_nvml_driver_no_handle() { nvml_driver_unusable FAKECUDA_NVML_NO_HANDLE "it has no handle for $UUID0"; }

t nvml_tenant_fails_mem test_nvml_tenant_fails_mem
t nvml_tenant_lies_mem test_nvml_tenant_lies_mem
t nvml_absent_mem test_nvml_absent_mem
t nvml_tenant_fails_sm test_nvml_tenant_fails_sm
t nvml_tenant_lies_sm test_nvml_tenant_lies_sm
t nvml_absent_sm test_nvml_absent_sm
t nvml_absent_bound test_nvml_absent_bound
t nvml_driver_init_fails test_nvml_driver_init_fails
t nvml_driver_no_handle test_nvml_driver_no_handle
