//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// Paths inside a vGPU container (Contract 3).
const (
	shimInContainer   = "/usr/local/nri-vgpu/libvgpu-shim.so"
	limitsInContainer = "/run/nri-vgpu/limits"
	regionInContainer = "/run/nri-vgpu/region"
)

const sliceMemory = 4 << 30 // 16 GiB / splitCount
const sliceCores = 25

// allocationOf verifies the allocation annotation that the container of rp
// was created with, using the node's key, and returns it.
func (v *vgpu) allocationOf(t *testing.T, rp *kubeletsim.RunningPod, container string) *allocation.Allocation {
	t.Helper()
	rc := rp.Containers[container]
	if rc == nil {
		t.Fatalf("pod %s has no container %s", rp.Pod.Name, container)
	}
	value := rc.Config.Annotations[allocationAnnotation]
	if value == "" {
		t.Fatalf("container %s of pod %s was created without %s; annotations: %v", container, rp.Pod.Name, allocationAnnotation, rc.Config.Annotations)
	}
	key, err := allockey.Load(v.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := allocation.Verify(key, value)
	if err != nil {
		t.Fatalf("the device plugin's annotation does not verify: %v", err)
	}
	return a
}

// runtimeSpec is the OCI spec containerd generated for a container (the
// verbose ContainerStatus carries it).
func (v *vgpu) runtimeSpec(t *testing.T, ctx context.Context, containerID string) *specs.Spec {
	t.Helper()
	st, err := v.c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containerID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		RuntimeSpec *specs.Spec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.RuntimeSpec == nil {
		t.Fatalf("no runtime spec in the container status (%v): %.200s", err, st.Info["info"])
	}
	return info.RuntimeSpec
}

// deviceRule reports whether spec has a device-cgroup rule allowing (or, with
// allow false, denying) char major:minor (minor -1 = any).
func deviceRule(spec *specs.Spec, allow bool, major, minor int64) bool {
	if spec.Linux == nil || spec.Linux.Resources == nil {
		return false
	}
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow != allow || (r.Type != "c" && r.Type != "a") || r.Major == nil || *r.Major != major {
			continue
		}
		if minor < 0 && r.Minor == nil || minor >= 0 && (r.Minor == nil || *r.Minor == minor) {
			return true
		}
	}
	return false
}

// TestGPUPodReceivesItsSlice: a pod asking for one slice gets the nodes of
// its GPU (allowed in the device cgroup; other GPUs' not), the read-only
// preload of the shim, the limits file with its slice, and the usage region.
func TestGPUPodReceivesItsSlice(t *testing.T) { forEachContainerd(t, testGPUPodReceivesItsSlice) }

