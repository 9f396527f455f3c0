package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

const (
	resourceName = "nvidia.com/gpu"
	// splitCount slices per GPU: 10 % of SM time each, so 3 and 7 slices
	// are the 30 % and 70 % of sm-share and 10 slices the whole GPU.
	splitCount = 10
	// appImage is every pod's image: busybox, the glibc libraries of the
	// programs the checks run, and no NVIDIA file (see buildAppImage).
	appImage = "nri-vgpu.gpu-check/app:1"
	// Where the bundle's test programs and scripts appear in containers.
	testInCtr    = "/gpu-check/test"
	scriptsInCtr = "/gpu-check/scripts"
	// fakeStateInCtr holds the fake driver's state in simulated mode: one
	// host directory shared by the daemons, the host's processes and every
	// GPU container, as one GPU is shared by all of them.
	fakeStateInCtr = "/run/fakecuda"
	// tolerateAnnotation is the NRI validator's
	// tolerate_missing_plugins_annotation (as nri-vgpu configure sets it).
	tolerateAnnotation = "nri-vgpu.io/tolerate-missing-plugin"
)

// hostGPU is one GPU as the node's own tools see it: nvidia-smi in nvml
// mode, the GPU the check declares to the fake driver in simulated mode.
type hostGPU struct {
	UUID, Name, PCIBusID string
	MemoryMiB            uint64
	Minor                int
	SMs                  int // simulated only: the fake's SM count
}

// node is the chain gpu-check starts, everything under base.
type node struct {
	o    *options
	sim  bool
	base string
	// driverRoot holds the driver's files and /dev: "/" (--driver-root) in
	// nvml mode, a fake one under base in simulated mode.
	driverRoot string
	configPath string
	stateDir   string
	fakeState  string // simulated: the fake driver's state directory
	kubeletDir string
	nriSocket  string
	gpus       []hostGPU
	// daemonEnv is the daemons' environment (simulated: the fake
	// driver's settings); hostEnv the workloads' the checks run on the host
	// (simulated: also where the fake driver's libraries are).
	daemonEnv, hostEnv []string
	// ctrEnv and ctrMounts go to every pod's container.
	ctrEnv    []kubeletsim.EnvVar
	ctrMounts []kubeletsim.Mount
	// python is what the containers run PyTorch with (nvml mode).
	python *pythonInfo

	gpuName, driverVersion string

	c          *harness.Containerd
	kubelet    *kubeletsim.Kubelet
	kubeletLog *os.File
	dp         *harness.Process // the device plugin
	nriMu      sync.Mutex
	nri        *harness.Process // nri-vgpu, an external NRI plugin (gate stops it)
	execs      int              // numbers the container output logs
	pods       int              // numbers the GPU pods (simulated: their pid offsets)
}

func (n *node) bin(name string) string { return filepath.Join(n.o.bundle, "bin", name) }

