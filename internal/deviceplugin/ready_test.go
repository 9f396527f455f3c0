package deviceplugin

import (
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
)

// waitReady polls p.Ready until it reports want (nil or not) and returns its
// last answer; supervise updates it on its own goroutine.
func waitReady(t *testing.T, p *Plugin, want bool) error {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		err := p.Ready()
		if (err == nil) == want || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Ready follows the registration: not ready before Run, ready once the
// kubelet accepted it, not ready while kubelet.sock is gone (naming it),
// ready again after registering with the next kubelet, not ready after
// Run returned.
func TestReadyFollowsTheRegistration(t *testing.T) {
	cfg := testConfig(shortDir(t), simGPU(uuidA, "A", 8*gib, 0))
	if p, _ := newPlugin(t, cfg); p.Ready() == nil {
		t.Error("before Run: Ready = nil, want an error")
	}

	h := start(t, cfg)
	if err := waitReady(t, h.plugin, true); err != nil {
		t.Fatalf("registered: Ready = %v, want nil", err)
	}

	h.kubelet.Stop()
	err := waitReady(t, h.plugin, false)
	if err == nil {
		t.Fatal("kubelet gone: Ready = nil, want an error")
	}
	if !strings.Contains(err.Error(), KubeletSocketName) {
		t.Errorf("Ready = %q, want it to name %s", err, KubeletSocketName)
	}

	k2, err := kubelettest.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Stop)
	h.waitRegistration(k2)
	if err := waitReady(t, h.plugin, true); err != nil {
		t.Errorf("registered with the new kubelet: Ready = %v, want nil", err)
	}

	h.cancel()
	if err := waitReady(t, h.plugin, false); err == nil {
		t.Error("after Run returned: Ready = nil, want an error")
	}
}
