//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/clusterview"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// kubectlPlugin is `kubectl nri-vgpu` (cmd/kubectl-nri_vgpu), built for a
// test.
type kubectlPlugin struct {
	bin, kubeconfig string
}

func buildKubectlPlugin(t *testing.T, ctx context.Context, kubeconfig string) *kubectlPlugin {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-nri_vgpu")
	if err := harness.GoBuild(ctx, "./cmd/kubectl-nri_vgpu", bin, false); err != nil {
		t.Fatal(err)
	}
	return &kubectlPlugin{bin: bin, kubeconfig: kubeconfig}
}

// run runs the plugin with args against the cluster; a non-zero exit fails
// the test. It logs what the plugin printed.
func (k *kubectlPlugin) run(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	t.Logf("$ kubectl nri-vgpu %s\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
	if err != nil {
		t.Fatalf("kubectl nri-vgpu %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String()
}

// view runs the plugin with -o json and decodes its output.
func (k *kubectlPlugin) view(t *testing.T, ctx context.Context) (*clusterview.View, string) {
	t.Helper()
	out, errOut := k.run(t, ctx, "-o", "json")
	var v clusterview.View
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("kubectl nri-vgpu -o json: %v\n%s", err, out)
	}
	return &v, errOut
}

func viewNode(v *clusterview.View, name string) *clusterview.Node {
	for i := range v.Nodes {
		if v.Nodes[i].Name == name {
			return &v.Nodes[i]
		}
	}
	return nil
}

// testKubectlPlugin checks `kubectl nri-vgpu` on the chart's cluster (its
// metrics on): the node is listed with its slices, and a GPU pod appears
// under its GPU with its slices, memory limit and the memory a process of
// it holds, read from the node's NRI plugin pod through the API server's
// pod proxy. (A node whose metrics cannot be read is the DRA cluster's
// case, testKubectlPluginDRA, and the unit tests'.)
func testKubectlPlugin(t *testing.T, ctx context.Context, h *helmNode) {
	k := buildKubectlPlugin(t, ctx, h.k.Kubeconfig)
	node := h.k.NodeName
	total := int64(splitCount * len(testGPUs))

	v, errOut := k.view(t, ctx)
	n := viewNode(v, node)
	if n == nil {
		t.Fatalf("node %s not in the view: %+v", node, v)
	}
	if len(n.Resources) != 1 || n.Resources[0].Name != resourceName || n.Resources[0].Allocatable != total {
		t.Errorf("node %s resources %+v, want %s allocatable %d", node, n.Resources, resourceName, total)
	}
	if errOut != "" || n.Error != "" {
		t.Errorf("node %s: stderr %q, error %q; want none with the chart's metrics on", node, errOut, n.Error)
	}

	pod := podSpec("kubectl-view", cudaTestImage, 2)
	id := h.runPod(t, ctx, pod)
	a := h.allocationOfContainer(t, ctx, id)
	if len(a.GPUs) != 1 {
		t.Fatalf("allocation %+v, want two slices of one GPU", a.GPUs)
	}
	uuid := a.GPUs[0].UUID
	// A process holds 1 GiB while the view is read.
	done := "/tmp/kubectl-view-done"
	script := fakeDriverEnv(uuid, "/tmp") + " cudaprog -m direct init alloc:1GiB waitfile:" + done + " >/dev/null 2>&1 &"
	if res, err := h.c.Exec(ctx, id, "/bin/sh", "-c", script); err != nil || res.ExitCode != 0 {
		t.Fatalf("starting a process holding GPU memory: %v %+v", err, res)
	}

	var ctr *clusterview.Container
	var g *clusterview.GPU
	err := waitFor(ctx, 60*time.Second, func() bool {
		v, _ := k.view(t, ctx)
		n := viewNode(v, node)
		if n == nil || n.Error != "" {
			return false
		}
		for i := range n.GPUs {
			for j := range n.GPUs[i].Containers {
				c := &n.GPUs[i].Containers[j]
				// The GPU's total too: the Prometheus subtest's pod, which
				// may have used this GPU, is gone once its host state is.
				gu := n.GPUs[i].MemoryUsedBytes
				if c.Pod == pod.Name && c.MemoryUsedBytes != nil && *c.MemoryUsedBytes == 1<<30 && gu != nil && *gu == 1<<30 {
					g, ctr = &n.GPUs[i], c
					return true
				}
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("pod %s never showed with 1 GiB in use", pod.Name)
	}
	if g.UUID != uuid || ctr.Namespace != podNamespace || ctr.Container != "main" || ctr.ContainerID != id || ctr.Slices != 2 ||
		ctr.MemoryLimitBytes == nil || *ctr.MemoryLimitBytes != 2*sliceMemory || ctr.Phase != "Running" {
		t.Errorf("GPU %s, container %+v; want GPU %s, %s/%s main %s, 2 slices, limit %d, Running", g.UUID, ctr, uuid, podNamespace, pod.Name, id, 2*sliceMemory)
	}
	if ctr.Processes == nil || *ctr.Processes != 1 {
		t.Errorf("container processes %v, want 1", ctr.Processes)
	}
	if g.MemoryUsedBytes == nil || *g.MemoryUsedBytes != 1<<30 || g.MemoryAllocatedBytes == nil || *g.MemoryAllocatedBytes != 2*sliceMemory {
		t.Errorf("GPU %s used %v allocated %v, want 1 GiB of %d", g.UUID, g.MemoryUsedBytes, g.MemoryAllocatedBytes, 2*sliceMemory)
	}
	// The table: the pod's row under its GPU, with its slices and memory.
	out, errOut := k.run(t, ctx)
	if errOut != "" {
		t.Errorf("stderr %q, want none", errOut)
	}
	idx := "?"
	if g.Index != nil {
		idx = strconv.Itoa(*g.Index)
	}
	want := strings.Join([]string{node, idx, podNamespace, pod.Name, "main", "2", "1GiB/8GiB"}, " ")
	found := false
	for line := range strings.Lines(out) {
		if strings.HasPrefix(strings.Join(strings.Fields(line), " "), want+" ") {
			found = true
		}
	}
	if !found {
		t.Errorf("no row %q in the table:\n%s", want, out)
	}
	k.run(t, ctx, "-o", "wide")

	if res, err := h.c.Exec(ctx, id, "/bin/sh", "-c", "touch "+done); err != nil || res.ExitCode != 0 {
		t.Errorf("ending the process: %v %+v", err, res)
	}
	dir := h.hostContainerDir(id)
	h.deletePod(t, ctx, pod)
	if err := waitFor(ctx, 90*time.Second, func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	}); err != nil {
		t.Errorf("%s still there after the pod was deleted", dir)
	}
}

// testKubectlPluginDRA checks `kubectl nri-vgpu` on the DRA driver's
// cluster, which has no kubelet and so no NRI plugin pod: a claim the
// scheduler allocated appears under the GPU of the driver's ResourceSlice
// with what it consumes and its pod, and an error names the node whose
// metrics cannot be read.
func testKubectlPluginDRA(t *testing.T, ctx context.Context, s *draScheduler) {
	k := buildKubectlPlugin(t, ctx, s.k.Kubeconfig)
	s.claimPod(t, ctx, "kubectl-view", "2Gi", "25")
	p := s.waitScheduled(t, ctx, "kubectl-view")
	v, errOut := k.view(t, ctx)
	node := s.k.NodeName
	if want := "node " + node + ": "; !strings.Contains(errOut, want) || !strings.Contains(errOut, "NRI plugin pod") {
		t.Errorf("stderr %q, want an error naming the node (%q) and its NRI plugin pod", errOut, want)
	}
	n := viewNode(v, node)
	if n == nil {
		t.Fatalf("node %s not in the view: %+v", node, v)
	}
	if n.Error == "" {
		t.Errorf("node %s without an error in the JSON, while no NRI plugin pod runs", node)
	}
	var found bool
	for _, g := range n.GPUs {
		for _, c := range g.Claims {
			if c.Name != "kubectl-view" {
				continue
			}
			found = true
			wantUUID := ""
			for i := range testGPUs {
				if draDeviceName(i) == p.device {
					wantUUID = testGPUs[i].UUID
				}
			}
			if g.UUID != wantUUID || g.DRADevice != p.device {
				t.Errorf("claim on GPU %s (device %s), want %s (%s)", g.UUID, g.DRADevice, wantUUID, p.device)
			}
			if c.AllocatedMemoryBytes == nil || *c.AllocatedMemoryBytes != 2<<30 || c.AllocatedSMRatio == nil || *c.AllocatedSMRatio != 0.25 {
				t.Errorf("claim allocated memory %v SM %v, want 2 GiB and 0.25", c.AllocatedMemoryBytes, c.AllocatedSMRatio)
			}
			if len(c.Pods) != 1 || c.Pods[0].Name != "kubectl-view" || len(c.Pods[0].Containers) != 1 || c.Pods[0].Containers[0] != "cuda" {
				t.Errorf("claim pods %+v, want kubectl-view with its container cuda", c.Pods)
			}
			if c.MemoryUsedBytes != nil {
				t.Errorf("claim memory used %d without metrics", *c.MemoryUsedBytes)
			}
		}
	}
	if !found {
		t.Errorf("claim kubectl-view not in the view of node %s: %+v", node, n)
	}
	k.run(t, ctx)
}
