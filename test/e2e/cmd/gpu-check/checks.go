package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// runChecks runs every check, each within its own limit (a stuck step fails
// by it, never holds up the run); what is left when the run's time is up
// fails as not run.
func runChecks(ctx context.Context, n *node, r *report) {
	checks := []struct {
		name  string
		limit time.Duration
		fn    func(context.Context, *node, *report)
	}{
		{"inventory", 30 * time.Second, checkInventory},
		{"gpu-container", 2 * time.Minute, checkGPUContainer},
		{"sm-share", 150 * time.Second, checkSMShare},
		{"no-gpu", time.Minute, checkNoGPU},
		{"gate", 90 * time.Second, checkGate},
		{"validate", 180 * time.Second, checkValidate},
	}
	for _, c := range checks {
		if ctx.Err() == context.DeadlineExceeded {
			r.fail(c.name, "not run: the run's --timeout is up")
			continue
		} else if ctx.Err() != nil {
			r.fail(c.name, "not run: interrupted")
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, c.limit)
		c.fn(cctx, n, r)
		cancel()
	}
}

// ---- a. inventory -----------------------------------------------------

// inventoryGPU is one GPU of `nri-vgpu-device-plugin inventory`'s JSON
// array.
type inventoryGPU struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid"`
	Name     string `json:"name"`
	Memory   uint64 `json:"memory_bytes"`
	Minor    int    `json:"minor"`
	PCIBusID string `json:"pci_bus_id"`
	Healthy  bool   `json:"healthy"`
}

// checkInventory compares the device plugin's NVML inventory with the
// node's own view (nvidia-smi, or the GPU declared to the fake driver), and
// prints the health event types the driver accepted (the device plugin
// logs them when it registers for events).
func checkInventory(ctx context.Context, n *node, r *report) {
	cmd := exec.CommandContext(ctx, n.bin("nri-vgpu-device-plugin"), "inventory", "--config", n.configPath)
	cmd.Env = append(os.Environ(), n.daemonEnv...)
	out, err := cmd.Output()
	if err != nil {
		r.fail("inventory", fmt.Sprintf("nri-vgpu-device-plugin inventory: %v: %s", err, stderrOf(err)))
	} else {
		r.check(compareInventory(out, n.gpus))
	}
	// The health watch registers once the device plugin serves; give it
	// a moment.
	line := healthLine(n.devicePluginLog())
	for i := 0; line == "" && i < 20 && ctx.Err() == nil; i++ {
		time.Sleep(500 * time.Millisecond)
		line = healthLine(n.devicePluginLog())
	}
	if line != "" {
		r.pass("health", line)
	} else {
		r.fail("health", "the device plugin logged no \"health watch registered\" line (device-plugin.log)")
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return harness.TailLines(strings.TrimSpace(string(ee.Stderr)), 3)
	}
	return ""
}

// compareInventory returns the check's name, what was seen, and a
// mismatch, if any.
func compareInventory(raw []byte, want []hostGPU) (string, string, error) {
	var inv struct{ GPUs []inventoryGPU }
	if err := json.Unmarshal(raw, &inv.GPUs); err != nil {
		return "inventory", "", fmt.Errorf("inventory JSON %q: %w", harness.TailLines(string(raw), 3), err)
	}
	if len(inv.GPUs) != len(want) {
		return "inventory", "", fmt.Errorf("the device plugin sees %d GPUs, the node %d", len(inv.GPUs), len(want))
	}
	var seen []string
	for i, g := range inv.GPUs {
		w := want[i]
		got := hostGPU{UUID: g.UUID, Name: g.Name, MemoryMiB: g.Memory >> 20, Minor: g.Minor, PCIBusID: g.PCIBusID}
		w.SMs = 0
		if !samePCIBusID(got.PCIBusID, w.PCIBusID) || got.UUID != w.UUID || got.Name != w.Name || got.MemoryMiB != w.MemoryMiB || got.Minor != w.Minor {
			return "inventory", "", fmt.Errorf("GPU %d: device plugin %+v, node %+v", i, got, w)
		}
		if !g.Healthy {
			return "inventory", "", fmt.Errorf("GPU %d (%s) is unhealthy in the device plugin's inventory", i, g.UUID)
		}
		seen = append(seen, fmt.Sprintf("GPU %d %s %q %d MiB minor %d %s", i, g.UUID, g.Name, g.Memory>>20, g.Minor, g.PCIBusID))
	}
	return "inventory", strings.Join(seen, "; ") + " (equal to the node's)", nil
}

