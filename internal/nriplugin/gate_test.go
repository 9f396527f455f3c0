package nriplugin

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
)

// The device plugin's gate mount, as the kubelet passes it through CRI.
const gatePath = "/proc/nri-vgpu/container-not-prepared-by-the-nri-vgpu-plugin"

func withGate(c *api.Container) *api.Container {
	c.Mounts = append(c.Mounts, &api.Mount{Destination: gatePath, Source: "/dev/null", Type: "bind", Options: []string{"rbind", "ro"}})
	return c
}

func removesGate(adj *api.ContainerAdjustment) bool {
	for _, m := range adj.GetMounts() {
		if m.GetDestination() == "-"+gatePath {
			return true
		}
	}
	return false
}

// Every container nri-vgpu lets through loses the gate mount, whatever else
// it gets; one it refuses keeps failing.
func TestGateMountIsRemoved(t *testing.T) {
	cfg := newConfig(t)
	h := newHarness(t, cfg)
	ann, _ := sign(t, h.key, gpu0)

	p := pod("sb1", "uid-1")
	adj, err := h.create(p, withGate(container("gpu", p, ann)))
	if err != nil {
		t.Fatal(err)
	}
	if !removesGate(adj) {
		t.Errorf("GPU container: adjustment %v does not remove the gate", adj.GetMounts())
	}

	// A privileged container is left alone by hiding (nil adjustment from
	// there), but still loses the gate.
	priv := withGate(container("priv", p, ""))
	priv.Linux.Resources.Devices = []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
	adj, err = h.create(p, priv)
	if err != nil {
		t.Fatal(err)
	}
	if !removesGate(adj) {
		t.Errorf("privileged container: adjustment %v does not remove the gate", adj.GetMounts())
	}

	// No gate, no removal: NRI would refuse to remove what is not there.
	adj, err = h.create(p, container("plain", p, ""))
	if err != nil {
		t.Fatal(err)
	}
	if removesGate(adj) {
		t.Errorf("container without the gate: adjustment removes it: %v", adj.GetMounts())
	}

	// Refused: no adjustment at all, the creation fails.
	p2 := pod("sb2", "uid-2")
	if _, err := h.create(p2, withGate(container("thief", p2, ann))); err == nil {
		t.Error("a replayed allocation with the gate was accepted")
	}
}