func testGPUPodReceivesItsSlice(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	rp := v.mustRun(t, ctx, gpuPod("one-slice", 1))
	id := rp.ContainerID("main")

	a := v.allocationOf(t, rp, "main")
	if len(a.GPUs) != 1 || a.GPUs[0].Slices != 1 || a.GPUs[0].Memory != sliceMemory || a.GPUs[0].Cores != sliceCores {
		t.Fatalf("allocation = %+v, want one slice of one GPU (%d bytes, %d%%)", a.GPUs, sliceMemory, sliceCores)
	}
	g := a.GPUs[0]
	other := testGPUs[0].Minor
	if g.Minor == other {
		other = testGPUs[1].Minor
	}

	t.Run("device nodes", func(t *testing.T) {
		out := v.sh(t, ctx, id, "ls /dev")
		have := strings.Fields(out)
		for _, want := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", fmt.Sprintf("nvidia%d", g.Minor)} {
			if !slices.Contains(have, want) {
				t.Errorf("/dev/%s missing in the container; /dev has %v", want, have)
			}
		}
		if slices.Contains(have, fmt.Sprintf("nvidia%d", other)) {
			t.Errorf("/dev/nvidia%d (a GPU the pod did not get) is in the container", other)
		}
	})

	t.Run("device cgroup", func(t *testing.T) {
		list := v.sh(t, ctx, id, "cat /sys/fs/cgroup/devices/devices.list")
		for _, rule := range []string{fmt.Sprintf("c 195:%d rw", g.Minor), "c 195:255 rw", fmt.Sprintf("c %d:0 rw", harness.FakeUVMMajor)} {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(rule)).MatchString(list) {
				t.Errorf("devices.list lacks %q:\n%s", rule, list)
			}
		}
		if regexp.MustCompile(fmt.Sprintf(`(?m)^c 195:(%d|\*) `, other)).MatchString(list) {
			t.Errorf("devices.list allows 195:%d, a GPU the pod did not get:\n%s", other, list)
		}
		// An allowed fake node opens as far as the missing driver (ENXIO);
		// the other GPU's, made by hand, is refused by the cgroup (EPERM).
		res, err := v.c.Exec(ctx, id, "cat", fmt.Sprintf("/dev/nvidia%d", g.Minor))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(res.Stderr, "No such device or address") {
			t.Errorf("opening the pod's GPU node: exit %d, stderr %q; want ENXIO (allowed, no driver)", res.ExitCode, res.Stderr)
		}
		res, err = v.c.Exec(ctx, id, "/bin/sh", "-c", fmt.Sprintf("mknod /tmp/other c 195 %d && cat /tmp/other", other))
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Operation not permitted") {
			t.Errorf("opening another GPU's node: exit %d, stderr %q; want EPERM", res.ExitCode, res.Stderr)
		}
	})

	t.Run("preload", func(t *testing.T) {
		if got := v.sh(t, ctx, id, "cat /etc/ld.so.preload"); strings.TrimSpace(got) != shimInContainer {
			t.Errorf("/etc/ld.so.preload = %q, want %q", got, shimInContainer)
		}
		v.sh(t, ctx, id, "test -s "+shimInContainer)
		for _, p := range []string{"/etc/ld.so.preload", shimInContainer} {
			res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", "echo x >> "+p)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
				t.Errorf("writing %s: exit %d, stderr %q; want a read-only mount", p, res.ExitCode, res.Stderr)
			}
		}
	})

	t.Run("limits", func(t *testing.T) {
		lf, err := limits.ParseLimits([]byte(v.sh(t, ctx, id, "cat "+limitsInContainer)))
		if err != nil {
			t.Fatal(err)
		}
		want := []limits.GPULimit{{UUID: g.UUID, Memory: sliceMemory, Cores: sliceCores}}
		if !slices.Equal(lf.GPUs, want) {
			t.Errorf("limits file GPUs = %+v, want %+v", lf.GPUs, want)
		}
		res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", "echo gpu.0.memory=0 >> "+limitsInContainer)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("the container could write its limits file")
		}
		if _, err := os.Stat(filepath.Join(v.hostContainerDir(id), "limits")); err != nil {
			t.Errorf("host copy of the limits file: %v", err)
		}
	})

	t.Run("region", func(t *testing.T) {
		v.sh(t, ctx, id, "test -d "+regionInContainer+" && touch "+regionInContainer+"/.probe && rm "+regionInContainer+"/.probe")
		// Before any process used a GPU: the empty region the host made,
		// root's, open to every user of the container, whole (280,896 bytes).
		if got := v.sh(t, ctx, id, "stat -c '%a %u %s' "+regionInContainer+"/usage"); got != "666 0 280896\n" {
			t.Errorf("usage region in the container: mode, owner, size %q; want the host's: 666 0 280896", got)
		}
	})
}

// TestPodWithoutGPUSeesNone: a pod that asked for no GPU, from an image that
// sets NVIDIA_VISIBLE_DEVICES=all, gets NVIDIA_VISIBLE_DEVICES=void and a
// device-cgroup rule denying every NVIDIA major (where containerd applies
// it), and no NVIDIA node.
func TestPodWithoutGPUSeesNone(t *testing.T) { forEachContainerd(t, testPodWithoutGPUSeesNone) }

func testPodWithoutGPUSeesNone(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	pod := gpuPod("no-gpu", 0)
	pod.Containers[0].Image = cudaLikeImage
	rp := v.mustRun(t, ctx, pod)
	id := rp.ContainerID("main")

	if got := strings.TrimSpace(v.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
	}
	if out := v.sh(t, ctx, id, "ls /dev"); strings.Contains(out, "nvidia") {
		t.Errorf("NVIDIA nodes in a pod without GPUs: %s", out)
	}
	spec := v.runtimeSpec(t, ctx, id)
	drops := dropsNRIDeviceRules(t, containerd)
	for _, major := range []int64{195, harness.FakeUVMMajor} {
		switch has := deviceRule(spec, false, major, -1); {
		case !drops && !has:
			t.Errorf("no device-cgroup rule denying major %d; rules: %s", major, deviceRules(spec))
		case drops && has:
			t.Errorf("containerd %s applied the rule denying major %d, which its NRI is known to drop: update dropsNRIDeviceRules", containerd, major)
		}
	}
	if drops {
		t.Logf("containerd %s drops the device-cgroup rules of NRI adjustments: only the device cgroup's default deny keeps NVIDIA nodes out", containerd)
	}
	res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", "mknod /tmp/gpu c 195 0 && cat /tmp/gpu")
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "Operation not permitted") {
		t.Errorf("opening a hand-made GPU node: exit %d, stderr %q; want EPERM", res.ExitCode, res.Stderr)
	}
	if _, err := os.Stat(v.hostContainerDir(id)); err == nil {
		t.Errorf("nri-vgpu keeps host state for a container without GPUs")
	}
}

