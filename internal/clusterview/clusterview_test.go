package clusterview

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/aymanbagabas/go-udiff"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// allMetrics answers the pod proxy for both NRI plugin pods of cluster().
var allMetrics = map[string]proxied{
	"kube-system/nri-vgpu-nri-plugin-aaaaa:9455": {body: []byte(gpuAMetrics)},
	"kube-system/nri-vgpu-nri-plugin-ccccc:9455": {body: []byte(draAMetrics)},
}

func collect(t *testing.T, objects []runtime.Object, metrics map[string]proxied, opts Options) *View {
	t.Helper()
	v, warnings, err := Collect(context.Background(), fakeClient(t, objects, metrics), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) > 0 {
		t.Errorf("warnings %q, want none", warnings)
	}
	return v
}

func render(t *testing.T, v *View, format string) string {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, v, format); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func wantText(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s differs (-want +got):\n%s", what, udiff.Unified("want", "got", want, got))
	}
}

// The table: node gpu-a's rows come from its metrics (the contract's
// series, and an older release's cores_limit_percent for ml/train, whose
// region is suspect); gpu-b has no NRI plugin pod, so its running pod is
// listed without a GPU; dra-a's claim carries its record's use and is
// followed by its pod; cpu-1 offers no GPU and is left out; the finished
// pod default/done counts for nothing.
func TestTable(t *testing.T) {
	v := collect(t, cluster(), allMetrics, Options{})
	want := `NODE   GPU  NAMESPACE  POD        CONTAINER  SLICES  MEMORY USED/LIMIT  PEAK    SM USED/LIMIT  THROTTLED
dra-a  -    -          -          -          -       -                  -       -              -
dra-a  0    -          -          -          -       5GiB/20GiB         -       40%/50%        -
dra-a  0    default    claim/big  -          -       5GiB/20GiB         6GiB    40%/50%        0s
dra-a  0    default    dra-pod    app
gpu-a  -    -          -          -          4/20    -                  -       -              -
gpu-a  0    -          -          -          -       3GiB/12GiB         -       25%/30%        -
gpu-a  0    default    cuda-a     main       2       2GiB/8GiB          2.5GiB  20%/20%        12.5s
gpu-a  0    ml         train      worker     1       suspect/4GiB       -       5%/10%         -
gpu-a  1    -          -          -          -       0B/0B              -       0%/0%          -
gpu-a  ?    default    waiting    main       1       -                  -       -              -
gpu-b  -    -          -          -          1/10    -                  -       -              -
gpu-b  ?    default    stuck      main       1       -                  -       -              -
`
	wantText(t, "table", render(t, v, OutputTable), want)
}

// -o wide: the GPU's UUID, model and memory on every row of it, the
// container IDs as crictl shortens them (a claim's record by its UID's
// first group), share utilisation, kernel launches, processes, suspect.
func TestWide(t *testing.T) {
	v := collect(t, cluster(), allMetrics, Options{})
	want := `NODE   GPU  UUID        MODEL                  GPU MEMORY  NAMESPACE  POD        CONTAINER  CONTAINER ID    SLICES  MEMORY USED/LIMIT  PEAK    SM USED/LIMIT  SHARE USED  THROTTLED  LAUNCHES  PROCESSES  SUSPECT
dra-a  -    -           -                      -           -          -          -          -               -       -                  -       -              -           -          -         -          -
dra-a  0    GPU-2222-b  NVIDIA H100 80GB HBM3  80GiB       -          -          -          -               -       5GiB/20GiB         -       40%/50%        -           -          -         -          -
dra-a  0    GPU-2222-b  NVIDIA H100 80GB HBM3  80GiB       default    claim/big  -          claim-11111111  -       5GiB/20GiB         6GiB    40%/50%        80%         0s         10        1          no
dra-a  0    GPU-2222-b  NVIDIA H100 80GB HBM3  80GiB       default    dra-pod    app
gpu-a  -    -           -                      -           -          -          -          -               4/20    -                  -       -              -           -          -         -          -
gpu-a  0    GPU-0000-a  NVIDIA A100-SXM4-40GB  40GiB       -          -          -          -               -       3GiB/12GiB         -       25%/30%        -           -          -         -          -
gpu-a  0    GPU-0000-a  NVIDIA A100-SXM4-40GB  40GiB       default    cuda-a     main       0123456789ab    2       2GiB/8GiB          2.5GiB  20%/20%        100%        12.5s      1234      2          no
gpu-a  0    GPU-0000-a  NVIDIA A100-SXM4-40GB  40GiB       ml         train      worker     fedcba987654    1       suspect/4GiB       -       5%/10%         50%         -          -         1          yes
gpu-a  1    GPU-1111-a  NVIDIA A100-SXM4-40GB  40GiB       -          -          -          -               -       0B/0B              -       0%/0%          -           -          -         -          -
gpu-a  ?    -           -                      -           default    waiting    main       -               1       -                  -       -              -           -          -         -          -
gpu-b  -    -           -                      -           -          -          -          -               1/10    -                  -       -              -           -          -         -          -
gpu-b  ?    -           -                      -           default    stuck      main       -               1       -                  -       -              -           -          -         -          -
`
	wantText(t, "wide table", render(t, v, OutputWide), want)
}

