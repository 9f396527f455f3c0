# Tests of the context footprint (what NVML says a process holds beyond its
# counted allocations, re-measured where it grows) and of the locks around
# context creation. Sourced by run.sh, which provides setup, run, expect, ...
# Expected sizes are literals or arithmetic on the fake driver's knobs.

# ---- what NVML cannot tell ----------------------------------------------------------------------

test_fp_nvml_not_available() {
	# NVML answers NVML_VALUE_NOT_AVAILABLE for every process (always so under WSL2 / WDDM):
	# the footprint is unknown, not 2^64-1 bytes, and what is counted still fills the quota.
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_NVML_USED_NA=1
	run init alloc:256MiB alloc:1:2 info:0:256MiB
}

test_fp_nvml_unknown_keeps() { # na | fail
	# A footprint once measured (the 64 MiB context) stays counted while NVML cannot tell,
	# whether it answers "not available" or fails: neither zero nor garbage. The module load
	# (0 bytes here) makes the shim measure again, and the next allocation once more.
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_MODULE_BYTES=0
	export FAKECUDA_NVML_USED_NA=$T/na FAKECUDA_NVML_PROCS_FAIL=$T/fail
	run init touch:"$T/$1" modload:data alloc:192MiB alloc:1:2 alloc:1:2
}

test_fp_many_processes() { # [PIDNS_OFFSET]
	# 100 processes of other containers on the GPU, listed before this one: more than a fixed
	# array of 64 holds. The list is sized from NVML's answer, so the context is still counted.
	setup $((256 * MiB))
	pidns "${1:-0}"
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_NVML_EXTRA_PROCS=100
	run init alloc:192MiB alloc:1:2 info:0:256MiB
}

test_fp_ctx_past_limit() {
	# A context whose own memory (16 MiB here, 518 MiB on an H200) would take the container past
	# its limit is destroyed and its creation fails as out of memory, primary or not, in every
	# ABI and through every entry point that makes one: the first
	# process holds 16 + 40 of 64 MiB, so a second one's contexts (16 more each) are refused and
	# the container stays at 56 MiB. Once the first is gone, a context is counted as before.
	setup $((64 * MiB))
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	held first init alloc:40MiB
	run cuinit primary:0:2 newctx:0:2 || { release first; return 1; }
	run -m rt12 cuinit newctxv1:0:2 || { release first; return 1; }
	# So are the contexts made for OpenGL and VDPAU interoperability.
	run cuinit newctxgl:0:2 newctxvdpau:0:2 || { release first; return 1; }
	run -m rt12 cuinit newctxgl:0:2 newctxvdpau:0:2 || { release first; return 1; }
	expect "used with the refused contexts gone" "$(used)" $((56 * MiB))
	expect "warning" "$(grep -c "new context's own memory would take the container past" "$T/err")" 1
	release first
	run init alloc:48MiB alloc:1:2
}

test_fp_green_contexts() { # [PIDNS_OFFSET]
	# A green context retains its device's primary context inside the driver, making it (16 MiB
	# here) if there is none. A process that uses only green contexts has that context counted
	# like any other: 16 + 48 fill 64 MiB. In a pid namespace the host pid is found only around a
	# context's creation the shim sees.
	setup $((64 * MiB))
	pidns "${1:-0}"
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	run cuinit green:0 alloc:48MiB alloc:1:2 || return 1
	# Past the limit it is refused like a primary context: the first process holds 16 + 40.
	held first init alloc:40MiB
	run cuinit green:0:2 || { release first; return 1; }
	expect "used with the refused context gone" "$(used)" $((56 * MiB))
	release first
	# What is allocated in a green context is the primary context's, and goes with it when the
	# last green context goes: 32 MiB allocated, the green context destroyed (the primary with
	# it), a new one made, and 16 + 48 fit again.
	run cuinit green:0 alloc:32MiB greendestroy green:0 alloc:48MiB alloc:1:2
}

