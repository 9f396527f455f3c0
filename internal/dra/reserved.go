package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
)

// refreshTimeout bounds one read of a claim from the API server for a
// refresh; the NRI plugin waits less than this anyway.
const refreshTimeout = 10 * time.Second

// RefreshPods brings the pods in the record of a prepared claim up to date
// with the claim's status.reservedFor, read now from the API server with the
// driver's own client. The kubelet prepares a claim once per node, so a pod
// that joins a claim already prepared here reaches the record only this
// way. A claim that is gone from the API server, or whose name now holds
// another claim, is reserved for no pod. The claim's limits file and region
// stay as they are: the pods still reserved use them. A claim without a
// record here is an error wrapping draclaim.ErrNotPrepared.
func (d *Driver) RefreshPods(ctx context.Context, client kubernetes.Interface, uid string) error {
	if !draclaim.ValidUID(uid) {
		return fmt.Errorf("claim UID %q is not a UUID: %w", uid, draclaim.ErrNotPrepared)
	}
	info, err := d.claimRecord(uid)
	if err != nil {
		return err
	}
	// Read without d.mu: a slow API server must not hold up preparations.
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	var uids, names []string
	claim, err := client.ResourceV1().ResourceClaims(info.Claim.Namespace).Get(ctx, info.Claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("claim %s/%s: read it from the API server: %w", info.Claim.Namespace, info.Claim.Name, err)
	case claim.UID != types.UID(uid):
	default:
		uids, names = podUIDs(claim), podNames(claim)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	// Read again under the lock: the claim may have been unprepared, or
	// prepared again with newer pods, meanwhile.
	if info, err = d.claimRecord(uid); err != nil {
		return err
	}
	c := info.Claim
	if slices.Equal(c.PodUIDs, uids) && slices.Equal(c.PodNames, names) {
		return nil
	}
	left := slices.DeleteFunc(slices.Clone(c.PodUIDs), func(p string) bool { return slices.Contains(uids, p) })
	joined := slices.DeleteFunc(slices.Clone(uids), func(p string) bool { return slices.Contains(c.PodUIDs, p) })
	c.PodUIDs, c.PodNames = uids, names
	if err := d.state.UpdateInfo(info); err != nil {
		return fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	d.log.Info("claim's pods brought up to date", "claim", c.Namespace+"/"+c.Name, "uid", uid,
		"pods", uids, "joined", joined, "left", left)
	return nil
}

// claimRecord reads the record of a prepared claim; a claim without one
// wraps draclaim.ErrNotPrepared.
func (d *Driver) claimRecord(uid string) (*hoststate.Info, error) {
	info, err := d.state.Claim(uid)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("claim %s: %w", uid, draclaim.ErrNotPrepared)
	case err != nil:
		return nil, fmt.Errorf("claim %s: %w", uid, err)
	}
	return info, nil
}

// ServePods serves the refresh of a claim's pods (RefreshPods) to the NRI
// plugin on draclaim.SocketPath under run_dir until ctx is done. The socket
// is 0600 in root's run_dir. A request names only a claim UID: what the
// record gets is what the API server says.
func (d *Driver) ServePods(ctx context.Context, client kubernetes.Interface) (func(), error) {
	if err := os.MkdirAll(d.cfg.Paths.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("dra driver: run_dir: %w", err)
	}
	path := draclaim.SocketPath(d.cfg.Paths.RunDir)
	// A socket left by a driver that did not stop cleanly; anything else
	// at that path is not the driver's, and listening fails on it.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("dra driver: remove the old socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dra driver: listen on %s: %w", path, err)
	}
	// Removed below only when it is still this driver's.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("dra driver: %s: %w", path, err)
	}
	made, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("dra driver: %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /claims/{uid}/pods", func(w http.ResponseWriter, r *http.Request) {
		uid := r.PathValue("uid")
		err := d.RefreshPods(r.Context(), client, uid)
		switch {
		case err == nil:
			w.WriteHeader(http.StatusNoContent)
		case errors.Is(err, draclaim.ErrNotPrepared):
			http.Error(w, err.Error(), http.StatusNotFound)
		default:
			d.log.Warn("cannot refresh the claim's pods", "uid", uid, "err", err)
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("the claims' pods socket stopped serving", "path", path, "err", err)
		}
	}()
	d.log.Info("serving the claims' pods to the NRI plugin", "path", path)
	return func() {
		srv.Close()
		<-done
		// Only the socket this driver made: a driver started since
		// has made its own.
		if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, made) {
			_ = os.Remove(path)
		}
	}, nil
}
