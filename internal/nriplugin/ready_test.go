package nriplugin

import (
	"strings"
	"testing"
	"time"
)

// waitReady polls p.Ready until it reports want (nil or not) and returns its
// last answer; the connection state changes on the plugin's goroutines.
func waitReady(t *testing.T, p *Plugin, want bool) error {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := p.Ready()
		if (err == nil) == want || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Ready follows the connection to the runtime: not ready before the first
// synchronization, ready after it, not ready once containerd goes away
// (naming the socket it dials), ready again after it reconnected.
func TestReadyFollowsTheConnection(t *testing.T) {
	cfg := newConfig(t)
	backend := cfg.NRI.SocketPath + ".runtime"
	px := startProxy(t, cfg.NRI.SocketPath, backend)
	h := newHarnessOn(t, cfg, backend)
	if err := h.plugin.Ready(); err != nil {
		t.Fatalf("connected and synchronized: Ready = %v, want nil", err)
	}

	h.r.Stop()
	px.dropAll()
	err := waitReady(t, h.plugin, false)
	if err == nil {
		t.Fatal("runtime gone: Ready = nil, want an error")
	}
	if !strings.Contains(err.Error(), cfg.NRI.SocketPath) {
		t.Errorf("Ready = %q, want it to name the socket %s", err, cfg.NRI.SocketPath)
	}

	h.startRuntime()
	h.waitSynced()
	if err := waitReady(t, h.plugin, true); err != nil {
		t.Errorf("reconnected: Ready = %v, want nil", err)
	}
}

// A plugin that never connected is not ready.
func TestReadyBeforeConnecting(t *testing.T) {
	h := newHarness(t, newConfig(t))
	p, err := New(Options{Config: h.cfg, Key: h.key, Host: h.plugin.host, Inventory: NewBackendInventory(h.cfg), Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ready(); err == nil {
		t.Error("never connected: Ready = nil, want an error")
	}
}
