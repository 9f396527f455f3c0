# SM limiter and CUDA graphs (sourced by run.sh after t_limiter.sh and t_graphs.sh; uses their
# share_in and grun): what stream capture and graph launches are charged.

test_sm_capture_not_charged() {
	# Launches recorded by stream capture run (and are charged) when their graph is launched, not
	# at capture time. NVML gives no utilisation here, so the rate stays at its first guess and a
	# charge would cost what it says: each of these 1000-wave launches would leave the bucket a
	# period in debt, and the 200 calls would take over 9 s instead of a few milliseconds.
	setup $GiB 30 hard
	export FAKECUDA_UTIL_UNSUPPORTED=1
	grun -m direct init capture launchks:200:132000 endcapture launchfor:2:0.5:132 || return 1
	local ms
	ms=$(sed -n 's/^launchks_ms //p' "$T/out")
	echo "    info: 200 captured 1000-wave launches took $ms ms"
	awk -v ms="$ms" 'BEGIN { exit !(ms != "" && ms < 3000) }' || return 1
	# The limiter is on all the same: eager launches after the capture are held to the share.
	share_in "$T/out" 25 35 "share of eager launches after the capture"
}

test_sm_graph_charged_by_work() {
	# A graph launch costs what its kernel nodes run: a graph of ten 1-wave kernels is held to the
	# share like an eager 10-wave kernel (1320 blocks on 132 SMs), the same GPU time per launch.
	setup $GiB 30 hard
	export FAKECUDA_SAMPLE_MS=166
	grun -m direct init graph kernels:10:132 inst launchfor:2:0.5 launchfor:2:0.5:1320 || return 1
	share_in "$T/out" 25 35 "shares of a 10-kernel graph and of an eager kernel of the same work"
}

test_sm_graph_small_kernels() {
	# A graph of many small kernels: each 1-block node holds the GPU for a wave, so a graph of
	# twelve of them is twelve waves, not ceil(12 blocks / 132 SMs) = one.
	setup $GiB 30 hard debug
	export FAKECUDA_SAMPLE_MS=166
	grun -m direct init graph kernels:12:1 inst launchfor:2:0.5 || return 1
	grep -q 'graph exec 0x[0-9a-f]*: 12 thread blocks a launch, .* 12 waves on 132 SMs' "$T/err" ||
		{ echo "    no '12 waves on 132 SMs' in the log"; grep 'graph exec' "$T/err" | sed 's/^/    /'; return 1; }
	share_in "$T/out" 25 35 "share of a graph of twelve 1-block kernels"
}

t sm_capture_not_charged test_sm_capture_not_charged
t sm_graph_charged_by_work test_sm_graph_charged_by_work
t sm_graph_small_kernels test_sm_graph_small_kernels
