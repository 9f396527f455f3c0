//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// The node's GPU in MIG mode, which another plugin serves: its minor, the
// MIG device's capability node (a dynamic major with no driver behind it
// here, so an allowed open fails with ENXIO) and the resource NVIDIA's
// device plugin names it by.
const (
	migGPUUUID    = "GPU-e2e00000-0000-4000-8000-00000000000f"
	migGPUMinor   = 2
	migCapsMajor  = 240
	migCapsMinor  = 21
	migResource   = "nvidia.com/mig-1g.18gb"
	migDeviceID   = "MIG-e2e00000-0000-4000-8000-0000000000a1"
	migPluginSock = "nvidia-mig.sock"
	migCDIDevice  = "nvidia.com/mig=e2e-0"
)

// migCDISpec is the CDI spec of the MIG device: its capability node.
const migCDISpec = `cdiVersion: "0.6.0"
kind: nvidia.com/mig
devices:
- name: e2e-0
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia-caps/nvidia-cap%d
      hostPath: %s
      permissions: rw
`

// migPlugin is the second device plugin of the node, in the part that
// matters here: it serves one MIG device of the GPU in MIG mode and its
// Allocate answers as NVIDIA's device plugin does: device specs for the
// parent GPU's node and the control node, a CDI device (resolved by
// containerd from its CDI spec directory) for the MIG device's capability
// node, and its NVIDIA_VISIBLE_DEVICES.
type migPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devRoot string
}

func (p *migPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *migPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: migDeviceID, Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *migPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.GetContainerRequests() {
		var specs []*pluginapi.DeviceSpec
		for _, n := range []string{"nvidiactl", fmt.Sprintf("nvidia%d", migGPUMinor)} {
			specs = append(specs, &pluginapi.DeviceSpec{HostPath: filepath.Join(p.devRoot, "dev", n), ContainerPath: "/dev/" + n, Permissions: "rw"})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Devices:    specs,
			CdiDevices: []*pluginapi.CDIDevice{{Name: migCDIDevice}},
			Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": migDeviceID},
		})
	}
	return resp, nil
}

// startMIGPlugin makes the MIG GPU's nodes under the node's dev root and
// its CDI spec in containerd's CDI directory, serves migPlugin in the
// kubelet's device-plugin directory and registers it with the kubelet
// listening there.
func startMIGPlugin(t *testing.T, ctx context.Context, v *vgpu) {
	t.Helper()
	caps := filepath.Join(v.devRoot, "dev", "nvidia-caps")
	if err := os.MkdirAll(caps, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		path         string
		major, minor uint32
	}{
		{filepath.Join(v.devRoot, "dev", fmt.Sprintf("nvidia%d", migGPUMinor)), harness.NVIDIAMajor, migGPUMinor},
		{filepath.Join(caps, fmt.Sprintf("nvidia-cap%d", migCapsMinor)), migCapsMajor, migCapsMinor},
	} {
		if err := unix.Mknod(n.path, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Fatalf("mknod %s: %v", n.path, err)
		}
		if err := os.Chmod(n.path, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	capNode := filepath.Join(caps, fmt.Sprintf("nvidia-cap%d", migCapsMinor))
	if err := os.WriteFile(filepath.Join(v.c.Dir, "cdi", "nvidia-mig.yaml"), []byte(fmt.Sprintf(migCDISpec, migCapsMinor, capNode)), 0o644); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(v.socketDir, migPluginSock))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &migPlugin{devRoot: v.devRoot})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(v.socketDir, kubeletsim.SocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: migPluginSock, ResourceName: migResource,
	}); err != nil {
		t.Fatalf("registering the MIG device plugin: %v", err)
	}
}

// TestNextToAMIGDevicePlugin: a node whose third GPU is in MIG mode, served
// by a second device plugin. nri-vgpu's device plugin advertises only the
// other two GPUs and status lists the third as served elsewhere; a pod
// given a MIG device by the other plugin keeps its nodes while
// hide_unrequested is on, and a tenant pod whose spec sets
// NVIDIA_VISIBLE_DEVICES=all gets no GPU, not even a node it makes itself.
func TestNextToAMIGDevicePlugin(t *testing.T) {
	forEachContainerd(t, testNextToAMIGDevicePlugin)
}

