//go:build e2e

package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/kubeletsim"
)

// TestContainerdRunsAPod checks the harness itself, with no nri-vgpu part: a
// containerd with NRI on runs a busybox pod through CRI, exec works, the pod
// goes away, and a restart of containerd keeps a running pod.
func TestContainerdRunsAPod(t *testing.T) { forEachContainerd(t, testContainerdRunsAPod) }

func testContainerdRunsAPod(t *testing.T, containerd string) {
	c := startContainerd(t, containerd, "")
	ctx := testContext(t, 3*time.Minute)

	if _, err := c.Runtime.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	kubelet, err := kubeletsim.New(kubeletsim.Options{SocketDir: filepath.Join(c.Dir, "device-plugins")})
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Close()

	pod := &kubeletsim.Pod{Name: "plain", UID: kubeletsim.NewUID(), TerminationGracePeriod: 5 * time.Second,
		Containers: []kubeletsim.Container{{Name: "main", Image: harness.BusyboxImage}}}
	rp, err := kubelet.RunPod(ctx, c.Runtime, pod)
	if err != nil {
		t.Fatal(err)
	}
	id := rp.ContainerID("main")
	res, err := c.Exec(ctx, id, "cat", "/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "Name:\tcat") {
		t.Fatalf("cat /proc/self/status: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// The container's NRI-visible annotations are set by kubelet.
	st, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING ||
		st.Status.Annotations[kubeletsim.AnnotationContainerRestartCount] != "0" {
		t.Errorf("container status: state %v, annotations %v", st.Status.State, st.Status.Annotations)
	}

	// containerd restarts; the pod keeps running and answers exec.
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, id, "echo", "still here"); err != nil || strings.TrimSpace(res.Stdout) != "still here" {
		t.Fatalf("exec after containerd restart: %+v, %v", res, err)
	}

	if err := kubelet.KillPod(ctx, c.Runtime, rp); err != nil {
		t.Fatal(err)
	}
	list, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d pod sandboxes left after KillPod", len(list.Items))
	}
}
