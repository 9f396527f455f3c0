package nriplugin

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// monitoring is a container of a dcgm-exporter-like pod as nri-vgpu sees
// it: its image's NVIDIA_VISIBLE_DEVICES=all and allow rules for the GPU
// nodes, no allocation of ours. The nodes themselves are not in its spec:
// there they would be another plugin's grant, which is kept (see
// TestGrantedDevicesAreKept); the NVIDIA runtime adds them after NRI.
func monitoring(id string, p *api.PodSandbox) *api.Container {
	c := container(id, p, "")
	for minor := int64(0); minor <= 1; minor++ {
		c.Linux.Resources.Devices = append(c.Linux.Resources.Devices,
			&api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(int64(195)), Minor: api.Int64(minor), Access: "rw"})
	}
	return c
}

// Containers without an allocation in pods that an nri.exempt entry matches
// are left exactly as they came; every other pod's are hidden.
func TestExemptPodsKeepTheirGPUs(t *testing.T) {
	exempt := []config.Exemption{
		{Namespace: "gpu-operator"},
		{Namespace: "monitoring", RuntimeHandler: "nvidia"},
		{RuntimeHandler: "nvidia-agents"},
	}
	tests := []struct {
		name, namespace, handler string
		exempt                   bool
	}{
		{"exempt namespace", "gpu-operator", "", true},
		{"exempt namespace, any handler", "gpu-operator", "nvidia", true},
		{"namespace and handler both match", "monitoring", "nvidia", true},
		{"namespace matches, handler does not", "monitoring", "", false},
		{"handler matches, namespace does not", "ml", "nvidia", false},
		{"exempt handler in a tenant namespace", "ml", "nvidia-agents", true},
		{"namespace that only starts like an exempt one", "gpu-operator-x", "", false},
		{"tenant", "ml", "", false},
	}
	cfg := newConfig(t)
	cfg.NRI.Exempt = exempt
	h := newHarness(t, cfg)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pod(fmt.Sprintf("sb%d", i), fmt.Sprintf("uid-%d", i))
			p.Namespace, p.RuntimeHandler = tt.namespace, tt.handler
			c := monitoring(fmt.Sprintf("mon%d", i), p)
			adj, err := h.create(p, c)
			if err != nil {
				t.Fatal(err)
			}
			s := specFor(t, adj)
			for _, d := range c.Linux.Devices {
				s.Linux.Devices = append(s.Linux.Devices, d.ToOCI())
			}
			// The container's own allow rules come before the plugin's.
			own := c.Linux.Resources.ToOCI().Devices
			s.Linux.Resources.Devices = append(own, s.Linux.Resources.Devices[2:]...)
			env := envOf(s, oci.EnvVisibleDevices)
			gpu := access(t, s, 195, 1)
			if tt.exempt {
				if adj != nil && (len(adj.GetEnv()) != 0 || len(adj.GetLinux().GetResources().GetDevices()) != 0 || len(adj.GetMounts()) != 0 || len(adj.GetLinux().GetDevices()) != 0) {
					t.Errorf("exempt container adjusted: %v", adj)
				}
				if env != "all" || gpu != "rw" {
					t.Errorf("exempt container: %s = %q, access to 195:1 = %q; want all and rw", oci.EnvVisibleDevices, env, gpu)
				}
				return
			}
			if env != "void" || strings.ContainsAny(gpu, "rw") {
				t.Errorf("container of a pod that is not exempt: %s = %q, access to 195:1 = %q; want void and none", oci.EnvVisibleDevices, env, gpu)
			}
		})
	}
}

// An exemption covers containers that asked nri-vgpu for nothing: a
// container of an exempt pod that holds an allocation gets its slices with
// every edit and loses the gate, and an allocation in the pod's own
// annotations is refused there as anywhere.
func TestExemptPodGPUContainerIsLimited(t *testing.T) {
	cfg := newConfig(t)
	cfg.NRI.Exempt = []config.Exemption{{Namespace: "gpu-operator"}}
	h := newHarness(t, cfg)
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	p.Namespace = "gpu-operator"
	adj, err := h.create(p, withGate(container("gpu", p, ann)))
	if err != nil {
		t.Fatal(err)
	}
	s := specFor(t, adj)
	if m, ok := mountAt(s, oci.ContainerPreloadPath); !ok || !strings.HasSuffix(m.Source, "ld.so.preload") {
		t.Errorf("GPU container of an exempt pod: no preload mount (%+v)", m)
	}
	if _, ok := mountAt(s, oci.ContainerLimitsPath); !ok {
		t.Error("GPU container of an exempt pod: no limits file")
	}
	if got := access(t, s, 195, 0); got != "rwm" {
		t.Errorf("access to its own GPU 195:0 = %q, want rwm", got)
	}
	if got := access(t, s, 195, 1); strings.ContainsAny(got, "rw") {
		t.Errorf("access to another GPU 195:1 = %q, want none", got)
	}
	if !removesGate(adj) {
		t.Errorf("adjustment %v does not remove the gate", adj.GetMounts())
	}
	if ids := recordIDs(h.cfg); len(ids) != 1 {
		t.Errorf("host directories = %v, want the GPU container's", ids)
	}

	forger := pod("sb2", "uid-2")
	forger.Namespace = "gpu-operator"
	forger.Annotations = map[string]string{allocation.AnnotationKey: ann}
	if _, err := h.create(forger, monitoring("forger", forger)); err == nil || !strings.Contains(err.Error(), "the pod's own annotations carry") {
		t.Errorf("exempt pod with an allocation in its own annotations: error = %v, want the pod-annotation rejection", err)
	}
}

// An allocation annotation that is there but empty is a malformed
// allocation, not a container that asked for no GPU: it fails, where an
// exempt pod's container without one would be left as it is.
func TestEmptyAllocationIsRejected(t *testing.T) {
	cfg := newConfig(t)
	cfg.NRI.Exempt = []config.Exemption{{Namespace: "ml"}}
	h := newHarness(t, cfg)
	p := pod("sb1", "uid-1")
	c := container("empty", p, "")
	c.Annotations[allocation.AnnotationKey] = ""
	_, err := h.create(p, c)
	if want := "nri-vgpu: allocation rejected: malformed"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("CreateContainer error = %v, want one containing %q", err, want)
	}
}