test_green_script() {
	# validate/greenctx.py, which check 12b of validate.sh runs on a GPU, run here on the fake
	# driver: the green context's primary context (16 MiB) counted at once, then 16 + 32, and
	# 16 again after the green context (the primary with it) is destroyed and another made.
	command -v python3 >/dev/null || { echo "    info: no python3: skipped"; return 0; }
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((16 * MiB))
	LD_PRELOAD=$SHIM timeout 60 python3 "$HERE/../validate/greenctx.py" $((32 * MiB)) >"$T/out" 2>&1 ||
		{ cat "$T/out"; return 1; }
	expect "made, allocated, again" "$(cat "$T/out")" "green $((16 * MiB)) $((48 * MiB)) $((16 * MiB))"
}

# ---- growth after the context's creation ----------------------------------------------------------

test_fp_module_loads() {
	# Every way of loading code holds device memory (32 MiB a module here) until it is unloaded.
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_MODULE_BYTES=$((32 * MiB))
	local kind
	for kind in file data dataex fatbin lib libfile; do
		run init modload:$kind info:160MiB:256MiB alloc:160MiB alloc:1:2 free modunload alloc:192MiB alloc:1:2 ||
			{ echo "    kind $kind"; return 1; }
	done
}

test_fp_lazy_loading() {
	# CUDA_MODULE_LOADING=LAZY (the driver's default since CUDA 12.2): a module costs nothing when
	# loaded and each function 16 MiB at its first use.
	setup $((256 * MiB))
	export CUDA_MODULE_LOADING=LAZY FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_FUNCTION_BYTES=$((16 * MiB))
	# cuModuleGetFunction loads the function (once).
	run init modload:data info:192MiB:256MiB getfunc:k1 getfunc:k1 alloc:176MiB alloc:1:2
	# cuKernelGetFunction, a library's.
	run init modload:lib getfunc:k1 getfunc:k2 alloc:160MiB alloc:1:2
	# A library kernel's first launch: the next allocation a second later sees it.
	run init modload:lib getkernel:k1 launchf:3 sleep:1100 alloc:176MiB alloc:1:2
}

test_fp_launch_watcher() {
	# At cores < 100 the limiter's watcher measures too: growth at launch (a lazily loaded
	# kernel, 16 MiB) reaches the usage region without the process allocating again.
	setup $((256 * MiB)) 50
	export CUDA_MODULE_LOADING=LAZY FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_FUNCTION_BYTES=$((16 * MiB))
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init modload:lib getkernel:k1 launchf:1 touch:"$T/ready" \
		waitfile:"$T/end" >"$T/out" 2>"$T/err" &
	waitfor "$T/ready" $!
	local i
	for i in $(seq 100); do
		[ "$(used)" = $((80 * MiB)) ] && break
		sleep 0.05
	done
	expect "region used" "$(used)" $((80 * MiB))
	touch "$T/end"
	wait
}

test_fp_launch_local_memory() {
	# A kernel that needs more local memory than is reserved grows the reservation when it is
	# launched (to 48 MiB here); the eagerly loaded module holds 4 MiB. The first allocation
	# takes the measure the lookup asked for, before the launch: the next one, a second
	# later, sees the growth.
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((64 * MiB)) FAKECUDA_LAUNCH_LMEM=$((48 * MiB)) FAKECUDA_MODULE_BYTES=$((4 * MiB))
	run init modload:data getfunc:k alloc:1MiB launchf:2 sleep:1100 alloc:139MiB alloc:1:2
}

