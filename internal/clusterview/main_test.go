package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// apiServer answers what the program asks an API server that does not
// serve resource.k8s.io: nodes, pods (with a label selector), and the pod
// proxy to the NRI plugin pods, from metrics keyed by the proxy path's
// "namespace/pods/name:port". It records the proxy paths asked for.
type apiServer struct {
	nodes   []corev1.Node
	pods    []corev1.Pod
	metrics map[string]string

	mu      sync.Mutex
	proxied []string
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	list := func(kind string, items any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": kind, "metadata": map[string]any{}, "items": items})
	}
	switch p := r.URL.Path; {
	case p == "/api/v1/nodes":
		list("NodeList", s.nodes)
	case p == "/api/v1/pods" || strings.HasPrefix(p, "/api/v1/namespaces/") && strings.HasSuffix(p, "/pods"):
		ns := strings.TrimSuffix(strings.TrimPrefix(p, "/api/v1/namespaces/"), "/pods")
		sel, err := labels.Parse(r.URL.Query().Get("labelSelector"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pods := []corev1.Pod{}
		for _, pod := range s.pods {
			if sel.Matches(labels.Set(pod.Labels)) && (p == "/api/v1/pods" || pod.Namespace == ns) {
				pods = append(pods, pod)
			}
		}
		list("PodList", pods)
	case strings.HasPrefix(p, "/api/v1/namespaces/") && strings.HasSuffix(p, "/proxy/metrics"):
		key := strings.TrimSuffix(strings.TrimPrefix(p, "/api/v1/namespaces/"), "/proxy/metrics")
		s.mu.Lock()
		s.proxied = append(s.proxied, key)
		s.mu.Unlock()
		text, ok := s.metrics[key]
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"error trying to reach service: dial tcp 10.0.0.7:9455: connect: connection refused","reason":"ServiceUnavailable","code":503}`)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, text)
	default:
		// resource.k8s.io/v1 and anything else: not served.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}`)
	}
}

// kubeconfig writes a kubeconfig whose current context is srv.
func kubeconfig(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q}
users:
- name: test
  user: {token: secret}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: ml}
current-context: test
`, srv.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func runMain(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestProgram: the program end to end against an API server over HTTP: the metrics of
// gpu-a's NRI plugin pod come through GET
// /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics; gpu-b's plugin
// pod does not answer, which names gpu-b on stderr and still prints its
// slices and pod, exit status 0. The kubeconfig context's namespace (ml)
// does not narrow the view; --namespace does.
func TestProgram(t *testing.T) {
	api := &apiServer{
		nodes: []corev1.Node{*gpuNode("gpu-a", 20, nil), *gpuNode("gpu-b", 10, nil), *gpuNode("cpu-1", 0, nil)},
		pods: []corev1.Pod{
			*pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodRunning, 9455),
			*pluginPod("nri-vgpu-nri-plugin-bbbbb", "gpu-b", corev1.PodRunning, 9455),
			*gpuPod("default", "cuda-a", "gpu-a", "main", 2, corev1.PodRunning),
			*gpuPod("ml", "train", "gpu-a", "worker", 1, corev1.PodRunning),
			*gpuPod("default", "stuck", "gpu-b", "main", 1, corev1.PodRunning),
		},
		metrics: map[string]string{"kube-system/pods/nri-vgpu-nri-plugin-aaaaa:9455": gpuAMetrics},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	cfg := kubeconfig(t, srv)

	code, stdout, stderr := runMain("--kubeconfig", cfg)
	want := `NODE   GPU  NAMESPACE  POD     CONTAINER  SLICES  MEMORY USED/LIMIT  PEAK    SM USED/LIMIT  THROTTLED
gpu-a  -    -          -       -          3/20    -                  -       -              -
gpu-a  0    -          -       -          -       3GiB/12GiB         -       25%/30%        -
gpu-a  0    default    cuda-a  main       2       2GiB/8GiB          2.5GiB  20%/20%        12.5s
gpu-a  0    ml         train   worker     1       suspect/4GiB       -       5%/10%         -
gpu-a  1    -          -       -          -       0B/0B              -       0%/0%          -
gpu-b  -    -          -       -          1/10    -                  -       -              -
gpu-b  ?    default    stuck   main       1       -                  -       -              -
`
	if code != 0 {
		t.Errorf("exit status %d, want 0 (the view was printed)", code)
	}
	wantText(t, "stdout", stdout, want)
	wantErr := "kubectl-nri_vgpu: node gpu-b: reading the metrics of NRI plugin pod kube-system/nri-vgpu-nri-plugin-bbbbb:9455 through the API server's pod proxy: error trying to reach service: dial tcp 10.0.0.7:9455: connect: connection refused\n"
	wantText(t, "stderr", stderr, wantErr)
	api.mu.Lock()
	proxied := strings.Join(api.proxied, " ")
	api.mu.Unlock()
	if !strings.Contains(proxied, "kube-system/pods/nri-vgpu-nri-plugin-aaaaa:9455") {
		t.Errorf("proxied %q, want the pod proxy path of gpu-a's NRI plugin pod", proxied)
	}

	code, stdout, stderr = runMain("--kubeconfig", cfg, "-n", "ml", "--node", "gpu-a", "-o", "wide")
	want = `NODE   GPU  UUID        MODEL                  GPU MEMORY  NAMESPACE  POD    CONTAINER  CONTAINER ID  SLICES  MEMORY USED/LIMIT  PEAK  SM USED/LIMIT  SHARE USED  THROTTLED  LAUNCHES  PROCESSES  SUSPECT
