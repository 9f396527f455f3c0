# SM limiter tests (sourced by run.sh): debt, missing samples, what a launch is charged.
# Shares come from the fake driver's device-time accounting (cudaprog launchfor), not
# from the launcher's wall time.

# share_in FILE LO HI [WHAT] — every "share" line of FILE lies in [LO, HI].
share_in() {
	local s
	s=$(sed -n 's/^share //p' "$1" | tr '\n' ' ')
	echo "    info: ${4:-share} $s (want $2..$3)"
	[ -n "$s" ] && awk -v lo="$2" -v hi="$3" -v s="$s" \
		'BEGIN { n = split(s, v, " "); for (i = 1; i <= n; i++) if (v[i] < lo || v[i] > hi) exit 1 }'
}

test_sm_huge_kernel_no_stall() {
	# vLLM's mix in miniature: seconds of 1-block kernels, then one 13,200-block kernel (100 waves of
	# 1 ms on 132 SMs, 100 ms of GPU time), then one of 132,000 blocks (1 s). The small kernels must be
	# held to the share, and a huge one may put the container about one control period (20 ms) in
	# debt, no more: the launches after it return within a second (a bound only a stalled limiter
	# misses; the 13,200-block kernel used to hold the next launch over a minute).
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166
	run init launchfor:3:1:1 launchtimed:13200 launchtimed:1 launchtimed:132000 launchtimed:1 launchtimed:1 \
		launchfor:2:0.5:13200 launchfor:2:0.5:1 || return 1
	# Kernels longer than a period's allowance (the 100 ms ones) run at about one a period, over the
	# share: they are not held to it, but must not cut the rate for the small kernels after them.
	sed -n 's/^share //p' "$T/out" | sed -n 2p | sed 's/^/    info: share of 100 ms kernels /'
	sed -n 's/^share //p' "$T/out" | sed 2d | sed 's/^/share /' >"$T/small"
	share_in "$T/small" 25 35 "share of 1-block kernels before and after" || return 1
	local w
	w=$(sed -n 's/^launch_ms //p' "$T/out" | sort -n | tail -1)
	echo "    info: longest launch after a huge kernel $w ms"
	awk -v w="$w" 'BEGIN { exit !(w < 1000) }'
}

test_sm_charged_by_waves() {
	# A launch costs its grid in waves (grid / SMs, rounded up), the time it holds the GPU: 1 block
	# and 132 blocks are one wave (1 ms on the fake), 1320 blocks ten. Each mix is held to the share
	# from its first second on.
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166
	run init launchfor:2:0.5:132 launchfor:2:0.5:1320 launchfor:2:0.5:1 || return 1
	share_in "$T/out" 25 35 "shares of 1-, 10- and 1-wave kernels"
}

test_sm_launch_kinds() {
	# Cooperative and cuLaunchKernelEx launches are charged by their grid as well (10 waves each).
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166
	run init launchfor:2:0.5:1320:coop launchfor:2:0.5:1320:ex || return 1
	share_in "$T/out" 25 35 "shares of cooperative and Ex launches"
}

test_sm_launch_legacy() {
	# The launch ABIs from before cuLaunchKernel, deprecated but still exported by the driver, are
	# charged like it: cuLaunchGrid and cuLaunchGridAsync by their grid (10 waves), cuLaunch one
	# block, a multi-device cooperative launch by each entry's grid on its stream's device; the
	# runtime's way (cuGetProcAddress) reaches the same wrappers. Unhooked, each runs at 100 %.
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166
	run init launchfor:2:0.5:1320:grid launchfor:2:0.5:1320:gridasync launchfor:2:0.5:1:one \
		launchfor:2:0.5:1320:multi || return 1
	share_in "$T/out" 25 35 "shares of cuLaunchGrid, cuLaunchGridAsync, cuLaunch and multi-device launches"
	run -m rt12 init launchfor:2:0.5:1320:grid launchfor:2:0.5:1:one || return 1
	share_in "$T/out" 25 35 "shares of cuLaunchGrid and cuLaunch through cuGetProcAddress_v2"
}

