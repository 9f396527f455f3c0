package nriplugin

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

func i64(v int64) *int64 { return &v }

// specFor is the spec containerd would run: a CRI-like base with the
// adjustment applied by NRI's runtime-side code.
func specFor(t *testing.T, adj *api.ContainerAdjustment) *specs.Spec {
	t.Helper()
	s := &specs.Spec{
		Process: &specs.Process{Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
			{Allow: false, Access: "rwm"},
			{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},
		}}},
	}
	if err := ocitest.ApplyAdjustment(s, adj); err != nil {
		t.Fatalf("applying the adjustment: %v", err)
	}
	return s
}

func access(t *testing.T, s *specs.Spec, major, minor int64) string {
	t.Helper()
	p := ocitest.Probe{Type: "c", Major: major, Minor: minor}
	acc, err := ocitest.DeviceAccess(s.Linux.Resources.Devices, []ocitest.Probe{p})
	if err != nil {
		t.Fatalf("the runtime would refuse the device rules: %v", err)
	}
	return acc[p]
}

func envOf(s *specs.Spec, key string) string {
	for _, kv := range s.Process.Env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

func mountAt(s *specs.Spec, dst string) (specs.Mount, bool) {
	for _, m := range s.Mounts {
		if m.Destination == dst {
			return m, true
		}
	}
	return specs.Mount{}, false
}

func TestGPUContainerGetsEveryEdit(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0, gpu1)
	p := pod("sb1", "uid-1")
	adj, err := h.create(p, container("c1", p, ann))
	if err != nil {
		t.Fatal(err)
	}
	s := specFor(t, adj)

	devs := map[string]specs.LinuxDevice{}
	for _, d := range s.Linux.Devices {
		devs[d.Path] = d
	}
	for path, mm := range map[string][2]int64{
		"/dev/nvidiactl": {195, 255}, "/dev/nvidia-uvm": {ocitest.UVMMajor, 0}, "/dev/nvidia-uvm-tools": {ocitest.UVMMajor, 1},
		"/dev/nvidia0": {195, 0}, "/dev/nvidia1": {195, 1},
		"/dev/nvidia-modeset": {195, 254}, "/dev/dri/card1": {226, 1}, "/dev/dri/renderD129": {226, 129}, // from the CDI spec
	} {
		d, ok := devs[path]
		if !ok {
			t.Errorf("device %s missing", path)
			continue
		}
		if d.Major != mm[0] || d.Minor != mm[1] {
			t.Errorf("device %s = %d:%d, want %d:%d", path, d.Major, d.Minor, mm[0], mm[1])
		}
		if got := access(t, s, mm[0], mm[1]); got != "rwm" {
			t.Errorf("cgroup access to %s = %q, want rwm", path, got)
		}
	}
	if got := envOf(s, oci.EnvVisibleDevices); got != "void" {
		t.Errorf("%s = %q, want void (CDI injection)", oci.EnvVisibleDevices, got)
	}
	if n := len(s.Hooks.CreateContainer); n != 6 {
		t.Errorf("createContainer hooks = %d, want 6 (CDI update-ldcache, create-symlinks, ..., then the pin hook)", n)
	} else if h := s.Hooks.CreateContainer[5]; h.Path != self(t) || !slices.Equal(h.Args, []string{self(t), "hook", "pin"}) {
		t.Errorf("last createContainer hook = %+v, want %s hook pin (this executable)", h, self(t))
	}
	dir := filepath.Join(h.cfg.Paths.RunDir, "containers", "c1")
	for dst, src := range map[string]string{
		"/usr/local/nri-vgpu/libvgpu-shim.so":            h.cfg.Paths.ShimPath,
		"/etc/ld.so.preload":                             filepath.Join(h.cfg.Paths.RunDir, "ld.so.preload"),
		"/run/nri-vgpu/limits":                           filepath.Join(dir, "limits"),
		"/run/nri-vgpu/region":                           filepath.Join(dir, "region"),
		"/run/nri-vgpu/ledger":                           filepath.Join(dir, "ledger"),
		"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
	} {
		m, ok := mountAt(s, dst)
		if !ok || m.Source != src {
			t.Errorf("mount %s = %+v, want source %s", dst, m, src)
		}
	}

	// The file the shim reads (Contract 4), written out by hand from gpu0
	// and gpu1: the allocation's quotas, the default policy and log level.
	want := "# written by nri-vgpu; read by libvgpu-shim.so\n" +
		"version=1\n" +
		"gpu.0.uuid=" + uuid0 + "\n" +
		"gpu.0.memory=8589934592\n" + // 8 GiB = 8 × 1073741824
		"gpu.0.cores=20\n" +
		"gpu.1.uuid=" + uuid1 + "\n" +
		"gpu.1.memory=21474836480\n" + // 20 GiB = 20 × 1073741824
		"gpu.1.cores=50\n" +
		"cores.policy=hard\n" +
		"log.level=warn\n" +
		"ledger.shards=64\n"
	if got, err := os.ReadFile(filepath.Join(dir, "limits")); err != nil || string(got) != want {
		t.Errorf("limits file = %q (%v), want %q", got, err, want)
	}
	if st, err := os.Stat(filepath.Join(dir, "region")); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("region dir: %v, %v; want mode 0777", st, err)
	}
}

