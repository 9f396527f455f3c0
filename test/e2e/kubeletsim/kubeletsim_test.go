package kubeletsim

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
)

const testResource = "example.com/dev"

// fakePlugin is a minimal device plugin: a fixed device list whose health the
// test changes, recording the requests it gets.
type fakePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	opts     *pluginapi.DevicePluginOptions
	endpoint string
	server   *grpc.Server

	mu          sync.Mutex
	devices     []*pluginapi.Device
	update      chan struct{}
	preferred   func(req *pluginapi.ContainerPreferredAllocationRequest) []string
	allocateErr error
	prefReqs    []*pluginapi.ContainerPreferredAllocationRequest
	allocReqs   [][]string
	preStarts   [][]string
}

func newFakePlugin(t *testing.T, dir, endpoint string, opts *pluginapi.DevicePluginOptions, ids ...string) *fakePlugin {
	t.Helper()
	p := &fakePlugin{opts: opts, endpoint: endpoint, update: make(chan struct{}, 16)}
	for _, id := range ids {
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	p.start(t, dir)
	return p
}

func (p *fakePlugin) start(t *testing.T, dir string) {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, p.endpoint))
	if err != nil {
		t.Fatal(err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(lis) }()
	t.Cleanup(p.server.Stop)
}

func (p *fakePlugin) register(ctx context.Context, k *Kubelet, resource string) error {
	conn, err := grpc.NewClient("unix://"+k.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: p.endpoint, ResourceName: resource, Options: p.opts,
	})
	return err
}

// registerAndWait registers p for testResource and waits until k has every
// device of p, healthy.
func (p *fakePlugin) registerAndWait(t *testing.T, ctx context.Context, k *Kubelet) {
	t.Helper()
	if err := p.register(ctx, k, testResource); err != nil {
		t.Fatalf("registering %s: %v", p.endpoint, err)
	}
	p.mu.Lock()
	n := len(p.devices)
	p.mu.Unlock()
	if err := k.WaitForDevices(ctx, testResource, n); err != nil {
		t.Fatal(err)
	}
}

func (p *fakePlugin) setHealth(id, health string) {
	p.mu.Lock()
	for _, d := range p.devices {
		if d.ID == id {
			d.Health = health
		}
	}
	p.mu.Unlock()
	p.update <- struct{}{}
}

func (p *fakePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.opts, nil
}

func (p *fakePlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		p.mu.Lock()
		var devs []*pluginapi.Device
		for _, d := range p.devices {
			devs = append(devs, &pluginapi.Device{ID: d.ID, Health: d.Health})
		}
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-p.update:
		}
	}
}

func (p *fakePlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		p.prefReqs = append(p.prefReqs, cr)
		var ids []string
		if p.preferred != nil {
			ids = p.preferred(cr)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *fakePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.allocateErr != nil {
		return nil, p.allocateErr
	}
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		p.allocReqs = append(p.allocReqs, cr.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"FAKE_DEVICES": strings.Join(cr.DevicesIds, ",")},
			Annotations: map[string]string{
				"example.com/devices": strings.Join(cr.DevicesIds, ","),
				// kubelet's own keys win over a plugin's.
				AnnotationContainerRestartCount: "plugin-value",
			},
			Devices: []*pluginapi.DeviceSpec{{ContainerPath: "/dev/fake0", HostPath: "/dev/null", Permissions: "rw"}},
		})
	}
	return resp, nil
}

func (p *fakePlugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.mu.Lock()
	p.preStarts = append(p.preStarts, req.DevicesIds)
	p.mu.Unlock()
	return &pluginapi.PreStartContainerResponse{}, nil
}