// samePCIBusID compares PCI bus ids of NVML's form (8-digit domain,
// "00000000:10:00.0", as nvidia-smi prints it) and Linux's (4-digit,
// "0000:10:00.0"), in either case.
func samePCIBusID(a, b string) bool {
	norm := func(id string) (string, bool) {
		dom, rest, ok := strings.Cut(strings.ToLower(strings.TrimSpace(id)), ":")
		d, err := strconv.ParseUint(dom, 16, 32)
		if !ok || err != nil || strings.Count(rest, ":") != 1 {
			return "", false
		}
		return fmt.Sprintf("%08x:%s", d, rest), true
	}
	na, okA := norm(a)
	nb, okB := norm(b)
	return okA && okB && na == nb
}

// healthLine is what the device plugin logged when it registered for a
// GPU's health events: the event types the driver accepted and those it
// does not support (its "health watch registered" line).
func healthLine(log string) string {
	data, err := os.ReadFile(log)
	if err != nil {
		return ""
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if _, rest, ok := strings.Cut(l, `msg="health watch registered" `); ok {
			out = append(out, rest)
		}
	}
	return strings.Join(out, "; ")
}

// ---- b. gpu-container -------------------------------------------------

// chunk is the step of the fill workloads (torchmem.py, cudaprog fill).
const chunk = 256 << 20

// footprintBound is what a context may cost beyond its allocations
// (VGPU_FP_BOUND in shim/src/footprint.h): a fill stops at most that much, and
// a chunk, below the quota.
const footprintBound = 1 << 30

// checkGPUContainer runs a one-slice pod and looks from inside: CUDA's and
// NVML's totals are the slice, allocation stops at the quota, NVML lists
// only the container's processes.
func checkGPUContainer(ctx context.Context, n *node, r *report) {
	rp, err := n.runPod(ctx, n.pod("gpu", 1))
	defer n.killPod(rp)
	if err != nil {
		r.fail("gpu-container", err.Error())
		return
	}
	a, err := n.allocation(rp)
	if err != nil {
		r.fail("gpu-container", err.Error())
		return
	}
	slice := a.GPUs[0].Memory
	i := slices.IndexFunc(n.gpus, func(g hostGPU) bool { return g.UUID == a.GPUs[0].UUID })
	if i < 0 {
		r.fail("gpu-container", fmt.Sprintf("the pod got GPU %s, not one of the node's", a.GPUs[0].UUID))
		return
	}
	gpu := n.gpus[i]
	// The device plugin's slice, from the node's memory and split count:
	// a tenth, give or take a MiB of rounding.
	if whole := gpu.MemoryMiB << 20; slice > whole/splitCount+(1<<20) || slice+(1<<20) < whole/splitCount {
		r.fail("gpu-container", fmt.Sprintf("a one-slice allocation of %d bytes, not a tenth of %d", slice, whole))
		return
	}
	if n.python != nil && len(n.python.DriverLibs) > 0 {
		r.fail("gpu-container", fmt.Sprintf("the Python mounts hold driver libraries %v: the container would not get the driver from nri-vgpu alone", n.python.DriverLibs))
		return
	}
	v, err := n.memoryView(ctx, rp)
	if err != nil {
		r.fail("gpu-container", err.Error())
		return
	}
	sliceMiB := slice >> 20
	if v.cudaTotal != slice || v.nvmlTotalMiB != sliceMiB {
		r.fail("gpu-container", fmt.Sprintf("%s: total %d bytes, %s: %d MiB; the slice is %d bytes (%d MiB)", v.cudaWho, v.cudaTotal, v.nvmlWho, v.nvmlTotalMiB, slice, sliceMiB))
	} else {
		r.pass("gpu-container", fmt.Sprintf("image without NVIDIA files; %s total = %d MiB, %s memory.total = %d MiB = the slice (GPU %d MiB / %d)",
			v.cudaWho, v.cudaTotal>>20, v.nvmlWho, v.nvmlTotalMiB, gpu.MemoryMiB, splitCount))
	}
	if v.filled > slice || v.filled+chunk+footprintBound < slice || v.oomError == "" {
		r.fail("gpu-oom", fmt.Sprintf("%s: %d MiB allocated before %q, slice %d MiB", v.cudaWho, v.filled>>20, v.oomError, sliceMiB))
	} else {
		r.pass("gpu-oom", fmt.Sprintf("%s: %s after %d MiB in %d MiB steps (slice %d MiB)", v.cudaWho, v.oomError, v.filled>>20, chunk>>20, sliceMiB))
	}
	r.check(n.processList(ctx, rp))
}

