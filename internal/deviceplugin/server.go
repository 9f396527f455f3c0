package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// KubeletSocketName is kubelet's registration socket in socket_dir.
const KubeletSocketName = "kubelet.sock"

const (
	// checkInterval is how often the sockets are checked even without a
	// directory event: the fallback when inotify is unavailable, and the
	// retry interval for a failed registration.
	checkInterval = time.Second
	// registerTimeout bounds one Register call; kubelet dials back to us
	// before it answers.
	registerTimeout = 10 * time.Second
)

// Run serves the plugin until ctx is cancelled: it serves the device plugin
// API on SocketPath, registers with kubelet, re-registers when kubelet
// restarts (kubelet.sock is recreated) and restarts its own server when its
// socket is removed. It also follows GPU health events from the backend. On
// cancellation it stops the server, removes its socket and returns nil; it
// returns an error only when it cannot serve at all.
func (p *Plugin) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer p.stopFeatures() // after the socket is gone: see startFeatures
	defer wg.Wait()
	defer cancel() // runs first: ends the goroutines wg waits for
	events := make(chan gpu.HealthEvent, 16)
	wg.Go(func() {
		if err := p.backend.WatchHealth(ctx, events); err != nil && ctx.Err() == nil {
			p.log.Error("GPU health watch ended; health changes are no longer reported", "backend", p.backend.Name(), "err", err)
		}
	})
	wg.Go(func() {
		for {
			select {
			case ev := <-events:
				p.applyHealth(ev)
			case <-ctx.Done():
				return
			}
		}
	})
	return p.supervise(ctx)
}

// fileID identifies one file at a path: a socket removed and created again
// gets a new inode, or at least a new change time.
type fileID struct {
	dev, ino uint64
	ctime    unix.Timespec
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim}, nil
}

// socketServer is one run of the gRPC server on the plugin's socket.
type socketServer struct {
	srv  *grpc.Server
	id   fileID
	done chan struct{}
}

// errSocketBusy means another process answers on our socket path: a second
// instance for the same resource (a DaemonSet rollout with surge, or both
// the systemd unit and the Helm chart on one node).
var errSocketBusy = errors.New("another process is serving this socket")

// socketAnswers reports whether something accepts connections on path. A
// socket file left behind by a dead process refuses them.
func socketAnswers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// startServer removes a stale socket, listens and serves. It never takes
// the socket from a live process: two instances doing that would keep
// unlinking each other's socket and re-registering.
func (p *Plugin) startServer() (*socketServer, error) {
	path := p.SocketPath()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, fmt.Errorf("device plugin: create socket_dir: %w", err)
	}
	if socketAnswers(path) {
		return nil, fmt.Errorf("device plugin: %s: %w", path, errSocketBusy)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("device plugin: remove stale socket: %w", err)
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("device plugin: listen on %s: %w", path, err)
	}
	// The socket is removed by us, and only while it is still ours: closing
	// a listener whose socket kubelet has deleted must not unlink a newer one.
	lis.SetUnlinkOnClose(false)
	id, err := statID(path)
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("device plugin: socket vanished right after listening: %w", err)
	}
	s := &socketServer{srv: p.newServer(), id: id, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil {
			p.log.Error("device plugin server stopped", "socket", path, "err", err)
		}
	}()
	p.log.Info("serving the device plugin API", "socket", path)
	return s, nil
}

// stop stops the server (ending every ListAndWatch stream) and removes the
// socket if it is still the one this server created.
func (s *socketServer) stop(path string) {
	s.srv.Stop()
	<-s.done
	if id, err := statID(path); err == nil && id == s.id {
		_ = os.Remove(path)
	}
}

// intact reports whether the socket at path is still the one s listens on.
func (s *socketServer) intact(path string) bool {
	id, err := statID(path)
	return err == nil && id == s.id
}

// register announces the plugin to kubelet. Kubelet dials back to our socket
// before it answers, so the server must be serving already.
func (p *Plugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	path := filepath.Join(p.dir, KubeletSocketName)
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to kubelet at %s: %w", path, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.socketName,
		ResourceName: p.cfg.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", p.cfg.ResourceName, path, err)
	}
	return nil
}