// startNode starts the chain; the node it returns is closed by the caller,
// started or not.
func startNode(ctx context.Context, o *options, r *report) (*node, error) {
	n := &node{o: o, sim: o.mode == modeSimulated, driverRoot: o.driverRoot}
	if _, err := harness.SweepStale(n.bin("runc")); err != nil {
		return n, fmt.Errorf("cleaning up after an earlier run: %w", err)
	}
	base, err := harness.MkdirTemp("gpucheck")
	if err != nil {
		return n, err
	}
	// containerd's directory (harness.Start) is a sibling of base in
	// $TMPDIR, not inside it: its sockets' paths must stay under 108
	// bytes, and hack/gpu-check.sh already gives the run a TMPDIR of its own.
	n.base = base
	n.configPath = filepath.Join(base, "config.toml")
	n.stateDir = filepath.Join(base, "state")
	n.kubeletDir = filepath.Join(base, "device-plugins")
	n.nriSocket = filepath.Join(base, "nri.sock")
	steps := []struct {
		name string
		d    time.Duration
		fn   func(context.Context) error
	}{
		{"the node's GPUs", 60 * time.Second, n.discoverGPUs},
		{"config", 10 * time.Second, n.writeConfig},
		{"images", 90 * time.Second, n.buildImagesAndStart},
		{"kubelet simulator", 5 * time.Second, n.startKubelet},
		{"nri-vgpu", 40 * time.Second, n.startNRI},
		{"device plugin", 40 * time.Second, n.startDevicePlugin},
	}
	for _, s := range steps {
		sctx, cancel := context.WithTimeout(ctx, s.d)
		err := s.fn(sctx)
		cancel()
		if err != nil {
			return n, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return n, nil
}

// simGPU is the GPU the simulated mode declares to the fake driver: an
// H200's name and SM count, 16 GiB.
var simGPU = harness.FakeGPU{UUID: "GPU-5e1f0c2a-7b3d-4c8e-9a6f-0d1e2f3a4b5c", Name: "NVIDIA H200 (fake)",
	Memory: 16 << 30, SMs: 132, Minor: 0}

// simDriver is the fake driver root of simulated mode.
var simDriver = harness.FakeDriverRoot{LibDir: "/usr/local/nvidia/lib64", Version: "580.159.04", GPUs: []harness.FakeGPU{simGPU}}

// simPCIBusID is the bus id the fake NVML gives GPU 0 (FK_PCI_BUS in
// shim/test/fake/fakestate.h).
const simPCIBusID = "00000000:10:00.0"

// discoverGPUs learns the node's GPUs: from nvidia-smi (nvml mode), or by
// making a fake driver root with one fake GPU (simulated).
func (n *node) discoverGPUs(ctx context.Context) error {
	if n.sim {
		n.driverRoot = filepath.Join(n.base, "driver")
		n.fakeState = filepath.Join(n.base, "fakecuda")
		r := simDriver
		r.ShimBuild = n.o.bundle // the bundle's fake/ holds the fake libraries
		if err := harness.MakeFakeDriverRoot(n.driverRoot, r); err != nil {
			return err
		}
		if err := os.MkdirAll(n.fakeState, 0o777); err != nil {
			return err
		}
		// NVML's utilisation samples every 166 ms (as the shim's limiter
		// tests set it), so that shares settle within seconds.
		fake := append(r.Env(), "FAKECUDA_SAMPLE_MS=166")
		n.hostEnv = append(slices.Clone(fake), "FAKECUDA_STATE="+n.fakeState)
		for _, kv := range append(slices.Clone(fake), "FAKECUDA_STATE="+fakeStateInCtr) {
			k, v, _ := strings.Cut(kv, "=")
			n.ctrEnv = append(n.ctrEnv, kubeletsim.EnvVar{Name: k, Value: v})
		}
		n.ctrMounts = append(n.ctrMounts, kubeletsim.Mount{ContainerPath: fakeStateInCtr, HostPath: n.fakeState})
	}
	// The daemons find libnvidia-ml.so.1 beneath driver_root themselves
	// (library_dirs). The host's own workloads (nvmlprocs, validate.sh,
	// PyTorch on the host) use the loader: in simulated mode the fake
	// driver's directory goes first; in nvml mode they run as nvidia-smi
	// does on that machine, with its environment.
	n.daemonEnv = slices.Clone(n.hostEnv)
	if n.sim {
		ld := filepath.Join(n.driverRoot, simDriver.LibDir)
		if old := os.Getenv("LD_LIBRARY_PATH"); old != "" {
			ld += ":" + old
		}
		n.hostEnv = append(n.hostEnv, "LD_LIBRARY_PATH="+ld)
	}
	n.ctrMounts = append(n.ctrMounts,
		kubeletsim.Mount{ContainerPath: testInCtr, HostPath: filepath.Join(n.o.bundle, "test"), ReadOnly: true},
		kubeletsim.Mount{ContainerPath: scriptsInCtr, HostPath: filepath.Join(n.o.bundle, "scripts"), ReadOnly: true})
	if n.sim {
		n.gpus = []hostGPU{{UUID: simGPU.UUID, Name: simGPU.Name, PCIBusID: simPCIBusID, MemoryMiB: simGPU.Memory >> 20,
			Minor: simGPU.Minor, SMs: simGPU.SMs}}
		n.gpuName, n.driverVersion = simGPU.Name, simDriver.Version
		return nil
	}
	gpus, driver, err := nvidiaSMIGPUs(ctx)
	if err != nil {
		return err
	}
	n.gpus, n.driverVersion = gpus, driver
	n.gpuName = gpus[0].Name
	py, err := inspectPython(ctx, n.o.python)
	if err != nil {
		return err
	}
	n.python = py
	for _, d := range py.mounts() {
		n.ctrMounts = append(n.ctrMounts, kubeletsim.Mount{ContainerPath: d, HostPath: d, ReadOnly: true})
	}
	return nil
}

// nvidiaSMIGPUs reads the GPUs and the driver version from nvidia-smi.
// Real-GPU assumption: nvidia-smi is on PATH and prints one CSV line per
// GPU for --query-gpu, and `nvidia-smi -q` has one "Minor Number" line per
// GPU in index order.
func nvidiaSMIGPUs(ctx context.Context) ([]hostGPU, string, error) {
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil, "", fmt.Errorf("nvidia-smi --query-gpu: %w", err)
	}
	var gpus []hostGPU
	driver := ""
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := splitCSV(l)
		if len(f) != 6 {
			return nil, "", fmt.Errorf("nvidia-smi --query-gpu printed %q: want 6 fields", l)
		}
		mem, err := strconv.ParseUint(f[3], 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("nvidia-smi memory.total %q: %w", f[3], err)
		}
		gpus = append(gpus, hostGPU{UUID: f[1], Name: f[2], MemoryMiB: mem, PCIBusID: f[4]})
		driver = f[5]
	}
	q, err := exec.CommandContext(ctx, "nvidia-smi", "-q").Output()
	if err != nil {
		return nil, "", fmt.Errorf("nvidia-smi -q: %w", err)
	}
	i := 0
	for _, l := range strings.Split(string(q), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.TrimSpace(k) == "Minor Number" && i < len(gpus) {
			if gpus[i].Minor, err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
				return nil, "", fmt.Errorf("nvidia-smi -q: Minor Number %q: %w", v, err)
			}
			i++
		}
	}
	if len(gpus) == 0 || i != len(gpus) {
		return nil, "", fmt.Errorf("nvidia-smi shows %d GPUs and %d minor numbers", len(gpus), i)
	}
	return gpus, driver, nil
}

