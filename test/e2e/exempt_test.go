//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// operatorNamespace is the namespace the GPU Operator is installed into.
const operatorNamespace = "gpu-operator"

// TestExemptMonitoringPodNextToTenants: with [[nri.exempt]] namespace =
// "gpu-operator", a monitoring pod there (dcgm-exporter: image with
// NVIDIA_VISIBLE_DEVICES=all, every GPU node given to it as the NVIDIA
// runtime would) keeps every GPU, unedited; a tenant pod with the same
// image in another namespace sees none, not even a GPU node it makes
// itself (device nodes in its spec would be another plugin's grant, kept:
// TestNextToAMIGDevicePlugin); a tenant GPU pod on the same node is still
// held to its slice.
func TestExemptMonitoringPodNextToTenants(t *testing.T) {
	forEachContainerd(t, testExemptMonitoringPodNextToTenants)
}

func testExemptMonitoringPodNextToTenants(t *testing.T, containerd string) {
	v := startVGPU(t, containerd, vgpuOptions{extraConfig: fmt.Sprintf("\n[[nri.exempt]]\nnamespace = %q\n", operatorNamespace)})
	ctx := testContext(t, 4*time.Minute)
	allGPUs := func(name, namespace string) *kubeletsim.Pod {
		pod := gpuPod(name, 0)
		pod.Namespace = namespace
		c := &pod.Containers[0]
		c.Image = cudaLikeImage
		nodes := []string{"nvidiactl"}
		for _, g := range testGPUs {
			nodes = append(nodes, fmt.Sprintf("nvidia%d", g.Minor))
		}
		for _, n := range nodes {
			c.Devices = append(c.Devices, kubeletsim.DeviceMapping{HostPath: filepath.Join(v.devRoot, "dev", n), ContainerPath: "/dev/" + n, Permissions: "rw"})
		}
		return pod
	}
	monitor := v.mustRun(t, ctx, allGPUs("dcgm-exporter", operatorNamespace))
	tenantPod := gpuPod("tenant", 0)
	tenantPod.Containers[0].Image = cudaLikeImage
	tenant := v.mustRun(t, ctx, tenantPod)
	limited := v.mustRun(t, ctx, gpuPod("tenant-gpu", 1))

	// open says how opening a fake GPU node ends: ENXIO once the device
	// cgroup lets it through (no driver behind it), EPERM when it denies it.
	open := func(id string, minor int) string {
		t.Helper()
		res, err := v.c.Exec(ctx, id, "cat", fmt.Sprintf("/dev/nvidia%d", minor))
		if err != nil {
			t.Fatal(err)
		}
		return res.Stderr
	}

	t.Run("monitoring pod keeps every GPU", func(t *testing.T) {
		id := monitor.ContainerID("main")
		if got := strings.TrimSpace(v.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "all" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want all (the image's)", got)
		}
		for _, g := range testGPUs {
			if got := open(id, g.Minor); !strings.Contains(got, "No such device or address") {
				t.Errorf("opening /dev/nvidia%d: %q; want ENXIO (allowed, no driver)", g.Minor, got)
			}
		}
		if out := v.sh(t, ctx, id, "test -e /etc/ld.so.preload && echo preload || echo none"); strings.TrimSpace(out) != "none" {
			t.Errorf("the exempt container got /etc/ld.so.preload")
		}
		spec := v.runtimeSpec(t, ctx, id)
		if deviceRule(spec, false, 195, -1) {
			t.Errorf("the exempt container got a rule denying the GPUs: %s", deviceRules(spec))
		}
	})

	t.Run("tenant pod sees none", func(t *testing.T) {
		id := tenant.ContainerID("main")
		if got := strings.TrimSpace(v.sh(t, ctx, id, "echo $NVIDIA_VISIBLE_DEVICES")); got != "void" {
			t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", got)
		}
		if out := v.sh(t, ctx, id, "ls /dev"); strings.Contains(out, "nvidia") {
			t.Errorf("the tenant has NVIDIA nodes: %s", out)
		}
		for _, g := range testGPUs {
			res, err := v.c.Exec(ctx, id, "/bin/sh", "-c", fmt.Sprintf("mknod /tmp/gpu%d c 195 %d && cat /tmp/gpu%d", g.Minor, g.Minor, g.Minor))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(res.Stderr, "Operation not permitted") {
				t.Errorf("opening a node of GPU %d the tenant made: %q; want EPERM (denied)", g.Minor, res.Stderr)
			}
		}
	})

	t.Run("tenant GPU pod is limited", func(t *testing.T) {
		id := limited.ContainerID("main")
		a := v.allocationOf(t, limited, "main")
		lf, err := limits.ParseLimits([]byte(v.sh(t, ctx, id, "cat "+limitsInContainer)))
		if err != nil {
			t.Fatal(err)
		}
		want := []limits.GPULimit{{UUID: a.GPUs[0].UUID, Memory: sliceMemory, Cores: sliceCores}}
		if !slices.Equal(lf.GPUs, want) {
			t.Errorf("limits file GPUs = %+v, want %+v", lf.GPUs, want)
		}
		if got := strings.TrimSpace(v.sh(t, ctx, id, "cat /etc/ld.so.preload")); got != shimInContainer {
			t.Errorf("/etc/ld.so.preload = %q, want %q", got, shimInContainer)
		}
	})
}
