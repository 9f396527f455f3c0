package dra

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// ErrRejected is wrapped by the errors about a claim that must not be
// prepared on this node; their messages name the reason.
var ErrRejected = draclaim.ErrRejected

// rejected is a refusal for reason whose message says why and wraps
// ErrRejected.
func rejected(reason, format string, args ...any) error {
	return refuse(reason, fmt.Errorf("%w: %s", ErrRejected, fmt.Sprintf(format, args...)))
}

// share is what a claim holds of one GPU.
type share struct {
	allocation.GPU
	Device string // the published device name
}

// claimShares returns what the claim holds of each of the node's served
// GPUs, in the order its allocation names them (Contract 8): the consumed
// capacity of every result of this driver in this node's pool, added up
// per GPU, cores capped at 100 and memory at the GPU's capacity. A result
// without consumed capacity (a scheduler without consumable capacity)
// takes the GPU whole.
func claimShares(claim *resourceapi.ResourceClaim, driver, pool string, gpus []served) ([]share, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, rejected(ReasonNotAllocated, "claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	byName := make(map[string]served, len(gpus))
	for _, g := range gpus {
		byName[g.Name] = g
	}
	var out []share
	for _, r := range alloc.Devices.Results {
		if r.Driver != driver {
			continue // another driver's device in the same claim
		}
		if r.Pool != pool {
			return nil, rejected(ReasonForeignPool, "request %q: device %s/%s is not of this node's pool %q", r.Request, r.Pool, r.Device, pool)
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return nil, rejected(ReasonAdminAccess, "request %q: admin access to %s is not supported: it would bypass the GPU's quotas", r.Request, r.Device)
		}
		g, ok := byName[r.Device]
		if !ok {
			return nil, rejected(ReasonUnknownDevice, "request %q: this node serves no GPU %q through DRA", r.Request, r.Device)
		}
		mem, cores := g.Memory, uint64(g.MaxCores())
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			if q.Sign() <= 0 {
				return nil, rejected(ReasonInvalidCapacity, "request %q: consumed memory %s on %s is not positive", r.Request, q.String(), r.Device)
			}
			mem = uint64(q.Value())
		}
		if q, ok := r.ConsumedCapacity[CapacityCores]; ok {
			if q.Sign() <= 0 {
				return nil, rejected(ReasonInvalidCapacity, "request %q: consumed cores %s on %s is not positive", r.Request, q.String(), r.Device)
			}
			cores = uint64(q.Value())
		}
		i := slices.IndexFunc(out, func(s share) bool { return s.Device == g.Name })
		if i < 0 {
			out = append(out, share{Device: g.Name, GPU: allocation.GPU{UUID: g.UUID, Minor: g.Minor}})
			i = len(out) - 1
		}
		s := &out[i]
		s.Memory = min(s.Memory+mem, g.Memory)
		s.Cores = int(min(uint64(s.Cores)+cores, 100))
	}
	if len(out) == 0 {
		return nil, rejected(ReasonNoDevice, "claim %s/%s holds no device of driver %s", claim.Namespace, claim.Name, driver)
	}
	if len(out) > limits.MaxLimitsGPUs {
		return nil, rejected(ReasonTooManyGPUs, "claim %s/%s holds %d GPUs, at most %d", claim.Namespace, claim.Name, len(out), limits.MaxLimitsGPUs)
	}
	return out, nil
}

// podUIDs returns the UIDs of the pods the claim is reserved for.
func podUIDs(claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, c := range claim.Status.ReservedFor {
		if c.APIGroup == "" && c.Resource == "pods" && c.UID != "" {
			out = append(out, string(c.UID))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
