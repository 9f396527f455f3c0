package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
)

// reserve sets the claim's status.reservedFor to the pods with these UIDs,
// as the scheduler and the claim controller do, in the fake API server.
func reserve(t *testing.T, client *fake.Clientset, c *resourceapi.ResourceClaim, pods ...string) {
	t.Helper()
	c = c.DeepCopy()
	c.Status.ReservedFor = nil
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + p, UID: types.UID(p)})
	}
	if _, err := client.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func claimPods(t *testing.T, d *Driver, uid string) ([]string, []string) {
	t.Helper()
	info, err := d.state.Claim(uid)
	if err != nil {
		t.Fatalf("the claim's record: %v", err)
	}
	return info.Claim.PodUIDs, info.Claim.PodNames
}

// A pod that joins a claim after the claim was prepared on the node reaches
// its record at a refresh, from the claim's reservedFor in the API server;
// a pod that left it is dropped, while the claim's limits file and region,
// which the remaining pods use, stay the very same files.
func TestRefreshPodsFollowsReservedFor(t *testing.T) {
	d, cfg := newDriver(t)
	c := claim(uid1, []string{"pod-a"}, result("gpu", devA, "10Gi", "30"))
	if r := prepareOne(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	dir := hoststate.ContainerDir(cfg, hoststate.ClaimID(uid1))
	limitsBefore, err := os.Stat(filepath.Join(dir, "limits"))
	if err != nil {
		t.Fatal(err)
	}
	regionBefore, err := os.Stat(filepath.Join(dir, "region"))
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(c)
	ctx := context.Background()

	reserve(t, client, c, "pod-a", "pod-b", "pod-c")
	if err := d.RefreshPods(ctx, client, uid1); err != nil {
		t.Fatal(err)
	}
	uids, names := claimPods(t, d, uid1)
	if want := []string{"pod-a", "pod-b", "pod-c"}; !slices.Equal(uids, want) {
		t.Errorf("pods after b and c joined = %v, want %v", uids, want)
	}
	if want := []string{"pod-pod-a", "pod-pod-b", "pod-pod-c"}; !slices.Equal(names, want) {
		t.Errorf("pod names after b and c joined = %v, want %v", names, want)
	}

	reserve(t, client, c, "pod-a", "pod-c")
	if err := d.RefreshPods(ctx, client, uid1); err != nil {
		t.Fatal(err)
	}
	if uids, _ := claimPods(t, d, uid1); !slices.Equal(uids, []string{"pod-a", "pod-c"}) {
		t.Errorf("pods after b left = %v, want [pod-a pod-c]", uids)
	}
	limitsAfter, err := os.Stat(filepath.Join(dir, "limits"))
	if err != nil {
		t.Fatal(err)
	}
	regionAfter, err := os.Stat(filepath.Join(dir, "region"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(limitsBefore, limitsAfter) || !os.SameFile(regionBefore, regionAfter) {
		t.Error("the claim's limits file or region was replaced: the running containers would lose the claim's ledger")
	}
	if lf := readLimits(t, cfg, uid1); len(lf.GPUs) != 1 || lf.GPUs[0].Memory != 10*gib || lf.GPUs[0].Cores != 30 {
		t.Errorf("the claim's limits after the refreshes = %+v, want 10 GiB and 30 %%", lf.GPUs)
	}
}

// A claim gone from the API server, or a name that now holds another claim,
// leaves the prepared claim reserved for no pod; a claim not prepared here
// is ErrNotPrepared and writes nothing.
func TestRefreshPodsOfAClaimGone(t *testing.T) {
	ctx := context.Background()
	t.Run("deleted", func(t *testing.T) {
		d, _ := newDriver(t)
		c := claim(uid1, []string{"pod-a"}, result("gpu", devA, "10Gi", "30"))
		if r := prepareOne(t, d, c); r.Err != nil {
			t.Fatal(r.Err)
		}
		if err := d.RefreshPods(ctx, fake.NewClientset(), uid1); err != nil {
			t.Fatal(err)
		}
		if uids, _ := claimPods(t, d, uid1); len(uids) != 0 {
			t.Errorf("pods of a deleted claim = %v, want none", uids)
		}
	})
	t.Run("its name reused", func(t *testing.T) {
		d, _ := newDriver(t)
		c := claim(uid1, []string{"pod-a"}, result("gpu", devA, "10Gi", "30"))
		if r := prepareOne(t, d, c); r.Err != nil {
			t.Fatal(r.Err)
		}
		other := c.DeepCopy()
		other.UID = uid2
		other.Status.ReservedFor = append(other.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-x", UID: "pod-x"})
		if err := d.RefreshPods(ctx, fake.NewClientset(other), uid1); err != nil {
			t.Fatal(err)
		}
		if uids, _ := claimPods(t, d, uid1); len(uids) != 0 {
			t.Errorf("pods of a claim whose name holds another claim = %v, want none", uids)
		}
	})
	t.Run("not prepared", func(t *testing.T) {
		d, _ := newDriver(t)
		c := claim(uid2, []string{"pod-a"}, result("gpu", devA, "10Gi", "30"))
		if err := d.RefreshPods(ctx, fake.NewClientset(c), uid2); !errors.Is(err, draclaim.ErrNotPrepared) {
			t.Errorf("refresh of a claim never prepared: %v, want ErrNotPrepared", err)
		}
		if _, err := d.state.Claim(uid2); err == nil {
			t.Error("the refresh of a claim never prepared made its record")
		}
	})
}

// The NRI plugin's side of the socket: root-only, and a refresh through it
// is the driver's refresh; a claim never prepared answers ErrNotPrepared.
func TestServePods(t *testing.T) {
	d, cfg := newDriver(t)
	c := claim(uid1, []string{"pod-a"}, result("gpu", devA, "10Gi", "30"))
	if r := prepareOne(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	client := fake.NewClientset(c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := d.ServePods(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	sock := draclaim.SocketPath(cfg.Paths.RunDir)
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want a socket 0600", sock, fi.Mode())
	}

	reserve(t, client, c, "pod-a", "pod-b")
	if err := draclaim.RefreshPods(ctx, sock, uid1); err != nil {
		t.Fatal(err)
	}
	if uids, _ := claimPods(t, d, uid1); !slices.Equal(uids, []string{"pod-a", "pod-b"}) {
		t.Errorf("pods after a refresh through the socket = %v, want [pod-a pod-b]", uids)
	}
	if err := draclaim.RefreshPods(ctx, sock, uid3); !errors.Is(err, draclaim.ErrNotPrepared) {
		t.Errorf("refresh of a claim never prepared: %v, want ErrNotPrepared", err)
	}

	stop()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket after the driver stopped: %v, want it gone", err)
	}
}