func testNextToAMIGDevicePlugin(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{extraConfig: fmt.Sprintf(
		"\n[[gpu.simulated]]\nuuid = %q\nname = \"NVIDIA H200\"\nmemory = %d\nminor = %d\nmig = true\n",
		migGPUUUID, uint64(141<<30), migGPUMinor)})
	ctx := testContext(t, 4*time.Minute)
	startMIGPlugin(t, ctx, v)
	if err := v.kubelet.WaitForDevices(ctx, migResource, 1); err != nil {
		t.Fatal(err)
	}

	t.Run("device plugin leaves the MIG GPU out", func(t *testing.T) {
		devs := v.kubelet.Devices(resourceName)
		if len(devs) != splitCount*len(testGPUs) {
			t.Errorf("%d devices advertised, want %d", len(devs), splitCount*len(testGPUs))
		}
		for _, d := range devs {
			if strings.HasPrefix(d.ID, migGPUUUID) {
				t.Errorf("slice %s of the GPU in MIG mode advertised", d.ID)
			}
		}
	})

	t.Run("status shows the MIG GPU served elsewhere", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, binaries.nriPlugin, "--config", v.configPath, "status").CombinedOutput()
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		want := fmt.Sprintf("GPU 2  %s  NVIDIA H200  141GiB  served elsewhere (MIG mode): not shared by nri-vgpu", migGPUUUID)
		if !strings.Contains(string(out), want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
		for _, g := range testGPUs {
			if !strings.Contains(string(out), g.UUID+"  "+g.Name) {
				t.Errorf("status lacks GPU %s:\n%s", g.UUID, out)
			}
		}
	})

	migPod := gpuPod("mig-user", 0)
	migPod.Containers[0].Limits = map[string]int{migResource: 1}
	mig := v.mustRun(t, ctx, migPod)
	tenantPod := gpuPod("tenant", 0)
	tenantPod.Containers[0].Env = []kubeletsim.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	tenant := v.mustRun(t, ctx, tenantPod)

	// open says how opening a node ends: ENXIO once the device cgroup lets
	// it through (no driver behind it), EPERM when it denies it.
	open := func(t *testing.T, id, path string) string {
		t.Helper()
		res, err := v.c.Exec(ctx, id, "cat", path)
		if err != nil {
			t.Fatal(err)
		}
		return res.Stderr
	}
	// ownNode makes a node in the container itself (a default pod may
	// mknod) and opens it: what the device cgroup allows, whatever the
	// spec's device list holds.
	ownNode := func(t *testing.T, id string, major, minor int) string {
		t.Helper()
		res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", fmt.Sprintf("mknod /tmp/n%d-%d c %d %d && cat /tmp/n%d-%d", major, minor, major, minor, major, minor))
		if err != nil {
			t.Fatal(err)
		}
		return res.Stderr
	}
	const allowed, denied = "No such device or address", "Operation not permitted"
	deniesHold := !dropsNRIDeviceRules(t, containerd)

	t.Run("MIG pod keeps its device", func(t *testing.T) {
		id := mig.ContainerID("main")
		for _, p := range []string{"/dev/nvidiactl", fmt.Sprintf("/dev/nvidia%d", migGPUMinor), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", migCapsMinor)} {
			if got := open(t, id, p); !strings.Contains(got, allowed) {
				t.Errorf("opening %s: %q; want ENXIO (the other plugin's grant, kept)", p, got)
			}
		}
		if got := strings.TrimSpace(v.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void (an environment grant is not honoured)", got)
		}
		if out := v.sh(t, ctx, id, "ls /dev"); strings.Contains(out, "nvidia0") || strings.Contains(out, "nvidia1") {
			t.Errorf("the MIG pod sees nri-vgpu's GPUs: %s", out)
		}
		if deniesHold {
			for _, g := range testGPUs {
				if got := ownNode(t, id, harness.NVIDIAMajor, g.Minor); !strings.Contains(got, denied) {
					t.Errorf("the MIG pod opening a node of GPU %d it made: %q; want EPERM", g.Minor, got)
				}
			}
		}
	})

	t.Run("tenant with NVIDIA_VISIBLE_DEVICES=all gets no GPU", func(t *testing.T) {
		id := tenant.ContainerID("main")
		if got := strings.TrimSpace(v.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
		}
		if out := v.sh(t, ctx, id, "ls /dev"); strings.Contains(out, "nvidia") {
			t.Errorf("the tenant has NVIDIA nodes: %s", out)
		}
		if !deniesHold {
			t.Logf("containerd %s drops NRI's device rules: only the default device cgroup holds", containerd)
		}
		for _, mm := range [][2]int{{harness.NVIDIAMajor, 0}, {harness.NVIDIAMajor, migGPUMinor}, {harness.NVIDIAMajor, 255}, {migCapsMajor, migCapsMinor}} {
			if got := ownNode(t, id, mm[0], mm[1]); !strings.Contains(got, denied) {
				t.Errorf("the tenant opening %d:%d it made: %q; want EPERM", mm[0], mm[1], got)
			}
		}
	})
}

// TestPodCDIAnnotationIsRemoved: where the runtime copies pod annotations
// into the container's spec (pod_annotations), a CDI request the tenant
// wrote on its pod is removed before a CDI-mode runtime could act on it; the
// pod's other annotations still pass.
func TestPodCDIAnnotationIsRemoved(t *testing.T) {
	forEachContainerd(t, testPodCDIAnnotationIsRemoved)
}