// dropsNRIDeviceRules reports whether containerd version ignores the
// device-cgroup rules (Linux.Resources.Devices) of an NRI adjustment: the
// NRI of containerd 1.7 to 2.1 (v0.8.0) does not apply them, and nothing
// says so; from 2.2 (NRI v0.10.0) they are applied.
func dropsNRIDeviceRules(t *testing.T, version string) bool {
	t.Helper()
	var major, minor, patch int
	if _, err := fmt.Sscanf(version, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("containerd version %q: %v", version, err)
	}
	return major < 2 || major == 2 && minor < 2
}

func deviceRules(spec *specs.Spec) string {
	if spec.Linux == nil || spec.Linux.Resources == nil {
		return "none"
	}
	b, _ := json.Marshal(spec.Linux.Resources.Devices)
	return string(b)
}

// TestForgedAllocationIsRejected: an allocation annotation that the device
// plugin did not issue for this pod fails container creation with a message
// naming the reason, and no container is left.
func TestForgedAllocationIsRejected(t *testing.T) {
	forEachContainerd(t, testForgedAllocationIsRejected)
}

func testForgedAllocationIsRejected(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	victim := v.mustRun(t, ctx, gpuPod("victim", 1))
	issued := victim.Containers["main"].Config.Annotations[allocationAnnotation]
	a := v.allocationOf(t, victim, "main")

	key, err := allockey.Load(v.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(k allocation.Key, mutate func(*allocation.Allocation)) string {
		t.Helper()
		b := *a
		b.GPUs = slices.Clone(a.GPUs)
		id, err := allocation.NewID()
		if err != nil {
			t.Fatal(err)
		}
		b.ID = id
		mutate(&b)
		s, err := allocation.Sign(k, &b)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var otherKey allocation.Key
	otherKey[0] = 1

	tests := []struct {
		name, value, reason string
	}{
		{"garbage", "not-an-allocation", "malformed"},
		{"other key", sign(otherKey, func(*allocation.Allocation) {}), "bad MAC"},
		{"tampered payload", tamper(t, issued), "bad MAC"},
		{"unknown GPU", sign(key, func(b *allocation.Allocation) { b.GPUs[0].UUID = "GPU-00000000-0000-4000-8000-00000000dead" }), "unknown GPU GPU-00000000-0000-4000-8000-00000000dead"},
		{"replayed from another pod", issued, "already bound to pod " + victim.Pod.UID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := gpuPod("forged", 0)
			pod.Containers[0].ExtraAnnotations = map[string]string{allocationAnnotation: tt.value}
			rp, err := v.run(t, ctx, pod)
			if err == nil {
				t.Fatalf("a container with a %s allocation was created", tt.name)
			}
			if !strings.Contains(err.Error(), "nri-vgpu: allocation rejected") || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("creation error = %v\nwant one with %q and %q", err, "nri-vgpu: allocation rejected", tt.reason)
			}
			if rp != nil && rp.SandboxID != "" {
				list, lerr := v.c.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{
					Filter: &runtimeapi.ContainerFilter{PodSandboxId: rp.SandboxID}})
				if lerr != nil {
					t.Fatal(lerr)
				}
				if len(list.Containers) != 0 {
					t.Errorf("%d containers left in the pod after a rejected creation", len(list.Containers))
				}
			}
		})
	}
}

// tamper changes one byte of the payload of a signed annotation (keeping
// it valid base64url), so that its MAC no longer matches.
func tamper(t *testing.T, value string) string {
	t.Helper()
	payload, mac, ok := strings.Cut(value, ".")
	if !ok || len(payload) < 10 {
		t.Fatalf("annotation %q is not payload.mac", value)
	}
	b := []byte(payload)
	if b[5] == 'A' {
		b[5] = 'B'
	} else {
		b[5] = 'A'
	}
	return string(b) + "." + mac
}

// TestRemovingPodRemovesHostState: once a vGPU pod is removed, its host
// directory is gone and its slice is free again.
func TestRemovingPodRemovesHostState(t *testing.T) {
	forEachContainerd(t, testRemovingPodRemovesHostState)
}

func testRemovingPodRemovesHostState(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 3*time.Minute)
	rp := v.mustRun(t, ctx, gpuPod("short-lived", 2))
	dir := v.hostContainerDir(rp.ContainerID("main"))
	if _, err := os.Stat(filepath.Join(dir, "limits")); err != nil {
		t.Fatalf("host state of a running vGPU container: %v", err)
	}
	if err := v.kubelet.KillPod(ctx, v.c.Runtime, rp); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 10*time.Second, func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	}); err != nil {
		t.Errorf("%s still exists after the pod was removed", dir)
	}
	for _, d := range v.kubelet.Devices(resourceName) {
		if d.PodUID != "" {
			t.Errorf("slice %s still held by %s", d.ID, d.PodUID)
		}
	}
}