test_sm_quick_climb() {
	# Kernels of 50 us a wave at 30 %: the first guess (1 ms a wave) lets the container run 1.5 %.
	# The rate gets most of the way in one step while far below the share and starved (half-steps
	# of 1.5x at most took 2-3 s on an H200), so the window from 0.5 s to 1.5 s after the first
	# launch is already near the share.
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166 FAKECUDA_KERNEL_US=50
	run init launchfor:1.5:0.5:1 || return 1
	share_in "$T/out" 20 35 "share from 0.5 s to 1.5 s"
}

# sm_small_waves IDLE — kernels of 50 us a wave at a 10 % limit: the first guess (1 ms a wave) lets
# the container run 0.5 % of the GPU, less than NVML's 1 % resolution. NVML shows it as IDLE says
# (absent: no samples at all; zero: listed with 0 %); either way the rate must climb to the share.
sm_small_waves() {
	setup $GiB 10 hard
	export FAKECUDA_SAMPLE_MS=166 FAKECUDA_KERNEL_US=50 FAKECUDA_UTIL_IDLE=$1
	run init launchfor:6:4:1 || return 1
	share_in "$T/out" 5 15 "share with NVML idle=$1 (limit 10)"
}
test_sm_no_samples() { sm_small_waves absent; }
test_sm_zero_samples() { sm_small_waves zero; }

test_sm_nvml_unsupported() {
	# NVML gives no per-process utilisation at all: the bucket still refills at the rate it has
	# (here the first guess, right for 1 ms waves), with one warning; launches never stall.
	setup $GiB 30 hard
	export FAKECUDA_UTIL_UNSUPPORTED=1
	run init launchfor:3:1:132 launchtimed:1 || return 1
	share_in "$T/out" 25 35 "share without NVML utilisation" || return 1
	grep -q "NVML gives no per-process utilisation" "$T/err" || { echo "    no warning"; return 1; }
	expect "warnings" "$(grep -c "NVML gives no per-process utilisation" "$T/err")" 1
}

test_sm_wait_carried_behind_long_kernels() {
	# Two threads launch kernels of 20 waves (20 ms) at 30 %: longer than a period's allowance
	# (15 ms), so each charge hits the bounded debt and the owed stays full. The thread in line
	# behind the other's launch would wait for that launch's debt as well as its own, two
	# periods; after one period in line it goes and the debt ahead is carried past the owed
	# bound (the limiter's debug log says so). NVML gives no utilisation: the rate stays at its
	# first guess, right for these 1 ms waves.
	setup $GiB 30 hard debug
	export FAKECUDA_UTIL_UNSUPPORTED=1
	run init launchthreads:2:3:1:2640 || return 1
	local past paid
	past=$(grep -c 'let go after a period in line.*past the owed bound' "$T/err" || true)
	paid=$(grep -c 'let go after a period in line.*to be paid back' "$T/err" || true)
	echo "    info: launches let go after a period: $past past the owed bound, $paid to be paid back"
	[ "$past" -ge 5 ]
}

test_sm_carried_debt_keeps_share() {
	# Four threads launch kernels of 5 waves (5 ms, a third of a period's allowance at 30 %) flat
	# out: in line behind three others a launch would wait about 1.3 periods. Its debt is carried
	# only while the owed has room; then launches wait for it, so the share still holds (with
	# carrying past the bound the four threads would take 40 %).
	setup $GiB 30 hard
	export FAKECUDA_UTIL_UNSUPPORTED=1
	run init launchthreads:4:8:2:660 || return 1
	share_in "$T/out" 25 35 "share of four launching threads"
}

t sm_huge_kernel_no_stall test_sm_huge_kernel_no_stall
t sm_charged_by_waves test_sm_charged_by_waves
t sm_launch_kinds test_sm_launch_kinds
t sm_launch_legacy test_sm_launch_legacy
t sm_quick_climb test_sm_quick_climb
t sm_no_samples test_sm_no_samples
t sm_zero_samples test_sm_zero_samples
t sm_nvml_unsupported test_sm_nvml_unsupported
t sm_wait_carried_behind_long_kernels test_sm_wait_carried_behind_long_kernels
t sm_carried_debt_keeps_share test_sm_carried_debt_keeps_share