func testPodCDIAnnotationIsRemoved(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{containerd: harness.Options{PodAnnotations: []string{"*/*"}}})
	ctx := testContext(t, 3*time.Minute)
	const key = "cdi.k8s.io/tenant"
	for _, n := range []int{0, 1} {
		pod := gpuPod(fmt.Sprintf("cdi-%d", n), n)
		pod.Annotations = map[string]string{key: "nvidia.com/gpu=all", "example.com/team": "ml"}
		rp := v.mustRun(t, ctx, pod)
		ann := v.runtimeSpec(t, ctx, rp.ContainerID("main")).Annotations
		if ann["example.com/team"] != "ml" {
			t.Fatalf("pod annotations are not passed through (%v): the test would prove nothing", ann)
		}
		if got, ok := ann[key]; ok {
			t.Errorf("pod asking for %d slices: the container's spec keeps %s = %q", n, key, got)
		}
	}
}

// TestClusterNextToAMIGDevicePlugin is TestNextToAMIGDevicePlugin's pods on
// a real kubelet and scheduler: the pod asking for the MIG resource keeps
// the nodes the second plugin gives it, the tenant whose spec sets
// NVIDIA_VISIBLE_DEVICES=all gets none, and the node's nvidia.com/gpu
// capacity holds no slice of the GPU in MIG mode.
func TestClusterNextToAMIGDevicePlugin(t *testing.T) {
	forEachKubernetes(t, testClusterNextToAMIGDevicePlugin)
}

func testClusterNextToAMIGDevicePlugin(t *testing.T, version string) {
	n := startClusterNode(t, version, vgpuOptions{extraConfig: fmt.Sprintf(
		"\n[[gpu.simulated]]\nuuid = %q\nname = \"NVIDIA H200\"\nmemory = %d\nminor = %d\nmig = true\n",
		migGPUUUID, uint64(141<<30), migGPUMinor)})
	ctx := testContext(t, 6*time.Minute)
	total := int64(splitCount * len(testGPUs))
	if capacity := n.waitAllocatable(t, ctx, total); capacity != total {
		t.Errorf("capacity %s = %d, want %d (no slice of the GPU in MIG mode)", resourceName, capacity, total)
	}
	startMIGPlugin(t, ctx, n.vgpu)
	if err := waitFor(ctx, 60*time.Second, func() bool {
		node, err := n.k.Client.CoreV1().Nodes().Get(ctx, n.k.NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := node.Status.Allocatable[migResource]
		return q.Value() == 1
	}); err != nil {
		t.Fatalf("the node never had one %s allocatable", migResource)
	}

	migPod := podSpec("mig-user", harness.BusyboxImage, 0)
	migPod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{migResource: *resource.NewQuantity(1, resource.DecimalSI)}
	migID := n.runPod(t, ctx, migPod)
	tenantPod := podSpec("tenant", harness.BusyboxImage, 0)
	tenantPod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	tenantID := n.runPod(t, ctx, tenantPod)

	stderrOf := func(t *testing.T, id string, script string) string {
		t.Helper()
		res, err := n.c.Exec(ctx, id, "/bin/sh", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		return res.Stderr
	}
	const allowed, denied = "No such device or address", "Operation not permitted"
	t.Run("MIG pod keeps its device", func(t *testing.T) {
		for _, p := range []string{"/dev/nvidiactl", fmt.Sprintf("/dev/nvidia%d", migGPUMinor), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", migCapsMinor)} {
			if got := stderrOf(t, migID, "cat "+p); !strings.Contains(got, allowed) {
				t.Errorf("opening %s: %q; want ENXIO (the other plugin's grant, kept)", p, got)
			}
		}
		if got := strings.TrimSpace(n.sh(t, ctx, migID, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
		}
		for _, g := range testGPUs {
			if got := stderrOf(t, migID, fmt.Sprintf("mknod /tmp/g%d c 195 %d && cat /tmp/g%d", g.Minor, g.Minor, g.Minor)); !strings.Contains(got, denied) {
				t.Errorf("the MIG pod opening a node of GPU %d it made: %q; want EPERM", g.Minor, got)
			}
		}
	})
	t.Run("tenant with NVIDIA_VISIBLE_DEVICES=all gets no GPU", func(t *testing.T) {
		if got := strings.TrimSpace(n.sh(t, ctx, tenantID, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
		}
		if out := n.sh(t, ctx, tenantID, "ls /dev"); strings.Contains(out, "nvidia") {
			t.Errorf("the tenant has NVIDIA nodes: %s", out)
		}
		for _, mm := range [][2]int{{195, 0}, {195, migGPUMinor}, {migCapsMajor, migCapsMinor}} {
			if got := stderrOf(t, tenantID, fmt.Sprintf("mknod /tmp/n c %d %d; cat /tmp/n; rm -f /tmp/n", mm[0], mm[1])); !strings.Contains(got, denied) {
				t.Errorf("the tenant opening %d:%d it made: %q; want EPERM", mm[0], mm[1], got)
			}
		}
	})
}
