package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// The data of a claim's device status (Contract 8): its apiVersion and
// kind. A new version gets a new apiVersion; fields are only ever added to
// this one.
const (
	QuotaAPIVersion = "nri-vgpu.io/v1"
	QuotaKind       = "GPUQuota"
)

// Quota is the data the driver writes in a claim's status.devices entry
// for each of its allocation results: the quota the claim holds on that
// device's GPU, as the claim's limits file says. Results of one claim on
// one GPU share one quota, so each of them carries the whole of it.
type Quota struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// UUID is the GPU's.
	UUID string `json:"uuid"`
	// Memory is the memory limit in bytes.
	Memory uint64 `json:"memory"`
	// Cores is the SM share in percent (100: not throttled).
	Cores int `json:"cores"`
	// CoresPolicy is hard or burst.
	CoresPolicy string `json:"coresPolicy"`
}

// statusTimeout bounds the write of a claim's status, which the kubelet's
// prepare call waits for.
const statusTimeout = 10 * time.Second

// writeStatus writes the quota of a claim just prepared into its
// status.devices, one entry per allocation result of this driver. It is
// a server-side apply with the driver's name as field manager, so that
// the entries of the claim's other drivers are left alone, and with the
// claim's UID, so that a claim deleted and made again under its name is
// not written. A failure is logged and not returned: the quota is enforced
// on the node either way, and a later prepare of the claim, if the kubelet
// makes one, writes it again. No client (a driver not started by Run):
// nothing is written.
func (d *Driver) writeStatus(ctx context.Context, claim *resourceapi.ResourceClaim, gpus []served) {
	if d.statusClient == nil {
		return
	}
	log := logging.FromContext(ctx)
	entries, err := d.deviceStatus(claim, gpus)
	if err != nil {
		log.Warn("cannot write the claim's quota into its status", "err", err)
		return
	}
	ac := resourceac.ResourceClaim(claim.Name, claim.Namespace).
		WithUID(claim.UID).
		WithStatus(resourceac.ResourceClaimStatus().WithDevices(entries...))
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if _, err := d.statusClient.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, ac,
		metav1.ApplyOptions{FieldManager: d.cfg.DRA.DriverName, Force: true}); err != nil {
		log.Warn("cannot write the claim's quota into its status", "err", fmt.Errorf("apply status.devices: %w", err))
		return
	}
	log.Debug("claim's quota written into its status", "devices", len(entries))
}

// deviceStatus builds the status.devices entries of a prepared claim from
// its limits file, the quota the shim enforces.
func (d *Driver) deviceStatus(claim *resourceapi.ResourceClaim, gpus []served) ([]*resourceac.AllocatedDeviceStatusApplyConfiguration, error) {
	shares, err := claimShares(claim, d.cfg.DRA.DriverName, d.pool, gpus)
	if err != nil {
		return nil, err
	}
	lf, err := d.claimLimits(string(claim.UID))
	if err != nil {
		return nil, err
	}
	policy := lf.CoresPolicy
	if policy == "" {
		policy = limits.DefaultCoresPolicy
	}
	var out []*resourceac.AllocatedDeviceStatusApplyConfiguration
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DRA.DriverName {
			continue
		}
		uuid := ""
		for _, s := range shares {
			if s.Device == r.Device {
				uuid = s.UUID
			}
		}
		var q *Quota
		for _, g := range lf.GPUs {
			if g.UUID == uuid {
				q = &Quota{APIVersion: QuotaAPIVersion, Kind: QuotaKind, UUID: g.UUID, Memory: g.Memory, Cores: g.Cores, CoresPolicy: policy}
			}
		}
		if q == nil {
			return nil, fmt.Errorf("the claim's limits file has no GPU %q for device %s", uuid, r.Device)
		}
		raw, err := json.Marshal(q)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", r.Device, err)
		}
		e := resourceac.AllocatedDeviceStatus().WithDriver(r.Driver).WithPool(r.Pool).WithDevice(r.Device).
			WithData(runtime.RawExtension{Raw: raw})
		if r.ShareID != nil {
			e.WithShareID(string(*r.ShareID))
		}
		out = append(out, e)
	}
	return out, nil
}

// errFound stops a Scan at the record looked for.
var errFound = errors.New("found")

// claimLimits reads the limits file of the prepared claim uid.
func (d *Driver) claimLimits(uid string) (*limits.LimitsFile, error) {
	id := hoststate.ClaimID(uid)
	var (
		lf      *limits.LimitsFile
		readErr error
	)
	err := d.state.Scan(func(r *hoststate.Record) error {
		if r.ID != id {
			return nil
		}
		lf, readErr = r.Limits()
		return errFound
	})
	switch {
	case errors.Is(err, errFound) && readErr != nil:
		return nil, fmt.Errorf("claim record %s: %w", id, readErr)
	case errors.Is(err, errFound):
		return lf, nil
	case err != nil:
		return nil, fmt.Errorf("claim record %s: %w", id, err)
	}
	return nil, fmt.Errorf("claim record %s: not found", id)
}