// Ready reports nil while the plugin serves its socket and is registered
// with the kubelet that listens on kubelet.sock now, else why not. It
// answers the readiness probe.
func (p *Plugin) Ready() error {
	if p.registered.Load() {
		return nil
	}
	return fmt.Errorf("not registered with the kubelet at %s", filepath.Join(p.dir, KubeletSocketName))
}

// newDirWatcher is watchDir; tests replace it to exercise polling.
var newDirWatcher = watchDir

// supervise keeps the server up and registered until ctx is done.
func (p *Plugin) supervise(ctx context.Context) error {
	sockPath := p.SocketPath()
	kubeletPath := filepath.Join(p.dir, KubeletSocketName)

	// Directory events make the reaction immediate; the ticker catches what
	// they miss and retries failed registrations. socket_dir is created
	// first: the plugin may start before kubelet has made it, and a
	// directory that does not exist cannot be watched.
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("device plugin: create socket_dir: %w", err)
	}
	var dirEvents <-chan dirEvent
	if w, err := newDirWatcher(p.dir); err != nil {
		p.log.Warn("cannot watch socket_dir; polling it every second instead", "dir", p.dir, "err", err)
	} else {
		defer w.Close()
		dirEvents = w.Events()
	}
	tick := time.NewTicker(checkInterval)
	defer tick.Stop()

	var (
		srv        *socketServer
		registered bool   // with the kubelet whose socket is kubeletID
		kubeletID  fileID // kubelet.sock when we registered
		lastErr    string // last registration error, logged once
		waiting    bool   // for another instance to free the socket
	)
	defer func() {
		p.registered.Store(false)
		if srv != nil {
			srv.stop(sockPath)
			p.log.Info("device plugin stopped", "socket", sockPath)
		}
	}()

	for {
		if srv == nil || !srv.intact(sockPath) {
			if srv != nil {
				p.log.Warn("our socket was removed (kubelet restarting?); serving again", "socket", sockPath)
				srv.stop(sockPath)
				srv = nil
			}
			s, err := p.startServer()
			switch {
			case errors.Is(err, errSocketBusy):
				if !waiting {
					p.log.Warn("another instance serves this resource; waiting for it to stop",
						"resource", p.cfg.ResourceName, "socket", sockPath)
					waiting = true
				}
			case err != nil:
				return err
			default:
				if waiting {
					p.log.Info("the other instance stopped; taking over", "socket", sockPath)
					waiting = false
				}
				srv, registered = s, false
				p.startFeatures()
			}
		}

		kid, err := statID(kubeletPath)
		switch {
		case srv == nil:
			// Nothing to register until we serve.
		case err != nil:
			if registered {
				p.log.Warn("kubelet.sock is gone; waiting for kubelet to come back", "socket", kubeletPath)
			}
			registered = false
		case !registered || kid != kubeletID:
			if registered {
				p.log.Info("kubelet restarted; registering again", "socket", kubeletPath)
			}
			if err := p.register(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if err.Error() != lastErr {
					p.log.Warn("registration with kubelet failed; retrying", "err", err)
					lastErr = err.Error()
				}
				registered = false
				break
			}
			registered, kubeletID, lastErr = true, kid, ""
			p.metrics.registrations.WithLabelValues(p.cfg.ResourceName).Inc()
			p.log.Info("registered with kubelet", "resource", p.cfg.ResourceName, "endpoint", p.socketName,
				"policy", p.policy, "kubelet", kubeletPath)
		}

		p.registered.Store(srv != nil && registered)

		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-dirEvents:
			if !ok {
				p.log.Warn("socket_dir watch ended; polling it every second instead", "dir", p.dir)
				dirEvents = nil
			} else if ev.created && ev.name == KubeletSocketName && registered {
				// A creation event can describe the very socket the poll
				// already registered with (both saw one kubelet start);
				// registering twice would cut the first connection and
				// any call kubelet has in flight on it. A new kubelet's
				// socket differs in inode or change time.
				if kid, err := statID(kubeletPath); err != nil || kid != kubeletID {
					registered = false
				}
			}
		case <-tick.C:
		}
	}
}
