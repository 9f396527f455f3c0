package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

const (
	share1 = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
	share2 = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
)

// withShare gives r the share ID the scheduler gives each allocation of a
// device that allows several.
func withShare(r resourceapi.DeviceRequestAllocationResult, id string) resourceapi.DeviceRequestAllocationResult {
	r.ShareID = ptr.To(types.UID(id))
	return r
}

// apiClaim is c as the API server holds it, for the fake clientset.
func apiClaim(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c = c.DeepCopy()
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: config.DefaultDRADriverName}}}
	return c
}

// entry is what a test expects of one status.devices entry; data is the
// JSON, written out by hand.
type entry struct {
	driver, pool, device, shareID, data string
}

func statusEntries(t *testing.T, client *fake.Clientset, c *resourceapi.ResourceClaim) []entry {
	t.Helper()
	got, err := client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []entry
	for _, d := range got.Status.Devices {
		e := entry{driver: d.Driver, pool: d.Pool, device: d.Device, shareID: ptr.Deref(d.ShareID, "")}
		if d.Data != nil {
			e.data = canonical(t, string(d.Data.Raw))
		}
		out = append(out, e)
	}
	return out
}

// canonical is the JSON object data with its keys sorted and no spaces:
// an apply re-encodes the data.
func canonical(t *testing.T, data string) string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		t.Fatalf("data is not a JSON object: %v: %s", err, data)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func checkEntries(t *testing.T, got, want []entry) {
	t.Helper()
	for i := range want {
		want[i].data = canonical(t, want[i].data)
	}
	cmp := func(a, b entry) int { return strings.Compare(a.device+a.shareID+a.driver, b.device+b.shareID+b.driver) }
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	if !slices.Equal(got, want) {
		t.Errorf("status.devices =\n%+v\nwant\n%+v", got, want)
	}
}

// Prepare writes, for each allocation result of the driver, the quota the
// claim holds on that result's GPU into the claim's status, keyed as the
// result is (shareID included), and leaves another driver's entries alone.
func TestPrepareWritesQuotaIntoStatus(t *testing.T) {
	d, _ := newDriver(t)
	other := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "net.example.com", Pool: node, Device: "eth0"}
	c := claim(uid1, []string{"p1"},
		withShare(result("gpu", devA, "4Gi", "20"), share1),
		withShare(result("more", devA, "2Gi", "10"), share2),
		result("whole", devB, "", ""),
		other)
	stored := apiClaim(c)
	stored.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "net.example.com", Pool: node, Device: "eth0",
		Data: &runtime.RawExtension{Raw: []byte(`{"mac":"02:00:00:00:00:01"}`)}}}
	client := fake.NewClientset(stored)
	d.statusClient = client

	if r := prepareOne(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	// Both results on GPU A carry the claim's whole quota there: 6 GiB, 30 %.
	onA := `{"apiVersion":"nri-vgpu.io/v1","kind":"GPUQuota","uuid":"GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f","memory":6442450944,"cores":30,"coresPolicy":"hard"}`
	want := []entry{
		{config.DefaultDRADriverName, node, devA, share1, onA},
		{config.DefaultDRADriverName, node, devA, share2, onA},
		{config.DefaultDRADriverName, node, devB, "",
			`{"apiVersion":"nri-vgpu.io/v1","kind":"GPUQuota","uuid":"GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a","memory":17179869184,"cores":100,"coresPolicy":"hard"}`},
		{"net.example.com", node, "eth0", "", `{"mac":"02:00:00:00:00:01"}`},
	}
	checkEntries(t, statusEntries(t, client, c), want)

	// The write is a server-side apply of the status by the driver, naming
	// the claim's UID.
	var applied int
	for _, a := range client.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok {
			continue
		}
		applied++
		if p.GetSubresource() != "status" || p.GetPatchType() != types.ApplyPatchType || p.GetName() != c.Name || p.GetNamespace() != c.Namespace {
			t.Errorf("patch %s %s/%s subresource %q type %s, want an apply of the claim's status",
				p.GetVerb(), p.GetNamespace(), p.GetName(), p.GetSubresource(), p.GetPatchType())
		}
		if !strings.Contains(string(p.GetPatch()), `"uid":"`+uid1+`"`) {
			t.Errorf("applied patch does not name the claim's UID: %s", p.GetPatch())
		}
	}
	if applied != 1 {
		t.Errorf("%d patches, want 1", applied)
	}
}

// What is written is the claim's limits file: a claim prepared again after
// the node's cores policy changed keeps, and reports, the policy it was
// prepared with.
func TestStatusIsTheLimitsFile(t *testing.T) {
	d, cfg := newDriver(t)
	cfg.Limits.CoresPolicy = "burst"
	c := claim(uid1, []string{"p1"}, result("gpu", devB, "3Gi", "25"))
	client := fake.NewClientset(apiClaim(c))
	d.statusClient = client
	if r := prepareOne(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	cfg.Limits.CoresPolicy = "hard"
	c = claim(uid1, []string{"p1", "p2"}, result("gpu", devB, "3Gi", "25"))
	if r := prepareOne(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	checkEntries(t, statusEntries(t, client, c), []entry{{config.DefaultDRADriverName, node, devB, "",
		`{"apiVersion":"nri-vgpu.io/v1","kind":"GPUQuota","uuid":"GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a","memory":3221225472,"cores":25,"coresPolicy":"burst"}`}})
}

// A status the API server refuses to take fails nothing: the claim is
// prepared, and the refusal is logged with the claim.
func TestStatusWriteFailureKeepsThePrepare(t *testing.T) {
	d, cfg := newDriver(t)
	var logs bytes.Buffer
	d.log = slog.New(slog.NewTextHandler(&logs, nil))
	c := claim(uid1, []string{"p1"}, result("gpu", devA, "4Gi", "20"))
	client := fake.NewClientset(apiClaim(c))
	client.PrependReactor("patch", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims/status"}, c.Name, nil)
	})
	d.statusClient = client

	r := prepareOne(t, d, c)
	if r.Err != nil {
		t.Fatalf("prepare failed with the status write: %v", r.Err)
	}
	if len(r.Devices) != 1 || r.Devices[0].DeviceName != devA {
		t.Errorf("devices = %+v, want %s", r.Devices, devA)
	}
	if lf := readLimits(t, cfg, uid1); len(lf.GPUs) != 1 || lf.GPUs[0].Memory != 4*gib || lf.GPUs[0].Cores != 20 {
		t.Errorf("limits = %+v, want 4 GiB and 20 %% of %s", lf.GPUs, uuidA)
	}
	for _, want := range []string{
		`level=WARN msg="cannot write the claim's quota into its status" claim=ml/claim-1111 uid=` + uid1,
		`resourceclaims/status.resource.k8s.io \"claim-1111\" is forbidden`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
