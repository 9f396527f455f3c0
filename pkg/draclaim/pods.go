package draclaim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
)

// SocketName is the DRA driver's socket under run_dir, on which the NRI
// plugin asks it to read a claim's pods again. run_dir is root's, and the
// driver makes the socket 0600: only root on the node reaches it, and all
// it can do there is make the driver read the API server again.
const SocketName = "dra-driver.sock"

// SocketPath is the DRA driver's socket for this run_dir.
func SocketPath(runDir string) string { return filepath.Join(runDir, SocketName) }

// PodsPath is the HTTP path, on the driver's socket, of the refresh of the
// pods of the claim with this UID.
func PodsPath(claimUID string) string { return "/claims/" + claimUID + "/pods" }

// ErrNotPrepared is the driver's answer for a claim it has no record of.
var ErrNotPrepared = errors.New("claim not prepared on this node")

// RefreshPods asks the DRA driver listening on socket to bring the pods in
// the record of the claim with this UID up to date with the claim's
// status.reservedFor, as the API server has it now. It returns once the
// record is written, or with ctx's error.
func RefreshPods(ctx context.Context, socket, claimUID string) error {
	if !ValidUID(claimUID) {
		return fmt.Errorf("refresh the pods of claim %q: not a UUID", claimUID)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	// The host is not looked up: the transport dials the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://dra-driver"+PodsPath(claimUID), nil)
	if err != nil {
		return fmt.Errorf("refresh the pods of claim %s: %w", claimUID, err)
	}
	rsp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("refresh the pods of claim %s through %s: %w", claimUID, socket, err)
	}
	defer rsp.Body.Close()
	if rsp.StatusCode == http.StatusNoContent {
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(rsp.Body, 4096))
	if rsp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("refresh the pods of claim %s: %w", claimUID, ErrNotPrepared)
	}
	return fmt.Errorf("refresh the pods of claim %s: the DRA driver answered %s: %s", claimUID, rsp.Status, strings.TrimSpace(string(msg)))
}
