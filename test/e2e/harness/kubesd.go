package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Debian's prometheus (hack/prometheus.sh) is built without
// kubernetes_sd_configs: of the service discoveries it has, HTTP is the one
// that follows a cluster as it changes. So the harness answers Prometheus'
// http_sd_configs from the API server (as the cluster's admin), with the
// labels kubernetes_sd_configs' endpointslice role gives each target (those
// a scrape job selects on: the slice's, its Service's and the endpoint's
// pod's, under the names of Prometheus' configuration reference), and the
// scrape job relabels them exactly as a cluster Prometheus's would: the
// relabelling under test runs in Prometheus, unchanged.

// targetGroup is one entry of an HTTP service discovery response.
type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// kubernetesTargets lists what kubernetes_sd_configs (role endpointslice,
// namespaces.names = [namespace]) would discover in namespace now: one
// target per address and port of each EndpointSlice, with its labels.
func kubernetesTargets(ctx context.Context, client kubernetes.Interface, namespace string) ([]targetGroup, error) {
	slices, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: listing EndpointSlices in %s: %w", namespace, err)
	}
	services, err := client.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: listing Services in %s: %w", namespace, err)
	}
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("harness: listing pods in %s: %w", namespace, err)
	}
	serviceByName := map[string]*corev1.Service{}
	for i := range services.Items {
		serviceByName[services.Items[i].Name] = &services.Items[i]
	}
	podByName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		podByName[pods.Items[i].Name] = &pods.Items[i]
	}
	groups := []targetGroup{}
	for i := range slices.Items {
		es := &slices.Items[i]
		for _, ep := range es.Endpoints {
			for _, port := range es.Ports {
				if port.Port == nil {
					continue
				}
				for _, addr := range ep.Addresses {
					labels := map[string]string{
						"__meta_kubernetes_namespace":                  namespace,
						"__meta_kubernetes_endpointslice_name":         es.Name,
						"__meta_kubernetes_endpointslice_address_type": string(es.AddressType),
						"__meta_kubernetes_endpointslice_port":         strconv.Itoa(int(*port.Port)),
					}
					if port.Name != nil {
						labels["__meta_kubernetes_endpointslice_port_name"] = *port.Name
					}
					if port.Protocol != nil {
						labels["__meta_kubernetes_endpointslice_port_protocol"] = string(*port.Protocol)
					}
					if ep.Conditions.Ready != nil {
						labels["__meta_kubernetes_endpointslice_endpoint_conditions_ready"] = strconv.FormatBool(*ep.Conditions.Ready)
					}
					if name := es.Labels[discoveryv1.LabelServiceName]; name != "" {
						if svc := serviceByName[name]; svc != nil {
							objectLabels(labels, "service", svc.Name, svc.Labels)
						}
					}
					if ref := ep.TargetRef; ref != nil {
						labels["__meta_kubernetes_endpointslice_address_target_kind"] = ref.Kind
						labels["__meta_kubernetes_endpointslice_address_target_name"] = ref.Name
						if pod := podByName[ref.Name]; ref.Kind == "Pod" && pod != nil {
							objectLabels(labels, "pod", pod.Name, pod.Labels)
							labels["__meta_kubernetes_pod_node_name"] = pod.Spec.NodeName
							labels["__meta_kubernetes_pod_host_ip"] = pod.Status.HostIP
							labels["__meta_kubernetes_pod_ip"] = pod.Status.PodIP
							labels["__meta_kubernetes_pod_uid"] = string(pod.UID)
						}
					}
					groups = append(groups, targetGroup{
						Targets: []string{net.JoinHostPort(addr, strconv.Itoa(int(*port.Port)))},
						Labels:  labels,
					})
				}
			}
		}
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Targets[0] < groups[j].Targets[0] })
	return groups, nil
}

// objectLabels adds kubernetes_sd's labels of an object of kind ("service",
// "pod"): its name, and each label and its presence, with the label's name
// made a valid label name.
func objectLabels(to map[string]string, kind, name string, labels map[string]string) {
	prefix := "__meta_kubernetes_" + kind + "_"
	to[prefix+"name"] = name
	for k, v := range labels {
		n := labelNameChars.ReplaceAllString(k, "_")
		to[prefix+"label_"+n] = v
		to[prefix+"labelpresent_"+n] = "true"
	}
}

// kubernetesSDServer answers GET /NAMESPACE with kubernetesTargets(NAMESPACE)
// as an HTTP service discovery response.
type kubernetesSDServer struct {
	client kubernetes.Interface
}

func (s *kubernetesSDServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ns := strings.Trim(r.URL.Path, "/")
	if r.Method != http.MethodGet || ns == "" || strings.Contains(ns, "/") {
		http.Error(w, "GET /NAMESPACE", http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	groups, err := kubernetesTargets(ctx, s.client, ns)
	if err != nil {
		// Prometheus keeps the targets it had and logs this.
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(groups)
}
