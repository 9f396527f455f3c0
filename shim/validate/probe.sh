#!/usr/bin/env bash
# What the driver does where validate.sh's checks depend on it, printed, not
# judged (record it in docs/validation.md):
#  1. NVML's pid numbering across pid namespaces: a context on the host, one
#     in a pid namespace with its own /proc, one in a pid namespace that sees
#     the host's /proc; each prints NVML's process list as it sees it.
#  2. When a context's memory shows: NVML's per-process memory after each step
#     of a PyTorch start, without the shim and with it (then also the shim's
#     slot in the usage region).
#  3. How the SM limiter's rate settles at cores=30 for a CUDA graph of 50
#     small kernels and for the same kernels launched one by one: the share of
#     the unlimited rate in consecutive two-second windows.
#
#   shim/validate/probe.sh [GPU-index]
. "$(dirname "$0")/common.sh"
P=validate/nvmlprobe.py

echo "== 1. NVML's pid numbering in pid namespaces"
rm -f "$W"/go*
CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" $P hold host 64 "$W/go" &
CUDA_VISIBLE_DEVICES=$gpu unshare --pid --fork --mount-proc "$PYTHON" $P hold ns-own-proc 32 "$W/go" &
CUDA_VISIBLE_DEVICES=$gpu unshare --pid --fork "$PYTHON" $P hold ns-host-proc 16 "$W/go" &
for _ in $(seq 300); do [ -e "$W/go.host" ] && [ -e "$W/go.ns-own-proc" ] && [ -e "$W/go.ns-host-proc" ] && break; sleep 0.1; done
CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" $P list "host (no context)"
touch "$W/go"
wait

echo "== 2. When a context's memory shows"
CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" $P timeline | sed 's/^/direct /'
limits $((8 << 30)) 100
shimmed "$PYTHON" $P timeline "$SHIM_TOOLS/regiondump" "$W/region/usage" | sed 's/^/shim   /'

echo "== 3. SM limiter at cores=30, shares of the unlimited rate in 2 s windows"
for kind in graph eager; do
	base=$(CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" validate/smallkernels.py $kind 2 2 | tail -n 1)
	limits 0 30
	got=$(shimmed "$PYTHON" validate/smallkernels.py $kind 2 2 2 2 2 2 | grep -v '^capture_ms' | tr '\n' ' ')
	echo "  $kind: unlimited $base/s; at cores=30: $(for r in $got; do printf '%s%% ' "$("$PYTHON" -c "print(round(100 * $r / $base, 1))")"; done)"
done