// memoryView is what a container's programs see of the GPU's memory.
type memoryView struct {
	cudaWho, nvmlWho string
	cudaTotal        uint64 // bytes
	nvmlTotalMiB     uint64
	filled           uint64 // bytes allocated before the refusal
	oomError         string // the refusal; "" when none came
}

func (n *node) memoryView(ctx context.Context, rp *kubeletsim.RunningPod) (*memoryView, error) {
	if n.sim {
		// The shim's test program against the fake driver: cuMemGetInfo,
		// NVML's memory info, then 256 MiB cuMemAllocs until one fails
		// (cudaprog checks that it fails with CUDA_ERROR_OUT_OF_MEMORY).
		out, err := n.exec(ctx, rp, 60*time.Second, fmt.Sprintf("%s/cudaprog init info nvml:0 && %s/cudaprog init fill:%d", testInCtr, testInCtr, chunk))
		if err != nil {
			return nil, err
		}
		v := &memoryView{cudaWho: "cuMemGetInfo", nvmlWho: "NVML", oomError: "CUDA_ERROR_OUT_OF_MEMORY"}
		var nvmlTotal, filled uint64
		if err := scanInts(out, map[string]*uint64{`info free=\d+ total=(\d+)`: &v.cudaTotal, `nvml total=(\d+)`: &nvmlTotal, `filled (\d+)`: &filled}); err != nil {
			return nil, err
		}
		v.nvmlTotalMiB, v.filled = nvmlTotal>>20, filled*chunk
		return v, nil
	}
	// Real GPU: PyTorch's mem_get_info and fill, nvidia-smi's memory.total.
	// Real-GPU assumption: the generated edits mount nvidia-smi at its host
	// path (driver root "/"), whose directory smiPath puts first on PATH.
	out, err := n.exec(ctx, rp, 90*time.Second, fmt.Sprintf("%s nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits && %s %s/torchmem.py fill",
		smiPath(), n.o.python, scriptsInCtr))
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("nvidia-smi and torchmem.py printed %q", out)
	}
	v := &memoryView{cudaWho: "torch.cuda.mem_get_info", nvmlWho: "nvidia-smi"}
	if v.nvmlTotalMiB, err = strconv.ParseUint(strings.TrimSpace(lines[0]), 10, 64); err != nil {
		return nil, fmt.Errorf("nvidia-smi memory.total %q: %w", lines[0], err)
	}
	var t struct {
		Total, Allocated uint64
		Error            string
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &t); err != nil {
		return nil, fmt.Errorf("torchmem.py fill printed %q: %w", lines[len(lines)-1], err)
	}
	v.cudaTotal, v.filled = t.Total, t.Allocated
	if t.Error == "OutOfMemoryError" {
		v.oomError = t.Error
	} else if t.Error != "" {
		return nil, fmt.Errorf("torchmem.py fill ended with %s, not OutOfMemoryError", t.Error)
	}
	return v, nil
}

