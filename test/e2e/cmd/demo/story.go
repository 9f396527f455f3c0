package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// Paths inside a vGPU container (Contract 3).
const (
	limitsInContainer  = "/run/nri-vgpu/limits"
	preloadInContainer = "/etc/ld.so.preload"
	shimInContainer    = "/usr/local/nri-vgpu/libvgpu-shim.so"
)

// demo is one run of the story.
type demo struct {
	opts *options
	p    *printer
	n    *node
	pods []*gpuPod
}

// gpuPod is a running pod of the story and what it received.
type gpuPod struct {
	name  string
	asked int
	rp    *kubeletsim.RunningPod
	id    string // the container's ID
	alloc *allocation.Allocation
}

// run tells the story; each step returns an error naming what failed.
func (d *demo) run(ctx context.Context) error {
	if err := d.setup(ctx); err != nil {
		return err
	}
	steps := []struct {
		title string
		fn    func(context.Context) error
	}{
		{"The device plugin advertises GPU slices to the kubelet", d.slicesAdvertised},
		{"`nri-vgpu status` before any pod: no vGPU containers", d.statusBefore},
		{"Two pods ask for slices: pod-a nvidia.com/gpu: 2, pod-b nvidia.com/gpu: 1", d.runGPUPods},
		{"A CUDA program in pod-a allocating past its slice is refused", d.refusedPastLimit},
		{"`nri-vgpu status` while the pods hold GPU memory", d.statusWhileRunning},
		{"A pod that asks for no GPU sees none", d.podWithoutGPU},
		{"The pods are removed: their slices are free and their host state is gone", d.removePods},
	}
	for i, s := range steps {
		d.p.section(i+1, s.title)
		if err := s.fn(ctx); err != nil {
			return &stepError{step: fmt.Sprintf("[%d] %s", i+1, s.title), err: err}
		}
	}
	return nil
}

func (d *demo) setup(ctx context.Context) error {
	n, p, o := d.n, d.p, d.opts
	var images []string
	steps := []struct {
		name string
		fn   func() error
	}{
		{"config with two simulated GPUs, fake /dev/nvidia* nodes", func() error {
			if err := n.writeConfig(filepath.Join(o.ShimBuild, "libvgpu-shim.so")); err != nil {
				return err
			}
			return n.makeDevRoot()
		}},
		{"images: pause, and busybox with cudaprog + fake CUDA driver", func() error {
			dir := filepath.Join(n.base, "images")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			var err error
			images, err = buildImages(ctx, dir, o.ShimBuild)
			return err
		}},
		{"containerd " + o.containerdVersion + " with NRI, nri-vgpu pre-registered", func() error {
			return n.startContainerd(ctx, images, o.ContainerdBin, o.Runc, filepath.Join(o.BinDir, "nri-vgpu"))
		}},
		{"device plugin registered with the kubelet simulator", func() error {
			if err := n.startDevicePlugin(filepath.Join(o.BinDir, "nri-vgpu-device-plugin")); err != nil {
				return err
			}
			return n.waitForSlices(ctx)
		}},
	}
	for _, s := range steps {
		if err := p.progress(s.name, s.fn); err != nil {
			return err
		}
	}
	p.printf("  containerd root %s\n", n.c.Dir)
	return nil
}

// gpuByUUID returns the demo GPU with uuid.
func gpuByUUID(uuid string) (simGPU, int, bool) {
	for i, g := range demoGPUs {
		if g.UUID == uuid {
			return g, i, true
		}
	}
	return simGPU{}, 0, false
}

// [1]
func (d *demo) slicesAdvertised(context.Context) error {
	snap := d.n.kubelet.Snapshot(resourceName)
	per := map[string][2]int{} // uuid -> advertised, healthy
	for _, dev := range snap.Devices {
		uuid, _, err := limits.ParseDeviceID(dev.ID)
		if err != nil {
			return fmt.Errorf("the device plugin advertises %q: %w", dev.ID, err)
		}
		c := per[uuid]
		c[0]++
		if dev.Healthy {
			c[1]++
		}
		per[uuid] = c
	}
	d.p.printf("    %s: %d devices, %d healthy; device ID = <GPU-UUID>::<slice>\n", resourceName, len(snap.Devices), snap.Healthy())
	tw := tabwriter.NewWriter(d.p.w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "    GPU\tUUID\tMODEL\tMEMORY\tSLICES ADVERTISED")
	dp := d.n.cfg.DevicePlugin
	for i, g := range demoGPUs {
		split := dp.SplitCountFor(g.Name)
		s := limits.SliceSize(g.Memory, split, dp.MemoryScaling, dp.CoresScaling)
		c := per[g.UUID]
		if c[0] != split || c[1] != split {
			return fmt.Errorf("GPU %s: %d slices advertised, %d healthy; want %d healthy", g.UUID, c[0], c[1], split)
		}
		fmt.Fprintf(tw, "    %d\t%s\t%s\t%s\t%d x %s, %d%% of SM time each\n", i, g.UUID, g.Name, quantity.FormatBytes(g.Memory),
			split, quantity.FormatBytes(s.Memory), s.Cores)
	}
	if len(per) != len(demoGPUs) {
		return fmt.Errorf("slices of %d GPUs advertised, want %d", len(per), len(demoGPUs))
	}
	return tw.Flush()
}

