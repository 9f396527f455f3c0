# NVML's process lists inside a container (src/nvmlprocs.c), sourced by run.sh.
# test/nvmlprocs.c plays the GPU processes ("worker") and nvidia-smi ("smi").

NPROG=$B/nvmlprocs

# np_worker WHO NAME DEV BYTES [launch] — a GPU process holding BYTES on CUDA device DEV until
# $T/end exists; its pid (in its own namespace) lands in $T/NAME.pid. WHO: ours (this
# container), other (a second container on the same GPU), bare (no shim: the host, say).
np_worker() {
	local who=$1 name=$2
	shift 2
	case $who in
	ours) LD_PRELOAD=$SHIM "$NPROG" worker "$1" "$2" "$T/$name.pid" "$T/end" ${3:-} >"$T/$name.out" 2>&1 & ;;
	other)
		mkdir -p "$T/c2/region"
		cp "$T/limits" "$T/c2/limits"
		ledger_dir "$T/c2/ledger"
		NRI_VGPU_LIMITS=$T/c2/limits NRI_VGPU_REGION_DIR=$T/c2/region NRI_VGPU_LEDGER_DIR=$T/c2/ledger LD_PRELOAD=$SHIM \
			"$NPROG" worker "$1" "$2" "$T/$name.pid" "$T/end" ${3:-} >"$T/$name.out" 2>&1 &
		;;
	bare) LD_PRELOAD= "$NPROG" worker "$1" "$2" "$T/$name.pid" "$T/end" ${3:-} >"$T/$name.out" 2>&1 & ;;
	esac
	# One at a time: each finds its host pid as the one new process in NVML's list.
	waitfor "$T/$name.pid" $! || { cat "$T/$name.out"; return 1; }
}

np_pid() { cat "$T/$1.pid"; }

# np_smi DEV [SHIM] — what nvidia-smi would see, in $T/smi.out.
np_smi() {
	if ! LD_PRELOAD=${2-$SHIM} timeout 60 "$NPROG" smi "$1" >"$T/smi.out" 2>"$T/smi.err"; then
		cat "$T/smi.out" "$T/smi.err"
		return 1
	fi
}

np_end() {
	touch "$T/end"
	wait
}

