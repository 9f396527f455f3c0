package status

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nri-vgpu/nri-vgpu/internal/dra"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

type devices []gpu.Device

func (d devices) Devices() ([]gpu.Device, error) { return d, nil }

// A claim the DRA driver prepared shows like a container with an
// allocation: under its GPU, with its pods, memory limit and SM share.
func TestCollectClaim(t *testing.T) {
	cfg := config.Default()
	cfg.DRA.Enabled = true
	cfg.DRA.CDIDir = t.TempDir()
	cfg.Paths.RunDir = hoststatetest.RunDir(t)
	cfg.Paths.ShimPath = filepath.Join(t.TempDir(), "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	devs := devices{
		{Index: 0, UUID: uuidA, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Healthy: true},
		{Index: 1, UUID: uuidB, Name: "NVIDIA A100-SXM4-40GB", Memory: 40 << 30, Healthy: true},
	}
	d, err := dra.New(dra.Options{Config: cfg, Inventory: devs, NodeName: "n", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const uid = "11111111-1111-4111-8111-111111111111"
	dev, err := draclaim.DeviceName(uuidB)
	if err != nil {
		t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: uid},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: cfg.DRA.DriverName, Pool: "n", Device: dev,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("30")},
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "job-0", UID: types.UID("pod-uid")}},
		},
	}
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil || res[claim.UID].Err != nil {
		t.Fatalf("prepare: %v %v", err, res[claim.UID].Err)
	}

	noUsage := func(*hoststate.Record) (*region.Usage, error) {
		return nil, fmt.Errorf("usage region: %w", fs.ErrNotExist)
	}
	r, err := Collect(cfg, devs, noUsage)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 2 || len(r.GPUs[0].Containers) != 0 || len(r.GPUs[1].Containers) != 1 {
		t.Fatalf("GPUs = %+v, want the claim under %s only", r.GPUs, uuidB)
	}
	c := r.GPUs[1].Containers[0]
	if c.ID != "claim-"+uid || c.Pod != "ml/job-0" || c.MemoryLimit != 10<<30 || c.Cores != 30 {
		t.Errorf("claim shown as %+v, want claim-%s of pod ml/job-0 with 10 GiB and 30 %%", c, uid)
	}
	var out bytes.Buffer
	if err := r.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "claim-11111111 ") || !strings.Contains(out.String(), "ml/job-0") {
		t.Errorf("table does not show the claim and its pod:\n%s", out.String())
	}

	// The previous release wrote no podNames: the pods' names were only in
	// the pod field ("ml/job-0"), which status reads then.
	hoststatetest.AsPreviousRelease(t, filepath.Join(hoststate.ContainerDir(cfg, "claim-"+uid), hoststate.InfoFileName))
	r, err = Collect(cfg, devs, noUsage)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GPUs) != 2 || len(r.GPUs[1].Containers) != 1 || r.GPUs[1].Containers[0] != c || c.Name != "claim train" {
		t.Errorf("the previous release's claim record shown as %+v, want %+v named \"claim train\"", r.GPUs, c)
	}
}
