package nriplugin

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"

	"github.com/nri-vgpu/nri-vgpu/internal/allockey"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

const (
	uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01" // in the CDI fixture, minor 0
	uuid1 = "GPU-1f0e2d3c-4b5a-4968-8776-5a4b3c2d1e02" // in the CDI fixture, minor 1
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMain(m *testing.M) {
	// The runtime side logs through the NRI library's global logger.
	SetNRILogger(discard)
	os.Exit(m.Run())
}

// harness is an in-process NRI runtime (the runtime side of
// github.com/containerd/nri, as containerd embeds it) on a temporary socket,
// with the real plugin connected to it over that socket.
type harness struct {
	t    testing.TB
	cfg  *config.Config
	key  allocation.Key
	sock string // where the runtime listens

	mu         sync.Mutex
	pods       map[string]*api.PodSandbox // by sandbox ID: what the runtime reports at sync
	containers map[string]*api.Container  // by container ID
	synced     chan struct{}

	r      *adaptation.Adaptation
	plugin *Plugin
	stop   context.CancelFunc
	done   chan error
}

func simulated(uuid string, minor int) config.SimulatedGPU {
	return config.SimulatedGPU{UUID: uuid, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Minor: minor}
}

// newConfig returns a configuration over fake device nodes, two simulated
// GPUs and the nvidia-ctk-shaped CDI fixture of pkg/oci.
func newConfig(t testing.TB) *config.Config {
	t.Helper()
	root := ocitest.FakeDevRoot(t, ocitest.StandardNodes)
	cfg := config.Default()
	cfg.Driver.DevRoot = root
	cfg.Driver.Injection = config.InjectionAuto
	cdiDir := t.TempDir()
	fixture, err := os.ReadFile("../../pkg/oci/testdata/nvidia.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdiDir, "nvidia.yaml"), fixture, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Driver.CDIDirs = []string{cdiDir}
	cfg.GPU.Backend = config.BackendSimulated
	cfg.GPU.Simulated = []config.SimulatedGPU{simulated(uuid0, 0), simulated(uuid1, 1)}
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are short (108 bytes): not under t.TempDir().
	sockDir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg.NRI.SocketPath = filepath.Join(sockDir, "nri.sock")
	return cfg
}

func newHarness(t testing.TB, cfg *config.Config) *harness {
	t.Helper()
	return newHarnessOn(t, cfg, cfg.NRI.SocketPath)
}

// newHarnessOn starts the runtime on sock, which may differ from the
// plugin's nri.socket_path when a proxy sits between them.
func newHarnessOn(t testing.TB, cfg *config.Config, sock string) *harness {
	t.Helper()
	key, err := allockey.LoadOrCreate(cfg.Paths.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, cfg: cfg, key: key, sock: sock,
		pods: map[string]*api.PodSandbox{}, containers: map[string]*api.Container{},
		synced: make(chan struct{}, 1),
	}
	h.startRuntime()
	t.Cleanup(func() {
		h.stopPlugin()
		h.r.Stop()
	})
	h.startPlugin()
	return h
}

func (h *harness) startRuntime() {
	h.t.Helper()
	empty := h.t.TempDir()
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		h.mu.Lock()
		var pods []*api.PodSandbox
		var ctrs []*api.Container
		for _, p := range h.pods {
			pods = append(pods, proto.Clone(p).(*api.PodSandbox))
		}
		for _, c := range h.containers {
			ctrs = append(ctrs, proto.Clone(c).(*api.Container))
		}
		h.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		if err == nil {
			select {
			case h.synced <- struct{}{}:
			default:
			}
		}
		return err
	}
	updateFn := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", "v2.4.2", syncFn, updateFn,
		adaptation.WithPluginPath(empty), adaptation.WithPluginConfigPath(empty), adaptation.WithSocketPath(h.sock))
	if err != nil {
		h.t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		h.t.Fatal(err)
	}
	// Start synchronizes the pre-installed plugins (none) at once; only a
	// later sync is the plugin's.
	select {
	case <-h.synced:
	default:
	}
	h.r = r
}

func (h *harness) startPlugin() {
	h.t.Helper()
	// Watching the CDI directories, as the daemon does.
	host := oci.NewHost(h.cfg, true)
	h.t.Cleanup(func() { host.Close() })
	p, err := New(Options{Config: h.cfg, Key: h.key, Host: host, Inventory: NewBackendInventory(h.cfg), Logger: discard})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.plugin, h.stop, h.done = p, cancel, make(chan error, 1)
	go func() { h.done <- p.Run(ctx) }()
	h.waitSynced()
}

