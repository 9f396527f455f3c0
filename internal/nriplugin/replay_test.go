package nriplugin

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// The annotation of a removed pod must not give a new pod a slice that the
// kubelet counts as free: across the removal, and across a restart of the
// plugin (a new process reading its state_dir).
func TestReplayAfterPodRemoval(t *testing.T) {
	h := newHarness(t, newConfig(t))
	ann, _ := sign(t, h.key, gpu0)
	p1 := pod("sb1", "uid-1")
	c1 := container("c1", p1, ann)
	if _, err := h.create(p1, c1); err != nil {
		t.Fatal(err)
	}
	if err := h.remove(p1, c1); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	delete(h.pods, p1.Id)
	h.mu.Unlock()
	if err := h.r.RemovePodSandbox(t.Context(), &api.RemovePodSandboxRequest{Pod: p1}); err != nil {
		t.Fatal(err)
	}

	const want = "nri-vgpu: allocation rejected: id "
	p2 := pod("sb2", "uid-2")
	_, err := h.create(p2, container("c2", p2, ann))
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "uid-1, which was removed") {
		t.Fatalf("replay after removal: err = %v, want a rejection naming the removed pod", err)
	}

	h.stopPlugin()
	h.startPlugin()
	p3 := pod("sb3", "uid-3")
	if _, err := h.create(p3, container("c3", p3, ann)); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("replay after removal and a plugin restart: err = %v, want rejected", err)
	}
	// The same pod (UID) with a new sandbox, as after a node reboot.
	p1b := pod("sb1b", "uid-1")
	if _, err := h.create(p1b, container("c1b", p1b, ann)); err != nil {
		t.Fatalf("the same pod again: %v", err)
	}
}

// A pod that carries the allocation annotation in its own annotations (which
// containerd's pod_annotations pass-through can also copy onto its
// containers) is refused, with or without a kubelet-set allocation.
func TestAllocationInPodAnnotationsIsRejected(t *testing.T) {
	h := newHarness(t, newConfig(t))
	forged, _ := sign(t, h.key, gpu0)
	genuine, _ := sign(t, h.key, gpu1)
	tests := []struct {
		name     string
		ctrValue string
	}{
		{"no GPU asked, annotation passed through to the container", forged},
		{"no GPU asked, container without it", ""},
		{"GPU asked, pod adds another", genuine},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pod("sb-forge", "uid-forge")
			p.Annotations = map[string]string{allocation.AnnotationKey: forged}
			id := []string{"f0", "f1", "f2"}[i]
			_, err := h.create(p, container(id, p, tt.ctrValue))
			if err == nil || !strings.Contains(err.Error(), "nri-vgpu: allocation rejected: the pod's own annotations carry nri-vgpu.io/allocation") {
				t.Fatalf("err = %v, want the pod-annotation rejection", err)
			}
		})
	}
	// Other pod annotations are no reason to refuse.
	p := pod("sb-ok", "uid-ok")
	p.Annotations = map[string]string{"example.com/team": "ml"}
	if _, err := h.create(p, container("ok", p, genuine)); err != nil {
		t.Fatalf("pod with unrelated annotations: %v", err)
	}
}