# np_expect LIST "PID:BYTES ..." — the line smi printed for LIST (in any order given here).
np_expect() {
	local want sum=0 pb
	want=$(printf '%s\n' $2 | sort -t: -k1,1n | paste -sd, -)
	for pb in $2; do sum=$((sum + ${pb#*:})); done
	expect "$1" "$(grep "^list $1 " "$T/smi.out")" "list $1 ${want:--} sum=$sum"
}

np_expect_lists() { # np_expect_lists COMPUTE GRAPHICS MPS — each "PID:BYTES ...", for every ABI
	local v
	for v in "" _v2 _v3; do
		np_expect ComputeRunningProcesses$v "$1"
		np_expect GraphicsRunningProcesses$v "$2"
		np_expect MPSComputeRunningProcesses$v "$3"
	done
	np_expect DetailList/mode0 "$1"
	np_expect DetailList/mode1 "$2"
	np_expect DetailList/mode2 "$3"
	np_expect DetailList/mode3 "$1"
}

test_nvmlprocs_lists() { # [PIDNS_OFFSET]
	# Two processes of this container (one also a graphics client, one an MPS client), one of
	# another container and one of the host share the GPU. Inside the container every list
	# shows only its two, under their own pids, with what the container counts for each
	# (allocation + 16 MiB context), and they add up to the "used" NVML reports; the names are
	# theirs.
	setup $GiB
	pidns "${1:-0}"
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	FAKECUDA_PROC_KIND=graphics np_worker ours a1 0 $((64 * MiB))
	FAKECUDA_PROC_KIND=mps np_worker ours a2 0 $((96 * MiB))
	FAKECUDA_PROC_KIND=graphics,mps np_worker other b 0 $((32 * MiB))
	FAKECUDA_PROC_KIND=graphics,mps np_worker bare x 0 $((48 * MiB))
	local a1 a2
	a1=$(np_pid a1)
	a2=$(np_pid a2)
	# Without the shim NVML lists all four, in its numbering (what the filter works on).
	np_smi 0 ""
	expect "processes NVML lists" "$(grep '^list ComputeRunningProcesses ' "$T/smi.out" | tr ',' '\n' | grep -c :)" 4
	np_smi 0
	expect "used" "$(grep '^used ' "$T/smi.out")" "used $((192 * MiB))"
	np_expect_lists "$a1:$((80 * MiB)) $a2:$((112 * MiB))" "$a1:$((80 * MiB))" "$a2:$((112 * MiB))"
	expect "names" "$(grep '^name ' "$T/smi.out" | sort)" "$(printf 'name %s %s\n' $a1 "$NPROG" $a2 "$NPROG" | sort)"
	np_end
}

test_nvmlprocs_utilization() { # [PIDNS_OFFSET]
	# Both utilisation calls sample only the container's processes, under their own pids,
	# while a process of the host keeps the GPU busy too.
	setup $GiB
	pidns "${1:-0}"
	np_worker ours a1 0 $MiB launch
	np_worker ours a2 0 $MiB launch
	np_worker bare x 0 $MiB launch
	local ours
	ours=" $(np_pid a1) $(np_pid a2) "
	SMI_UTIL=1 np_smi 0
	local call pids p
	for call in ProcessUtilization ProcessesUtilizationInfo; do
		pids=$(sed -n "s/^util $call //p" "$T/smi.out")
		[ -n "$pids" ] && [ "$pids" != - ] || { echo "    $call: no samples"; cat "$T/smi.out"; return 1; }
		for p in ${pids//,/ }; do
			[[ $ours == *" $p "* ]] || { echo "    $call: pid $p is not one of ours ($ours)"; return 1; }
		done
	done
	np_end
}

test_nvmlprocs_unknown_host_pid() {
	# A process whose host pid stayed unknown (NVML's list failed it at its first context) is
	# not matched with NVML's entry for it; it is still listed, under its own pid, with the
	# bytes the container counts for it (no context footprint: that needs the host pid).
	setup $GiB
	pidns $PIDNS
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	FAKECUDA_FAIL=nvmlDeviceGetComputeRunningProcesses:1 np_worker ours a1 0 $((64 * MiB))
	np_worker ours a2 0 $((64 * MiB))
	np_smi 0
	expect "used" "$(grep '^used ' "$T/smi.out")" "used $((144 * MiB))"
	np_expect ComputeRunningProcesses_v3 "$(np_pid a1):$((64 * MiB)) $(np_pid a2):$((80 * MiB))"
	np_expect GraphicsRunningProcesses_v3 ""
	np_end
}

test_nvmlprocs_unattributed_bytes() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# Bytes the ledger counts as held for the container but no process owns (a forged lock across
	# two processes' ranges: 2^48 bytes) go to the process holding the most: the column still adds
	# up to "used".
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	np_worker ours a1 0 $((64 * MiB))
	np_worker ours a2 0 $((32 * MiB))
	"$DUMP" hold "$T/limits" 1 0 $((1 << 48)) "$T/held" held &
	local h=$!
	waitfor "$T/held" $h
	np_smi 0
	expect "used" "$(grep '^used ' "$T/smi.out")" "used $((128 * MiB + (1 << 48)))"
	np_expect ComputeRunningProcesses "$(np_pid a1):$((80 * MiB + (1 << 48))) $(np_pid a2):$((48 * MiB))"
	kill $h
	np_end
}

test_nvmlprocs_forged_identity() {
	# The ledger on the limits file alone: the offsets forged below are its lock space's.
	SHARDS=0
	# A process of the container that takes a lock on another process's identity byte (the
	# ledger's record of who owns a slot) can at most relabel that process's memory in the
	# container's own lists: "used" stays what the container holds, the list still adds up to
	# it, and names no process outside the container. (On Linux the query answers with the
	# lock taken first, the owner's, so the labels do not even change; nothing here relies on
	# that.)
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	np_worker ours a1 0 $((64 * MiB))
	np_worker ours a2 0 $((32 * MiB))
	python3 - "$T/limits" "$(np_pid a1)" "$T/forged" <<-'EOF' &
		import fcntl, os, struct, sys, time
		fd = os.open(sys.argv[1], os.O_RDONLY)
		at = (1 << 62) + (1 << 54) + (1 << 22) + int(sys.argv[2])  # slot = pid: its identity byte
		fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, at, 1, 0))
		open(sys.argv[3], "w").close()
		time.sleep(120)
	EOF
	local f=$! r=0 line pids p
	waitfor "$T/forged" $f || return 1
	np_smi 0 || r=1
	kill $f
	wait $f 2>/dev/null || true
	expect "used" "$(grep '^used ' "$T/smi.out")" "used $((128 * MiB))" || r=1
	line=$(grep '^list ComputeRunningProcesses ' "$T/smi.out")
	expect "the list's sum" "${line##* }" "sum=$((128 * MiB))" || r=1
	pids=$(echo "$line" | cut -d' ' -f3 | tr ',' '\n' | cut -d: -f1)
	for p in $pids; do
		case " $(np_pid a1) $(np_pid a2) $f " in
		*" $p "*) ;;
		*) echo "    listed pid $p is none of the container's"; r=1 ;;
		esac
	done
	np_end
	return $r
}