func newKubelet(t *testing.T) *Kubelet {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir can be long.
	k, err := New(Options{SocketDir: filepath.Join(t.TempDir(), "dp")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRegisterValidation(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{}, "a")
	tests := []struct {
		name     string
		req      *pluginapi.RegisterRequest
		wantErr  string
		register bool
	}{
		{"old version", &pluginapi.RegisterRequest{Version: "v1alpha", Endpoint: "p.sock", ResourceName: testResource}, "unsupported device plugin API version", false},
		{"no domain", &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "gpu"}, "not an extended resource name", false},
		{"kubernetes.io domain", &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "kubernetes.io/gpu"}, "not an extended resource name", false},
		{"endpoint path", &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "../p.sock", ResourceName: testResource}, "socket file name", false},
		{"valid", &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: testResource}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := grpc.NewClient("unix://"+k.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, tt.req)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Register: %v", err)
				}
				if err := k.WaitForDevices(ctx, testResource, 1); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Register error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	_ = p
}

func TestRegisterNeedsAServingPlugin(t *testing.T) {
	defer func(d time.Duration) { kubelettest.DialTimeout = d }(kubelettest.DialTimeout)
	kubelettest.DialTimeout = 200 * time.Millisecond
	k := newKubelet(t)
	ctx := testCtx(t)
	conn, err := grpc.NewClient("unix://"+k.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "nobody.sock", ResourceName: testResource,
	})
	if err == nil || !strings.Contains(err.Error(), "GetDevicePluginOptions") {
		t.Fatalf("Register with no plugin serving: error = %v, want one naming GetDevicePluginOptions", err)
	}
}

func TestAllocateWithPreferredAllocation(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock",
		&pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, "d3", "d1", "d0", "d2")
	// Prefer the highest IDs, to tell the preference from kubelet's fallback.
	p.preferred = func(r *pluginapi.ContainerPreferredAllocationRequest) []string {
		ids := slices.Clone(r.AvailableDeviceIDs)
		slices.Sort(ids)
		slices.Reverse(ids)
		return ids[:r.AllocationSize]
	}
	p.registerAndWait(t, ctx, k)
	if got := k.Devices(testResource); got[0].ID != "d3" || got[3].ID != "d2" {
		t.Errorf("Devices() = %+v, want the plugin's order d3 d1 d0 d2", got)
	}

	pod := &Pod{Name: "p1", UID: NewUID(), Containers: []Container{
		{Name: "a", Limits: map[string]int{testResource: 2}},
		{Name: "b", Limits: map[string]int{testResource: 1}},
		{Name: "none"},
	}}
	allocs, err := k.Allocate(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if got := allocs["a"].DeviceIDs[testResource]; !slices.Equal(got, []string{"d2", "d3"}) {
		t.Errorf("container a got %v, want the preferred [d2 d3]", got)
	}
	if got := allocs["b"].DeviceIDs[testResource]; !slices.Equal(got, []string{"d1"}) {
		t.Errorf("container b got %v, want [d1]", got)
	}
	if len(allocs["none"].DeviceIDs) != 0 {
		t.Errorf("container without limits got %v", allocs["none"].DeviceIDs)
	}
	p.mu.Lock()
	prefReqs := p.prefReqs
	p.mu.Unlock()
	if len(prefReqs) != 2 {
		t.Fatalf("GetPreferredAllocation called %d times, want 2", len(prefReqs))
	}
	if got := prefReqs[0]; !slices.Equal(got.AvailableDeviceIDs, []string{"d0", "d1", "d2", "d3"}) || got.AllocationSize != 2 || len(got.MustIncludeDeviceIDs) != 0 {
		t.Errorf("first preferred request = %v size %d must %v", got.AvailableDeviceIDs, got.AllocationSize, got.MustIncludeDeviceIDs)
	}
	if got := prefReqs[1]; !slices.Equal(got.AvailableDeviceIDs, []string{"d0", "d1"}) || got.AllocationSize != 1 {
		t.Errorf("second preferred request = %v size %d, want [d0 d1] size 1 (d2, d3 taken)", got.AvailableDeviceIDs, got.AllocationSize)
	}

	// An unhealthy device is not available; asking for more than is left fails
	// and leaves nothing allocated to the pod.
	p.setHealth("d0", pluginapi.Unhealthy)
	if err := k.WaitFor(ctx, testResource, func(s Snapshot) bool { return s.Healthy() == 3 }); err != nil {
		t.Fatal(err)
	}
	pod2 := &Pod{Name: "p2", UID: NewUID(), Containers: []Container{{Name: "c", Limits: map[string]int{testResource: 1}}}}
	if _, err := k.Allocate(ctx, pod2); err == nil || !strings.Contains(err.Error(), "requested 1, available 0") {
		t.Fatalf("Allocate with no device left: error = %v", err)
	}

	// Releasing the first pod frees its devices for the second.
	k.Release(pod.UID)
	allocs2, err := k.Allocate(ctx, pod2)
	if err != nil {
		t.Fatal(err)
	}
	if got := allocs2["c"].DeviceIDs[testResource]; !slices.Equal(got, []string{"d3"}) {
		t.Errorf("after release got %v, want [d3]", got)
	}
	for _, d := range k.Devices(testResource) {
		want := ""
		if d.ID == "d3" {
			want = pod2.UID
		}
		if d.PodUID != want {
			t.Errorf("device %s held by %q, want %q", d.ID, d.PodUID, want)
		}
	}
}