// subset picks objects of cluster() by name.
func subset(t *testing.T, names ...string) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, o := range cluster() {
		m, err := meta(o)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if m == n {
				out = append(out, o)
			}
		}
	}
	if len(out) != len(names) {
		t.Fatalf("subset %q: found %d objects", names, len(out))
	}
	return out
}

func meta(o runtime.Object) (string, error) {
	type named interface{ GetName() string }
	n, ok := o.(named)
	if !ok {
		return "", errors.New("object without a name")
	}
	return n.GetName(), nil
}

// -o json: the documented structure (testdata/subset.json, written from the
// types' json tags): a DRA node whose claim has both what the scheduler
// allocated and its record's use, and a node whose metrics could not be
// read, with its error and its pod without a GPU.
func TestJSON(t *testing.T) {
	objs := subset(t, "gpu-b", "dra-a", "nri-vgpu-nri-plugin-ccccc", "stuck", "dra-a-gpu.nri-vgpu.io-x7k2p", "big", "dra-pod")
	v := collect(t, objs, allMetrics, Options{})
	want, err := os.ReadFile("testdata/subset.json")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "JSON", render(t, v, OutputJSON), string(want))
}

// -o yaml: the same structure as the JSON (testdata/gpu-a.yaml): a
// device-plugin node, its labels of GPU feature discovery, two GPUs, a
// container with every series and one whose region is suspect (its used
// left out).
func TestYAML(t *testing.T) {
	objs := subset(t, "gpu-a", "nri-vgpu-nri-plugin-aaaaa", "cuda-a", "train")
	v := collect(t, objs, allMetrics, Options{})
	want, err := os.ReadFile("testdata/gpu-a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wantText(t, "YAML", render(t, v, OutputYAML), string(want))
}

// A node whose metrics cannot be read is listed with what the API server
// knows (its slices, its GPU pod without a GPU) and an error that names
// what failed; the other nodes are not affected.
func TestNodeErrors(t *testing.T) {
	pending := pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodPending, 9455)
	noPort := pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodRunning, 0)
	running := pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodRunning, 9455)
	for _, tc := range []struct {
		name    string
		plugin  *corev1.Pod // nil: none on gpu-a
		metrics proxied
		want    string
	}{
		{"no plugin pod", nil, proxied{}, "no NRI plugin pod (label selector app.kubernetes.io/name=nri-vgpu,app.kubernetes.io/component=nri-plugin) on the node"},
		{"plugin pod pending", pending, proxied{}, "NRI plugin pod kube-system/nri-vgpu-nri-plugin-aaaaa is Pending, not Running"},
		{"metrics off", noPort, proxied{}, `NRI plugin pod kube-system/nri-vgpu-nri-plugin-aaaaa has no container port named "metrics" (the chart serves metrics with metrics.enabled=true)`},
		{"proxy error", running, proxied{err: errors.New(`error trying to reach service: dial tcp 10.0.0.7:9455: connect: connection refused`)},
			"reading the metrics of NRI plugin pod kube-system/nri-vgpu-nri-plugin-aaaaa:9455 through the API server's pod proxy: error trying to reach service: dial tcp 10.0.0.7:9455: connect: connection refused"},
		{"bad scrape", running, proxied{body: []byte("<html>Service Unavailable</html>\n")},
			"metrics of NRI plugin pod kube-system/nri-vgpu-nri-plugin-aaaaa:9455: not the Prometheus text format: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := subset(t, "gpu-a", "cuda-a", "dra-a", "nri-vgpu-nri-plugin-ccccc")
			if tc.plugin != nil {
				objs = append(objs, tc.plugin)
			}
			metrics := map[string]proxied{
				"kube-system/nri-vgpu-nri-plugin-aaaaa:9455": tc.metrics,
				"kube-system/nri-vgpu-nri-plugin-ccccc:9455": {body: []byte(draAMetrics)},
			}
			v := collect(t, objs, metrics, Options{})
			if len(v.Nodes) != 2 || v.Nodes[0].Name != "dra-a" || v.Nodes[1].Name != "gpu-a" {
				t.Fatalf("nodes %+v, want dra-a and gpu-a", v.Nodes)
			}
			if n := v.Nodes[0]; n.Error != "" || len(n.GPUs) != 1 {
				t.Errorf("node dra-a: error %q, %d GPUs; want its metrics read", n.Error, len(n.GPUs))
			}
			n := v.Nodes[1]
			if !strings.HasPrefix(n.Error, tc.want) {
				t.Errorf("node gpu-a error\n%q\nwant it to start with\n%q", n.Error, tc.want)
			}
			if len(n.Resources) != 1 || n.Resources[0].Requested != 2 || n.Resources[0].Allocatable != 20 {
				t.Errorf("node gpu-a resources %+v, want 2 of 20 slices requested", n.Resources)
			}
			if len(n.GPUs) != 0 || len(n.Unplaced) != 1 || n.Unplaced[0].Pod != "cuda-a" || n.Unplaced[0].Slices != 2 {
				t.Errorf("node gpu-a GPUs %+v unplaced %+v; want no GPU and cuda-a's 2 slices unplaced", n.GPUs, n.Unplaced)
			}
			var stderr bytes.Buffer
			WriteErrors(&stderr, Name, v)
			if got, want := stderr.String(), "kubectl-nri_vgpu: node gpu-a: "+tc.want; !strings.HasPrefix(got, want) || strings.Count(got, "\n") != 1 {
				t.Errorf("stderr %q, want one line starting %q", got, want)
			}
		})
	}
}