// TestContainerMountsCannotCoverOurs checks, through the runtime side of
// NRI, that mounts of the container's own at our destinations in another
// spelling, or beneath them, are removed, and mounts of their parents kept.
func TestContainerMountsCannotCoverOurs(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	own := []specs.Mount{
		{Destination: "/etc", Type: "bind", Source: "/host/etc", Options: []string{"rbind", "ro"}},
		{Destination: "/etc/ld.so.preload/", Type: "bind", Source: "/host/preload", Options: []string{"rbind", "ro"}},
		{Destination: "/run/nri-vgpu/region/usage", Type: "bind", Source: "/host/usage", Options: []string{"rbind", "rw"}},
		{Destination: "/run/nri-vgpu/", Type: "tmpfs", Source: "tmpfs"},
	}
	c := container("c1", p, ann)
	c.Mounts = api.FromOCIMounts(own)
	adj, err := h.create(p, c)
	if err != nil {
		t.Fatal(err)
	}
	s := &specs.Spec{Process: &specs.Process{}, Mounts: slices.Clone(own), Linux: &specs.Linux{}}
	if err := ocitest.ApplyAdjustment(s, adj); err != nil {
		t.Fatal(err)
	}
	dests := make([]string, len(s.Mounts))
	for i, m := range s.Mounts {
		dests[i] = m.Destination
	}
	for _, gone := range []string{"/etc/ld.so.preload/", "/run/nri-vgpu/region/usage"} {
		if slices.Contains(dests, gone) {
			t.Errorf("container mount %s over ours was kept: %v", gone, dests)
		}
	}
	// Parents stay, and come before what they contain.
	for _, order := range [][2]string{{"/etc", "/etc/ld.so.preload"}, {"/run/nri-vgpu/", "/run/nri-vgpu/region"}, {"/run/nri-vgpu/", "/run/nri-vgpu/limits"}} {
		i, j := slices.Index(dests, order[0]), slices.Index(dests, order[1])
		if i < 0 || j < 0 || i > j {
			t.Errorf("mounts %v: want %s before %s", dests, order[0], order[1])
		}
	}
	if m, ok := mountAt(s, "/etc/ld.so.preload"); !ok || m.Source != filepath.Join(h.cfg.Paths.RunDir, "ld.so.preload") {
		t.Errorf("preload mount %+v", m)
	}
}

func TestContainerWithoutAllocationIsStripped(t *testing.T) {
	h := newHarness(t, newConfig(t))
	p := pod("sb1", "uid-1")
	c := container("plain", p, "")
	// The runtime allowed a GPU node without putting it in the spec (a
	// device-cgroup rule of its own): the deny rules must take it away.
	c.Linux.Resources.Devices = append(c.Linux.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(int64(195)), Minor: api.Int64(int64(0)), Access: "rw"})
	adj, err := h.create(p, c)
	if err != nil {
		t.Fatal(err)
	}
	s := specFor(t, adj)
	// The container's own rules come before the plugin's.
	s.Linux.Resources.Devices = append(c.Linux.Resources.ToOCI().Devices, s.Linux.Resources.Devices[2:]...)
	if got := envOf(s, oci.EnvVisibleDevices); got != "void" {
		t.Errorf("%s = %q, want void", oci.EnvVisibleDevices, got)
	}
	for _, mm := range [][2]int64{{195, 0}, {195, 1}, {195, 255}, {195, 9}, {ocitest.UVMMajor, 0}, {ocitest.UVMMajor, 1}} {
		if got := access(t, s, mm[0], mm[1]); strings.ContainsAny(got, "rw") {
			t.Errorf("container without allocation can open %d:%d (%q)", mm[0], mm[1], got)
		}
	}
	if got := access(t, s, 1, 3); got != "rwm" {
		t.Errorf("/dev/null access = %q, want rwm", got)
	}
	if _, ok := mountAt(s, "/etc/ld.so.preload"); ok {
		t.Error("container without allocation got the preload mount")
	}
	if ids := recordIDs(h.cfg); len(ids) != 0 {
		t.Errorf("host directories created for a container without allocation: %v", ids)
	}
}

