package harness

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

// sdCluster holds, in kube-system, the chart's metrics Service with its
// EndpointSlice (one endpoint the NRI plugin's pod, one without a pod), and
// in default another Service's slice.
func sdCluster() *fake.Clientset {
	name, port, tcp, ready := "metrics", int32(9455), corev1.ProtocolTCP, true
	return fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "nri-vgpu-metrics", Namespace: "kube-system",
			Labels: map[string]string{"app.kubernetes.io/instance": "nri-vgpu"}}},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "nri-vgpu-nri-plugin-x", Namespace: "kube-system", UID: "u1",
				Labels: map[string]string{"app.kubernetes.io/component": "nri-plugin"}},
			Spec:   corev1.PodSpec{NodeName: "gpu-node-1"},
			Status: corev1.PodStatus{PodIP: "10.234.77.5", HostIP: "192.0.2.2"},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "nri-vgpu-metrics-abc", Namespace: "kube-system", Labels: map[string]string{discoveryv1.LabelServiceName: "nri-vgpu-metrics"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.234.77.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "kube-system", Name: "nri-vgpu-nri-plugin-x"}},
				{Addresses: []string{"10.234.77.9"}},
			},
			Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "other", Namespace: "default"},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.234.77.7"}}},
			Ports:       []discoveryv1.EndpointPort{{Port: &port}},
		},
	)
}

// TestKubernetesTargets: the targets of a namespace, with the labels
// kubernetes_sd_configs' endpointslice role gives them: the slice's port, the
// Service's labels (made label names) and the endpoint's pod's node; an
// endpoint without a pod has no pod labels; another namespace is left out.
func TestKubernetesTargets(t *testing.T) {
	got, err := kubernetesTargets(context.Background(), sdCluster(), "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	slice := map[string]string{
		"__meta_kubernetes_namespace":                                       "kube-system",
		"__meta_kubernetes_endpointslice_name":                              "nri-vgpu-metrics-abc",
		"__meta_kubernetes_endpointslice_address_type":                      "IPv4",
		"__meta_kubernetes_endpointslice_port":                              "9455",
		"__meta_kubernetes_endpointslice_port_name":                         "metrics",
		"__meta_kubernetes_endpointslice_port_protocol":                     "TCP",
		"__meta_kubernetes_service_name":                                    "nri-vgpu-metrics",
		"__meta_kubernetes_service_label_app_kubernetes_io_instance":        "nri-vgpu",
		"__meta_kubernetes_service_labelpresent_app_kubernetes_io_instance": "true",
	}
	withPod := map[string]string{
		"__meta_kubernetes_endpointslice_endpoint_conditions_ready":      "true",
		"__meta_kubernetes_endpointslice_address_target_kind":            "Pod",
		"__meta_kubernetes_endpointslice_address_target_name":            "nri-vgpu-nri-plugin-x",
		"__meta_kubernetes_pod_name":                                     "nri-vgpu-nri-plugin-x",
		"__meta_kubernetes_pod_label_app_kubernetes_io_component":        "nri-plugin",
		"__meta_kubernetes_pod_labelpresent_app_kubernetes_io_component": "true",
		"__meta_kubernetes_pod_node_name":                                "gpu-node-1",
		"__meta_kubernetes_pod_ip":                                       "10.234.77.5",
		"__meta_kubernetes_pod_host_ip":                                  "192.0.2.2",
		"__meta_kubernetes_pod_uid":                                      "u1",
	}
	for k, v := range slice {
		withPod[k] = v
	}
	want := []targetGroup{
		{Targets: []string{"10.234.77.5:9455"}, Labels: withPod},
		{Targets: []string{"10.234.77.9:9455"}, Labels: slice},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("targets:\n%+v\nwant\n%+v", got, want)
	}
}

// TestKubernetesSDServer: the HTTP service discovery answers a namespace's
// targets as JSON, and refuses a path that is not a namespace.
func TestKubernetesSDServer(t *testing.T) {
	srv := httptest.NewServer(&kubernetesSDServer{client: sdCluster()})
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/default")
	if err != nil {
		t.Fatal(err)
	}
	var groups []targetGroup
	err = json.NewDecoder(resp.Body).Decode(&groups)
	resp.Body.Close()
	if err != nil || resp.Header.Get("Content-Type") != "application/json" || len(groups) != 1 || groups[0].Targets[0] != "10.234.77.7:9455" {
		t.Errorf("GET /default: %s %q, %+v (%v); want the one target of default as JSON", resp.Status, resp.Header.Get("Content-Type"), groups, err)
	}
	for _, path := range []string{"/", "/a/b"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
}

// TestPrometheusConfig: a job keeps the targets of the Services with its
// labels on its port name (label names made valid, values matched
// literally), puts the pod's node in `node`, keeps the series' own labels,
// and refreshes and scrapes at the interval; a job without a cluster, or
// without a selector, is refused.
func TestPrometheusConfig(t *testing.T) {
	opts := PrometheusOptions{
		Jobs: []ServiceJob{{Name: "nri-vgpu", Namespace: "kube-system", Port: "metrics",
			ServiceLabels: map[string]string{"app.kubernetes.io/instance": "nri-vgpu", "app.kubernetes.io/name": "a.b"}}},
		RuleFiles: []string{"/r/rules.yaml"},
		Interval:  2_000_000_000,
	}
	raw, err := prometheusConfig(opts, "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal([]byte(`
global: {scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 2s}
rule_files: [/r/rules.yaml]
scrape_configs:
- job_name: nri-vgpu
  honor_labels: true
  http_sd_configs:
  - {url: "http://127.0.0.1:1/kube-system", refresh_interval: 2s}
  relabel_configs:
  - {action: keep, source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_instance], regex: nri-vgpu}
  - {action: keep, source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_name], regex: 'a\.b'}
  - {action: keep, source_labels: [__meta_kubernetes_endpointslice_port_name], regex: metrics}
  - {action: replace, source_labels: [__meta_kubernetes_pod_node_name], target_label: node}
`), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("config:\n%s\nwant the same as %v", raw, want)
	}
	if _, err := prometheusConfig(opts, ""); err == nil {
		t.Error("a job without a cluster: no error")
	}
	opts.Jobs[0].ServiceLabels = nil
	if _, err := prometheusConfig(opts, "http://127.0.0.1:1"); err == nil {
		t.Error("a job without service labels: no error")
	}
}
