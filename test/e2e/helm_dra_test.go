//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// TestHelmChartDRADriver installs the chart with draDriver.enabled=true into
// a real API server that authorizes by RBAC: the API server accepts the
// DeviceClass, the DRA driver's DaemonSet, ServiceAccount and RBAC, and the
// driver, run with that ServiceAccount's token and the chart's config,
// publishes the node's ResourceSlice, which the rules allow and nothing
// else does. No kubelet runs (the driver is a process, as the pods of a
// control plane without a node cannot reach the API server), so this runs
// beside the tests that hold the machine's kubelet.
func TestHelmChartDRADriver(t *testing.T) { forEachKubernetes(t, testHelmChartDRADriver) }

func testHelmChartDRADriver(t *testing.T, version string) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t, 5*time.Minute)
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "helm.sh"), "bin").Output()
	if err != nil {
		t.Fatalf("hack/helm.sh bin: %v", err)
	}
	helm := strings.TrimSpace(string(out))
	dir := t.TempDir()
	bin := filepath.Join(dir, "nri-vgpu-dra-driver")
	if err := harness.GoBuild(ctx, "./cmd/dra-driver", bin, false); err != nil {
		t.Fatal(err)
	}
	k, err := harness.StartCluster(ctx, harness.ClusterOptions{Version: version, ControlPlaneOnly: true, RBAC: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("cleaning up the cluster: %v", err)
		}
	})
	if err := k.CreateNode(ctx); err != nil {
		t.Fatal(err)
	}

	// The node's two simulated GPUs, handed to DRA.
	s := &draScheduler{k: k, dir: dir, log: filepath.Join(dir, "dra-driver.log")}
	config, err := os.ReadFile(s.writeConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	// Prepare wants the shim library where the config says; nothing loads
	// it here.
	shim := filepath.Join(dir, "libvgpu-shim.so")
	if err := os.WriteFile(shim, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	config = []byte(strings.Replace(string(config), "[paths]\n", fmt.Sprintf("[paths]\nshim_path = %q\n", shim), 1))
	values, err := yaml.Marshal(map[string]any{
		"image":     map[string]any{"repository": chartImageRepo, "tag": chartImageTag, "pullPolicy": "Never"},
		"config":    string(config),
		"draDriver": map[string]any{"enabled": true},
	})
	if err != nil {
		t.Fatal(err)
	}
	valuesPath := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(valuesPath, values, 0o644); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "packaging", "helm", "nri-vgpu")
	if out, err := exec.CommandContext(ctx, helm, "install", chartRelease, chart, "--namespace", "kube-system",
		"--values", valuesPath, "--kubeconfig", k.Kubeconfig).CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}

	name := chartRelease + "-dra-driver"
	class, err := k.Client.ResourceV1().DeviceClasses().Get(ctx, draDriver, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's DeviceClass: %v", err)
	}
	if want := fmt.Sprintf("device.driver == %q", draDriver); len(class.Spec.Selectors) != 1 ||
		class.Spec.Selectors[0].CEL == nil || class.Spec.Selectors[0].CEL.Expression != want {
		t.Errorf("DeviceClass %s selectors %+v, want one CEL selector %q", draDriver, class.Spec.Selectors, want)
	}
	ds, err := k.Client.AppsV1().DaemonSets("kube-system").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the DRA driver's DaemonSet: %v", err)
	}
	if got := ds.Spec.Template.Spec.ServiceAccountName; got != name {
		t.Errorf("the DRA driver's pods run as %q, want the chart's account %q", got, name)
	}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the DRA driver's ClusterRoleBinding: %v", err)
	}
	// The driver reads the config the chart hands its pods.
	cm, err := k.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, chartRelease+"-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chartConfig := filepath.Join(dir, "chart-config.toml")
	if err := os.WriteFile(chartConfig, []byte(cm.Data["config.toml"]), 0o644); err != nil {
		t.Fatal(err)
	}

	// The driver's pod has the account's token, bound to the pod, which
	// names the pod's node: no kubelet runs the pod, the test hands its
	// token to the driver.
	driverPod, err := k.Client.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-node", Namespace: "kube-system"},
		Spec: corev1.PodSpec{ServiceAccountName: name, NodeName: k.NodeName,
			Containers: []corev1.Container{{Name: "dra-driver", Image: chartImageRepo + ":" + chartImageTag}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := k.Client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: driverPod.Name, UID: driverPod.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s: %v", name, err)
	}
	kubeconfig := filepath.Join(dir, "dra-driver.kubeconfig")
	if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: dra-driver
  user: {token: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: dra-driver}
current-context: e2e
`, k.Config.Host, tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	// RBAC holds: the account may not do what its rules do not name.
	ok, err := canList(ctx, k, tr.Status.Token, "pods")
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Fatalf("the DRA driver's account lists pods: the API server does not enforce RBAC")
	}

	s.start(t, bin, chartConfig, kubeconfig)
	want := []string{draDeviceName(0), draDeviceName(1)}
	slices.Sort(want)
	s.waitSlice(t, ctx, want)
	testKubectlPluginDRA(t, ctx, s)

	t.Run("quota in the claim's status", func(t *testing.T) {
		s.claimPod(t, ctx, "status", "4Gi", "25")
		p := s.waitScheduled(t, ctx, "status")
		uuid := ""
		for i := range testGPUs {
			if draDeviceName(i) == p.device {
				uuid = testGPUs[i].UUID
			}
		}
		claim, err := k.Client.ResourceV1().ResourceClaims(podNamespace).Get(ctx, "status", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The kubelet's call, played by the test.
		ref := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
		plugin := draPluginClient(t, filepath.Join(dir, "plugin", "dra.sock"))
		resp, err := plugin.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref}})
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.Claims[string(claim.UID)]; r == nil || r.Error != "" {
			t.Fatalf("NodePrepareResources: %+v", resp.Claims)
		}
		defer func() {
			resp, err := plugin.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref}})
			if err != nil || resp.Claims[string(claim.UID)] == nil || resp.Claims[string(claim.UID)].Error != "" {
				t.Errorf("NodeUnprepareResources: %+v, %v", resp, err)
			}
		}()
		if log, _ := os.ReadFile(s.log); strings.Contains(string(log), "cannot write the claim's quota") {
			t.Errorf("the driver could not write the claim's status:\n%s", harness.Tail(s.log, 10))
		}
		checkClaimStatus(t, ctx, k, "status", p.device,
			`{"apiVersion":"nri-vgpu.io/v1","kind":"GPUQuota","uuid":"`+uuid+`","memory":4294967296,"cores":25,"coresPolicy":"hard"}`)
	})
}

// draPluginClient is the kubelet's side of a DRA driver's socket.
func draPluginClient(t *testing.T, socket string) drapb.DRAPluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// canList reports whether the bearer of token may list resource (core
// group) in every namespace, as the API server answers a request.
func canList(ctx context.Context, k *harness.Cluster, token, resource string) (bool, error) {
	cfg := rest.AnonymousClientConfig(k.Config)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	_, err = client.CoreV1().RESTClient().Get().Resource(resource).Do(ctx).Raw()
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsForbidden(err):
		return false, nil
	default:
		return false, fmt.Errorf("listing %s: %w", resource, err)
	}
}

func ptrTo[T any](v T) *T { return &v }