// statusReport is the part of `nri-vgpu status -o json` the demo checks.
type statusReport struct {
	GPUs []struct {
		UUID       string `json:"uuid"`
		Containers []struct {
			Pod         string  `json:"pod"`
			MemoryLimit uint64  `json:"memoryLimit"`
			MemoryUsed  *uint64 `json:"memoryUsed"`
		} `json:"containers"`
	} `json:"gpus"`
}

// status runs `nri-vgpu status`, prints its table and returns its JSON
// report.
func (d *demo) status(ctx context.Context) (*statusReport, error) {
	bin := filepath.Join(d.opts.BinDir, "nri-vgpu")
	cmd := func(args ...string) ([]byte, error) {
		c := exec.CommandContext(ctx, bin, append([]string{"--config", d.n.configPath, "status"}, args...)...)
		var stderr strings.Builder
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(c.Args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	table, err := cmd()
	if err != nil {
		return nil, err
	}
	d.p.printf("    $ nri-vgpu status\n")
	d.p.block("    ", string(table))
	raw, err := cmd("-o", "json")
	if err != nil {
		return nil, err
	}
	var r statusReport
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("nri-vgpu status -o json: %w", err)
	}
	return &r, nil
}

// containerCount counts the vGPU containers in a status report.
func (r *statusReport) containerCount() int {
	n := 0
	for _, g := range r.GPUs {
		n += len(g.Containers)
	}
	return n
}

// [2]
func (d *demo) statusBefore(ctx context.Context) error {
	r, err := d.status(ctx)
	if err != nil {
		return err
	}
	if len(r.GPUs) != len(demoGPUs) || r.containerCount() != 0 {
		return fmt.Errorf("status lists %d GPUs and %d containers, want %d GPUs and none", len(r.GPUs), r.containerCount(), len(demoGPUs))
	}
	return nil
}

// newPod is a pod of one container of the demo image asking for n slices.
func newPod(name string, n int) *kubeletsim.Pod {
	c := kubeletsim.Container{Name: "main", Image: appImage}
	if n > 0 {
		c.Limits = map[string]int{resourceName: n}
	}
	return &kubeletsim.Pod{Name: name, UID: kubeletsim.NewUID(), TerminationGracePeriod: 5 * time.Second,
		Containers: []kubeletsim.Container{c}}
}

// exec runs a shell script in a container and returns its stdout; a
// non-zero exit is an error that shows the output.
func (d *demo) exec(ctx context.Context, id, script string) (string, error) {
	res, err := d.n.c.Exec(ctx, id, "/bin/sh", "-c", script)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("in container %.12s, %q exited %d: %s", id, script, res.ExitCode,
			strings.TrimSpace(res.Stdout+"\n"+res.Stderr))
	}
	return res.Stdout, nil
}

// [3]
func (d *demo) runGPUPods(ctx context.Context) error {
	key, err := allockey.Load(d.n.stateDir)
	if err != nil {
		return err
	}
	for _, spec := range []struct {
		name string
		n    int
	}{{"pod-a", 2}, {"pod-b", 1}} {
		rp, err := d.n.kubelet.RunPod(ctx, d.n.c.Runtime, newPod(spec.name, spec.n))
		if err != nil {
			return err
		}
		gp := &gpuPod{name: spec.name, asked: spec.n, rp: rp, id: rp.ContainerID("main")}
		d.pods = append(d.pods, gp)
		rc := rp.Containers["main"]
		gp.alloc, err = allocation.Verify(key, rc.Config.Annotations[allocation.AnnotationKey])
		if err != nil {
			return fmt.Errorf("pod %s: the allocation annotation kubelet passed on: %w", spec.name, err)
		}
		if err := d.showPod(ctx, gp, rc.Allocation.DeviceIDs[resourceName]); err != nil {
			return fmt.Errorf("pod %s: %w", spec.name, err)
		}
	}
	return nil
}