func TestPickPreferred(t *testing.T) {
	avail := []string{"a", "b", "c", "d"}
	tests := []struct {
		name      string
		preferred []string
		n         int
		want      []string
	}{
		{"exact", []string{"d", "c"}, 2, []string{"c", "d"}},
		{"none preferred", nil, 2, []string{"a", "b"}},
		{"too few topped up", []string{"d"}, 3, []string{"d", "a", "b"}},
		{"too many trimmed", []string{"d", "c", "b"}, 2, []string{"b", "c"}},
		{"unknown ids ignored", []string{"zz", "c"}, 2, []string{"c", "a"}},
		{"duplicates ignored", []string{"c", "c"}, 2, []string{"c", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pickPreferred(tt.preferred, avail, tt.n); !slices.Equal(got, tt.want) {
				t.Errorf("pickPreferred(%v, %d) = %v, want %v", tt.preferred, tt.n, got, tt.want)
			}
		})
	}
}

func TestAllocateWithoutPreferredAllocation(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{PreStartRequired: true}, "z", "y", "x")
	p.registerAndWait(t, ctx, k)
	allocs, err := k.Allocate(ctx, &Pod{Name: "p", UID: NewUID(), Containers: []Container{{Name: "c", Limits: map[string]int{testResource: 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := allocs["c"].DeviceIDs[testResource]; !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("got %v, want the first two available, sorted: [x y]", got)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.prefReqs) != 0 {
		t.Errorf("GetPreferredAllocation called on a plugin that does not offer it")
	}
	if len(p.allocReqs) != 1 || !slices.Equal(p.allocReqs[0], []string{"x", "y"}) {
		t.Errorf("Allocate requests = %v", p.allocReqs)
	}
}

func TestAllocateErrorFreesDevices(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{}, "a", "b")
	p.registerAndWait(t, ctx, k)
	p.mu.Lock()
	p.allocateErr = errors.New("device busy")
	p.mu.Unlock()
	pod := &Pod{Name: "p", UID: NewUID(), Containers: []Container{
		{Name: "c1", Limits: map[string]int{testResource: 1}},
		{Name: "c2", Limits: map[string]int{testResource: 1}},
	}}
	if _, err := k.Allocate(ctx, pod); err == nil || !strings.Contains(err.Error(), "device busy") {
		t.Fatalf("Allocate error = %v, want the plugin's", err)
	}
	for _, d := range k.Devices(testResource) {
		if d.PodUID != "" {
			t.Errorf("device %s still held by %s after a failed admission", d.ID, d.PodUID)
		}
	}
	if _, err := k.Allocate(ctx, &Pod{Name: "q", UID: NewUID(), Containers: []Container{{Name: "c", Limits: map[string]int{"example.com/other": 1}}}}); err == nil ||
		!strings.Contains(err.Error(), "no device plugin is registered for example.com/other") {
		t.Errorf("Allocate of an unknown resource: error = %v", err)
	}
}

func TestPluginDisconnectAndReregister(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{}, "a", "b")
	p.registerAndWait(t, ctx, k)
	pod := &Pod{Name: "p", UID: NewUID(), Containers: []Container{{Name: "c", Limits: map[string]int{testResource: 1}}}}
	if _, err := k.Allocate(ctx, pod); err != nil {
		t.Fatal(err)
	}

	p.server.Stop()
	if err := k.WaitFor(ctx, testResource, func(s Snapshot) bool { return !s.Registered && s.Healthy() == 0 }); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Allocate(ctx, &Pod{Name: "q", UID: NewUID(), Containers: []Container{{Name: "c", Limits: map[string]int{testResource: 1}}}}); err == nil {
		t.Fatal("Allocate succeeded while the plugin was gone")
	}

	// The plugin comes back on a new socket; the allocation made before is kept.
	p2 := newFakePlugin(t, k.SocketDir(), "p2.sock", &pluginapi.DevicePluginOptions{}, "a", "b")
	p2.registerAndWait(t, ctx, k)
	held := 0
	for _, d := range k.Devices(testResource) {
		if d.PodUID == pod.UID {
			held++
		}
	}
	if held != 1 {
		t.Errorf("pod holds %d devices after the plugin re-registered, want 1", held)
	}
	if s := k.Snapshot(testResource); s.Registrations != 2 || s.Endpoint != "p2.sock" || s.PreferredAllocation {
		t.Errorf("snapshot after re-registering = %+v, want 2 registrations at p2.sock, no preferred allocation", s)
	}
	if got := k.Resources(); !slices.Equal(got, []string{testResource}) {
		t.Errorf("Resources() = %v, want [%s]", got, testResource)
	}
}

func TestChangedSignalsUpdates(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	if s := k.Snapshot(testResource); s.Registered || s.Registrations != 0 || len(k.Resources()) != 0 {
		t.Fatalf("a new kubelet knows %v: %+v", k.Resources(), s)
	}
	changed := k.Changed()
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, "a", "b")
	if err := p.register(ctx, k, testResource); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("Changed was not closed by a registration")
	}
	if err := k.WaitForDevices(ctx, testResource, 2); err != nil {
		t.Fatal(err)
	}
	if s := k.Snapshot(testResource); s.Registrations != 1 || s.Endpoint != "p.sock" || !s.PreferredAllocation {
		t.Errorf("snapshot = %+v, want 1 registration at p.sock with preferred allocation", s)
	}
	changed = k.Changed()
	p.setHealth("b", pluginapi.Unhealthy)
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("Changed was not closed by a ListAndWatch update")
	}
	if err := k.WaitFor(ctx, testResource, func(s Snapshot) bool { return s.Healthy() == 1 }); err != nil {
		t.Fatal(err)
	}
}