// TestGrantedDevicesAreKept: a container that another plugin gave a MIG
// device (its nodes in the spec, with their allow rules, as the runtime
// makes it from a device plugin's DeviceSpecs or a CDI device) keeps those
// nodes, while its own NVIDIA_VISIBLE_DEVICES=all (the pod spec's, which
// cannot be told from a device plugin's) becomes void and every other GPU
// stays denied.
func TestGrantedDevicesAreKept(t *testing.T) {
	h := newHarness(t, newConfig(t))
	p := pod("sb1", "uid-1")
	c := container("mig", p, "")
	granted := []*api.LinuxDevice{
		{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1},
		{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
	}
	c.Linux.Devices = granted
	for _, d := range granted {
		c.Linux.Resources.Devices = append(c.Linux.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c", Major: api.Int64(d.Major), Minor: api.Int64(d.Minor), Access: "rw"})
	}
	c.CDIDevices = []*api.CDIDevice{{Name: "nvidia.com/mig=1:0"}}
	adj, err := h.create(p, c)
	if err != nil {
		t.Fatal(err)
	}
	s := specFor(t, adj)
	s.Linux.Resources.Devices = append(c.Linux.Resources.ToOCI().Devices, s.Linux.Resources.Devices[2:]...)
	if got := envOf(s, oci.EnvVisibleDevices); got != "void" {
		t.Errorf("%s = %q, want void", oci.EnvVisibleDevices, got)
	}
	for _, mm := range [][2]int64{{195, 1}, {195, 255}} {
		if got := access(t, s, mm[0], mm[1]); got != "rw" {
			t.Errorf("granted node %d:%d: access %q, want rw", mm[0], mm[1], got)
		}
	}
	for _, mm := range [][2]int64{{195, 0}, {195, 9}, {ocitest.UVMMajor, 0}} {
		if got := access(t, s, mm[0], mm[1]); strings.ContainsAny(got, "rw") {
			t.Errorf("node %d:%d nobody granted: access %q, want none", mm[0], mm[1], got)
		}
	}
	for _, gone := range adj.GetLinux().GetDevices() {
		if gone.GetPath() == "-/dev/nvidia1" || gone.GetPath() == "-/dev/nvidiactl" {
			t.Errorf("granted node %s removed", strings.TrimPrefix(gone.GetPath(), "-"))
		}
	}
}

// TestPodCDIRequestsRemoved: a CDI annotation the runtime copied from the
// pod (written by the tenant) is removed, from a container that asked for
// nothing and from a vGPU container alike; one kubelet set on the container
// alone (a device plugin's) stays, and an exempt pod keeps everything.
func TestPodCDIRequestsRemoved(t *testing.T) {
	const key = "cdi.k8s.io/tenant"
	cfg := newConfig(t)
	cfg.NRI.Exempt = []config.Exemption{{Namespace: "gpu-operator"}}
	h := newHarness(t, cfg)
	ann, _ := sign(t, h.key, gpu0)
	tests := []struct {
		name, namespace, allocation string
		onPod                       bool
		wantRemoved                 bool
	}{
		{"copied from the pod", "ml", "", true, true},
		{"copied from the pod, vGPU container", "ml", ann, true, true},
		{"the container's own (kubelet)", "ml", "", false, false},
		{"exempt pod", "gpu-operator", "", true, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pod(fmt.Sprintf("sbc%d", i), fmt.Sprintf("uid-c%d", i))
			p.Namespace = tt.namespace
			if tt.onPod {
				p.Annotations = map[string]string{key: "nvidia.com/gpu=all"}
			}
			c := container(fmt.Sprintf("cdi%d", i), p, tt.allocation)
			c.Annotations[key] = "nvidia.com/gpu=all"
			adj, err := h.create(p, c)
			if err != nil {
				t.Fatal(err)
			}
			_, removed := adj.GetAnnotations()["-"+key]
			if removed != tt.wantRemoved {
				t.Errorf("annotation %s removed = %v, want %v (adjustment annotations %v)", key, removed, tt.wantRemoved, adj.GetAnnotations())
			}
		})
	}
}

func TestHideExceptions(t *testing.T) {
	t.Run("privileged", func(t *testing.T) {
		h := newHarness(t, newConfig(t))
		p := pod("sb1", "uid-1")
		c := container("priv", p, "")
		c.Linux.Resources.Devices = []*api.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
		adj, err := h.create(p, c)
		if err != nil {
			t.Fatal(err)
		}
		if len(adj.GetEnv()) != 0 || len(adj.GetLinux().GetResources().GetDevices()) != 0 {
			t.Errorf("privileged container adjusted: %v", adj)
		}
	})
	t.Run("every char device allowed", func(t *testing.T) {
		h := newHarness(t, newConfig(t))
		p := pod("sb1", "uid-1")
		c := container("dind", p, "")
		c.Linux.Resources.Devices = append(c.Linux.Resources.Devices, &api.LinuxDeviceCgroup{Allow: true, Type: "c", Access: "rwm"})
		adj, err := h.create(p, c)
		if err != nil {
			t.Fatal(err)
		}
		if len(adj.GetLinux().GetResources().GetDevices()) != 0 {
			t.Errorf("deny rules for a container allowed c *:* (the runtime would refuse them): %v", adj)
		}
	})
	t.Run("hide_unrequested = false", func(t *testing.T) {
		cfg := newConfig(t)
		cfg.NRI.HideUnrequested = false
		h := newHarness(t, cfg)
		p := pod("sb1", "uid-1")
		adj, err := h.create(p, container("plain", p, ""))
		if err != nil {
			t.Fatal(err)
		}
		if len(adj.GetEnv()) != 0 || len(adj.GetLinux().GetResources().GetDevices()) != 0 {
			t.Errorf("container adjusted with hide_unrequested = false: %v", adj)
		}
	})
}

// signRaw returns an annotation value carrying payload as it is, with a
// correct MAC: Contract 2's encoding done by hand, so that a payload Sign
// would refuse to make reaches the plugin.
func signRaw(key allocation.Key, payload string) string {
	m := hmac.New(sha256.New, key[:])
	m.Write([]byte(payload))
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(payload)) + "." + enc.EncodeToString(m.Sum(nil))
}