// TestRestarts: restarting nri-vgpu, and restarting containerd, lose
// nothing: running pods keep their limits and host state, an annotation in
// use stays bound to its pod, and new pods get their slices.
func TestRestarts(t *testing.T) { forEachContainerd(t, testRestarts) }

func testRestarts(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{})
	ctx := testContext(t, 5*time.Minute)
	before := v.mustRun(t, ctx, gpuPod("before", 1))
	id := before.ContainerID("main")
	issued := before.Containers["main"].Config.Annotations[allocationAnnotation]
	limitsBefore := v.sh(t, ctx, id, "cat "+limitsInContainer)

	check := func(t *testing.T, stage string) {
		t.Helper()
		if got := v.sh(t, ctx, id, "cat "+limitsInContainer); got != limitsBefore {
			t.Errorf("%s: limits of the running pod changed:\n%s\nwas:\n%s", stage, got, limitsBefore)
		}
		if _, err := os.Stat(filepath.Join(v.hostContainerDir(id), "limits")); err != nil {
			t.Errorf("%s: host state of the running pod: %v", stage, err)
		}
		replay := gpuPod("replay", 0)
		replay.Containers[0].ExtraAnnotations = map[string]string{allocationAnnotation: issued}
		if _, err := v.run(t, ctx, replay); err == nil || !strings.Contains(err.Error(), "already bound to pod "+before.Pod.UID) {
			t.Errorf("%s: replaying the running pod's allocation: error = %v, want a rejection naming pod %s", stage, err, before.Pod.UID)
		}
		after := v.mustRun(t, ctx, gpuPod("after", 1))
		if _, err := limits.ParseLimits([]byte(v.sh(t, ctx, after.ContainerID("main"), "cat "+limitsInContainer))); err != nil {
			t.Errorf("%s: limits of a new pod: %v", stage, err)
		}
		if err := v.kubelet.KillPod(ctx, v.c.Runtime, after); err != nil {
			t.Error(err)
		}
	}

	t.Run("nri-vgpu", func(t *testing.T) {
		pids := processesOf(binaries.nriPlugin)
		if len(pids) != 1 {
			t.Fatalf("want one nri-vgpu process, found %v", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(ctx, 10*time.Second, func() bool { return len(processesOf(binaries.nriPlugin)) == 0 }); err != nil {
			t.Fatal("nri-vgpu did not exit on SIGTERM")
		}
		// Started again, as systemd would: an external plugin on the NRI
		// socket of the config file.
		startExternalNRIPlugin(t, v)
		v.waitNRIReady(t, ctx)
		check(t, "after restarting nri-vgpu")
	})

	t.Run("containerd", func(t *testing.T) {
		if err := v.c.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		v.waitNRIReady(t, ctx)
		check(t, "after restarting containerd")
	})
}

// startExternalNRIPlugin runs nri-vgpu as an external plugin (it connects to
// nri.socket_path of the config), stopped when t ends.
func startExternalNRIPlugin(t *testing.T, v *vgpu) {
	t.Helper()
	logPath := filepath.Join(filepath.Dir(v.configPath), "nri-vgpu-external.log")
	cmd := exec.Command(binaries.nriPlugin)
	cmd.Env = append(os.Environ(), "NRI_VGPU_CONFIG="+v.configPath)
	p, err := harness.StartProcess(cmd, logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// One that outlasts SIGTERM is killed: how it stops is not what
		// this test checks.
		_ = p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("external nri-vgpu log (tail):\n%s", harness.Tail(logPath, 40))
		}
	})
}

// waitNRIReady waits until nri-vgpu acts on new containers again: a probe
// pod without GPUs gets NVIDIA_VISIBLE_DEVICES=void only once the plugin is
// synchronized.
func (v *vgpu) waitNRIReady(t *testing.T, ctx context.Context) {
	t.Helper()
	err := waitFor(ctx, 30*time.Second, func() bool {
		rp, err := v.kubelet.RunPod(ctx, v.c.Runtime, gpuPod("probe", 0))
		defer func() { _ = v.kubelet.KillPod(ctx, v.c.Runtime, rp) }()
		if err != nil {
			return false
		}
		res, err := v.c.Exec(ctx, rp.ContainerID("main"), "/bin/sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
		return err == nil && strings.TrimSpace(res.Stdout) == "void"
	})
	if err != nil {
		t.Fatal("nri-vgpu did not come back (probe pods are not edited)")
	}
}

// processesOf returns the PIDs of processes running the executable exe.
func processesOf(exe string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && target == exe {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFor polls cond every 100 ms for up to d.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