func splitCSV(l string) []string {
	f := strings.Split(l, ",")
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	return f
}

// writeConfig writes the config both daemons read. Both modes use the
// production settings of a node with a driver and no CDI spec:
// gpu.backend = "nvml", driver.injection = "auto" (with an empty CDI
// directory, so that a host's /etc/cdi cannot decide it: auto then
// generates the driver's files from driver_root). The device nodes are
// beneath driver_root too, as under the GPU Operator's driver container.
func (n *node) writeConfig(context.Context) error {
	cdiDir := filepath.Join(n.base, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`# gpu-check (%s mode)
[device_plugin]
split_count = %d
socket_dir = %q
feature_file = %q

[gpu]
backend = "nvml"

[driver]
injection = "auto"
cdi_dirs = [%q]
dev_root = "/"
driver_root = %q

[paths]
state_dir = %q
run_dir = %q
shim_path = %q

[nri]
socket_path = %q
`, n.o.mode, splitCount, n.kubeletDir, filepath.Join(n.base, "features.d", "nri-vgpu"), cdiDir, n.driverRoot, n.stateDir,
		filepath.Join(n.base, "run"), filepath.Join(n.o.bundle, "lib", "libvgpu-shim.so"), n.nriSocket)
	if err := os.WriteFile(n.configPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	return copyFile(n.configPath, filepath.Join(n.o.logs, "config.toml"))
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// buildImagesAndStart builds the pause and application images and starts
// containerd with NRI's validator requiring nri-vgpu (containerd 2.x's
// default_validator: what makes the node fail closed).
func (n *node) buildImagesAndStart(ctx context.Context) error {
	dir := filepath.Join(n.base, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pause, err := harness.WritePauseImage(dir, n.bin("pause"))
	if err != nil {
		return err
	}
	app, err := n.buildAppImage(dir)
	if err != nil {
		return err
	}
	c, err := harness.Start(ctx, harness.Options{
		BinDir:       filepath.Join(n.o.bundle, "bin"),
		Runc:         n.bin("runc"),
		Images:       []string{pause, app},
		SandboxImage: harness.PauseImage,
		NRISocket:    n.nriSocket,
		LogDir:       n.o.logs,
		Validator:    &harness.Validator{RequiredPlugins: []string{"nri-vgpu"}, TolerateMissingAnnotation: tolerateAnnotation},
	})
	if err != nil {
		return err
	}
	n.c = c
	return nil
}

// startNRI starts nri-vgpu as an external NRI plugin (so that the gate
// check can stop and restart it) and waits until it edits new containers.
func (n *node) startNRI(ctx context.Context) error {
	cmd := exec.Command(n.bin("nri-vgpu"))
	cmd.Env = append(append(os.Environ(), n.daemonEnv...), "NRI_VGPU_CONFIG="+n.configPath)
	p, err := harness.StartProcess(cmd, filepath.Join(n.o.logs, "nri-vgpu.log"))
	if err != nil {
		return err
	}
	n.nriMu.Lock()
	n.nri = p
	n.nriMu.Unlock()
	return n.waitNRIReady(ctx)
}

func (n *node) stopNRI() error {
	n.nriMu.Lock()
	p := n.nri
	n.nri = nil
	n.nriMu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(10 * time.Second)
}

// waitNRIReady waits until nri-vgpu acts on new containers: a pod without
// a GPU gets NVIDIA_VISIBLE_DEVICES=void only from it (and, with the
// validator, no pod starts at all before it is connected).
func (n *node) waitNRIReady(ctx context.Context) error {
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		rp, err := n.runPod(pctx, n.pod("probe", 0))
		if err == nil {
			var out string
			out, err = n.exec(pctx, rp, 10*time.Second, "echo $NVIDIA_VISIBLE_DEVICES")
			if err == nil && strings.TrimSpace(out) != "void" {
				err = fmt.Errorf("a pod without a GPU got NVIDIA_VISIBLE_DEVICES=%q, want void", strings.TrimSpace(out))
			}
		}
		n.killPod(rp)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("nri-vgpu does not edit containers: %w (log: %s)", last, harness.Tail(filepath.Join(n.o.logs, "nri-vgpu.log"), 3))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startKubelet starts the kubelet simulator: the device plugin registers
// with it, and every pod is run through it.
func (n *node) startKubelet(context.Context) error {
	klog, err := os.OpenFile(filepath.Join(n.o.logs, "kubeletsim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.kubeletLog = klog
	k, err := kubeletsim.New(kubeletsim.Options{SocketDir: n.kubeletDir, PodLogDir: filepath.Join(n.base, "pod-logs"),
		Logger: slog.New(slog.NewTextHandler(klog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		return err
	}
	n.kubelet = k
	return nil
}

// startDevicePlugin runs the device plugin against the kubelet simulator
// and waits for every slice.
func (n *node) startDevicePlugin(ctx context.Context) error {
	cmd := exec.Command(n.bin("nri-vgpu-device-plugin"), "--config", n.configPath, "--log-level", "debug")
	cmd.Env = append(os.Environ(), n.daemonEnv...)
	dp, err := harness.StartProcess(cmd, n.devicePluginLog())
	if err != nil {
		return err
	}
	n.dp = dp
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		select {
		case <-dp.Exited():
			stop(errors.New("the device plugin exited"))
		case <-ctx.Done():
		}
	}()
	if err := n.kubelet.WaitForDevices(ctx, resourceName, splitCount*len(n.gpus)); err != nil {
		return fmt.Errorf("%w (%v): %s", err, context.Cause(ctx), harness.Tail(n.devicePluginLog(), 5))
	}
	return nil
}

func (n *node) devicePluginLog() string { return filepath.Join(n.o.logs, "device-plugin.log") }

// pod is a one-container pod of the application image asking for slices
// (none: a pod without a GPU).
func (n *node) pod(name string, nslices int) *kubeletsim.Pod {
	c := kubeletsim.Container{Name: "main", Image: appImage, Mounts: n.ctrMounts}
	if nslices > 0 {
		c.Limits = map[string]int{resourceName: nslices}
		c.Env = slices.Clone(n.ctrEnv)
		if n.sim {
			// The fake driver knows a process by its pid in its own
			// namespace, where a real driver knows it by its host pid: an
			// offset per pod keeps two containers' pid 1s apart, as host
			// pids are (FAKECUDA_PIDNS_OFFSET in shim/test/fake).
			n.pods++
			c.Env = append(c.Env, kubeletsim.EnvVar{Name: "FAKECUDA_PIDNS_OFFSET", Value: strconv.Itoa(n.pods * 1000000)})
		}
	}
	return &kubeletsim.Pod{Name: name, UID: kubeletsim.NewUID(), TerminationGracePeriod: 2 * time.Second,
		Containers: []kubeletsim.Container{c}}
}

// runPod runs pod through the kubelet simulator (Allocate, then CRI).
func (n *node) runPod(ctx context.Context, pod *kubeletsim.Pod) (*kubeletsim.RunningPod, error) {
	return n.kubelet.RunPod(ctx, n.c.Runtime, pod)
}

// killPod removes a pod as the kubelet does; a failure shows in cleanup,
// which removes every pod that is left.
func (n *node) killPod(rp *kubeletsim.RunningPod) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = n.kubelet.KillPod(ctx, n.c.Runtime, rp)
}

// allocation returns the verified allocation the device plugin signed for
// the pod's container (what the kubelet passed on as an annotation).
func (n *node) allocation(rp *kubeletsim.RunningPod) (*allocation.Allocation, error) {
	key, err := allockey.Load(n.stateDir)
	if err != nil {
		return nil, err
	}
	rc := rp.Containers["main"]
	if rc == nil {
		return nil, errors.New("the pod has no container")
	}
	return allocation.Verify(key, rc.Config.Annotations[allocation.AnnotationKey])
}

// exec runs a shell script in the pod's container (CRI ExecSync) within
// limit, keeps its output in the logs, and returns its stdout; a non-zero
// exit is an error that carries the output's end.
func (n *node) exec(ctx context.Context, rp *kubeletsim.RunningPod, limit time.Duration, script string) (string, error) {
	stdout, stderr, code, err := n.execRaw(ctx, rp, limit, script)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return stdout, fmt.Errorf("in pod %s, `%s` exited %d: %s", rp.Pod.Name, script, code, harness.TailLines(strings.TrimSpace(stdout+"\n"+stderr), 3))
	}
	return stdout, nil
}

func (n *node) execRaw(ctx context.Context, rp *kubeletsim.RunningPod, limit time.Duration, script string) (string, string, int32, error) {
	if rp == nil || rp.ContainerID("main") == "" {
		return "", "", 0, errors.New("the pod has no running container")
	}
	ctx, cancel := context.WithTimeout(ctx, limit+5*time.Second)
	defer cancel()
	res, err := n.c.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: rp.ContainerID("main"),
		Cmd: []string{"/bin/sh", "-c", script}, Timeout: int64(limit / time.Second)})
	n.nriMu.Lock()
	n.execs++
	logPath := filepath.Join(n.o.logs, "containers", fmt.Sprintf("%02d-%s.log", n.execs, rp.Pod.Name))
	n.nriMu.Unlock()
	_ = os.MkdirAll(filepath.Dir(logPath), 0o755)
	if err != nil {
		_ = os.WriteFile(logPath, []byte("$ "+script+"\n"+err.Error()+"\n"), 0o644)
		return "", "", 0, fmt.Errorf("exec in pod %s: %w", rp.Pod.Name, err)
	}
	_ = os.WriteFile(logPath, fmt.Appendf(nil, "$ %s\n--- exit %d, stdout:\n%s--- stderr:\n%s", script, res.ExitCode, res.Stdout, res.Stderr), 0o644)
	return string(res.Stdout), string(res.Stderr), res.ExitCode, nil
}

// close stops everything and removes base, going on past errors: the
// pods and containerd, the daemons, the kubelet simulator, then mounts and
// files under base.
func (n *node) close() error {
	var errs []error
	if n.c != nil {
		if err := n.c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stopping containerd: %w", err))
		}
	}
	if err := n.stopNRI(); err != nil {
		errs = append(errs, fmt.Errorf("stopping nri-vgpu: %w", err))
	}
	if n.dp != nil {
		if err := n.dp.Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stopping the device plugin: %w", err))
		}
	}
	if n.kubelet != nil {
		if err := n.kubelet.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.kubeletLog != nil {
		n.kubeletLog.Close()
	}
	if n.base != "" {
		if err := mountinfo.UnmountUnder(n.base); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(n.base); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", n.base, err))
		}
	}
	return errors.Join(errs...)
}