func TestRejections(t *testing.T) {
	h := newHarness(t, newConfig(t))
	var otherKey allocation.Key
	otherKey[0] = 1
	forged, _ := sign(t, otherKey, gpu0)
	unknown, _ := sign(t, h.key, allocation.GPU{UUID: "GPU-99999999-9999-4999-8999-999999999999", Minor: 9, Slices: 1, Memory: 1 << 30, Cores: 10})
	tamperedMAC := func() string {
		v, _ := sign(t, h.key, gpu0)
		return v[:len(v)-3] + "AAA" // a different MAC: must not pass as anything but a bad MAC
	}()
	// A payload of a later version, in the form Sign writes and correctly
	// MACed: everything but "v" would pass.
	version2 := signRaw(h.key, `{"v":2,"id":"0123456789abcdef0123456789abcdef","issued":1800000000,`+
		`"gpus":[{"uuid":"`+uuid0+`","minor":0,"slices":2,"memory":8589934592,"cores":20}]}`)
	replayed, _ := sign(t, h.key, gpu1)
	p1, p2 := pod("sb1", "uid-1"), pod("sb2", "uid-2")
	if _, err := h.create(p1, container("owner", p1, replayed)); err != nil {
		t.Fatalf("first use of the allocation: %v", err)
	}

	tests := []struct {
		name, annotation string
		pod              *api.PodSandbox
		want             string
	}{
		{"forged MAC", forged, p1, "nri-vgpu: allocation rejected: bad MAC"},
		{"tampered MAC", tamperedMAC, p1, "nri-vgpu: allocation rejected: bad MAC"},
		{"unknown version", version2, p1, "nri-vgpu: allocation rejected: unknown version 2"},
		{"unknown GPU", unknown, p1, "nri-vgpu: allocation rejected: unknown GPU GPU-99999999"},
		{"bad JSON", signRaw(h.key, `{"v":1,"id":`), p1, "nri-vgpu: allocation rejected: malformed: payload is not JSON"},
		{"not an annotation", "garbage", p1, "nri-vgpu: allocation rejected: malformed"},
		{"replay from another pod", replayed, p2, "nri-vgpu: allocation rejected: id "},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "rej" + string(rune('a'+i))
			_, err := h.create(tt.pod, container(id, tt.pod, tt.annotation))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("CreateContainer error = %v, want one containing %q", err, tt.want)
			}
			if _, err := os.Stat(hoststate.ContainerDir(h.cfg, id)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("rejected container has a host directory (%v)", err)
			}
		})
	}
}