test_nvmlprocs_unlisted_gpu() {
	# A GPU the limits file does not list is reported as the driver reports it (memory info
	# too): its list passes through, in NVML's numbering.
	setup $GiB
	pidns $PIDNS
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	np_worker bare x 1 $((32 * MiB))
	np_worker ours a1 0 $((64 * MiB))
	np_smi 1
	np_expect ComputeRunningProcesses_v2 "$(($(np_pid x) + PIDNS)):$((48 * MiB))"
	np_end
}

test_fake_host_pids() {
	# The fake driver as a host process sees it (FAKECUDA_HOST_PIDS: nri-vgpu's utilisation
	# query): two processes, each pid 1 of a pid namespace of its own, are two processes,
	# listed and sampled under their host pids, as the real driver reports them.
	setup $GiB
	local i hp=() want
	for i in 1 2; do
		LD_PRELOAD= unshare -p -f "$NPROG" worker 0 $((i * MiB)) "$T/w$i.pid" "$T/end" launch >"$T/w$i.out" 2>&1 &
		waitfor "$T/w$i.pid" $! || { cat "$T/w$i.out"; return 1; }
		expect "its pid in its namespace" "$(cat "$T/w$i.pid")" 1
		hp+=("$(tr -d ' ' </proc/$!/task/$!/children)")
	done
	want=$(printf '%s\n' "${hp[@]}" | sort -n | paste -sd, -)
	FAKECUDA_HOST_PIDS=1 SMI_UTIL=1 np_smi 0 ""
	expect "listed" "$(sed -n 's/^list ComputeRunningProcesses \([^ ]*\) .*/\1/p' "$T/smi.out" | tr , '\n' | cut -d: -f1 | sort -n | paste -sd, -)" "$want"
	expect "sampled" "$(sed -n 's/^util ProcessUtilization //p' "$T/smi.out")" "$want"
	expect "sampled (info)" "$(sed -n 's/^util ProcessesUtilizationInfo //p' "$T/smi.out")" "$want"
	np_end
}

test_fake_proc_root() {
	# The fake driver as nri-vgpu in a pod sees it: the caller in a pid namespace of its own,
	# with the host's /proc at another path (the chart's /host/proc, FAKECUDA_PROC), lists
	# and samples the processes under their host pids; without FAKECUDA_PROC its own /proc
	# shows none of them (pid 0).
	setup $GiB
	local i hp=() want
	for i in 1 2; do
		LD_PRELOAD= unshare -p -f "$NPROG" worker 0 $((i * MiB)) "$T/w$i.pid" "$T/end" launch >"$T/w$i.out" 2>&1 &
		waitfor "$T/w$i.pid" $! || { cat "$T/w$i.out"; return 1; }
		hp+=("$(tr -d ' ' </proc/$!/task/$!/children)")
	done
	want=$(printf '%s\n' "${hp[@]}" | sort -n | paste -sd, -)
	mkdir "$T/hostproc"
	local proc
	for proc in "$T/hostproc" ""; do
		LD_PRELOAD= FAKECUDA_HOST_PIDS=1 FAKECUDA_PROC=$proc SMI_UTIL=1 unshare -m sh -c \
			'mount --bind /proc "$1" && shift && exec unshare -p -f --mount-proc "$@"' sh "$T/hostproc" \
			timeout 60 "$NPROG" smi 0 >"$T/smi.out" 2>"$T/smi.err" || { cat "$T/smi.out" "$T/smi.err"; return 1; }
		local got
		got=$(sed -n 's/^list ComputeRunningProcesses \([^ ]*\) .*/\1/p' "$T/smi.out" | tr , '\n' | cut -d: -f1 | sort -n | paste -sd, -)
		if [ -n "$proc" ]; then
			expect "listed through FAKECUDA_PROC" "$got" "$want"
			expect "sampled through FAKECUDA_PROC" "$(sed -n 's/^util ProcessUtilization //p' "$T/smi.out")" "$want"
		else
			expect "listed through the pod's own /proc" "$got" "0,0"
		fi
	done
	np_end
}

t nvmlprocs_lists test_nvmlprocs_lists
t nvmlprocs_lists_pidns test_nvmlprocs_lists $PIDNS
t nvmlprocs_utilization test_nvmlprocs_utilization
t nvmlprocs_forged_identity test_nvmlprocs_forged_identity
t nvmlprocs_utilization_pidns test_nvmlprocs_utilization $PIDNS
t nvmlprocs_unknown_host_pid test_nvmlprocs_unknown_host_pid
t nvmlprocs_unattributed_bytes test_nvmlprocs_unattributed_bytes
t nvmlprocs_unlisted_gpu test_nvmlprocs_unlisted_gpu
t fake_host_pids test_fake_host_pids
t fake_proc_root test_fake_proc_root
