// Package kubelettest is the project's one fake kubelet: the device plugin
// side of it, for the device plugin's tests and for the kubelet simulator of
// the end-to-end tests (test/e2e/kubeletsim), which runs pods on top of it.
// Where a real kubelet can run, the end-to-end tests use one
// (test/e2e/harness.StartCluster); this fake stays for what a real kubelet
// cannot be made to do on cue (registration edge cases, restarts mid-call).
//
// It speaks the real device plugin API (v1beta1) over unix sockets: it
// serves Registration on <dir>/kubelet.sock, checks each request as kubelet
// does (API version, extended resource name, endpoint a socket name in
// dir) and, like kubelet, dials back to each plugin that registers, asks for
// its options before Register returns, and then consumes its ListAndWatch
// stream.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DialTimeout bounds how long Register waits for the plugin's own socket to
// answer GetDevicePluginOptions, like kubelet's 10 s connection timeout. A
// variable for tests.
var DialTimeout = 10 * time.Second

// SocketName is the registration socket's name inside the plugin directory.
const SocketName = "kubelet.sock"

// Kubelet is a running fake kubelet.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer

	dir        string
	srv        *grpc.Server
	regs       chan *Registration
	onRegister func(*Registration)

	mu     sync.Mutex
	all    []*Registration
	closed bool
}

// Start serves Registration on <dir>/kubelet.sock, replacing a stale
// socket there. dir must be short enough for a unix socket path.
func Start(dir string) (*Kubelet, error) { return StartWith(dir, nil) }

// StartWith is Start with a hook: onRegister (when not nil) is called with
// each registration before Register answers the plugin, as kubelet updates
// its device manager before it does.
func StartWith(dir string, onRegister func(*Registration)) (*Kubelet, error) {
	path := filepath.Join(dir, SocketName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: listen on %s: %w", path, err)
	}
	k := &Kubelet{
		dir:        dir,
		srv:        grpc.NewServer(),
		regs:       make(chan *Registration, 16),
		onRegister: onRegister,
	}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	return k, nil
}

// Register implements the Registration service the way kubelet does: it
// checks the request, dials the plugin's endpoint in the same directory and
// calls GetDevicePluginOptions (waiting up to DialTimeout for the plugin to
// answer) before answering, then watches ListAndWatch in the background.
func (k *Kubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if !slices.Contains(pluginapi.SupportedVersions[:], req.Version) {
		return nil, fmt.Errorf("fake kubelet: unsupported device plugin API version %q (supported: %v)", req.Version, pluginapi.SupportedVersions)
	}
	if !IsExtendedResourceName(req.ResourceName) {
		return nil, fmt.Errorf("fake kubelet: %q is not an extended resource name (domain/name, domain not kubernetes.io)", req.ResourceName)
	}
	if req.Endpoint == "" || filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("fake kubelet: endpoint %q must be a socket file name in %s", req.Endpoint, k.dir)
	}
	sock := filepath.Join(k.dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("fake kubelet: dial %s: %w", sock, err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	optCtx, cancelOpt := context.WithTimeout(ctx, DialTimeout)
	defer cancelOpt()
	opts, err := client.GetDevicePluginOptions(optCtx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("fake kubelet: GetDevicePluginOptions of %s at %s: %w", req.ResourceName, sock, err)
	}
	streamCtx, cancel := context.WithCancel(context.Background())
	stream, err := client.ListAndWatch(streamCtx, &pluginapi.Empty{})
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("fake kubelet: ListAndWatch from %s: %w", req.Endpoint, err)
	}
	r := &Registration{
		Request: req,
		Options: opts,
		Client:  client,
		conn:    conn,
		cancel:  cancel,
		lists:   make(chan []*pluginapi.Device, 64),
		done:    make(chan struct{}),
	}
	go r.watch(streamCtx, stream)

	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		r.Close()
		return nil, errors.New("fake kubelet: stopped")
	}
	k.all = append(k.all, r)
	if k.onRegister != nil {
		k.onRegister(r)
	}
	select {
	case k.regs <- r:
	default:
		// A test that lets 16 registrations pile up unread has failed
		// already; do not block the plugin's Register call on it.
	}
	return &pluginapi.Empty{}, nil
}

// WaitRegistration returns the next plugin that registers.
func (k *Kubelet) WaitRegistration(ctx context.Context) (*Registration, error) {
	select {
	case r := <-k.regs:
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("fake kubelet: no registration: %w", ctx.Err())
	}
}

// Stop stops serving, closes the connections to registered plugins and
// removes kubelet.sock, as a kubelet that exits.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	k.closed = true
	all := k.all
	k.all = nil
	k.mu.Unlock()
	k.srv.Stop()
	for _, r := range all {
		r.Close()
	}
	_ = os.Remove(filepath.Join(k.dir, SocketName))
}

// Registration is one plugin that registered, with a client connected to it.
type Registration struct {
	Request *pluginapi.RegisterRequest
	Options *pluginapi.DevicePluginOptions
	Client  pluginapi.DevicePluginClient

	conn   *grpc.ClientConn
	cancel context.CancelFunc
	lists  chan []*pluginapi.Device
	done   chan struct{}

	mu      sync.Mutex
	err     error
	closeMu sync.Once
}

func (r *Registration) watch(ctx context.Context, stream pluginapi.DevicePlugin_ListAndWatchClient) {
	defer close(r.done)
	for {
		resp, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.mu.Lock()
				r.err = err
				r.mu.Unlock()
			}
			return
		}
		select {
		case r.lists <- resp.Devices:
		case <-ctx.Done():
			return
		}
	}
}

// NextList returns the next device list the plugin sent on ListAndWatch.
func (r *Registration) NextList(ctx context.Context) ([]*pluginapi.Device, error) {
	select {
	case l := <-r.lists:
		return l, nil
	case <-r.done:
		// Lists sent just before the stream ended are still delivered.
		select {
		case l := <-r.lists:
			return l, nil
		default:
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return nil, fmt.Errorf("fake kubelet: ListAndWatch ended: %v", r.err)
	case <-ctx.Done():
		return nil, fmt.Errorf("fake kubelet: no device list: %w", ctx.Err())
	}
}

// WaitList returns the first device list that satisfies ok, skipping others.
func (r *Registration) WaitList(ctx context.Context, ok func([]*pluginapi.Device) bool) ([]*pluginapi.Device, error) {
	for {
		l, err := r.NextList(ctx)
		if err != nil {
			return nil, err
		}
		if ok(l) {
			return l, nil
		}
	}
}

// Ended is closed when the plugin's ListAndWatch stream ends.
func (r *Registration) Ended() <-chan struct{} { return r.done }

// Close cancels the ListAndWatch stream and closes the connection.
func (r *Registration) Close() {
	r.closeMu.Do(func() {
		r.cancel()
		_ = r.conn.Close()
	})
}

// IsExtendedResourceName mirrors kubelet's check of a device plugin's
// resource name: domain/name, with a domain other than kubernetes.io's, and
// not a requests. quota name.
func IsExtendedResourceName(n string) bool {
	domain, name, ok := strings.Cut(n, "/")
	if !ok || domain == "" || name == "" || strings.Contains(name, "/") {
		return false
	}
	if domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") {
		return false
	}
	return !strings.HasPrefix(n, "requests.")
}
