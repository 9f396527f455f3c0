package packaging

import (
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// servicesOf is the rendered Services of one component.
func servicesOf(m manifests, component string) []corev1.Service {
	var out []corev1.Service
	for _, s := range m.services {
		if s.Labels["app.kubernetes.io/component"] == component {
			out = append(out, s)
		}
	}
	return out
}

// serviceMonitorsOf is the rendered ServiceMonitors of one component.
func serviceMonitorsOf(m manifests, component string) []monitoringv1.ServiceMonitor {
	var out []monitoringv1.ServiceMonitor
	for _, s := range m.serviceMonitors {
		if s.Labels["app.kubernetes.io/component"] == component {
			out = append(out, s)
		}
	}
	return out
}

// checkDaemonMetrics holds one daemon's metrics to what Prometheus needs:
// --metrics-listen on port, a headless Service of that daemon's pods alone
// whose port "metrics" reaches the container's port, and a ServiceMonitor
// of that Service which adds node from the pod's node before the user's
// relabelings.
func checkDaemonMetrics(t *testing.T, m manifests, component string, port int32) {
	t.Helper()
	ds := m.daemonSets[component]
	c := mainContainer(t, ds)
	if got := listenPort(t, c, "--metrics-listen"); got != port {
		t.Errorf("%s: --metrics-listen port %d, want %d; args %q", component, got, port, c.Args)
	}
	services := servicesOf(m, component)
	if len(services) != 1 {
		t.Fatalf("%s: %d Services, want its metrics Service", component, len(services))
	}
	svc := services[0]
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("%s: Service clusterIP %q, want None: each node's pod is its own target", component, svc.Spec.ClusterIP)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("%s: Service selector %v does not match its pods %v", component, svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	for other, ods := range m.daemonSets {
		if other != component && sel.Matches(labels.Set(ods.Spec.Template.Labels)) {
			t.Errorf("%s: Service selector %v also matches the %s pods", component, svc.Spec.Selector, other)
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || containerPort(c, svc.Spec.Ports[0].TargetPort) != port {
		t.Errorf("%s: Service ports %+v, want metrics targeting the container's port %d (ports %+v)", component, svc.Spec.Ports, port, c.Ports)
	}

	monitors := serviceMonitorsOf(m, component)
	if len(monitors) != 1 {
		t.Fatalf("%s: %d ServiceMonitors, want 1", component, len(monitors))
	}
	sm := monitors[0]
	msel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range m.services {
		if matches := msel.Matches(labels.Set(other.Labels)); matches != (other.Name == svc.Name) {
			t.Errorf("%s: ServiceMonitor selector %v matches Service %s: %v", component, msel, other.Name, matches)
		}
	}
	if sm.Labels["release"] != "prom" {
		t.Errorf("%s: ServiceMonitor labels %v lack additionalLabels release=prom", component, sm.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%s: ServiceMonitor endpoints %+v, want 1", component, sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != "metrics" || ep.Path != "/metrics" || ep.Interval != "15s" {
		t.Errorf("%s: ServiceMonitor endpoint port %q path %q interval %q, want metrics, /metrics, 15s", component, ep.Port, ep.Path, ep.Interval)
	}
	rl := ep.RelabelConfigs
	if len(rl) != 2 || len(rl[0].SourceLabels) != 1 || rl[0].SourceLabels[0] != "__meta_kubernetes_pod_node_name" ||
		rl[0].TargetLabel != "node" || (rl[0].Action != "" && rl[0].Action != "replace") || rl[1].TargetLabel != "team" {
		t.Errorf("%s: ServiceMonitor relabelings %+v, want node from __meta_kubernetes_pod_node_name, then the user's", component, rl)
	}
}

// metrics.enabled serves the device plugin's and the DRA driver's metrics
// too, each on its own port behind its own headless Service and
// ServiceMonitor; the device plugin's port, equal to its health port by
// default, is one port of the container, and a port of its own otherwise.
func TestChartDaemonMetrics(t *testing.T) {
	on := []string{"--set", "metrics.enabled=true", "--set", "draDriver.enabled=true",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.additionalLabels.release=prom",
		"--set", "metrics.serviceMonitor.interval=15s",
		"--set-json", `metrics.serviceMonitor.relabelings=[{"targetLabel":"team","replacement":"gpu"}]`}
	t.Run("defaults", func(t *testing.T) {
		m := render(t, on...)
		checkDaemonMetrics(t, m, "device-plugin", 9456)
		checkDaemonMetrics(t, m, "dra-driver", 9457)
		c := mainContainer(t, m.daemonSets["device-plugin"])
		checkProbes(t, c, "--health-listen")
		if len(c.Ports) != 1 {
			t.Errorf("device plugin ports %+v, want the one health port that also serves the metrics", c.Ports)
		}
	})
	t.Run("own ports", func(t *testing.T) {
		m := render(t, append(on, "--set", "devicePlugin.metrics.port=9600", "--set", "draDriver.metrics.port=9601")...)
		checkDaemonMetrics(t, m, "device-plugin", 9600)
		checkDaemonMetrics(t, m, "dra-driver", 9601)
		c := mainContainer(t, m.daemonSets["device-plugin"])
		checkProbes(t, c, "--health-listen")
		if containerPort(c, intstr.FromString("metrics")) != 9600 {
			t.Errorf("device plugin ports %+v lack metrics 9600", c.Ports)
		}
	})
	t.Run("off", func(t *testing.T) {
		m := render(t, "--set", "draDriver.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
		for _, component := range []string{"device-plugin", "dra-driver"} {
			c := mainContainer(t, m.daemonSets[component])
			if listenPort(t, c, "--metrics-listen") != 0 || containerPort(c, intstr.FromString("metrics")) != 0 {
				t.Errorf("%s: metrics off, yet a metrics port: args %q, ports %+v", component, c.Args, c.Ports)
			}
		}
	})
}
