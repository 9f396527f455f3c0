#!/usr/bin/env bash
# Checks libvgpu-shim.so on a real NVIDIA GPU, with PyTorch and
# nvidia-smi. Needs: an NVIDIA driver, nvidia-smi, Python with torch (CUDA).
# Uses the override paths (NRI_VGPU_LIMITS / NRI_VGPU_REGION_DIR), so it must
# not run where /run/nri-vgpu/limits exists. Prints one PASS/FAIL line per check
# and the numbers behind it; record them in docs/validation.md.
#
#   shim/validate/validate.sh [--only LABELS] [GPU-index]
#
# --only 4c,4d,6   runs only the checks with these labels (the numbers of the
#                  "# N." comments below; the cudart checks are "cudart"), in
#                  this file's order; each runs as it does in a full run.
# Environment: PYTHON, the Python with PyTorch (default python3); SHIM and
# SHIM_TOOLS for a shim built elsewhere (common.sh).

# Every check's label, in order.
labels="1 2 3 3b 4 4b 4c 4d 5 6 7 7b cudart 8 9 10 11 12 12b 13"
only=""
while (($#)); do
	case $1 in
	--only)
		(($# >= 2)) || { echo "validate: --only needs a list of check labels ($labels)" >&2; exit 2; }
		only=" ${2//,/ } "
		shift 2
		;;
	--only=*) only=" $(echo "${1#--only=}" | tr , ' ') "; shift ;;
	-*) echo "validate: unknown option '$1' (usage: validate.sh [--only LABELS] [GPU-index])" >&2; exit 2 ;;
	*) break ;;
	esac
done
for l in $only; do
	[[ " $labels " == *" $l "* ]] || { echo "validate: unknown check '$l' in --only (checks: $labels)" >&2; exit 2; }
done
# want LABEL...: one of the checks is to run (all of them without --only).
want() {
	[ -z "$only" ] && return 0
	local l
	for l in "$@"; do [[ $only == *" $l "* ]] && return 0; done
	return 1
}
# The checks' lines inside each "if want" are as in a full run, not indented
# again: Python in their here-documents must keep its indentation.
. "$(dirname "$0")/common.sh"

echo "GPU $gpu $uuid, ${total_mib} MiB; memory limit $limit bytes"
echo "  $(nvidia-smi -i "$gpu" --query-gpu=name,driver_version --format=csv,noheader); $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
limits "$limit" 100

# 1. mem_get_info reports the slice; allocation at the limit fails cleanly.
if want 1; then
shimmed "$PYTHON" - "$limit" <<'PY'
import sys, torch
limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
print(f"  mem_get_info free={free} total={total}")
assert total == limit, "total is not the limit"
chunks, n = [], 0
try:
    while True:
        chunks.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda")); n += 1
except torch.cuda.OutOfMemoryError as e:
    print(f"  OOM after {n} x 64 MiB = {n * 64} MiB (limit {limit >> 20} MiB): {str(e).splitlines()[0][:100]}")
assert n * (64 << 20) <= limit, "allocated past the limit"
PY
result $? "mem_get_info reports the slice; allocation past the limit raises OutOfMemoryError"
fi

# 2. nvidia-smi (its own NVML calls) reports the slice while a process holds memory.
if want 2; then
shimmed "$PYTHON" -c 'import torch,time; x=torch.empty(256<<20,dtype=torch.uint8,device="cuda"); open("'"$W"'/held","w"); time.sleep(20)' &
holder=$!
for _ in $(seq 100); do [ -e "$W/held" ] && break; sleep 0.2; done
line=$(shimmed nvidia-smi -i "$gpu" --query-gpu=memory.total,memory.used --format=csv,noheader,nounits)
kill $holder 2>/dev/null; wait $holder 2>/dev/null
echo "  nvidia-smi total,used (MiB): $line"
smi_total=$(echo "$line" | cut -d, -f1 | tr -d ' ')
[ "$smi_total" = $((limit / 1048576)) ]
result $? "nvidia-smi shows the slice as total"
fi

# 3. Expandable segments (cuMemCreate/cuMemMap) are counted.
if want 3; then
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True shimmed "$PYTHON" - "$limit" <<'PY'
import sys, torch
limit = int(sys.argv[1]); n = 0; keep = []
try:
    while True:
        keep.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda")); n += 1
except torch.cuda.OutOfMemoryError:
    pass
print(f"  expandable segments: {n * 32} MiB before OOM (limit {limit >> 20} MiB)")
assert 0 < n * (32 << 20) <= limit
PY
result $? "expandable segments stop at the limit"
fi

# 3b. Stream-ordered pools: PyTorch's cudaMallocAsync backend keeps freed memory
#     in its pool (release threshold UINT64_MAX); the shim charges what the pool
#     keeps, lets the pool reuse it, and gives it back when the pool is trimmed.
if want 3b; then
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync shimmed "$PYTHON" - "$limit" <<'PY'
import sys, torch
limit = int(sys.argv[1]); q = limit * 3 // 4
base = torch.cuda.mem_get_info()[0]  # the slice less the context's own footprint
x = torch.empty(q, dtype=torch.uint8, device="cuda"); del x; torch.cuda.synchronize()
kept = torch.cuda.mem_get_info()[0]
x = torch.empty(q, dtype=torch.uint8, device="cuda")
try:
    y = torch.empty(limit // 2, dtype=torch.uint8, device="cuda"); refused = False
except torch.cuda.OutOfMemoryError:
    refused = True
del x; torch.cuda.synchronize(); torch.cuda.empty_cache()
trimmed = torch.cuda.mem_get_info()[0]
print(f"  cudaMallocAsync: free {kept >> 20} MiB while the pool keeps {q >> 20} MiB, "
      f"reuse ok, {limit >> 21} MiB more refused={refused}, free {trimmed >> 20} MiB after empty_cache "
      f"(free at start {base >> 20} MiB)")
assert kept <= base - q and refused and trimmed >= base - (32 << 20)
PY
result $? "cudaMallocAsync pool retention charged, reused, trimmed"
fi

# 4. SM limits: matmul throughput relative to the unlimited run.
bench='
import time, torch
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
for _ in range(20): a @ b
torch.cuda.synchronize(); t = time.time(); n = 0
while time.time() - t < 10:
    a @ b; n += 1
    if n % 10 == 0: torch.cuda.synchronize()
torch.cuda.synchronize(); print(n / (time.time() - t))'
if want 4 5 6 7b; then # the unlimited rate: 5, 6 and 7b compare with it too
base=$(CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" -c "$bench")
echo "  unlimited, no shim: $base matmul/s"
fi
if want 4; then
for cores in 30 50 70; do
	limits 0 "$cores"
	got=$(shimmed "$PYTHON" -c "$bench")
	share=$("$PYTHON" -c "print(round(100 * $got / $base, 1))")
	echo "  cores=$cores: $got matmul/s = $share %"
	"$PYTHON" -c "import sys; sys.exit(0 if abs($share - $cores) <= 5 else 1)"
	result $? "SM limit $cores % within 5 points"
done
fi

# 4b. CUDA graph memory: counted when the driver backs it (upload), refused over
#    the quota before the driver is called, given back by cuDeviceGraphMemTrim.
#    Driver API through ctypes (no toolkit needed); the shim sees it via dlsym.
if want 4b; then
limits "$limit" 100
shimmed "$PYTHON" - "$limit" <<'PY'
import ctypes as C, sys
limit = int(sys.argv[1]); cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0: raise SystemExit(f"  {what} returned {r}")
ck(cu.cuInit(0), "cuInit"); dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "set")
class P(C.Structure):  # CUDA_MEM_ALLOC_NODE_PARAMS (120 bytes)
    _fields_ = [("allocType", C.c_int), ("handleTypes", C.c_int), ("locType", C.c_int), ("locId", C.c_int),
                ("win32", C.c_void_p), ("maxSize", C.c_size_t), ("usage", C.c_ushort), ("res", C.c_ubyte * 54),
                ("access", C.c_void_p), ("naccess", C.c_size_t), ("bytesize", C.c_size_t), ("dptr", C.c_ulonglong)]
assert C.sizeof(P) == 120
def free():
    f, t = C.c_size_t(), C.c_size_t(); ck(cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), "cuMemGetInfo"); return f.value
def reserved():
    v = C.c_ulonglong(); ck(cu.cuDeviceGetGraphMemAttribute(dev, 2, C.byref(v)), "attr"); return v.value
def graph(n):
    g, a, f, e = C.c_void_p(), C.c_void_p(), C.c_void_p(), C.c_void_p()
    ck(cu.cuGraphCreate(C.byref(g), 0), "cuGraphCreate")
    p = P(allocType=1, locType=1, locId=dev.value, bytesize=n)
    ck(cu.cuGraphAddMemAllocNode(C.byref(a), g, None, C.c_size_t(0), C.byref(p)), "cuGraphAddMemAllocNode")
    ck(cu.cuGraphAddMemFreeNode(C.byref(f), g, C.byref(a), C.c_size_t(1), C.c_ulonglong(p.dptr)), "free node")
    ck(cu.cuGraphInstantiateWithFlags(C.byref(e), g, C.c_ulonglong(0)), "instantiate"); return e
f0 = free(); e = graph(limit // 2); f1 = free()
ck(cu.cuGraphUpload(e, None), "cuGraphUpload"); ck(cu.cuCtxSynchronize(), "sync"); f2 = free(); r = reserved()
big = graph(limit); rc = cu.cuGraphLaunch(big, None); rr = reserved()
ck(cu.cuGraphExecDestroy(e), "destroy"); ck(cu.cuDeviceGraphMemTrim(dev), "trim"); f3 = free()
print(f"  free: start {f0}, instantiated {f1}, uploaded {f2} (pool {r}); over-quota launch rc={rc} "
      f"(pool then {rr}); after trim {f3}")
ok = f1 == f0 and abs((f0 - f2) - r) <= (2 << 20) and rc == 2 and rr == r and abs(f3 - f0) <= (2 << 20)
sys.exit(0 if ok else 1)
PY
result $? "CUDA graph memory counted at upload, refused over the quota, given back by the trim"
fi

# The device's busy percentage (NVML's utilization.gpu: the time a kernel ran) over the window
# a program prints as its last line's last two fields (wall-clock start and end, seconds since
# the epoch), sampled every 100 ms while it runs; the program's output is printed before it.
busy() { # busy COMMAND...
	nvidia-smi -i "$gpu" --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 >"$W/busy" 2>/dev/null &
	local sampler=$! out
	out=$("$@")
	kill $sampler 2>/dev/null
	wait $sampler 2>/dev/null
	echo "$out" | "$PYTHON" -c '
import datetime, sys
lines = sys.stdin.read().split("\n")
last = [l for l in lines if l.strip()][-1].split()
t0, t1 = float(last[-2]), float(last[-1])
vals = []
for row in open(sys.argv[1]):
    try:
        ts, u = row.rsplit(",", 1)
        t = datetime.datetime.strptime(ts.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        if t0 <= t <= t1:
            vals.append(float(u))
    except ValueError:
        pass
print(" ".join(last[:-2]), round(sum(vals) / len(vals), 1) if vals else -1)' "$W/busy"
}

# 4c. The SM limiter neither stalls nor lets small kernels run over the share: at 30 %,
#     1-element kernels launched one by one (four seconds for the rate to settle, then three
#     measured), then three large matmuls (tens of ms each, longer than a control period's
#     allowance), then 50 small launches. A launch-bound loop of tiny kernels may keep the GPU
#     busy less than 30 % of the time even unlimited, so the share is judged by the time the
#     GPU was busy (NVML's utilization.gpu, sampled by nvidia-smi), not by the launch rate.
#     Passes when the measured phase kept the GPU busy at most 35 % of the time and no launch
#     after the matmuls waited more than twice the control period (2 x 50 ms).
if want 4c; then
stall='
import time, torch
x = torch.ones(1, device="cuda"); a = torch.randn(8192, 8192, device="cuda")
def small(sec):
    torch.cuda.synchronize(); t = time.time(); n = 0
    while time.time() - t < sec:
        x.add_(1); n += 1
    torch.cuda.synchronize(); return n / (time.time() - t), t, time.time()
small(4)
rate, t0, t1 = small(3)
a @ a; a @ a; a @ a
waits = []
for _ in range(50):
    s = time.time(); x.add_(1); waits.append(time.time() - s)
torch.cuda.synchronize()
print(rate, round(max(waits) * 1000, 1), t0, t1)'
read -r small_base _ busy_base < <(busy env CUDA_VISIBLE_DEVICES="$gpu" "$PYTHON" -c "$stall")
limits 0 30
read -r small_got wait_ms busy_got < <(busy shimmed "$PYTHON" -c "$stall")
share=$("$PYTHON" -c "print(round(100 * $small_got / $small_base, 1))")
echo "  small kernels: unlimited GPU busy $busy_base %; at cores=30 GPU busy $busy_got % (launch rate $share % of unlimited); longest launch after the matmuls $wait_ms ms"
"$PYTHON" -c "import sys; sys.exit(0 if 0 <= $busy_got <= 35 and $wait_ms <= 100 else 1)"
result $? "SM limiter: small kernels held to 30 % of GPU time, no launch waits over 2 control periods after long kernels"
fi

# 4d. A CUDA graph is charged what its kernels run: a captured graph of 50 1-element kernels
#     (each a 1-block launch, a wave each), replayed at 30 % (four seconds for the rate to
#     settle from its first guess, then three measured), replays at about 30 % of its
#     unlimited rate (replays keep the GPU busy: the rate is the share); charged as one wave
#     (its 50 blocks on the GPU's SMs) it would run far above. Capturing it at 30 % is not
#     charged (no replay has run yet).
if want 4d; then
graph_base=$(CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" validate/smallkernels.py graph 4 3 | tail -n 1)
limits 0 30
out=$(shimmed "$PYTHON" validate/smallkernels.py graph 4 3)
graph_got=$(echo "$out" | tail -n 1)
cap_ms=$(echo "$out" | sed -n 's/^capture_ms //p')
share=$("$PYTHON" -c "print(round(100 * $graph_got / $graph_base, 1))")
echo "  cores=30: a 50-kernel graph replays at $share % of its unlimited rate once settled; capturing it took $cap_ms ms"
"$PYTHON" -c "import sys; sys.exit(0 if 25 <= $share <= 35 else 1)"
result $? "SM limiter: a graph of small kernels charged by its kernels (replays at about 30 % once settled)"
fi

# 5. Overhead with the shim loaded and no limits in force.
if want 5; then
limits 0 100
got=$(shimmed "$PYTHON" -c "$bench")
over=$("$PYTHON" -c "print(round(100 * (1 - $got / $base), 2))")
echo "  shim, no limit: $got matmul/s, overhead $over %"
"$PYTHON" -c "import sys; sys.exit(0 if $over < 1 else 1)"
result $? "overhead at no limit below 1 %"
fi

# 6. In a pid namespace of its own, as in a container, the shim finds its "host pid": the pid
#    NVML gives the process as seen from the process's own namespace (a driver that numbers
#    pids in the caller's namespace lists the container's pid there, an older one the host's).
#    Both views are printed; the slot must hold the one NVML shows inside. The SM limit holds.
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
	inns() { shimmed unshare --pid --fork --mount-proc --kill-child "$@"; }
	if want 6; then
	limits "$limit" 100
	rm -f "$W/held" "$W/looked"
	inns bash -c '
		"$PYTHON" -c "import torch,time; x=torch.empty(64<<20,dtype=torch.uint8,device=\"cuda\"); open(\"$1/held\",\"w\"); time.sleep(30)" &
		p=$!
		for _ in $(seq 100); do [ -e "$1/held" ] && break; sleep 0.2; done
		echo "holder $p"
		env -u LD_PRELOAD nvidia-smi -i "$2" --query-compute-apps=pid --format=csv,noheader | sed "s/^/inside /"
		"$SHIM_TOOLS/regiondump" "$1/region/usage" | grep "^proc " | sed "s/^/slot /"
		for _ in $(seq 100); do [ -e "$1/looked" ] && break; sleep 0.2; done
		kill $p' _ "$W" "$gpu" >"$W/ns6" &
	for _ in $(seq 100); do [ -e "$W/held" ] && break; sleep 0.2; done
	outside=$(nvidia-smi -i "$gpu" --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | tr '\n' ' ')
	touch "$W/looked"
	wait
	seen=$(cat "$W/ns6")
	echo "$seen" | sed 's/^/  /'
	echo "  NVML's pids seen from outside the namespace: $outside"
	host_pid=$(echo "$seen" | sed -n 's/^slot .* host_pid=\([0-9-]*\) .*/\1/p' | head -n 1)
	[ -n "$host_pid" ] && [ "$host_pid" != 0 ] && echo "$seen" | sed -n 's/^inside //p' | tr -d ' ' | grep -qx "$host_pid"
	result $? "the host pid the shim records inside a pid namespace is the pid NVML lists there ($host_pid)"
	limits 0 30
	got=$(inns "$PYTHON" -c "$bench")
	share=$("$PYTHON" -c "print(round(100 * $got / $base, 1))")
	echo "  cores=30 in a pid namespace: $got matmul/s = $share %"
	"$PYTHON" -c "import sys; sys.exit(0 if abs($share - 30) <= 5 else 1)"
	result $? "SM limit 30 % within 5 points inside a pid namespace"
	fi

	# 7. nvidia-smi in the namespace (a container) lists only the container's process, under
	#    its pid there, with the memory that adds up to "used"; not the one outside.
	if want 7; then
	limits "$limit" 100
	rm -f "$W/outside" "$W/in"
	"$PYTHON" -c 'import torch,time; x=torch.empty(128<<20,dtype=torch.uint8,device="cuda"); open("'"$W"'/outside","w"); time.sleep(60)' &
	outside=$!
	for _ in $(seq 100); do [ -e "$W/outside" ] && break; sleep 0.2; done
	seen=$(inns bash -c '
		"$PYTHON" -c "import torch,time; x=torch.empty(256<<20,dtype=torch.uint8,device=\"cuda\"); open(\"$1/in\",\"w\"); time.sleep(60)" &
		p=$!
		for _ in $(seq 100); do [ -e "$1/in" ] && break; sleep 0.2; done
		echo "holder $p"
		nvidia-smi -i "$2" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | sed "s/^/app /"
		nvidia-smi -i "$2" --query-gpu=memory.used --format=csv,noheader,nounits | sed "s/^/used /"
		kill $p' _ "$W" "$gpu")
	kill $outside 2>/dev/null; wait $outside 2>/dev/null
	echo "$seen" | sed 's/^/  /'
	echo "  outside the namespace: pid $outside"
	holder=$(echo "$seen" | sed -n 's/^holder //p')
	apps=$(echo "$seen" | sed -n 's/^app //p' | tr -d ' ')
	used=$(echo "$seen" | sed -n 's/^used //p' | tr -d ' ')
	sum=$(echo "$apps" | awk -F, '{s += $2} END {print s + 0}')
	[ "$(echo "$apps" | grep -c .)" = 1 ] && [ "$(echo "$apps" | cut -d, -f1)" = "$holder" ] &&
		[ -n "$used" ] && [ $((sum - used)) -le 1 ] && [ $((used - sum)) -le 1 ]
	result $? "nvidia-smi in a pid namespace lists only its own process (pid $holder), summing to used ($sum vs $used MiB)"
	fi

	# 7b. One SM cap for a claim that two containers of a pod share: two processes, each in a
	#     pid namespace of its own, with one limits file at 30 %, run the matmul loop at once.
	#     Together they get about 30 % of the unlimited rate, not 30 % each (each counts the
	#     other with the SM use it publishes in the ledger). What NVML lists inside one of the
	#     namespaces while both run is printed: the driver is expected to show only its own.
	if want 7b; then
	limits 0 30
	for ns in a b; do
		inns bash -c '"$PYTHON" -c "$1" >"$2" & p=$!; sleep 6
			nvidia-smi -i "$3" --query-compute-apps=pid --format=csv,noheader | tr -d " " | tr "\n" " " >"$2.apps"
			wait $p' _ "$bench" "$W/ns.$ns" "$gpu" &
	done
	wait
	got_a=$(tail -n 1 "$W/ns.a"); got_b=$(tail -n 1 "$W/ns.b")
	share=$("$PYTHON" -c "print(round(100 * ($got_a + $got_b) / $base, 1))")
	echo "  one 30 % claim in two pid namespaces: $got_a + $got_b matmul/s = $share % (NVML lists in a: $(cat "$W/ns.a.apps"); in b: $(cat "$W/ns.b.apps"))"
	"$PYTHON" -c "import sys; sys.exit(0 if abs($share - 30) <= 5 else 1)"
	result $? "one SM cap for a claim shared by two pid namespaces: 30 % together within 5 points"
	fi
elif want 6 7 7b; then
	echo "  pid-namespace checks skipped: they need root and unshare(1)"
fi

# cudart. NVIDIA's own libcudart 11.8 and 12.4 (hack/cudart.sh; without network,
#    copy a filled cache over and point NRI_VGPU_CUDART_CACHE at it) through
#    the shim on the real driver: every allocation API counted and refused
#    past the quota, and every recorded cuGetProcAddress request of an
#    allocation or launch entry answered with the shim's wrapper.
if want cudart; then
if cudart=$(../hack/cudart.sh); then
	limits $((2 << 30)) 100
	sed -n 's/^HOOK(LIB_CUDA, *\([^,]*\), *\([^,]*\),.*/\1 \2/p' src/hooks.def >"$W/hooks"
	for v in 11.8.89 12.4.127; do
		out=$(shimmed "$SHIM_TOOLS/rtprog" "$cudart/$v/libcudart.so.$v" info:-:2GiB malloc:3GiB:2 malloc:64MiB \
			managed:64MiB async:64MiB defpool:64MiB pool:64MiB info:-:2GiB malloc:2GiB:2 free free free free free 2>&1)
		rc=$?
		echo "$out" | grep -E '^(info|FAIL)|-> [1-9]' | sed "s/^/  cudart $v: /"
		result $rc "cudart $v: allocations counted, refused past the quota, cudaMemGetInfo shows the slice"
		CUDA_VISIBLE_DEVICES=$gpu "$SHIM_TOOLS/procreplay" <"test/cudart/requests-$v.txt" >"$W/direct"
		shimmed "$SHIM_TOOLS/procreplay" <"test/cudart/requests-$v.txt" >"$W/shim"
		bad=$(awk -v info="$W/info" -f test/cudart/requests.awk "$W/hooks" "$W/direct" "$W/shim")
		echo "  cudart $v: $(grep -c 'libvgpu-shim.so' "$W/shim") requests answered by the shim, $(grep -c -- '-> - -' "$W/direct") unknown to the driver"
		[ -n "$bad" ] && echo "$bad" | sed "s/^/  cudart $v: /"
		[ -s "$W/info" ] && sed "s/^/  cudart $v: info: /" "$W/info" && rm -f "$W/info"
		[ -z "$bad" ]
		result $? "cudart $v: its driver requests for allocation and launch entries reach the shim"
	done
else
	echo "  cudart checks skipped: hack/cudart.sh could not provide the libraries (its error is above)"
fi
fi

# 8. Context footprint: what the driver holds for a process beyond its allocations (the
#    context, kernels cuBLAS and cuDNN load lazily at first use, the stack reservation
#    cuCtxSetLimit makes) is counted: a second after the last growth and an allocation, the
#    process's slot in the region holds what nvidia-smi says the process uses.
if want 8; then
limits "$limit" 100
rm -f "$W/fp"
shimmed "$PYTHON" - "$W/fp" <<'PY' &
import ctypes, os, sys, time, torch
x = torch.randn(1024, 1024, device="cuda")
(x @ x).sum().item()
torch.nn.functional.conv2d(x[None, None], x[None, None, :3, :3]).sum().item()
rc = ctypes.CDLL("libcuda.so.1").cuCtxSetLimit(0, ctypes.c_size_t(8192))  # 8 KiB stack per thread
time.sleep(1.2)
y = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")  # measured again on the way
torch.cuda.synchronize()
open(sys.argv[1], "w").write(f"{os.getpid()} {rc}\n")
time.sleep(30)
PY
holder=$!
for _ in $(seq 150); do [ -s "$W/fp" ] && break; sleep 0.2; done
read -r fp_pid fp_rc <"$W/fp" || fp_pid=
smi_mib=$(nvidia-smi -i "$gpu" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
	awk -F', *' -v p="$fp_pid" '$1 == p {print $2}')
slot=$("$SHIM_TOOLS/regiondump" "$W/region/usage" | sed -n "s/^proc pid=$fp_pid .* used0=\([0-9]*\).*/\1/p")
kill $holder 2>/dev/null; wait $holder 2>/dev/null
echo "  footprint: pid ${fp_pid:-?} cuCtxSetLimit rc=${fp_rc:-?}; nvidia-smi ${smi_mib:-?} MiB, region slot $((${slot:-0} >> 20)) MiB"
[ -n "$smi_mib" ] && [ -n "$slot" ] && [ "${fp_rc:-1}" = 0 ] &&
	"$PYTHON" -c "import sys; sys.exit(0 if abs($slot / 1048576 - $smi_mib) <= 4 else 1)"
result $? "context footprint (lazy kernels, stack limit) counted: region slot matches nvidia-smi within 4 MiB"
fi

# 9. Entry points reached around the _v2s: after a release of the primary context through the
#    pre-11.0 cuDevicePrimaryCtxRelease (as cudart 11.8 / 12.4 do) what was allocated in it is
#    free again, and the pre-3.2 cuMemGetInfo / cuDeviceTotalMem report the slice (32 bits,
#    saturated at 4 GiB - 1). Driver calls through ctypes: no PyTorch needed.
if want 9; then
limits "$limit" 100
shimmed "$PYTHON" - "$limit" <<'PY'
import ctypes, sys
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
limit = int(sys.argv[1]); cap = (1 << 32) - 1
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx = c_int(), c_void_p()
assert cu.cuDeviceGet(byref(dev), 0) == 0
def retain():
    assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
def info():
    f, t = c_size_t(), c_size_t()
    assert cu.cuMemGetInfo_v2(byref(f), byref(t)) == 0
    return f.value, t.value
retain()
free0, total = info()
p = c_uint64()
rc = cu.cuMemAlloc_v2(byref(p), c_size_t(limit // 2))
free1, _ = info()
f32, t32, b32 = c_uint(), c_uint(), c_uint()
rc32 = cu.cuMemGetInfo(byref(f32), byref(t32))
rcb = cu.cuDeviceTotalMem(byref(b32), dev)
print(f"  cuMemAlloc_v2 rc={rc}; free {free0} -> {free1} of {total}; pre-3.2 cuMemGetInfo rc={rc32} "
      f"free={f32.value} total={t32.value}, cuDeviceTotalMem rc={rcb} {b32.value}")
ok = rc == 0 and free0 - free1 >= limit // 2 and total == limit
ok = ok and rc32 == 0 and t32.value == min(total, cap) and abs(f32.value - min(free1, cap)) <= 4 << 20
ok = ok and rcb == 0 and b32.value == min(limit, cap)
rel = cu.cuDevicePrimaryCtxRelease(dev)  # the bare (pre-11.0) name
retain()
free2, _ = info()
print(f"  after the pre-11.0 cuDevicePrimaryCtxRelease (rc={rel}) and a new context: free {free2}")
ok = ok and rel == 0 and free2 >= free0 - (4 << 20)
sys.exit(0 if ok else 1)
PY
result $? "pre-11.0 primary-context release gives memory back; pre-3.2 cuMemGetInfo / cuDeviceTotalMem report the slice"
fi

# 10. IPC lifetime: memory still resident after the exporter's free, while a sibling holds an
#     import, must stay charged (the 580 driver keeps an IPC block: the importer is charged for
#     its import). Two shimmed processes of one container (validate/ipcshare.py), once per way
#     of sharing: cuIpcOpenMemHandle of a cuMemAlloc block, and cuMemPoolImportPointer of a
#     block of a pool shared as a file descriptor (the exporter frees it and trims the pool).
#     The exporter allocates a quarter of the limit and exports it, the importer imports it,
#     the exporter frees it, the importer closes (frees) it. The device's real "used"
#     (nvidia-smi, no shim) and the shim's (cuMemGetInfo in the importer) are read while
#     shared, after the exporter's free and after the close; NVML's per-process figures while
#     shared say whose figure the import is in (the context footprint assumes the exporter's).
#     Passes when, if the driver keeps the block after the exporter's free, the shim still
#     charges it then and gives it back at the close.
gpu_used() { nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '; }
await() { for _ in $(seq 600); do [ -e "$W/share/$1" ] && return 0; sleep 0.1; done; return 1; }
share_check() { # share_check MODE (ipc or pool)
	limits "$limit" 100
	rm -rf "$W/share" && mkdir -p "$W/share"
	local block=$((limit / 4)) u_shared u_after u_closed s_shared s_after s_closed
	shimmed "$PYTHON" validate/ipcshare.py "$1" export "$W/share" "$block" &
	shimmed "$PYTHON" validate/ipcshare.py "$1" import "$W/share" "$block" &
	await opened
	u_shared=$(gpu_used)
	echo "  NVML per process while shared (pid, MiB): $(nvidia-smi -i "$gpu" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr '\n' ' ')"
	touch "$W/share/go_free"
	await measured
	u_after=$(gpu_used)
	touch "$W/share/go_close"
	await closed
	u_closed=$(gpu_used)
	touch "$W/share/done"
	wait
	s_shared=$(cat "$W/share/opened" 2>/dev/null)
	s_after=$(cat "$W/share/measured" 2>/dev/null)
	s_closed=$(cat "$W/share/closed" 2>/dev/null)
	echo "  device used (MiB, no shim): shared $u_shared, after the exporter's free $u_after, after the close $u_closed"
	echo "  shim's used (bytes): shared ${s_shared:-?}, after the exporter's free ${s_after:-?}, after the close ${s_closed:-?} (block $block)"
	awk -v a="$u_shared" -v b="$u_after" -v sb="${s_after:--1}" -v sc="${s_closed:--1}" -v blk="$block" 'BEGIN {
		if (sb < 0 || sc < 0) exit 1
		keeps = (a - b) * 1048576 <= blk / 2; charged = (sb - sc) > blk / 2
		print "  the driver " (keeps ? "keeps the block while an import holds it (refcounts)" : "frees the block at the exporter'"'"'s free") \
			"; the shim " (charged ? "charges it until the close" : "does not charge it after the exporter'"'"'s free")
		exit !(!keeps || charged) }'
}
if want 10; then
echo "  cuIpcOpenMemHandle:"
share_check ipc
result $? "IPC: memory resident after the exporter's free is what the shim charges"
echo "  cuMemPoolImportPointer:"
share_check pool
result $? "pool import: memory resident after the exporter's free and trim is what the shim charges"
fi

# 11. Leases: an allocation inside a process's lease takes no lock. Cost of cuMemAlloc_v2 +
# cuMemFree_v2 (4 KiB, a memory limit in force) with and without the shim, and 8 processes
# filling the quota at once with 64 MiB tensors never get more than the limit between them.
if want 11; then
limits "$limit" 100
cat >"$W/pairs.py" <<'PY'
import ctypes, sys, time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), c_int(0)) == 0 and cu.cuCtxSetCurrent(ctx) == 0
p, n, best = c_uint64(), 100000, 1e18
for r in range(5):
    t0 = time.perf_counter()
    for i in range(n):
        cu.cuMemAlloc_v2(byref(p), c_size_t(4096))
        cu.cuMemFree_v2(p)
    best = min(best, (time.perf_counter() - t0) / n * 1e9)
print(f"{best:.0f}")
PY
direct_ns=$(CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" "$W/pairs.py")
shim_ns=$(shimmed "$PYTHON" "$W/pairs.py")
echo "  cuMemAlloc_v2+cuMemFree_v2 of 4 KiB (ctypes loop): direct ${direct_ns} ns, shim ${shim_ns} ns"
awk -v d="$direct_ns" -v s="$shim_ns" 'BEGIN { exit !(d > 0 && s > 0 && s <= 1.2 * d) }'
result $? "alloc+free with a quota costs at most 1.2x the driver's own (leases: no lock in the common case)"
for i in $(seq 8); do
	shimmed "$PYTHON" -c '
import torch
n = 0
try:
    xs = []
    while True:
        xs.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda")); n += 1
except (torch.cuda.OutOfMemoryError, RuntimeError):  # RuntimeError: no room for its context
    pass
print(n)
open("'"$W"'/filled.'"$i"'", "w").close()
import time; time.sleep(5)' >"$W/fill.$i" 2>/dev/null &
done
for _ in $(seq 300); do [ "$(ls "$W"/filled.* 2>/dev/null | wc -l)" -ge 8 ] && break; sleep 0.1; done
used_mib=$(shimmed nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' ')
wait
got=$(cat "$W"/fill.* | awk '{s += $1} END {print s * 64}')
echo "  8 processes got ${got} MiB of tensors between them; nvidia-smi in the container: ${used_mib} MiB used; limit $((limit >> 20)) MiB"
[ "$got" -gt 0 ] && [ $((got * 1048576)) -le "$limit" ] && [ "$((used_mib * 1048576))" -le "$limit" ]
result $? "8 processes filling the quota at once never pass the limit between them"
fi

# 12. Process start: N processes (32: each real context holds hundreds of MiB) started at once,
# each timing cuInit -> primary context -> first 1 MiB cuMemAlloc_v2; the mean with the shim
# against the mean without (the grant's measurement of the others' leases grows with N).
if want 12; then
limits "$limit" 100
cat >"$W/start.py" <<'PY'
import ctypes, os, sys, time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.001)
t0 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1")
ctx, p = c_void_p(), c_uint64()
ok = cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(byref(ctx), c_int(0)) == 0 and \
    cu.cuCtxSetCurrent(ctx) == 0 and cu.cuMemAlloc_v2(byref(p), c_size_t(1 << 20)) == 0
print(f"{(time.perf_counter() - t0) * 1e9:.0f}" if ok else "fail")
PY
start_mean() { # start_mean direct|shim: mean ns over 32 processes, or "fail"
	rm -f "$W/go" "$W"/start.*.out
	for i in $(seq 32); do
		if [ "$1" = shim ]; then shimmed "$PYTHON" "$W/start.py" "$W/go" >"$W/start.$i.out" 2>/dev/null &
		else CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" "$W/start.py" "$W/go" >"$W/start.$i.out" 2>/dev/null & fi
	done
	sleep 3; touch "$W/go"; wait
	cat "$W"/start.*.out | awk '/^[0-9]+$/ {s += $1; n++} END {if (n == 32) printf "%.0f\n", s / n; else print "fail"}'
}
start_direct=$(start_mean direct)
start_shim=$(start_mean shim)
echo "  32 processes at once, cuInit -> first allocation (mean): direct ${start_direct} ns, shim ${start_shim} ns"
awk -v d="$start_direct" -v s="$start_shim" 'BEGIN { exit !(d > 0 && s > 0 && s <= 1.2 * d) }'
result $? "process start with 32 processes at once costs at most 1.2x the driver's own"
fi

# 12b. Green contexts: a process that uses only green contexts (validate/greenctx.py). Creating
#     one retains the primary context inside the driver; the shim retains it first itself, so
#     the context's memory is counted at once, and what is allocated in the green context goes
#     with the primary context when the green one is destroyed. Printed without the shim too
#     (the driver's own used memory, the whole card's). Passes when the shim counts hundreds of
#     MiB at once (a context on this card) and gives the allocation back.
if want 12b; then
green_size=$((limit / 8))
echo "  without the shim (card's used, bytes): $(CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" validate/greenctx.py "$green_size")"
limits "$limit" 100
green_out=$(shimmed "$PYTHON" validate/greenctx.py "$green_size")
echo "  with the shim (container's used, bytes): $green_out (allocated $green_size)"
echo "$green_out" | awk -v sz="$green_size" '$1 == "green" {
	ok = $2 >= 64 * 1048576 && $3 - $2 >= sz && $4 <= $2 + sz / 2; found = 1 } END { exit !(found && ok) }'
result $? "green contexts: the primary context counted at once, the allocation given back with it"
fi

# 13. The ABI facts the shim's notes mark as inferred, read from the driver itself (no shim:
#     they describe the driver), and the NVML names nvidia-smi resolves with dlsym (those the
#     shim must hook for nvidia-smi's numbers). Passes when the probe ran to its end.
if want 13; then
CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" validate/abiprobe.py | sed 's/^/  /'
result $? "ABI probe of the driver ran"
for q in "" "--query-gpu=memory.total,memory.used --format=csv" "--query-compute-apps=pid,used_memory --format=csv" "-q -d MEMORY,PIDS"; do
	# shellcheck disable=SC2086 # $q is several words
	CUDA_VISIBLE_DEVICES=$gpu LD_PRELOAD=$SHIM_TOOLS/dlsymlog.so nvidia-smi -i "$gpu" $q >/dev/null 2>>"$W/smi.dlsym"
done
echo "  nvidia-smi resolves with dlsym: $(grep -o '^dlsym nvml.*' "$W/smi.dlsym" | cut -d' ' -f2 | sort -u | tr '\n' ' ')"
echo "  nvidia-smi inside the limits (shim, a quarter of the card):"
limits "$limit" 100
shimmed nvidia-smi -i "$gpu" | sed 's/^/    /'
fi

echo "validate: $fails check(s) failed"
[ "$fails" -eq 0 ]
