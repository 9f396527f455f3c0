package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	fakedriver "github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// TestDaemonFakeNVMLHealth runs the daemon on the fake NVML of a fake
// driver root, against a fake kubelet: it says which health events each GPU
// accepted, ignores an application XID, and takes a GPU's slices away when
// the driver reports a critical XID on it.
func TestDaemonFakeNVMLHealth(t *testing.T) {
	gpus := []fakedriver.FakeGPU{
		{UUID: "GPU-5e1ec7ed-0000-4000-8000-00000000000a", Name: "NVIDIA H200", Memory: 140 << 30, SMs: 132, Minor: 0},
		{UUID: "GPU-5e1ec7ed-0000-4000-8000-00000000000b", Name: "NVIDIA H200", Memory: 140 << 30, SMs: 132, Minor: 1},
	}
	libDir, env := fakeDriverNode(t, gpus)
	dir := shortDir(t)
	xid := filepath.Join(dir, "xid")
	path := filepath.Join(dir, "config.toml")
	writeConfig(t, path, fmt.Sprintf("[device_plugin]\nsocket_dir = %q\nfeature_file = \"\"\nsplit_count = 2\n[paths]\nstate_dir = %q\n"+
		"[gpu]\nbackend = \"nvml\"\n[driver]\nlibrary_dirs = [%q]\n", dir, filepath.Join(dir, "state"), libDir))

	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	cmd := exec.Command(os.Args[0], "--config", path)
	// Double-bit ECC events are listed but the driver refuses them, as with
	// ECC turned off: only XIDs are watched.
	cmd.Env = append(env, "FAKECUDA_XID="+xid, "FAKECUDA_NVML_EVENT_TYPES=0xa", "FAKECUDA_NVML_REFUSE_EVENTS=0x2")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	reg, err := k.WaitRegistration(ctx)
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, out.String())
	}
	defer reg.Close()
	health := func(l []*pluginapi.Device, uuid string) (n int, healthy bool) {
		healthy = true
		for _, d := range l {
			if strings.HasPrefix(d.ID, uuid) {
				n++
				healthy = healthy && d.Health == pluginapi.Healthy
			}
		}
		return n, healthy
	}
	if _, err := reg.WaitList(ctx, func(l []*pluginapi.Device) bool {
		n0, h0 := health(l, gpus[0].UUID)
		n1, h1 := health(l, gpus[1].UUID)
		return n0 == 2 && n1 == 2 && h0 && h1
	}); err != nil {
		t.Fatalf("waiting for 2 healthy slices of each GPU: %v; output:\n%s", err, out.String())
	}
	// The registration lines come before the first wait; the list may come
	// before them.
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(20 * time.Millisecond) {
		ok := true
		for _, g := range gpus {
			ok = ok && strings.Contains(out.String(), `msg="health watch registered" gpu=`+g.UUID+
				` accepted=[xid_critical_error] unsupported=[double_bit_ecc_error]`)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no health registration line for each GPU; output:\n%s", out.String())
		}
	}

	// 43 is an application's fault: logged, the GPU stays. 79 (fallen off
	// the bus) is not.
	if err := os.WriteFile(xid, []byte(gpus[1].UUID+":43\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(waitTimeout); !strings.Contains(out.String(), `msg="ignoring application XID" xid=43`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("XID 43 not seen; output:\n%s", out.String())
		}
	}
	if err := os.WriteFile(xid, []byte(gpus[1].UUID+":79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := reg.WaitList(ctx, func(l []*pluginapi.Device) bool {
		_, h1 := health(l, gpus[1].UUID)
		return !h1
	})
	if err != nil {
		t.Fatalf("waiting for GPU 1 to turn unhealthy: %v; output:\n%s", err, out.String())
	}
	if n0, h0 := health(l, gpus[0].UUID); n0 != 2 || !h0 {
		t.Errorf("GPU 0: %d slices, healthy %v after an XID on GPU 1; want 2, healthy", n0, h0)
	}
	if n1, _ := health(l, gpus[1].UUID); n1 != 2 {
		t.Errorf("GPU 1: %d slices listed, want 2 (unhealthy)", n1)
	}
}