func TestSameContainerRestartedIsAccepted(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	if _, err := h.create(p, container("c1", p, ann)); err != nil {
		t.Fatal(err)
	}
	// kubelet restarts a failed container as a new container of the same
	// pod, with the same annotation; runtimes may also reuse the ID.
	for _, id := range []string{"c1-restart", "c1"} {
		if _, err := h.create(p, container(id, p, ann)); err != nil {
			t.Errorf("restart as %s rejected: %v", id, err)
		}
	}
}

func TestPluginRestartRebuildsState(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p1, p2 := pod("sb1", "uid-1"), pod("sb2", "uid-2")
	if _, err := h.create(p1, container("c1", p1, ann)); err != nil {
		t.Fatal(err)
	}
	limitsPath := filepath.Join(hoststate.ContainerDir(h.cfg, "c1"), "limits")
	before, err := os.ReadFile(limitsPath)
	if err != nil {
		t.Fatal(err)
	}

	h.stopPlugin()
	h.startPlugin() // a new process: empty bindings until Synchronize

	after, err := os.ReadFile(limitsPath)
	if err != nil || string(after) != string(before) {
		t.Errorf("limits file after restart = %q (%v), want it unchanged", after, err)
	}
	if _, err := h.create(p2, container("thief", p2, ann)); err == nil || !strings.Contains(err.Error(), "allocation rejected") {
		t.Errorf("replay after plugin restart: err = %v, want rejected", err)
	}
	if _, err := h.create(p1, container("c1-again", p1, ann)); err != nil {
		t.Errorf("same pod after plugin restart: %v", err)
	}
}

func TestRuntimeRestartReconnects(t *testing.T) {
	cfg := newConfig(t)
	backend := cfg.NRI.SocketPath + ".runtime"
	px := startProxy(t, cfg.NRI.SocketPath, backend)
	h := newHarnessOn(t, cfg, backend)
	// containerd exits: its side of every connection goes away.
	h.r.Stop()
	px.dropAll()
	h.startRuntime()
	h.waitSynced() // the plugin dialed again, with backoff
	ann, _ := sign(t, h.key, gpu1)
	p := pod("sb1", "uid-1")
	if _, err := h.create(p, container("c1", p, ann)); err != nil {
		t.Fatalf("after reconnecting: %v", err)
	}
}

