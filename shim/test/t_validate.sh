# Sourced by run.sh: validate/validate.sh's --only, without a GPU. A stub
# nvidia-smi and a stub Python (PYTHON) that answer anything let every check
# run to its PASS or FAIL line; which lines appear says which checks ran.

# validate_stubs: $T/bin/nvidia-smi and $T/bin/python, answering anything.
validate_stubs() {
	T=$(mktemp -d "$ROOT/t.XXXXXX")
	mkdir -p "$T/bin"
	cat >"$T/bin/nvidia-smi" <<-'SH'
		#!/bin/sh
		case "$*" in *uuid*) echo GPU-stub ;; *memory.total*) echo 1024 ;; *) echo 1 ;; esac
	SH
	printf '#!/bin/sh\necho 1 1 1 1\n' >"$T/bin/python"
	chmod +x "$T/bin/nvidia-smi" "$T/bin/python"
}

# validate_lines LABELS: the titles of the PASS/FAIL lines of validate.sh --only LABELS.
validate_lines() {
	PATH=$T/bin:$PATH PYTHON=$T/bin/python SHIM=$SHIM SHIM_TOOLS=$B \
		bash "$HERE/../validate/validate.sh" --only "$1" 0 2>"$T/err" >"$T/out" || true
	sed -n 's/^\(PASS\|FAIL\) //p' "$T/out"
}

test_validate_only() {
	validate_stubs
	expect "--only 4c,5,12b" "$(validate_lines 4c,5,12b)" "SM limiter: small kernels held to 30 % of GPU time, no launch waits over 2 control periods after long kernels
overhead at no limit below 1 %
green contexts: the primary context counted at once, the allocation given back with it"
	expect "--only 9,1,3b (file order)" "$(validate_lines 9,1,3b)" "mem_get_info reports the slice; allocation past the limit raises OutOfMemoryError
cudaMallocAsync pool retention charged, reused, trimmed
pre-11.0 primary-context release gives memory back; pre-3.2 cuMemGetInfo / cuDeviceTotalMem report the slice"
}

test_validate_only_unknown() {
	validate_stubs
	local rc=0
	PATH=$T/bin:$PATH PYTHON=$T/bin/python SHIM=$SHIM bash "$HERE/../validate/validate.sh" --only 4c,4x 0 \
		>"$T/out" 2>"$T/err" || rc=$?
	expect "exit status" "$rc" 2
	grep -q "unknown check '4x'" "$T/err" || { echo "    no error naming 4x:"; cat "$T/err"; return 1; }
	# Refused before any check ran.
	expect "result lines" "$(grep -c '^\(PASS\|FAIL\) ' "$T/out")" 0
}

t validate_only test_validate_only
t validate_only_unknown test_validate_only_unknown