test_fp_set_limit() {
	# cuCtxSetLimit reserves device memory: the stack size for every resident thread
	# (1 KiB x 2048 x 132 SMs = 264 MiB here), the malloc heap its size (32 MiB).
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((64 * MiB))
	run init setlimit:0:1KiB setlimit:2:32MiB alloc:664MiB alloc:1:2
	# Set back, the memory is given back (believed once a second measure agrees).
	run init setlimit:0:1KiB setlimit:0:0 alloc:1MiB alloc:959MiB alloc:1:2
	# Past the quota: counted all the same, as the driver has already reserved it; later
	# allocations fail, and the growth is said once.
	setup $((256 * MiB))
	export FAKECUDA_CTX_BYTES=$((64 * MiB))
	run init setlimit:0:1KiB alloc:1MiB:2 setlimit:2:1MiB alloc:1MiB:2 info:0:256MiB
	expect "lines about the footprint past the quota" "$(grep -c 'footprint' "$T/err")" 1
}

# ---- no lock across context creation ---------------------------------------------------------------

test_lock_ctx_create_stopped() {
	# A process stopped in the middle of creating its first context (the driver takes 5 s
	# here) must not hold up the container's other processes: their allocations and frees go on.
	setup $GiB
	LD_PRELOAD=$SHIM timeout 60 "$PROG" init touch:"$T/b.ready" waitfile:"$T/go" alloc:1MiB free alloc:2MiB free \
		touch:"$T/b.done" waitfile:"$T/end" >"$T/out.b" 2>&1 &
	local b=$!
	waitfor "$T/b.ready" $b
	FAKECUDA_CTX_SLEEP_MS=5000 FAKECUDA_CTX_STARTED=$T/a.creating LD_PRELOAD=$SHIM "$PROG" init alloc:1MiB \
		>"$T/out.a" 2>&1 &
	local a=$!
	waitfor "$T/a.creating" $a
	kill -STOP $a
	touch "$T/go"
	local i done=no
	for i in $(seq 200); do
		[ -e "$T/b.done" ] && { done=yes; break; }
		sleep 0.05
	done
	kill -CONT $a
	touch "$T/end"
	wait $a
	wait $b
	expect "the other process allocated and freed while one was stopped creating a context" $done yes
}

test_lock_reentrant_alloc() { # [interposer]
	# The driver calls the program back while it creates a context (as a profiler's callback
	# runs), and the callback allocates 1 MiB; with an interposer preloaded first, through its
	# wrapper. The allocation is counted, and nothing the shim holds around context creation
	# makes the thread wait on itself.
	setup $GiB
	export FAKECUDA_CTX_BYTES=$((64 * MiB))
	local pre=$SHIM
	[ -n "${1:-}" ] && pre="$B/libinterposer.so $SHIM"
	LD_PRELOAD=$pre timeout 20 "$PROG" cuinit ctxcb:1MiB ctx:0 alloc:2MiB touch:"$T/ready" waitfile:"$T/end" \
		>"$T/out" 2>"$T/err" &
	waitfor "$T/ready" $!
	expect "region used (context, callback, allocation)" "$(used)" $((67 * MiB))
	touch "$T/end"
	wait
	[ -z "${1:-}" ] || grep -q "interposer: 2 calls" "$T/err"
}

t fp_ctx_past_limit test_fp_ctx_past_limit
t fp_green_contexts test_fp_green_contexts
t fp_green_contexts_pidns test_fp_green_contexts $PIDNS
t green_script test_green_script
t fp_nvml_not_available test_fp_nvml_not_available
t fp_nvml_unknown_keeps_na test_fp_nvml_unknown_keeps na
t fp_nvml_unknown_keeps_fail test_fp_nvml_unknown_keeps fail
t fp_many_processes test_fp_many_processes
t fp_many_processes_pidns test_fp_many_processes $PIDNS
t fp_module_loads test_fp_module_loads
t fp_lazy_loading test_fp_lazy_loading
t fp_launch_watcher test_fp_launch_watcher
t fp_launch_local_memory test_fp_launch_local_memory
t fp_set_limit test_fp_set_limit
t lock_ctx_create_stopped test_lock_ctx_create_stopped
t lock_reentrant_alloc test_lock_reentrant_alloc
t lock_reentrant_alloc_interposer test_lock_reentrant_alloc interposer