// compactIDs writes device IDs with each GPU's UUID once: "GPU-x::0 ::1".
func compactIDs(ids []string) string {
	var out []string
	last := ""
	for _, id := range ids {
		uuid, slice, err := limits.ParseDeviceID(id)
		switch {
		case err != nil:
			out = append(out, id)
		case uuid == last:
			out = append(out, "::"+strconv.Itoa(slice))
		default:
			out = append(out, id)
		}
		last = uuid
	}
	return strings.Join(out, " ")
}

// showPod prints what a GPU pod received, from kubelet's side and from
// inside its container, and checks it.
func (d *demo) showPod(ctx context.Context, gp *gpuPod, ids []string) error {
	p := d.p
	p.printf("\n    %s asked for %s: %d\n", gp.name, resourceName, gp.asked)
	p.printf("      device IDs   %s\n", compactIDs(ids))
	total := 0
	for _, g := range gp.alloc.GPUs {
		sim, idx, ok := gpuByUUID(g.UUID)
		if !ok {
			return fmt.Errorf("allocated GPU %s is not one of the node's", g.UUID)
		}
		p.printf("      allocation   GPU %d (%s): %s = %s, %d%% of SM time (signed; verified)\n",
			idx, sim.Name, plural(g.Slices, "slice"), quantity.FormatBytes(g.Memory), g.Cores)
		total += g.Slices
	}
	if total != gp.asked || len(ids) != gp.asked {
		return fmt.Errorf("asked for %d slices, got device IDs %v and an allocation of %d", gp.asked, ids, total)
	}

	p.printf("      inside the container (CRI exec):\n")
	lf, err := d.exec(ctx, gp.id, "cat "+limitsInContainer)
	if err != nil {
		return err
	}
	parsed, err := limits.ParseLimits([]byte(lf))
	if err != nil {
		return fmt.Errorf("%s: %w", limitsInContainer, err)
	}
	for i, g := range gp.alloc.GPUs {
		if i >= len(parsed.GPUs) || parsed.GPUs[i].UUID != g.UUID || parsed.GPUs[i].Memory != g.Memory || parsed.GPUs[i].Cores != g.Cores {
			return fmt.Errorf("%s holds %+v, want the allocation %+v", limitsInContainer, parsed.GPUs, gp.alloc.GPUs)
		}
	}
	p.printf("        $ cat %s\n", limitsInContainer)
	p.block("          ", lf)

	nodes, err := d.deviceNodes(ctx, gp.id)
	if err != nil {
		return err
	}
	p.printf("        NVIDIA device nodes (major:minor):\n          %s\n", strings.Join(nodes, "  "))
	for _, g := range gp.alloc.GPUs {
		want := fmt.Sprintf("/dev/nvidia%d (%d:%d)", g.Minor, harness.NVIDIAMajor, g.Minor)
		if !slices.Contains(nodes, want) {
			return fmt.Errorf("the container lacks %s; it has %v", want, nodes)
		}
	}
	for _, g := range demoGPUs {
		if !slices.ContainsFunc(gp.alloc.GPUs, func(a allocation.GPU) bool { return a.UUID == g.UUID }) &&
			slices.ContainsFunc(nodes, func(s string) bool { return strings.HasPrefix(s, fmt.Sprintf("/dev/nvidia%d ", g.Minor)) }) {
			return fmt.Errorf("the container has /dev/nvidia%d, a GPU it was not given", g.Minor)
		}
	}

	preload, err := d.exec(ctx, gp.id, "cat "+preloadInContainer)
	if err != nil {
		return err
	}
	if strings.TrimSpace(preload) != shimInContainer {
		return fmt.Errorf("%s = %q, want %q", preloadInContainer, preload, shimInContainer)
	}
	res, err := d.n.c.Exec(ctx, gp.id, "/bin/sh", "-c", "echo >> "+preloadInContainer)
	if err != nil {
		return err
	}
	if res.ExitCode == 0 {
		return fmt.Errorf("the container could write %s", preloadInContainer)
	}
	p.printf("        $ cat %s   (read-only: writing it fails)\n          %s\n", preloadInContainer, strings.TrimSpace(preload))
	return nil
}

