package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
)

// createWithClaim gives a container the GPUs of a claim the DRA driver
// prepared: the marked devices of the claim, with the claim's limits file
// and usage region, shared by every container of the claim. The claim must
// have been prepared on this node by the driver, for this container's pod.
func (p *Plugin) createWithClaim(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, uid string, devices []string) (*api.ContainerAdjustment, error) {
	log := logging.FromContext(ctx)
	start := time.Now()
	gpus, id, err := p.verifyClaim(ctx, podUID(pod, ctr), uid, devices)
	if err != nil {
		log.Warn("claim rejected", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: %w", err)
	}
	files, err := p.state.Files(id)
	if err != nil {
		log.Error("cannot read the claim's host files", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: claim %s: %w", uid, err)
	}
	adj, err := p.apply(ctx, gpus, files, pod, ctr)
	if err != nil {
		log.Error("cannot give the container its vGPUs", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	log.Info("vGPU container", "claim", uid, "gpus", gpuSummary(gpus), "took", time.Since(start))
	return adj, nil
}

// verifyClaim checks a container's claim markers against the claim's host
// state and returns the marked GPUs and the claim's directory. The claim's
// pods are first read again by the DRA driver (refreshPods); when it cannot
// be asked, the record as it is decides.
func (p *Plugin) verifyClaim(ctx context.Context, pod, uid string, devices []string) ([]allocation.GPU, string, error) {
	if _, _, err := p.claimRecord(uid); err != nil {
		return nil, "", err
	}
	refreshErr := p.refreshPods(ctx, uid)
	info, id, err := p.claimRecord(uid)
	if err != nil {
		return nil, "", err
	}
	if refreshErr != nil {
		logging.FromContext(ctx).Warn("the DRA driver could not read the claim's pods again; its record as it is decides",
			"claim", uid, "err", refreshErr)
	}
	if !slices.Contains(info.Claim.PodUIDs, pod) {
		why := ""
		if refreshErr != nil {
			why = fmt.Sprintf(" (its pods could not be read again: %v)", refreshErr)
		}
		return nil, "", fmt.Errorf("%w: claim %s/%s is not reserved for pod %s%s", draclaim.ErrRejected, info.Claim.Namespace, info.Claim.Name, pod, why)
	}
	var gpus []allocation.GPU
	for _, dev := range devices {
		i := slices.IndexFunc(info.GPUs, func(g allocation.GPU) bool {
			name, err := draclaim.DeviceName(g.UUID)
			return err == nil && name == dev
		})
		if i < 0 {
			return nil, "", fmt.Errorf("%w: claim %s/%s holds no device %s", draclaim.ErrRejected, info.Claim.Namespace, info.Claim.Name, dev)
		}
		g := info.GPUs[i]
		if !p.knownGPU(g.UUID) {
			return nil, "", fmt.Errorf("%w: claim %s/%s: GPU %s is not on this node", draclaim.ErrRejected, info.Claim.Namespace, info.Claim.Name, g.UUID)
		}
		if !p.cfg.DRA.Serves(g.UUID) {
			return nil, "", fmt.Errorf("%w: claim %s/%s: GPU %s is served by the device plugin here, not through DRA (dra.gpus)", draclaim.ErrRejected, info.Claim.Namespace, info.Claim.Name, g.UUID)
		}
		gpus = append(gpus, g)
	}
	return gpus, id, nil
}

// claimRecord returns the record the DRA driver wrote for the claim and its
// directory: a claim not prepared on this node, or a directory that does not
// hold the record of that claim, is rejected. info.Claim is not nil.
func (p *Plugin) claimRecord(uid string) (*hoststate.Info, string, error) {
	id := hoststate.ClaimID(uid)
	info, err := p.state.Claim(uid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: claim %s is not prepared on this node", draclaim.ErrRejected, uid)
	}
	if errors.Is(err, hoststate.ErrNotClaim) {
		return nil, "", fmt.Errorf("%w: %s is not the directory of claim %s", draclaim.ErrRejected, hoststate.ContainerDir(p.cfg, id), uid)
	}
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", uid, err)
	}
	return info, id, nil
}

// refreshWait bounds the wait for the DRA driver's refresh of a claim's
// pods when the runtime gives no request timeout.
const refreshWait = time.Second

// refreshPods asks the DRA driver to bring the record of the claim up to
// date with the claim's status.reservedFor. The kubelet prepares a claim once
// per node, so a pod that joins a claim prepared before it reaches the record
// only this way, and a pod that left it leaves the record this way. The driver reads the claim from the API server with its
// own client; nothing of the pod or the container goes into the request but
// the claim's UID, which the marker names. The wait is at most half the
// runtime's request timeout: containerd drops a plugin that does not answer
// in time.
func (p *Plugin) refreshPods(ctx context.Context, uid string) error {
	wait := refreshWait
	p.mu.Lock()
	if p.stub != nil && p.stub.RequestTimeout() > 0 {
		wait = p.stub.RequestTimeout() / 2
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return draclaim.RefreshPods(ctx, draclaim.SocketPath(p.cfg.Paths.RunDir), uid)
}