// smiPath puts where the edits may have mounted nvidia-smi on PATH in a
// container: the host's nvidia-smi directory (the edits mount it at its
// host path, the driver root being "/"), then the usual driver
// directories.
func smiPath() string {
	dirs := []string{"/usr/local/nvidia/bin", "/usr/bin", "/usr/sbin"}
	if p, err := exec.LookPath("nvidia-smi"); err == nil {
		dirs = append([]string{filepath.Dir(p)}, dirs...)
	}
	return "PATH=" + strings.Join(dirs, ":") + ":$PATH"
}

// scanInts fills each target with the first group of its pattern in out.
func scanInts(out string, targets map[string]*uint64) error {
	for pat, dst := range targets {
		m := regexp.MustCompile(pat).FindStringSubmatch(out)
		if m == nil {
			return fmt.Errorf("no %q in %q", pat, harness.TailLines(out, 4))
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return err
		}
		*dst = v
	}
	return nil
}

// processList starts a GPU process on the host (no shim) and one in the
// container, and reads NVML's compute-process list in the container: it
// must list the container's process, under its pid there, and nothing
// else. The host process is first seen in the host's own list, so that an
// empty or filtered list cannot pass by chance.
func (n *node) processList(ctx context.Context, rp *kubeletsim.RunningPod) (string, string, error) {
	const name = "gpu-processes"
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp(n.base, "procs")
	if err != nil {
		return name, "", err
	}
	var host *exec.Cmd
	var hostList func() (string, error)
	var ctrScript string
	var parse func(string) ([]int, error)
	if n.sim {
		np := filepath.Join(n.o.bundle, "test", "nvmlprocs")
		host = exec.CommandContext(ctx, np, "worker", "0", strconv.Itoa(chunk), filepath.Join(dir, "pid"), filepath.Join(dir, "end"))
		hostList = func() (string, error) { return n.hostOutput(ctx, np, "smi", "0") }
		ctrScript = fmt.Sprintf(`d=/tmp/np; mkdir -p $d; %[1]s/nvmlprocs worker 0 %[2]d $d/pid $d/end >$d/out 2>&1 &
for i in $(seq 200); do [ -s $d/pid ] && break; sleep 0.1; done
%[1]s/nvmlprocs smi 0; echo "own $(cat $d/pid)"; touch $d/end; wait`, testInCtr, chunk)
		parse = parseNVMLProcs
	} else {
		// Real GPU: PyTorch holds 1 GiB on the host and in the container;
		// nvidia-smi lists compute processes. Real-GPU assumption: the
		// shim's list (its pids in the container) is what nvidia-smi shows.
		host = exec.CommandContext(ctx, n.o.python, filepath.Join(n.o.bundle, "scripts", "torchmem.py"), "hold", strconv.Itoa(1<<30), "60")
		hostList = func() (string, error) {
			return n.hostOutput(ctx, "nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
		}
		ctrScript = fmt.Sprintf(`%[1]s %[2]s/torchmem.py hold %[3]d 60 >/tmp/hold 2>&1 &
for i in $(seq 300); do grep -q held /tmp/hold && break; sleep 0.1; done
%[4]s nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | sed 's/^/app /'
echo "own $(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' /tmp/hold)"; kill $!`, n.o.python, scriptsInCtr, 1<<30, smiPath())
		parse = parseSMIApps
	}
	host.Env = append(os.Environ(), n.hostEnv...)
	hostOut, err := os.Create(filepath.Join(n.o.logs, "host-gpu-process.log"))
	if err != nil {
		return name, "", err
	}
	defer hostOut.Close()
	host.Stdout, host.Stderr = hostOut, hostOut
	if err := host.Start(); err != nil {
		return name, "", fmt.Errorf("the host's GPU process: %w", err)
	}
	defer func() {
		_ = os.WriteFile(filepath.Join(dir, "end"), nil, 0o644)
		_ = host.Process.Kill()
		_ = host.Wait()
	}()
	// The host's process is on the GPU once the host's list shows it.
	hostPid := host.Process.Pid
	var hostSeen []int
	for {
		out, err := hostList()
		if pids, perr := parse(out); err == nil && perr == nil && slices.Contains(pids, hostPid) {
			hostSeen = pids
			break
		}
		select {
		case <-ctx.Done():
			return name, "", fmt.Errorf("the host's GPU process %d never showed in the host's list (%q)", hostPid, out)
		case <-time.After(500 * time.Millisecond):
		}
	}
	out, err := n.exec(ctx, rp, 90*time.Second, ctrScript)
	if err != nil {
		return name, "", err
	}
	listed, err := parse(out)
	if err != nil {
		return name, "", err
	}
	own := 0
	if m := regexp.MustCompile(`(?m)^own (\d+)$`).FindStringSubmatch(out); m != nil {
		own, _ = strconv.Atoi(m[1])
	}
	if own == 0 || !slices.Equal(listed, []int{own}) {
		return name, "", fmt.Errorf("the container's list is %v, want only its own process %d (the host's list: %v)", listed, own, hostSeen)
	}
	return name, fmt.Sprintf("the container's compute-process list is [%d], its own process; the host's lists %v, with the host's process %d", own, hostSeen, hostPid), nil
}

// hostOutput runs a program on the host with the node's driver environment
// and no shim.
func (n *node) hostOutput(ctx context.Context, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = append(os.Environ(), n.hostEnv...)
	out, err := cmd.Output()
	return string(out), err
}

// parseNVMLProcs reads nvmlprocs smi's "list ComputeRunningProcesses_v3
// PID:BYTES,... sum=N" line ("-" when empty).
func parseNVMLProcs(out string) ([]int, error) {
	m := regexp.MustCompile(`(?m)^list ComputeRunningProcesses_v3 (\S+) sum=`).FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("no compute-process list in %q", harness.TailLines(out, 4))
	}
	var pids []int
	if m[1] == "-" {
		return pids, nil
	}
	for _, e := range strings.Split(m[1], ",") {
		p, _, _ := strings.Cut(e, ":")
		pid, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("list entry %q: %w", e, err)
		}
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids, nil
}