// deviceNodes lists the container's /dev/nvidia* nodes as "path (major:minor)".
func (d *demo) deviceNodes(ctx context.Context, id string) ([]string, error) {
	out, err := d.exec(ctx, id, `for f in /dev/nvidia*; do [ -e "$f" ] && stat -c '%n %t %T' "$f"; done; true`)
	if err != nil {
		return nil, err
	}
	return parseDeviceNodes(out)
}

// parseDeviceNodes turns `stat -c '%n %t %T'` lines (major and minor in hex)
// into "path (major:minor)".
func parseDeviceNodes(out string) ([]string, error) {
	var nodes []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 3 {
			return nil, fmt.Errorf("unexpected stat output %q", l)
		}
		major, err1 := strconv.ParseUint(f[1], 16, 32)
		minor, err2 := strconv.ParseUint(f[2], 16, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("stat output %q: %w", l, err)
		}
		nodes = append(nodes, fmt.Sprintf("%s (%d:%d)", f[0], major, minor))
	}
	return nodes, nil
}

// fakeDriverEnv is the environment of cudaprog in a container holding the
// GPUs of a: the fake driver shows those GPUs, whole (the shim then shows
// the slice), with its state in the container's /tmp.
func fakeDriverEnv(a *allocation.Allocation) string {
	var devs []string
	for _, g := range a.GPUs {
		sim, _, _ := gpuByUUID(g.UUID)
		devs = append(devs, fmt.Sprintf("%s:%dMiB:%d", g.UUID, sim.Memory>>20, sim.SMs))
	}
	return "FAKECUDA_DEVICES=" + strings.Join(devs, ",") + " FAKECUDA_STATE=/tmp"
}

// mib writes a byte count the way cudaprog reads sizes.
func mib(b uint64) string { return fmt.Sprintf("%dMiB", b>>20) }

// cudaStep is one operation of a cudaprog script and how to show it.
type cudaStep struct {
	op    string // cudaprog operation, with its expected values
	label string
	// result is what the step returned when cudaprog's checks pass; empty
	// for steps that print their own result (info, nvml).
	result string
	note   string
}