func TestRestartDropsPlugins(t *testing.T) {
	k := newKubelet(t)
	ctx := testCtx(t)
	p := newFakePlugin(t, k.SocketDir(), "p.sock", &pluginapi.DevicePluginOptions{}, "a")
	p.registerAndWait(t, ctx, k)
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	if s := k.Devices(testResource); len(s) != 1 || s[0].Healthy {
		t.Errorf("after a restart, before re-registration: devices %+v, want one unhealthy", s)
	}
	// Registering again after the restart brings the device back.
	p.registerAndWait(t, ctx, k)
}

func TestContainerConfig(t *testing.T) {
	k := newKubelet(t)
	pod := &Pod{Name: "web", Namespace: "ns", UID: "uid-1", Annotations: map[string]string{"pod": "annotation"},
		TerminationGracePeriod: 5 * time.Second}
	c := &Container{
		Name: "c", Image: "img:1", Command: []string{"sh"}, Args: []string{"-c", "true"},
		Env:              []EnvVar{{Name: "FAKE_DEVICES", Value: "from-spec"}},
		Mounts:           []Mount{{HostPath: "/v", ContainerPath: "/data"}},
		Devices:          []DeviceMapping{{HostPath: "/dev/zero", ContainerPath: "/dev/y", Permissions: "r"}},
		ExtraAnnotations: map[string]string{"example.com/devices": "forged", "extra": "kept"},
	}
	a := &Allocation{
		DeviceIDs: map[string][]string{testResource: {"d1"}},
		Responses: map[string]*pluginapi.ContainerAllocateResponse{testResource: {
			Envs:        map[string]string{"FAKE_DEVICES": "d1"},
			Annotations: map[string]string{"example.com/devices": "d1", AnnotationContainerRestartCount: "plugin-value"},
			Mounts:      []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/h", ReadOnly: true}},
			Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/null", Permissions: "rw"}},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "example.com/dev=d1"}},
		}},
	}
	cfg, err := k.ContainerConfig(pod, c, a, 2)
	if err != nil {
		t.Fatal(err)
	}
	wantAnn := map[string]string{
		"example.com/devices":                       "d1", // the plugin's wins over an extra annotation
		"extra":                                     "kept",
		AnnotationContainerRestartCount:             "2", // kubelet's wins over the plugin's
		AnnotationContainerTerminationMessagePath:   "/dev/termination-log",
		AnnotationContainerTerminationMessagePolicy: "File",
		AnnotationPodTerminationGracePeriod:         "5",
		AnnotationContainerType:                     "container",
	}
	for key, want := range wantAnn {
		if got := cfg.Annotations[key]; got != want {
			t.Errorf("annotation %s = %q, want %q", key, got, want)
		}
	}
	if cfg.Annotations[AnnotationContainerHash] == "" {
		t.Errorf("no %s annotation", AnnotationContainerHash)
	}
	if _, ok := cfg.Annotations["pod"]; ok {
		t.Errorf("a pod annotation reached the container config")
	}
	var envs []string
	for _, e := range cfg.Envs {
		envs = append(envs, e.Key+"="+string(e.Value))
	}
	if want := []string{"FAKE_DEVICES=d1", "FAKE_DEVICES=from-spec"}; !slices.Equal(envs, want) {
		t.Errorf("envs = %v, want %v (plugin's first, the spec's last)", envs, want)
	}
	if len(cfg.Mounts) != 2 || cfg.Mounts[0].HostPath != "/h" || !cfg.Mounts[0].Readonly || cfg.Mounts[1].ContainerPath != "/data" {
		t.Errorf("mounts = %v", cfg.Mounts)
	}
	if len(cfg.Devices) != 2 || cfg.Devices[0].ContainerPath != "/dev/x" || len(cfg.CDIDevices) != 1 ||
		cfg.Devices[1].HostPath != "/dev/zero" || cfg.Devices[1].ContainerPath != "/dev/y" || cfg.Devices[1].Permissions != "r" {
		t.Errorf("devices = %v, CDI = %v", cfg.Devices, cfg.CDIDevices)
	}
	if cfg.Metadata.Attempt != 2 || cfg.LogPath != "c/2.log" || cfg.Labels[LabelPodUID] != "uid-1" || cfg.Labels[LabelContainerName] != "c" {
		t.Errorf("metadata %v, log path %q, labels %v", cfg.Metadata, cfg.LogPath, cfg.Labels)
	}

	sb := k.SandboxConfig(pod, 0)
	if sb.Metadata.Uid != "uid-1" || sb.Metadata.Namespace != "ns" || sb.Hostname != "" ||
		sb.Linux.SecurityContext.NamespaceOptions.Network.String() != "NODE" || sb.Annotations["pod"] != "annotation" {
		t.Errorf("sandbox config = %v", sb)
	}
	if want := filepath.Join(k.logDir, "ns_web_uid-1"); sb.LogDirectory != want {
		t.Errorf("log directory = %q, want %q", sb.LogDirectory, want)
	}
}

func TestNewUID(t *testing.T) {
	a, b := NewUID(), NewUID()
	if a == b || len(a) != 36 || a[14] != '4' || strings.Count(a, "-") != 4 {
		t.Errorf("NewUID() = %q, %q: want distinct version 4 UUIDs", a, b)
	}
}