gpu-a  -    -           -                      -           -          -      -          -             1/20    -                  -     -              -           -          -         -          -
gpu-a  0    GPU-0000-a  NVIDIA A100-SXM4-40GB  40GiB       -          -      -          -             -       3GiB/12GiB         -     25%/30%        -           -          -         -          -
gpu-a  0    GPU-0000-a  NVIDIA A100-SXM4-40GB  40GiB       ml         train  worker     fedcba987654  1       suspect/4GiB       -     5%/10%         50%         -          -         1          yes
gpu-a  1    GPU-1111-a  NVIDIA A100-SXM4-40GB  40GiB       -          -      -          -             -       0B/0B              -     0%/0%          -           -          -         -          -
`
	if code != 0 || stderr != "" {
		t.Errorf("-n ml --node gpu-a: exit status %d, stderr %q; want 0 and nothing", code, stderr)
	}
	wantText(t, "stdout of -n ml --node gpu-a -o wide", stdout, want)
}

// Bad usage exits 2 naming what is wrong; an API server that cannot be read
// exits 1.
func TestMainFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes is forbidden: User \"alice\" cannot list resource \"nodes\"","reason":"Forbidden","code":403}`)
	}))
	defer srv.Close()
	cfg := kubeconfig(t, srv)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-o", "table"}, 2, `kubectl-nri_vgpu: --output "table": want wide, json or yaml`},
		{[]string{"nodes"}, 2, `kubectl-nri_vgpu: unexpected arguments ["nodes"]`},
		{[]string{"--bogus"}, 2, "kubectl-nri_vgpu: unknown flag: --bogus"},
		{[]string{"--kubeconfig", cfg}, 1, `kubectl-nri_vgpu: listing nodes: nodes is forbidden: User "alice" cannot list resource "nodes"`},
		{[]string{"--kubeconfig", cfg, "--context", "other"}, 1, `kubectl-nri_vgpu: context "other" does not exist`},
	} {
		code, stdout, stderr := runMain(tc.args...)
		if code != tc.code || !strings.HasPrefix(stderr, tc.want) || stdout != "" {
			t.Errorf("%q: exit status %d, stdout %q, stderr %q; want %d and stderr starting %q", tc.args, code, stdout, stderr, tc.code, tc.want)
		}
	}
}

// A metrics text from a node is read as the contract names its series;
// values that no count can have are not shown, and what is not the text
// format is an error.
func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics([]byte(`# TYPE nri_vgpu_container_memory_limit_bytes gauge
nri_vgpu_container_memory_limit_bytes{UUID="GPU-1",container_id="c1",namespace="n",pod="p",container="c"} -1
nri_vgpu_container_memory_limit_bytes{UUID="GPU-1",container_id="c2",namespace="n",pod="p",container="d"} NaN
# TYPE nri_vgpu_container_sm_limit_ratio gauge
nri_vgpu_container_sm_limit_ratio{UUID="GPU-1",container_id="c1",namespace="n",pod="p",container="c"} 0.25
# TYPE nri_vgpu_container_cores_limit_percent gauge
nri_vgpu_container_cores_limit_percent{UUID="GPU-1",container_id="c1",namespace="n",pod="p",container="c"} 90
nri_vgpu_container_cores_limit_percent{UUID="GPU-1",container_id="c2",namespace="n",pod="p",container="d"} 40
# TYPE nri_vgpu_gpu_cores_allocated_percent gauge
nri_vgpu_gpu_cores_allocated_percent{UUID="GPU-1",gpu="3",name="X"} 65
# TYPE nri_vgpu_container_kernel_launches_total histogram
nri_vgpu_container_kernel_launches_total_bucket{UUID="GPU-1",container_id="c1",le="+Inf"} 1
nri_vgpu_container_kernel_launches_total_sum{UUID="GPU-1",container_id="c1"} 1
nri_vgpu_container_kernel_launches_total_count{UUID="GPU-1",container_id="c1"} 1
`))
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := m.records[recordKey{"c1", "GPU-1"}], m.records[recordKey{"c2", "GPU-1"}]
	if c1 == nil || c2 == nil {
		t.Fatalf("records %v, want c1 and c2 on GPU-1", m.records)
	}
	// The contract's series wins over the older name, whichever comes first.
	if c1.usage.SMLimitRatio == nil || *c1.usage.SMLimitRatio != 0.25 {
		t.Errorf("c1 SM limit %v, want 0.25 from nri_vgpu_container_sm_limit_ratio", c1.usage.SMLimitRatio)
	}
	if c2.usage.SMLimitRatio == nil || *c2.usage.SMLimitRatio != 0.4 {
		t.Errorf("c2 SM limit %v, want 0.4 from cores_limit_percent 40", c2.usage.SMLimitRatio)
	}
	if c1.usage.MemoryLimitBytes != nil || c2.usage.MemoryLimitBytes != nil {
		t.Errorf("memory limits %v %v from -1 and NaN, want none", c1.usage.MemoryLimitBytes, c2.usage.MemoryLimitBytes)
	}
	if c1.usage.KernelLaunches != nil {
		t.Errorf("kernel launches %d from a histogram, want none", *c1.usage.KernelLaunches)
	}
	if g := m.gpus["GPU-1"]; g == nil || g.smAllocated == nil || *g.smAllocated != 0.65 || g.index != "3" {
		t.Errorf("GPU-1 %+v, want index 3 and SM allocated 0.65 from cores_allocated_percent", g)
	}

	for _, bad := range []string{"<html>Service Unavailable</html>\n", "nri_vgpu_gpu_memory_used_bytes{UUID=\"x\" 1\n"} {
		if _, err := parseMetrics([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "not the Prometheus text format: ") {
			t.Errorf("parsing %q: error %v, want not the text format", bad, err)
		}
	}
}