// [4]
func (d *demo) refusedPastLimit(ctx context.Context) error {
	a := d.pods[0]
	g := a.alloc.GPUs[0]
	sim, _, _ := gpuByUUID(g.UUID)
	limit := g.Memory
	rest := limit / 5 & ^uint64(1<<20-1)
	first := limit - rest
	steps := []cudaStep{
		{op: "init", label: "cuInit + context on device 0", result: "CUDA_SUCCESS"},
		{op: fmt.Sprintf("info:%s:%s", mib(limit), mib(limit)), label: "cuMemGetInfo",
			note: fmt.Sprintf("the slice, not the %s GPU", quantity.FormatBytes(sim.Memory))},
		{op: fmt.Sprintf("nvml:0:%s:0:%s", mib(limit), mib(limit)), label: "nvmlDeviceGetMemoryInfo", note: "what nvidia-smi shows"},
		{op: "alloc:" + mib(first), label: "cuMemAlloc(" + quantity.FormatBytes(first) + ")", result: "CUDA_SUCCESS"},
		{op: fmt.Sprintf("info:%s:%s", mib(rest), mib(limit)), label: "cuMemGetInfo"},
		{op: "alloc:" + mib(2*rest) + ":2", label: "cuMemAlloc(" + quantity.FormatBytes(2*rest) + ")", result: "CUDA_ERROR_OUT_OF_MEMORY",
			note: fmt.Sprintf("refused: %s + %s > %s", quantity.FormatBytes(first), quantity.FormatBytes(2*rest), quantity.FormatBytes(limit))},
		{op: "alloc:" + mib(rest), label: "cuMemAlloc(" + quantity.FormatBytes(rest) + ")", result: "CUDA_SUCCESS", note: "exactly up to the slice"},
		{op: fmt.Sprintf("info:0:%s", mib(limit)), label: "cuMemGetInfo"},
	}
	ops := make([]string, len(steps))
	for i, s := range steps {
		ops[i] = s.op
	}
	script := fmt.Sprintf("%s cudaprog -m direct %s", fakeDriverEnv(a.alloc), strings.Join(ops, " "))
	res, err := d.n.c.Exec(ctx, a.id, "/bin/sh", "-c", script)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || !strings.HasSuffix(strings.TrimSpace(res.Stdout), "ok") {
		return fmt.Errorf("cudaprog in %s exited %d (a result differs from the expected one):\n%s%s", a.name, res.ExitCode, res.Stdout, res.Stderr)
	}
	d.p.printf("    cudaprog (the shim's test program) in %s, on the fake driver's %s GPU; it checks every\n", a.name, quantity.FormatBytes(sim.Memory))
	d.p.printf("    result below and exits non-zero on any difference:\n")
	lines, err := renderCudaprog(steps, res.Stdout)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(d.p.w, 0, 8, 2, ' ', 0)
	for _, l := range lines {
		fmt.Fprintf(tw, "      %s\n", l)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	refusal := ""
	for _, l := range strings.Split(res.Stderr, "\n") {
		if strings.Contains(l, "GPU memory quota exceeded") {
			refusal = l
		}
	}
	if refusal == "" {
		return fmt.Errorf("the shim logged no refusal; cudaprog's stderr: %q", res.Stderr)
	}
	d.p.printf("    the shim, on stderr:\n      %s\n", refusal)
	return nil
}

// renderCudaprog pairs each step with its result: the line cudaprog printed
// for info and nvml steps ("info free=F total=T", "nvml total=T used=U
// free=F"), the checked return code for the others. Lines are tab-separated
// columns.
func renderCudaprog(steps []cudaStep, stdout string) ([]string, error) {
	var out []string
	lines := strings.Split(stdout, "\n")
	next := func(prefix string) (map[string]uint64, error) {
		for len(lines) > 0 {
			l := lines[0]
			lines = lines[1:]
			if !strings.HasPrefix(l, prefix+" ") {
				continue
			}
			vals := map[string]uint64{}
			for _, f := range strings.Fields(l)[1:] {
				k, v, ok := strings.Cut(f, "=")
				if !ok {
					continue
				}
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("cudaprog printed %q: %w", l, err)
				}
				vals[k] = n
			}
			return vals, nil
		}
		return nil, fmt.Errorf("cudaprog printed no %q line", prefix)
	}
	for _, s := range steps {
		result := s.result
		switch {
		case strings.HasPrefix(s.op, "info"):
			v, err := next("info")
			if err != nil {
				return nil, err
			}
			result = fmt.Sprintf("free %s of %s", formatBytes(v["free"]), formatBytes(v["total"]))
		case strings.HasPrefix(s.op, "nvml"):
			v, err := next("nvml")
			if err != nil {
				return nil, err
			}
			result = fmt.Sprintf("used %s of %s", formatBytes(v["used"]), formatBytes(v["total"]))
		}
		out = append(out, strings.TrimRight(s.label+"\t"+result+"\t"+s.note, "\t"))
	}
	return out, nil
}

// formatBytes is quantity.FormatBytes with a bare 0.
func formatBytes(n uint64) string {
	if n == 0 {
		return "0"
	}
	return quantity.FormatBytes(n)
}