// parseSMIApps reads nvidia-smi's --query-compute-apps=pid,used_memory
// lines (the container's are prefixed "app ").
func parseSMIApps(out string) ([]int, error) {
	pids := []int{}
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimPrefix(strings.TrimSpace(l), "app ")
		f := splitCSV(l)
		if len(f) != 2 {
			continue
		}
		if pid, err := strconv.Atoi(f[0]); err == nil {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// ---- c. sm-share ------------------------------------------------------

// shareTolerance is how far, in points of the whole GPU, a container's
// share may be from its quota.
const shareTolerance = 5.0

// checkSMShare measures a workload's rate with the whole GPU (10 slices:
// no SM limit), then in a 3-slice and a 7-slice pod at once; each must
// reach its quota's share of the unlimited rate within shareTolerance. On
// a real GPU the unlimited rate is also compared with the same workload on
// the host without the shim.
func checkSMShare(ctx context.Context, n *node, r *report) {
	unl, err := n.ratePod(ctx, "sm-unlimited", splitCount)
	if err == nil {
		err = unl.measure(ctx, n)
		n.killPod(unl.rp)
	}
	if err != nil {
		r.fail("sm-share", fmt.Sprintf("the unlimited run: %v", err))
		return
	}
	if n.sim {
		r.skip("sm-overhead", "the fake driver does no work to slow down: overhead needs a real GPU")
	} else {
		r.check(n.overhead(ctx, unl.rate))
	}
	// The pods start one after the other (a kubelet admits one pod at a
	// time), then their workloads run at once.
	var pods []*ratePod
	for _, p := range []struct {
		name   string
		slices int
	}{{"sm-30", 3}, {"sm-70", 7}} {
		rp, err := n.ratePod(ctx, p.name, p.slices)
		if err != nil {
			r.fail("sm-share-"+strconv.Itoa(p.slices*100/splitCount), err.Error())
			continue
		}
		defer n.killPod(rp.rp)
		pods = append(pods, rp)
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() { p.err = p.measure(ctx, n) })
	}
	wg.Wait()
	for _, p := range pods {
		name := "sm-share-" + strconv.Itoa(p.cores)
		if p.err != nil {
			r.fail(name, p.err.Error())
			continue
		}
		got := p.rate / unl.rate * 100
		what := fmt.Sprintf("%s at %d %% SM: %.1f %% of the unlimited rate (%s %.1f vs %.1f), want %d +- %.0f", p.rp.Pod.Name, p.cores, got,
			rateUnit(n.sim), p.rate, unl.rate, p.cores, shareTolerance)
		if math.Abs(got-float64(p.cores)) > shareTolerance {
			r.fail(name, what)
		} else {
			r.pass(name, what)
		}
	}
}

func rateUnit(sim bool) string {
	if sim {
		return "fake GPU busy %"
	}
	return "matmul iterations/s"
}

// Measurement windows of the rate workloads: seconds measured after a
// warm-up. Two containers flat out on one fake GPU share its one launch
// queue: the first seconds, while the limiters settle, skewed 6 s windows
// after 2 s of warm-up by up to 6 points (36/64 seen on this 2-core build
// machine under load); 10 s after 3 s gave 30.7/69.3, 31.0/69.0, 32.0/68.1.
// PyTorch's matmul loop gets longer windows for a steadier rate.
const (
	simRateSecs, simRateWarm   = 10, 3
	nvmlRateSecs, nvmlRateWarm = 20, 5
)

// ratePod is a pod that runs the rate workload.
type ratePod struct {
	rp    *kubeletsim.RunningPod
	cores int // the SM share its allocation carries
	rate  float64
	err   error
}

// ratePod starts a pod asking for slices.
func (n *node) ratePod(ctx context.Context, name string, slices int) (*ratePod, error) {
	rp, err := n.runPod(ctx, n.pod(name, slices))
	if err != nil {
		n.killPod(rp)
		return nil, err
	}
	a, err := n.allocation(rp)
	if err != nil {
		n.killPod(rp)
		return nil, err
	}
	return &ratePod{rp: rp, cores: a.GPUs[0].Cores}, nil
}

// measure runs the rate workload in the pod.
func (p *ratePod) measure(ctx context.Context, n *node) error {
	var script string
	if n.sim {
		// cudaprog launchfor: one-wave kernels flat out; prints the share of
		// the fake GPU's time its kernels ran (shim/test/t_limiter.sh).
		script = fmt.Sprintf("%s/cudaprog init launchfor:%d:%d:%d", testInCtr, simRateSecs+simRateWarm, simRateWarm, simGPU.SMs)
	} else {
		script = fmt.Sprintf("%s %s/matmul.py %d %d", n.o.python, scriptsInCtr, nvmlRateSecs, nvmlRateWarm)
	}
	out, err := n.exec(ctx, p.rp, 2*time.Minute, script)
	if err != nil {
		return err
	}
	p.rate, err = parseRate(out)
	return err
}

// parseRate reads "share X" (cudaprog launchfor) or matmul.py's JSON.
func parseRate(out string) (float64, error) {
	if m := regexp.MustCompile(`(?m)^share ([0-9.]+)$`).FindStringSubmatch(out); m != nil {
		return strconv.ParseFloat(m[1], 64)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var j struct {
		IPS float64 `json:"iters_per_s"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &j); err != nil || j.IPS <= 0 {
		return 0, fmt.Errorf("no rate in %q", harness.TailLines(out, 3))
	}
	return j.IPS, nil
}

// overheadLimit is the most the shim may cost with no SM limit, in percent
// of the rate without it.
const overheadLimit = 1.0

// overhead runs the workload on the host, without the shim, and compares
// the unlimited container's rate with it. Real-GPU assumption: nothing
// else runs on the GPU meanwhile, and the host's python is the one the
// container runs (the same binary and PyTorch, mounted).
func (n *node) overhead(ctx context.Context, unlimited float64) (string, string, error) {
	out, err := n.hostOutput(ctx, n.o.python, filepath.Join(n.o.bundle, "scripts", "matmul.py"),
		strconv.Itoa(nvmlRateSecs), strconv.Itoa(nvmlRateWarm))
	if err != nil {
		return "sm-overhead", "", fmt.Errorf("matmul.py on the host: %w: %s", err, stderrOf(err))
	}
	bare, err := parseRate(out)
	if err != nil {
		return "sm-overhead", "", err
	}
	cost := (bare - unlimited) / bare * 100
	what := fmt.Sprintf("unlimited container %.2f vs host without shim %.2f iterations/s: %.2f %% slower (limit %.0f %%)", unlimited, bare, cost, overheadLimit)
	if cost >= overheadLimit {
		return "sm-overhead", "", fmt.Errorf("%s", what)
	}
	return "sm-overhead", what, nil
}

// ---- d. no-gpu --------------------------------------------------------

// checkNoGPU runs a pod that asks for no GPU. On a real GPU it brings the
// driver's libraries and nvidia-smi itself (mounted from the host, as a
// tenant's image could hold them), so that only the missing device nodes
// stop it; the fake driver needs no device node, so in simulated mode the
// pod has no driver at all.
func checkNoGPU(ctx context.Context, n *node, r *report) {
	pod := n.pod("no-gpu", 0)
	smi := "nvidia-smi"
	cuda := fmt.Sprintf("%s/cudaprog init", testInCtr)
	if !n.sim {
		if p, err := exec.LookPath("nvidia-smi"); err == nil {
			smi = p
			pod.Containers[0].Mounts = append(pod.Containers[0].Mounts, kubeletsim.Mount{ContainerPath: p, HostPath: p, ReadOnly: true})
		}
		for _, d := range []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"} {
			if _, err := os.Stat(filepath.Join(n.driverRoot, d)); err == nil {
				pod.Containers[0].Mounts = append(pod.Containers[0].Mounts, kubeletsim.Mount{ContainerPath: d, HostPath: filepath.Join(n.driverRoot, d), ReadOnly: true})
			}
		}
		cuda = fmt.Sprintf("%s %s/torchmem.py count", n.o.python, scriptsInCtr)
	}
	rp, err := n.runPod(ctx, pod)
	defer n.killPod(rp)
	if err != nil {
		r.fail("no-gpu", err.Error())
		return
	}
	script := fmt.Sprintf(`for f in /dev/nvidia*; do [ -e "$f" ] || continue
  if (exec 3<"$f") 2>/tmp/e; then echo "node $f opens"; else echo "node $f $(sed 's/.*: //' /tmp/e)"; fi; done
%s -L >/tmp/smi 2>&1; echo "smi rc=$? $(head -n1 /tmp/smi)"
%s >/tmp/cuda 2>&1; echo "cuda rc=$? $(tail -n1 /tmp/cuda)"`, smi, cuda)
	out, err := n.exec(ctx, rp, 45*time.Second, script)
	if err != nil {
		r.fail("no-gpu", err.Error())
		return
	}
	var problems, seen []string
	nodes := regexp.MustCompile(`(?m)^node (\S+) (.*)$`).FindAllStringSubmatch(out, -1)
	for _, m := range nodes {
		// Operation not permitted: the device cgroup refuses it. Anything
		// else (it opens; no such device: allowed, no driver behind it)
		// means the container may use it.
		if !strings.Contains(m[2], "not permitted") {
			problems = append(problems, fmt.Sprintf("%s: %s", m[1], m[2]))
		}
	}
	seen = append(seen, fmt.Sprintf("%d /dev/nvidia* nodes, none usable", len(nodes)))
	smiLine := regexp.MustCompile(`(?m)^smi rc=(\d+) ?(.*)$`).FindStringSubmatch(out)
	if smiLine == nil || smiLine[1] == "0" {
		problems = append(problems, fmt.Sprintf("nvidia-smi -L succeeded: %q", out))
	} else {
		seen = append(seen, fmt.Sprintf("nvidia-smi exits %s (%s)", smiLine[1], smiLine[2]))
	}
	cudaLine := regexp.MustCompile(`(?m)^cuda rc=(\d+) ?(.*)$`).FindStringSubmatch(out)
	switch {
	case cudaLine == nil:
		problems = append(problems, fmt.Sprintf("no CUDA result in %q", out))
	case n.sim && cudaLine[1] == "0":
		problems = append(problems, "cudaprog found a CUDA device")
	case !n.sim && !strings.Contains(cudaLine[2], `"device_count": 0`):
		problems = append(problems, fmt.Sprintf("PyTorch: %s", cudaLine[2]))
	default:
		seen = append(seen, fmt.Sprintf("CUDA finds no device (%s)", cudaLine[2]))
	}
	if len(problems) > 0 {
		r.fail("no-gpu", strings.Join(problems, "; "))
		return
	}
	r.pass("no-gpu", strings.Join(seen, "; "))
}

// ---- e. gate ----------------------------------------------------------

// checkGate stops nri-vgpu and asks for a GPU pod (refused: the NRI
// validator requires the plugin, and the device plugin's gate mount fails
// a container nri-vgpu did not prepare), then starts it again and asks
// again (it starts, with its limits file).
func checkGate(ctx context.Context, n *node, r *report) {
	if err := n.stopNRI(); err != nil {
		r.fail("gate", fmt.Sprintf("stopping nri-vgpu: %v", err))
		return
	}
	rp, err := n.runPod(ctx, n.pod("gate-down", 1))
	running := rp != nil && rp.ContainerID("main") != ""
	n.killPod(rp)
	if err == nil || running {
		r.fail("gate", "a GPU pod started while nri-vgpu was stopped")
		return
	}
	refused := err.Error()
	if i := strings.LastIndex(refused, "desc = "); i >= 0 {
		refused = refused[i+len("desc = "):]
	}
	if err := n.startNRI(ctx); err != nil {
		r.fail("gate", fmt.Sprintf("refused while stopped (%s); after the restart: %v", refused, err))
		return
	}
	rp, err = n.runPod(ctx, n.pod("gate-up", 1))
	defer n.killPod(rp)
	if err == nil {
		_, err = n.exec(ctx, rp, 20*time.Second, "cat /run/nri-vgpu/limits")
	}
	if err != nil {
		r.fail("gate", fmt.Sprintf("refused while stopped (%s); after the restart: %v", refused, err))
		return
	}
	r.pass("gate", fmt.Sprintf("nri-vgpu stopped: a GPU pod is refused (%s); restarted: it starts with its limits", refused))
}

// ---- f. validate ------------------------------------------------------

// validateChecks are the checks of shim/validate/validate.sh that gpu-check
// runs on a real GPU.
const validateChecks = "4c,4d,6,7b,10,11,12b"

// checkValidate runs the bundle's validate.sh checks with the host's
// Python and the bundle's shim, and turns each PASS/FAIL line into one of
// gpu-check's.
func checkValidate(ctx context.Context, n *node, r *report) {
	if n.sim {
		r.skip("validate", "shim/validate/validate.sh needs a real GPU, nvidia-smi and PyTorch")
		return
	}
	// PYTHON: the --python interpreter; SHIM: the bundle's shim (its tools,
	// regiondump and the rest, are found in the bundle's test/).
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(n.o.bundle, "validate", "validate.sh"), "--only", validateChecks)
	cmd.Env = append(append(os.Environ(), n.hostEnv...), "PYTHON="+n.o.python,
		"SHIM="+filepath.Join(n.o.bundle, "lib", "libvgpu-shim.so"))
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(filepath.Join(n.o.logs, "validate.log"), out, 0o644)
	lines, fails := 0, 0
	for _, l := range strings.Split(string(out), "\n") {
		if verdict, what, ok := strings.Cut(l, " "); ok && (verdict == "PASS" || verdict == "FAIL") {
			lines++
			if verdict == "PASS" {
				r.pass("validate", what)
			} else {
				fails++
				r.fail("validate", what)
			}
		}
	}
	switch {
	case ctx.Err() != nil:
		r.fail("validate", fmt.Sprintf("validate.sh did not finish in time (%d checks reported): %s", lines, harness.TailLines(string(out), 2)))
	case lines == 0 || err != nil && fails == 0:
		// It stopped before its checks, or failed without saying which.
		r.fail("validate", fmt.Sprintf("validate.sh: %v after %d checks: %s", err, lines, harness.TailLines(string(out), 3)))
	}
}
