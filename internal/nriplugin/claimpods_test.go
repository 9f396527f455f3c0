package nriplugin

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nri-vgpu/nri-vgpu/internal/dra"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// apiServer is the claim as the API server has it, behind the real DRA
// driver's socket for the claims' pods.
type apiServer struct {
	t      *testing.T
	client *fake.Clientset
}

// serveClaimPods starts the DRA driver's socket for the claims' pods on the
// node of cfg, the API server holding the claim prepareClaim prepared,
// reserved for pods.
func serveClaimPods(t *testing.T, cfg *config.Config, pods ...string) *apiServer {
	t.Helper()
	sim, err := gpu.NewSimulated(cfg.GPU.Simulated)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	d, err := dra.New(dra.Options{Config: cfg, Inventory: sim, NodeName: draNode, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "gpu", UID: types.UID(claimUID)}}
	s := &apiServer{t: t, client: fake.NewClientset(c)}
	s.reserve(pods...)
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := d.ServePods(ctx, s.client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		stop()
	})
	return s
}

// reserve sets the claim's status.reservedFor to these pods, as the
// scheduler and the claim controller do.
func (s *apiServer) reserve(pods ...string) {
	s.t.Helper()
	ctx := context.Background()
	c, err := s.client.ResourceV1().ResourceClaims("ml").Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	c.Status.ReservedFor = nil
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + p, UID: types.UID(p)})
	}
	if _, err := s.client.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// A claim prepared for one pod serves the pods that join it later, at
// their first container, from what the API server says: the kubelet does
// not prepare a claim again for them. A pod that left the claim is refused
// afterwards while the pods still reserved keep getting containers.
func TestClaimServesPodsJoiningLater(t *testing.T) {
	cfg := draNodeConfig(t)
	prepareClaim(t, cfg, claimUID, uuid1, "6Gi", "30", "uid-1")
	server := serveClaimPods(t, cfg, "uid-1")
	h := newHarness(t, cfg)
	dev := deviceName(t, uuid1)
	p1, p2, p3 := pod("sb1", "uid-1"), pod("sb2", "uid-2"), pod("sb3", "uid-3")

	if _, err := h.create(p1, withMarker(container("c1", p1, ""), claimUID, dev)); err != nil {
		t.Fatalf("the first pod: %v", err)
	}
	// Pods 2 and 3 join the running claim.
	server.reserve("uid-1", "uid-2", "uid-3")
	if _, err := h.create(p2, withMarker(container("c2", p2, ""), claimUID, dev)); err != nil {
		t.Fatalf("pod 2, reserved after the claim was prepared: %v", err)
	}
	if _, err := h.create(p3, withMarker(container("c3", p3, ""), claimUID, dev)); err != nil {
		t.Fatalf("pod 3, reserved after the claim was prepared: %v", err)
	}

	// Pod 2 leaves: a container of it is refused, pods 1 and 3 keep
	// getting the claim.
	server.reserve("uid-1", "uid-3")
	if _, err := h.create(p2, withMarker(container("c2b", p2, ""), claimUID, dev)); err == nil || !strings.Contains(err.Error(), "is not reserved for pod uid-2") {
		t.Errorf("pod 2 after it left the claim: %v, want a refusal", err)
	}
	for _, c := range []struct {
		p  *api.PodSandbox
		id string
	}{{p1, "c1b"}, {p3, "c3b"}} {
		if _, err := h.create(c.p, withMarker(container(c.id, c.p, ""), claimUID, dev)); err != nil {
			t.Errorf("pod %s, still reserved, after pod 2 left: %v", c.p.Uid, err)
		}
	}
}

// Nothing a tenant sets on its pod or container reserves a claim for it:
// a pod the API server does not list is refused, whatever its annotations
// and environment name, and the refresh does not add it.
func TestClaimNotReservedWhateverThePodSays(t *testing.T) {
	cfg := draNodeConfig(t)
	prepareClaim(t, cfg, claimUID, uuid1, "6Gi", "30", "uid-1")
	serveClaimPods(t, cfg, "uid-1")
	h := newHarness(t, cfg)
	dev := deviceName(t, uuid1)

	p := pod("sb9", "uid-9")
	p.Annotations = map[string]string{
		"resource.kubernetes.io/pod-claim-name": "gpu",
		"nri-vgpu.io/claim":                     claimUID,
		"nri-vgpu.io/pods":                      "uid-1,uid-9",
	}
	c := withMarker(container("c9", p, ""), claimUID, dev)
	c.Annotations["nri-vgpu.io/claim"] = claimUID
	c.Env = append(c.Env, "NRI_VGPU_CLAIM="+claimUID, "NRI_VGPU_POD_UID=uid-1")
	_, err := h.create(p, c)
	if err == nil || !strings.Contains(err.Error(), "claim rejected") || !strings.Contains(err.Error(), "is not reserved for pod uid-9") {
		t.Fatalf("a pod not reserved, naming the claim itself: %v, want a refusal", err)
	}
	// Nor does it pass for another pod: the pod UID is containerd's.
	c2 := withMarker(container("c9b", p, ""), claimUID, dev)
	c2.Annotations["io.kubernetes.pod.uid"] = "uid-1"
	if _, err := h.create(p, c2); err == nil || !strings.Contains(err.Error(), "is not reserved for pod uid-9") {
		t.Fatalf("a pod not reserved, with a container annotation naming a reserved pod: %v, want a refusal", err)
	}
}