// The pod of a claim made from a template names it in its status; a
// claim's record whose ResourceClaim the API server did not list (another
// namespace's reader, a claim deleted since) is still shown, with its pods
// from nri_vgpu_claim_pod_info.
func TestClaimPods(t *testing.T) {
	pod := claimPod("default", "tpl-pod", "dra-a", "app", "")
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo("tpl")}}
	pod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptrTo("big")}}
	claim := draClaim("default", "big", "", "dra-a", "gpu-2222-b", "20Gi", "50", "tpl-pod")
	objs := append(subset(t, "dra-a", "nri-vgpu-nri-plugin-ccccc", "dra-a-gpu.nri-vgpu.io-x7k2p"), pod, claim)
	v := collect(t, objs, allMetrics, Options{})
	cl := v.Nodes[0].GPUs[0].Claims
	if len(cl) != 1 || len(cl[0].Pods) != 1 || cl[0].Pods[0].Name != "tpl-pod" || strings.Join(cl[0].Pods[0].Containers, ",") != "app" {
		t.Errorf("claims %+v, want big with tpl-pod's container app", cl)
	}

	// Without the ResourceClaim: the record alone.
	objs = append(subset(t, "dra-a", "nri-vgpu-nri-plugin-ccccc", "dra-a-gpu.nri-vgpu.io-x7k2p"), pod)
	v = collect(t, objs, allMetrics, Options{})
	cl = v.Nodes[0].GPUs[0].Claims
	if len(cl) != 1 || cl[0].Name != "big" || cl[0].UID != "11111111-2222-3333-4444-555555555555" || cl[0].AllocatedMemoryBytes != nil ||
		cl[0].MemoryUsedBytes == nil || *cl[0].MemoryUsedBytes != 5<<30 || len(cl[0].Pods) != 1 || cl[0].Pods[0].Name != "dra-pod" {
		t.Errorf("claims %+v, want big from its record, 5 GiB used, pod dra-pod", cl)
	}
}

// A claim's record of a release before the claim label: the claim's name
// in container ("claim <name>") and its pods comma-separated in pod.
func TestClaimRecordBeforeClaimLabel(t *testing.T) {
	old := `# TYPE nri_vgpu_container_memory_limit_bytes gauge
nri_vgpu_container_memory_limit_bytes{UUID="GPU-2222-b",container="claim big",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod="dra-pod,other-pod"} 2.147483648e+10
`
	objs := subset(t, "dra-a", "nri-vgpu-nri-plugin-ccccc", "dra-a-gpu.nri-vgpu.io-x7k2p", "dra-pod")
	v := collect(t, objs, map[string]proxied{"kube-system/nri-vgpu-nri-plugin-ccccc:9455": {body: []byte(old)}}, Options{})
	cl := v.Nodes[0].GPUs[0].Claims
	if len(cl) != 1 || cl[0].Name != "big" || cl[0].MemoryLimitBytes == nil || *cl[0].MemoryLimitBytes != 20<<30 || len(cl[0].Pods) != 2 ||
		cl[0].Pods[0].Name != "dra-pod" || cl[0].Pods[0].Phase != "Running" || cl[0].Pods[1].Name != "other-pod" || cl[0].Pods[1].Phase != "" {
		t.Errorf("claims %+v, want big with a 20 GiB limit, pods dra-pod (Running) and other-pod (not listed)", cl)
	}
}

func ptrTo[T any](v T) *T { return &v }