// --namespace lists that namespace's containers and claims only; the GPUs
// stay whole (their totals are the node's).
func TestNamespace(t *testing.T) {
	v := collect(t, cluster(), allMetrics, Options{Namespace: "ml"})
	want := `NODE   GPU  NAMESPACE  POD    CONTAINER  SLICES  MEMORY USED/LIMIT  PEAK  SM USED/LIMIT  THROTTLED
dra-a  -    -          -      -          -       -                  -     -              -
dra-a  0    -          -      -          -       5GiB/20GiB         -     40%/50%        -
gpu-a  -    -          -      -          1/20    -                  -     -              -
gpu-a  0    -          -      -          -       3GiB/12GiB         -     25%/30%        -
gpu-a  0    ml         train  worker     1       suspect/4GiB       -     5%/10%         -
gpu-a  1    -          -      -          -       0B/0B              -     0%/0%          -
gpu-b  -    -          -      -          0/10    -                  -     -              -
`
	wantText(t, "table of namespace ml", render(t, v, OutputTable), want)
}

// --node lists the nodes named, even one that offers no GPU; a node that
// does not exist is an error.
func TestNodeFilter(t *testing.T) {
	v := collect(t, cluster(), allMetrics, Options{Nodes: []string{"gpu-b", "cpu-1"}})
	if len(v.Nodes) != 2 || v.Nodes[0].Name != "cpu-1" || v.Nodes[1].Name != "gpu-b" {
		t.Fatalf("nodes %+v, want cpu-1 and gpu-b", v.Nodes)
	}
	_, _, err := Collect(context.Background(), fakeClient(t, cluster(), allMetrics), Options{Nodes: []string{"gpu-z"}})
	if err == nil || err.Error() != `node "gpu-z": not found` {
		t.Errorf("--node gpu-z: error %v, want it not found", err)
	}
}

// During a rollout a node can have two NRI plugin pods: the running one is
// read, though the pending one is listed first (the fake lists by name).
func TestPluginPodChoice(t *testing.T) {
	objs := append(subset(t, "gpu-a"),
		pluginPod("nri-vgpu-nri-plugin-0new", "gpu-a", corev1.PodPending, 9455),
		pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodRunning, 9455))
	v := collect(t, objs, allMetrics, Options{})
	if n := v.Nodes[0]; n.Error != "" || n.MetricsPod != "kube-system/nri-vgpu-nri-plugin-aaaaa:9455" {
		t.Errorf("metrics from %q, error %q; want the running pod's", n.MetricsPod, n.Error)
	}
}

// A label value from a node's metrics cannot send the terminal an escape
// sequence or split a cell with a tab: the table shows "?" for control
// characters.
func TestTableControlCharacters(t *testing.T) {
	text := "# TYPE nri_vgpu_container_memory_limit_bytes gauge\n" +
		"nri_vgpu_container_memory_limit_bytes{UUID=\"GPU-0000-a\",container=\"m\tx\",container_id=\"abc\",namespace=\"default\",pod=\"evil\x1b[2J\"} 0\n"
	objs := subset(t, "gpu-a", "nri-vgpu-nri-plugin-aaaaa")
	v := collect(t, objs, map[string]proxied{"kube-system/nri-vgpu-nri-plugin-aaaaa:9455": {body: []byte(text)}}, Options{})
	if v.Nodes[0].Error != "" {
		t.Fatalf("node error %q", v.Nodes[0].Error)
	}
	want := `NODE   GPU  NAMESPACE  POD       CONTAINER  SLICES  MEMORY USED/LIMIT  PEAK  SM USED/LIMIT  THROTTLED
gpu-a  -    -          -         -          0/20    -                  -     -              -
gpu-a  ?    -          -         -          -       -/-                -     -/-            -
gpu-a  ?    default    evil?[2J  m?x        -       -/none             -     -/-            -
`
	wantText(t, "table", render(t, v, OutputTable), want)
}
