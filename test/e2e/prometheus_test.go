//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

// startPrometheus starts Debian's prometheus (harness.PrometheusBinary:
// make test-e2e provides it, so its absence fails the test) scraping the
// jobs' Services in k, and stops it when t ends; on failure its log tail
// is printed first.
func startPrometheus(t *testing.T, ctx context.Context, k *harness.Cluster, ruleFiles []string, jobs ...harness.ServiceJob) *harness.Prometheus {
	t.Helper()
	bin, err := harness.PrometheusBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := harness.StartPrometheus(ctx, harness.PrometheusOptions{Binary: bin, Cluster: k, Jobs: jobs, RuleFiles: ruleFiles, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log (tail):\n%s", p.LogTail(40))
		}
		pid := p.Pid()
		if err := p.Close(); err != nil {
			t.Errorf("stopping prometheus: %v", err)
		}
		if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
			t.Errorf("prometheus (pid %d) still there after Close: kill 0 = %v", pid, err)
		}
	})
	return p
}

// waitQuery evaluates q until ok accepts its vector, for up to d, and
// returns that vector; past d it fails t with the last answer and the
// targets' state.
func waitQuery(t *testing.T, ctx context.Context, p *harness.Prometheus, d time.Duration, q string, ok func(model.Vector) bool) model.Vector {
	t.Helper()
	var vec model.Vector
	var qerr error
	err := waitFor(ctx, d, func() bool {
		vec, qerr = p.Query(ctx, q)
		if qerr == nil && ok(vec) {
			return true
		}
		time.Sleep(500 * time.Millisecond)
		return false
	})
	if err != nil {
		t.Fatalf("%s = %v (%v) after %v\ntargets:\n%s", q, vec, qerr, d, p.Targets(ctx))
	}
	return vec
}

// one accepts a vector of exactly one sample.
func one(v model.Vector) bool { return len(v) == 1 }

// TestPrometheusDiscovery: the harness's Prometheus finds its targets as a
// cluster Prometheus does, through the API server (with the cluster's token,
// verifying the server's certificate): the EndpointSlices of the Services in
// the job's namespace with the job's labels, on the job's port name — not
// those of another Service, another port or another namespace — and gives
// the series the node of the endpoint's pod as `node`, keeping their own
// namespace and pod labels. The control plane alone: the "pod" is a local
// HTTP server, its EndpointSlice written by the test.
func TestPrometheusDiscovery(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	const node = "sd-node-e2e"
	k, err := harness.StartCluster(ctx, harness.ClusterOptions{ControlPlaneOnly: true, NodeName: node, Logf: t.Logf})
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
	const ns = "nri-vgpu-sd"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app.kubernetes.io/name": "nri-vgpu", "app.kubernetes.io/component": "nri-plugin"}
	// Each endpoint serves a value of its own: only the first may be
	// scraped. The API server refuses loopback endpoint addresses.
	ip := hostIPv4(t)
	target := serveMetrics(t, ip, `e2e_probe{namespace="tenant",pod="gpu-pod"} 42`)
	otherService := serveMetrics(t, ip, `e2e_probe 1`)
	otherPort := serveMetrics(t, ip, `e2e_probe 2`)
	otherNamespace := serveMetrics(t, ip, `e2e_probe 3`)
	sd := sdObjects{t: t, ctx: ctx, k: k, node: node}
	sd.service(ns, "metrics", labels, "metrics", target)
	sd.service(ns, "other", map[string]string{"app.kubernetes.io/name": "nri-vgpu", "app.kubernetes.io/component": "device-plugin"}, "metrics", otherService)
	sd.service(ns, "other-port", labels, "health", otherPort)
	sd.service("default", "metrics", labels, "metrics", otherNamespace)

	p := startPrometheus(t, ctx, k, nil, harness.ServiceJob{Name: "nri-vgpu", Namespace: ns, ServiceLabels: labels, Port: "metrics"})
	up := waitQuery(t, ctx, p, time.Minute, `up{job="nri-vgpu"} == 1`, one)
	if got := string(up[0].Metric["node"]); got != node {
		t.Errorf("up%v: node %q, want %q (the endpoint's pod's node)", up[0].Metric, got, node)
	}
	// Discovered in one pass with the target: a wrongly kept endpoint
	// would be up by now as well.
	time.Sleep(5 * time.Second)
	if all, err := p.Query(ctx, `up`); err != nil || len(all) != 1 {
		t.Errorf("up = %v (%v), want the one target\ntargets:\n%s", all, err, p.Targets(ctx))
	}
	probe := waitQuery(t, ctx, p, 30*time.Second, `e2e_probe`, one)
	want := model.Metric{"__name__": "e2e_probe", "namespace": "tenant", "pod": "gpu-pod", "node": node, "job": "nri-vgpu", "instance": model.LabelValue(target)}
	if s := probe[0]; !s.Metric.Equal(want) || s.Value != 42 {
		t.Errorf("e2e_probe = %v, want %v 42", s, want)
	}
}

// hostIPv4 is an IPv4 address of this machine outside the loopback range.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatalf("no IPv4 address outside loopback among %v: an EndpointSlice cannot name a loopback address", addrs)
	return ""
}

// serveMetrics serves body as /metrics on a port of ip for the rest of t
// and returns the address.
func serveMetrics(t *testing.T, ip, body string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// sdObjects writes what the endpointslice controller and a kubelet would
// have made of a Service with a running pod behind it.
type sdObjects struct {
	t    *testing.T
	ctx  context.Context
	k    *harness.Cluster
	node string
}

// service creates in ns a headless Service name with labels and one port
// named port, a pod bound to the node, and the Service's EndpointSlice,
// whose endpoint is that pod at addr.
func (s sdObjects) service(ns, name string, labels map[string]string, port, addr string) {
	t := s.t
	t.Helper()
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var portNum int32
	if _, err := fmt.Sscan(portStr, &portNum); err != nil {
		t.Fatal(err)
	}
	core := s.k.Client.CoreV1()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: port, Port: portNum, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := core.Services(ns).Create(s.ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-pod", Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: s.node, Containers: []corev1.Container{{Name: "main", Image: "none"}}},
	}
	created, err := core.Pods(ns).Create(s.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, node, tcp := true, s.node, corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-slice", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: created.Name, UID: created.UID},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &port, Port: &portNum, Protocol: &tcp}},
	}
	if _, err := s.k.Client.DiscoveryV1().EndpointSlices(ns).Create(s.ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