func TestRemoveAndSweep(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	c := container("c1", p, ann)
	if _, err := h.create(p, c); err != nil {
		t.Fatal(err)
	}
	if err := h.remove(p, c); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(hoststate.ContainerDir(h.cfg, "c1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("RemoveContainer left the directory (%v)", err)
	}

	// Orphans: a container removed while the plugin was away, and a
	// directory of the runtime wrapper, which is not the plugin's to sweep.
	keep := container("c2", p, ann)
	if _, err := h.create(p, keep); err != nil {
		t.Fatal(err)
	}
	lf := &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 8 << 30, Cores: 20}}}
	for id, source := range map[string]hoststate.Source{"ghost": hoststate.SourceNRI, "docker1": "runtime"} {
		if _, err := hoststate.New(h.cfg).Provision(&hoststate.Info{ID: id, Source: source}, lf); err != nil {
			t.Fatal(err)
		}
	}
	// Directories without container.json: one being prepared right now
	// (by the runtime wrapper: it writes container.json last), which must
	// survive, and one abandoned long ago.
	for id, age := range map[string]time.Duration{"being-prepared": 0, "abandoned": 2 * hoststate.ProvisionGrace} {
		dir := hoststate.ContainerDir(h.cfg, id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mtime := time.Now().Add(-age)
		if err := os.Chtimes(dir, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	h.stopPlugin()
	h.startPlugin()
	ids := recordIDs(h.cfg)
	slices.Sort(ids)
	if want := []string{"being-prepared", "c2", "docker1"}; !slices.Equal(ids, want) {
		t.Errorf("after the sweep the container dirs are %v, want %v", ids, want)
	}
}

// A GPU container whose edits cannot be computed (the host lost
// /dev/nvidiactl) fails, and the host files provisioned for it before the
// edits were computed are removed again.
func TestFailedCreateLeavesNoHostFiles(t *testing.T) {
	cfg := newConfig(t)
	if err := os.Remove(filepath.Join(cfg.Driver.DevRoot, "dev", "nvidiactl")); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cfg)
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	if _, err := h.create(p, container("c1", p, ann)); err == nil || !strings.Contains(err.Error(), "nri-vgpu: container c1: compute edits: device node /dev/nvidiactl") {
		t.Errorf("create without /dev/nvidiactl: err = %v, want it to name the missing node", err)
	}
	if _, err := os.Lstat(filepath.Join(cfg.Paths.RunDir, "containers", "c1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("host directory of the failed container: %v, want it removed", err)
	}
}

func TestNewValidatesOptions(t *testing.T) {
	cfg := newConfig(t)
	host := oci.NewHost(cfg, false)
	inv := NewBackendInventory(cfg)
	var key allocation.Key
	key[3] = 7
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no config", Options{Key: key, Host: host, Inventory: inv}, "required"},
		{"no host", Options{Config: cfg, Key: key, Inventory: inv}, "required"},
		{"no inventory", Options{Config: cfg, Key: key, Host: host}, "required"},
		{"zero key", Options{Config: cfg, Host: host, Inventory: inv}, "allocation key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := New(Options{Config: cfg, Key: key, Host: host, Inventory: inv}); err != nil {
		t.Errorf("New with every option: %v", err)
	}
}

// self is this test binary: what the plugin runs as the pin hook when
// Options.HookPath is empty.
func self(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPinHookFromConfig: paths.hook_path names the binary the runtime runs
// as the pin hook (where the plugin's own binary is not on the host).
func TestPinHookFromConfig(t *testing.T) {
	cfg := newConfig(t)
	cfg.Paths.HookPath = "/opt/nri-vgpu/bin/nri-vgpu"
	h := newHarness(t, cfg)
	ann, _ := sign(t, h.key, gpu0)
	p := pod("sb1", "uid-1")
	adj, err := h.create(p, container("c1", p, ann))
	if err != nil {
		t.Fatal(err)
	}
	s := specFor(t, adj)
	hooks := s.Hooks.CreateContainer
	if len(hooks) == 0 {
		t.Fatal("no createContainer hook")
	}
	if h := hooks[len(hooks)-1]; h.Path != "/opt/nri-vgpu/bin/nri-vgpu" || !slices.Equal(h.Args, []string{"/opt/nri-vgpu/bin/nri-vgpu", "hook", "pin"}) {
		t.Errorf("pin hook = %+v, want /opt/nri-vgpu/bin/nri-vgpu hook pin", h)
	}
}

// The NRI plugin's inventory, which its metrics read, lists the GPUs in MIG
// mode apart from those it shares, opening the backend on first use.
func TestBackendInventoryServedElsewhere(t *testing.T) {
	cfg := newConfig(t)
	mig := simulated("GPU-99999999-0000-4000-8000-0000000000ff", 7)
	mig.MIG = true
	cfg.GPU.Simulated = append(cfg.GPU.Simulated, mig)
	inv := NewBackendInventory(cfg)
	t.Cleanup(func() { _ = inv.Close() })
	elsewhere, err := inv.ServedElsewhere()
	if err != nil {
		t.Fatal(err)
	}
	if len(elsewhere) != 1 || elsewhere[0].UUID != mig.UUID || !elsewhere[0].MIG {
		t.Errorf("ServedElsewhere = %+v, want the GPU in MIG mode alone", elsewhere)
	}
	devs, err := inv.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.UUID == mig.UUID {
			t.Errorf("Devices lists the GPU in MIG mode: %+v", d)
		}
	}
}

// A backend that says it is closed (NVML shut down under the plugin) is
// opened again at the inventory's next call, whichever list asked: the
// shared GPUs and those served elsewhere alike.
func TestBackendInventoryReopensAClosedBackend(t *testing.T) {
	cfg := newConfig(t)
	inv := NewBackendInventory(cfg)
	t.Cleanup(func() { _ = inv.Close() })
	lists := []struct {
		name string
		call func() ([]gpu.Device, error)
	}{
		{"Devices", inv.Devices},
		{"ServedElsewhere", inv.ServedElsewhere},
	}
	for _, l := range lists {
		if _, err := l.call(); err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		if err := inv.b.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.call(); !errors.Is(err, gpu.ErrClosed) {
			t.Fatalf("%s on the closed backend: %v, want ErrClosed", l.name, err)
		}
		if _, err := l.call(); err != nil {
			t.Errorf("%s after the backend said it was closed: %v, want it opened again", l.name, err)
		}
	}
}
