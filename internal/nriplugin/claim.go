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
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// claimMarkers returns the claim and the devices that the container's claim
// markers name: no claim when it has none. Markers of two claims, or a
// malformed one, are an error: the shim reads one limits file.
func claimMarkers(ctr *api.Container) (uid string, devices []string, err error) {
	for _, m := range ctr.GetMounts() {
		u, dev, ok, err := limits.ParseClaimMarker(m.GetDestination())
		if err != nil {
			return "", nil, err
		}
		if !ok {
			continue
		}
		if uid != "" && u != uid {
			return "", nil, fmt.Errorf("%w: the container holds GPUs of two claims (%s and %s); a container may use one nri-vgpu claim", limits.ErrClaimRejected, uid, u)
		}
		uid = u
		if !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
	}
	return uid, devices, nil
}

// claimContainer gives a container the GPUs of a claim the DRA driver
// prepared: the marked devices of the claim, with the claim's limits file
// and usage region, shared by every container of the claim. The claim must
// have been prepared on this node by the driver, for this container's pod.
func (p *Plugin) claimContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, uid string, devices []string) (*api.ContainerAdjustment, error) {
	log := logging.FromContext(ctx)
	start := time.Now()
	a, id, err := p.verifyClaim(podUID(pod, ctr), uid, devices)
	if err != nil {
		log.Warn("claim rejected", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: %w", err)
	}
	files, err := hoststate.Files(p.cfg, id)
	if err != nil {
		log.Error("cannot read the claim's host files", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: claim %s: %w", uid, err)
	}
	adj, err := p.apply(ctx, a, files, pod, ctr)
	if err != nil {
		log.Error("cannot give the container its vGPUs", "claim", uid, "err", err)
		return nil, fmt.Errorf("nri-vgpu: container %s: %w", ctr.GetId(), err)
	}
	log.Info("vGPU container", "claim", uid, "gpus", gpuSummary(a), "took", time.Since(start))
	return adj, nil
}

// verifyClaim checks a container's claim markers against the claim's host
// state and returns the allocation of the marked GPUs and the claim's
// directory.
func (p *Plugin) verifyClaim(pod, uid string, devices []string) (*limits.Allocation, string, error) {
	id := hoststate.ClaimID(uid)
	info, err := hoststate.ReadInfo(p.cfg, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: claim %s is not prepared on this node", limits.ErrClaimRejected, uid)
	}
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", uid, err)
	}
	if info.Source != hoststate.ClaimSource || info.Claim == nil || info.Claim.UID != uid {
		return nil, "", fmt.Errorf("%w: %s is not the directory of claim %s", limits.ErrClaimRejected, hoststate.ContainerDir(p.cfg, id), uid)
	}
	if !slices.Contains(info.Claim.PodUIDs, pod) {
		return nil, "", fmt.Errorf("%w: claim %s/%s is not reserved for pod %s", limits.ErrClaimRejected, info.Claim.Namespace, info.Claim.Name, pod)
	}
	a := &limits.Allocation{ID: uid}
	for _, dev := range devices {
		i := slices.IndexFunc(info.GPUs, func(g limits.AllocatedGPU) bool {
			name, err := limits.ClaimDeviceName(g.UUID)
			return err == nil && name == dev
		})
		if i < 0 {
			return nil, "", fmt.Errorf("%w: claim %s/%s holds no device %s", limits.ErrClaimRejected, info.Claim.Namespace, info.Claim.Name, dev)
		}
		g := info.GPUs[i]
		if !p.knownGPU(g.UUID) {
			return nil, "", fmt.Errorf("%w: claim %s/%s: GPU %s is not on this node", limits.ErrClaimRejected, info.Claim.Namespace, info.Claim.Name, g.UUID)
		}
		if !p.cfg.DRA.Serves(g.UUID) {
			return nil, "", fmt.Errorf("%w: claim %s/%s: GPU %s is served by the device plugin here, not through DRA (dra.gpus)", limits.ErrClaimRejected, info.Claim.Namespace, info.Claim.Name, g.UUID)
		}
		a.GPUs = append(a.GPUs, g)
	}
	return a, id, nil
}