// holdMemory starts a cudaprog in the background in gp's container that
// allocates bytes and keeps them until the pod goes away, and waits until
// it holds them.
func (d *demo) holdMemory(ctx context.Context, gp *gpuPod, bytes uint64) error {
	script := fmt.Sprintf("%s cudaprog -m direct init alloc:%s touch:/tmp/held waitfile:/tmp/release freeall >/tmp/holder.log 2>&1 &",
		fakeDriverEnv(gp.alloc), mib(bytes))
	if _, err := d.exec(ctx, gp.id, script); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := d.n.c.Exec(ctx, gp.id, "test", "-e", "/tmp/held")
		if err != nil {
			return err
		}
		if res.ExitCode == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := d.exec(ctx, gp.id, "cat /tmp/holder.log")
			return fmt.Errorf("the program holding %s in %s did not get it within 20s: %s", quantity.FormatBytes(bytes), gp.name, log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// [5]
func (d *demo) statusWhileRunning(ctx context.Context) error {
	held := map[string]uint64{}
	for _, gp := range d.pods {
		// Three fifths of the slice, in whole MiB.
		b := gp.alloc.GPUs[0].Memory / 5 * 3 & ^uint64(1<<20-1)
		if err := d.holdMemory(ctx, gp, b); err != nil {
			return err
		}
		held[gp.name] = b
		d.p.printf("    %s: a process holds %s (cudaprog in the background)\n", gp.name, quantity.FormatBytes(b))
	}
	r, err := d.status(ctx)
	if err != nil {
		return err
	}
	seen := 0
	for _, g := range r.GPUs {
		for _, c := range g.Containers {
			// status names pods namespace/name.
			want, ok := held[strings.TrimPrefix(c.Pod, "default/")]
			if !ok {
				return fmt.Errorf("status lists a container of pod %q", c.Pod)
			}
			if c.MemoryUsed == nil || *c.MemoryUsed != want {
				got := "unknown"
				if c.MemoryUsed != nil {
					got = quantity.FormatBytes(*c.MemoryUsed)
				}
				return fmt.Errorf("status shows %s used by %s, want %s (from its usage region)", got, c.Pod, quantity.FormatBytes(want))
			}
			seen++
		}
	}
	if seen != len(d.pods) {
		return fmt.Errorf("status lists %d vGPU containers, want %d", seen, len(d.pods))
	}
	return nil
}

// [6]
func (d *demo) podWithoutGPU(ctx context.Context) error {
	rp, err := d.n.kubelet.RunPod(ctx, d.n.c.Runtime, newPod("pod-c", 0))
	if err != nil {
		return err
	}
	d.pods = append(d.pods, &gpuPod{name: "pod-c", rp: rp, id: rp.ContainerID("main")})
	id := rp.ContainerID("main")
	d.p.printf("    pod-c asks for no GPU; its image sets NVIDIA_VISIBLE_DEVICES=all, as CUDA images do\n")
	tw := tabwriter.NewWriter(d.p.w, 0, 8, 2, ' ', 0)

	env, err := d.exec(ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")
	if err != nil {
		return err
	}
	if v := strings.TrimSpace(env); v != "void" {
		return fmt.Errorf("NVIDIA_VISIBLE_DEVICES = %q in a pod without GPUs, want void", v)
	}
	fmt.Fprintf(tw, "      $NVIDIA_VISIBLE_DEVICES\tvoid\tset by nri-vgpu over the image's \"all\"\n")

	nodes, err := d.deviceNodes(ctx, id)
	if err != nil {
		return err
	}
	if len(nodes) > 0 {
		return fmt.Errorf("NVIDIA device nodes in a pod without GPUs: %v", nodes)
	}
	fmt.Fprintf(tw, "      /dev/nvidia*\tnone\tno NVIDIA device node\n")

	res, err := d.n.c.Exec(ctx, id, "/bin/sh", "-c", fmt.Sprintf("mknod /tmp/gpu c %d 0 && cat /tmp/gpu", harness.NVIDIAMajor))
	if err != nil {
		return err
	}
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Operation not permitted") {
		return fmt.Errorf("opening a hand-made GPU node (%d:0): exit %d, %q; want EPERM from the device cgroup", harness.NVIDIAMajor, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	fmt.Fprintf(tw, "      mknod c %d 0 + open\tOperation not permitted\tthe device cgroup denies NVIDIA devices\n", harness.NVIDIAMajor)

	res, err = d.n.c.Exec(ctx, id, "test", "-e", preloadInContainer)
	if err != nil {
		return err
	}
	if res.ExitCode == 0 {
		return fmt.Errorf("%s exists in a pod without GPUs", preloadInContainer)
	}
	fmt.Fprintf(tw, "      %s\tabsent\tno shim, no limits: nothing to limit\n", preloadInContainer)
	if _, err := os.Stat(filepath.Join(d.n.runDir, "containers", id)); err == nil {
		return fmt.Errorf("nri-vgpu keeps host state for pod-c, which has no GPU")
	}
	return tw.Flush()
}

// [7]
func (d *demo) removePods(ctx context.Context) error {
	for _, gp := range d.pods {
		if err := d.n.kubelet.KillPod(ctx, d.n.c.Runtime, gp.rp); err != nil {
			return err
		}
		d.p.printf("    removed %s\n", gp.name)
	}
	d.pods = nil
	containers := filepath.Join(d.n.runDir, "containers")
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, err := os.ReadDir(containers)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d container directories left in %s 10s after the pods were removed", len(entries), containers)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	r, err := d.status(ctx)
	if err != nil {
		return err
	}
	if r.containerCount() != 0 {
		return fmt.Errorf("status still lists %d vGPU containers", r.containerCount())
	}
	snap := d.n.kubelet.Snapshot(resourceName)
	free := 0
	for _, dev := range snap.Devices {
		if dev.PodUID == "" {
			free++
		}
	}
	if free != len(snap.Devices) {
		return fmt.Errorf("%d of %d slices still held after the pods were removed", len(snap.Devices)-free, len(snap.Devices))
	}
	d.p.printf("    host state: %s is empty; kubelet: %d of %d slices free\n", containers, free, len(snap.Devices))
	return nil
}

// plural writes "1 slice", "2 slices".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