// waitSynced waits until the runtime has synchronized the plugin and put it
// in its dispatch list.
func (h *harness) waitSynced() {
	h.t.Helper()
	select {
	case <-h.synced:
	case <-time.After(15 * time.Second):
		h.t.Fatal("plugin did not synchronize with the runtime")
	}
	h.r.BlockPluginSync().Unblock()
}

func (h *harness) stopPlugin() {
	if h.stop == nil {
		return
	}
	h.stop()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("plugin Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Error("plugin did not stop")
	}
	h.stop = nil
}

func pod(id, uid string) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Uid: uid, Name: "pod-" + id, Namespace: "ml"}
}

// container returns a container as containerd's CRI plugin passes it: the
// device plugin's annotation among the annotations, the default device
// rules of a non-privileged container, seccomp Unconfined.
func container(id string, p *api.PodSandbox, annotation string) *api.Container {
	c := &api.Container{
		Id: id, PodSandboxId: p.Id, Name: "ctr-" + id,
		Annotations: map[string]string{"io.kubernetes.cri.container-type": "container"},
		Env:         []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"},
		Linux: &api.LinuxContainer{
			Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"},
				{Allow: true, Type: "c", Major: api.Int64(int64(1)), Minor: api.Int64(int64(3)), Access: "rwm"},
			}},
			// A default pod: Unconfined, no policy.
			SeccompProfile: &api.SecurityProfile{ProfileType: api.SecurityProfile_UNCONFINED},
		},
	}
	if annotation != "" {
		c.Annotations[allocation.AnnotationKey] = annotation
	}
	return c
}

// create relays a CreateContainer request through the runtime side, as
// containerd does; on success the container exists for later syncs.
func (h *harness) create(p *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, error) {
	h.t.Helper()
	req := &adaptation.CreateContainerRequest{Pod: proto.Clone(p).(*api.PodSandbox), Container: proto.Clone(c).(*api.Container)}
	rsp, err := h.r.CreateContainer(context.Background(), req)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.pods[p.Id] = p
	h.containers[c.Id] = c
	h.mu.Unlock()
	return rsp.GetAdjust(), nil
}

func (h *harness) remove(p *api.PodSandbox, c *api.Container) error {
	h.mu.Lock()
	delete(h.containers, c.Id)
	h.mu.Unlock()
	return h.r.RemoveContainer(context.Background(), &adaptation.RemoveContainerRequest{Pod: p, Container: c})
}

// sign returns an annotation value for the GPUs, signed with key.
func sign(t testing.TB, key allocation.Key, gpus ...allocation.GPU) (string, *allocation.Allocation) {
	t.Helper()
	id, err := allocation.NewID()
	if err != nil {
		t.Fatal(err)
	}
	a := &allocation.Allocation{V: allocation.Version, ID: id, Issued: time.Now().Unix(), GPUs: slices.Clone(gpus)}
	v, err := allocation.Sign(key, a)
	if err != nil {
		t.Fatal(err)
	}
	return v, a
}

// The allocations the device plugin would sign for the simulated 40 GiB
// GPUs at the default split of 10: a slice is 40 GiB / 10 = 4 GiB and
// 100 % / 10 = 10 % of SM time.
var (
	gpu0 = allocation.GPU{UUID: uuid0, Minor: 0, Slices: 2, Memory: 8 << 30, Cores: 20}  // 2 × 4 GiB, 2 × 10 %
	gpu1 = allocation.GPU{UUID: uuid1, Minor: 1, Slices: 5, Memory: 20 << 30, Cores: 50} // 5 × 4 GiB, 5 × 10 %
)

// proxy forwards connections from front to the runtime's socket. Dropping
// its connections is what the plugin sees when containerd's process exits.
type proxy struct {
	l       net.Listener
	backend string
	mu      sync.Mutex
	conns   []net.Conn
}

func startProxy(t testing.TB, front, backend string) *proxy {
	t.Helper()
	l, err := net.Listen("unix", front)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, backend: backend}
	t.Cleanup(func() { l.Close(); p.dropAll() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("unix", backend)
			if err != nil {
				c.Close() // runtime not up: the plugin retries
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(c, b); c.Close(); b.Close() }()
			go func() { _, _ = io.Copy(b, c); c.Close(); b.Close() }()
		}
	}()
	return p
}

func (p *proxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
