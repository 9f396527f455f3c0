package packaging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/promserver/promtooltest"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

const rulesPath = "../../packaging/helm/nri-vgpu/rules/nri-vgpu.rules.yaml"

// promtool returns the path of the pinned promtool.
func promtool(t *testing.T) string { return promtooltest.Promtool(t) }

// runPromtool runs promtool with args in dir and fails the test, with its
// output, when it fails.
func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// The chart's alerting rules are valid, and each alert fires on the series
// in rules_test.yaml that should make it fire, and on no other.
func TestAlertRules(t *testing.T) {
	runPromtool(t, ".", "check", "rules", rulesPath)
	runPromtool(t, ".", "test", "rules", "rules_test.yaml")
}

// Every alert has a severity, a summary, a description and a runbook
// section in docs/metrics.md, and rules_test.yaml has for each a case
// where it fires and one where it does not.
func TestAlertRulesComplete(t *testing.T) {
	data, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &tests); err != nil { // promtool checks the rest
		t.Fatalf("rules_test.yaml: %v", err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	docs, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range ruleFileGroups(t) {
		for _, r := range g.Rules {
			n++
			a := r.Alert
			if !fires[a] || !quiet[a] {
				t.Errorf("%s: rules_test.yaml has a case where it fires: %v, where it does not: %v; want both", a, fires[a], quiet[a])
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: severity %q, annotations %v; want a severity, a summary and a description", a, r.Labels["severity"], r.Annotations)
			}
			anchor := "docs/metrics.md#" + strings.ToLower(a)
			if !strings.HasSuffix(r.Annotations["runbook_url"], anchor) {
				t.Errorf("%s: runbook_url %q, want one ending in %s", a, r.Annotations["runbook_url"], anchor)
			}
			if !bytes.Contains(docs, []byte("\n### "+a+"\n")) {
				t.Errorf("%s: docs/metrics.md has no section \"### %s\" (its runbook)", a, a)
			}
		}
	}
	if n == 0 {
		t.Fatalf("no rules in %s", rulesPath)
	}
}

// helmTemplate renders the chart like render, as the given release, and
// returns helm's failure instead of failing the test: for values the chart
// must refuse.
func helmTemplate(t *testing.T, release string, args ...string) ([]byte, error) {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Skip("HELM is not set: hack/helm.sh check runs these tests with its pinned helm")
	}
	out, err := exec.Command(helm, append([]string{"template", release, chartPath,
		"--namespace", "kube-system", "--kube-version", "1.30.0"}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("helm template %q: %w\n%s", args, err, out)
	}
	return out, nil
}

// dashboardConfigMap returns the rendered ConfigMaps holding the dashboard
// (those with its data key).
func dashboardConfigMaps(m manifests) []corev1.ConfigMap {
	var cms []corev1.ConfigMap
	for _, cm := range m.configMaps {
		if _, ok := cm.Data["nri-vgpu.json"]; ok {
			cms = append(cms, cm)
		}
	}
	return cms
}

// metrics.dashboard.enabled ships the dashboard file, unchanged, in a
// ConfigMap carrying the label Grafana's sidecar looks for; only with
// metrics on, and not by default.
func TestChartDashboard(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--set", "metrics.enabled=true"},
		{"--set", "metrics.dashboard.enabled=true"},
	} {
		if cms := dashboardConfigMaps(render(t, args...)); len(cms) != 0 {
			t.Errorf("values %q: %d dashboard ConfigMaps, want none", args, len(cms))
		}
	}

	want, err := os.ReadFile("../../packaging/helm/nri-vgpu/dashboards/nri-vgpu.json")
	if err != nil {
		t.Fatal(err)
	}
	m := render(t, "--set", "metrics.enabled=true", "--set", "metrics.dashboard.enabled=true",
		"--set", "metrics.dashboard.annotations.grafana_folder=GPU")
	cms := dashboardConfigMaps(m)
	if len(cms) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(cms))
	}
	cm := cms[0]
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "GPU" {
		t.Errorf("dashboard ConfigMap labels %v, annotations %v; want grafana_dashboard=1 and grafana_folder=GPU", cm.Labels, cm.Annotations)
	}
	if cm.Namespace != "kube-system" {
		t.Errorf("dashboard ConfigMap in %q, want the chart's namespace", cm.Namespace)
	}
	got := cm.Data["nri-vgpu.json"]
	if got != strings.TrimSuffix(string(want), "\n") {
		t.Errorf("the ConfigMap's dashboard differs from dashboards/nri-vgpu.json")
	}
	var d struct {
		UID    string           `json:"uid"`
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal([]byte(got), &d); err != nil || d.UID != "nri-vgpu" || len(d.Panels) == 0 {
		t.Errorf("the ConfigMap's dashboard is not the nri-vgpu dashboard JSON (uid %q, %d panels): %v", d.UID, len(d.Panels), err)
	}

	// Another sidecar's label, in the namespace it searches.
	m = render(t, "--set", "metrics.enabled=true", "--set", "metrics.dashboard.enabled=true",
		"--set", "metrics.dashboard.labels.grafana_dashboard=null", "--set", "metrics.dashboard.labels.dashboards=gpu",
		"--set", "metrics.dashboard.namespace=monitoring")
	if cms := dashboardConfigMaps(m); len(cms) != 1 || cms[0].Labels["dashboards"] != "gpu" ||
		cms[0].Labels["grafana_dashboard"] != "" || cms[0].Namespace != "monitoring" {
		t.Errorf("dashboard ConfigMaps %+v, want one in monitoring labelled dashboards=gpu only", cms)
	}
}

// ruleFileGroups decodes the rules file into the Prometheus Operator's
// types, strictly.
func ruleFileGroups(t *testing.T) []monitoringv1.RuleGroup {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return f.Groups
}

// checkRuleGroups runs promtool check rules on rendered rule groups.
func checkRuleGroups(t *testing.T, groups []monitoringv1.RuleGroup) {
	t.Helper()
	data, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rendered.rules.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "rendered.rules.yaml")
}

// alertRule returns the rendered rule of an alert, or nil.
func alertRule(groups []monitoringv1.RuleGroup, alert string) *monitoringv1.Rule {
	for _, g := range groups {
		for i, r := range g.Rules {
			if r.Alert == alert {
				return &g.Rules[i]
			}
		}
	}
	return nil
}

// metrics.prometheusRule.enabled wraps the rules file in a PrometheusRule:
// with the default values its groups are the file's, and the rules
// rendered pass the same promtool unit tests; the values change what they
// say they change.
func TestChartPrometheusRule(t *testing.T) {
	for _, args := range [][]string{
		{"--set", "metrics.enabled=true"},
		{"--set", "metrics.prometheusRule.enabled=true"},
	} {
		if m := render(t, args...); len(m.prometheusRules) != 0 {
			t.Errorf("values %q: %d PrometheusRules, want none", args, len(m.prometheusRules))
		}
	}

	on := []string{"--set", "metrics.enabled=true", "--set", "metrics.prometheusRule.enabled=true"}
	m := render(t, append(on, "--set", "metrics.prometheusRule.additionalLabels.release=prom")...)
	if len(m.prometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.prometheusRules))
	}
	pr := m.prometheusRules[0]
	if pr.Labels["release"] != "prom" || pr.Namespace != "kube-system" {
		t.Errorf("PrometheusRule %s/%s labels %v, want kube-system and release=prom", pr.Namespace, pr.Name, pr.Labels)
	}
	// The release is named nri-vgpu: the job selector stays the file's.
	if want := ruleFileGroups(t); !reflect.DeepEqual(pr.Spec.Groups, want) {
		got, _ := yaml.Marshal(pr.Spec.Groups)
		t.Errorf("PrometheusRule groups differ from %s's; rendered:\n%s", rulesPath, got)
	}
	// What the chart renders passes the file's unit tests.
	dir := t.TempDir()
	data, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rendered.rules.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests = bytes.Replace(tests, []byte("  - "+rulesPath+"\n"), []byte("  - rendered.rules.yaml\n"), 1)
	if !bytes.Contains(tests, []byte("rendered.rules.yaml")) {
		t.Fatalf("rules_test.yaml does not name %s in rule_files", rulesPath)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "test", "rules", "rules_test.yaml")

	t.Run("values", func(t *testing.T) {
		out, err := helmTemplate(t, "prod", append(on,
			"--set", "metrics.prometheusRule.alerts.NriVgpuContainerMemoryNearLimit.threshold=0.75",
			"--set", "metrics.prometheusRule.alerts.NriVgpuContainerMemoryNearLimit.for=30m",
			"--set", "metrics.prometheusRule.alerts.NriVgpuContainerThrottled.severity=warning",
			"--set", "metrics.prometheusRule.alerts.NriVgpuRegionSuspect.enabled=false",
			"--set", "metrics.prometheusRule.additionalRuleLabels.team=gpu")...)
		if err != nil {
			t.Fatal(err)
		}
		groups := decodeManifests(t, out).prometheusRules[0].Spec.Groups
		checkRuleGroups(t, groups)
		mem := alertRule(groups, "NriVgpuContainerMemoryNearLimit")
		if mem == nil || !strings.HasSuffix(mem.Expr.String(), "> 0.75") || mem.For == nil || *mem.For != "30m" {
			t.Errorf("NriVgpuContainerMemoryNearLimit %+v, want threshold 0.75 for 30m", mem)
		}
		if r := alertRule(groups, "NriVgpuContainerThrottled"); r == nil || r.Labels["severity"] != "warning" || r.Labels["team"] != "gpu" {
			t.Errorf("NriVgpuContainerThrottled %+v, want severity warning and team gpu", r)
		}
		if r := alertRule(groups, "NriVgpuRegionSuspect"); r != nil {
			t.Errorf("NriVgpuRegionSuspect rendered though disabled: %+v", r)
		}
		// Under the release prod the ServiceMonitor's job is its
		// Service's name.
		for _, a := range []string{"NriVgpuPluginDown", "NriVgpuPluginAbsent"} {
			if r := alertRule(groups, a); r == nil || !strings.Contains(r.Expr.String(), `up{job="prod-nri-vgpu-metrics"}`) {
				t.Errorf("%s %+v, want the selector of the Service prod-nri-vgpu-metrics", a, r)
			}
		}
		services := servicesOf(decodeManifests(t, out), "nri-plugin")
		if len(services) != 1 || services[0].Name != "prod-nri-vgpu-metrics" {
			t.Errorf("the NRI plugin's metrics Services %+v, want prod-nri-vgpu-metrics, the job the alerts select", services)
		}

		out, err = helmTemplate(t, "nri-vgpu", append(on, "--set", `metrics.prometheusRule.targetSelector=job="gpu-nodes"`)...)
		if err != nil {
			t.Fatal(err)
		}
		groups = decodeManifests(t, out).prometheusRules[0].Spec.Groups
		checkRuleGroups(t, groups)
		if r := alertRule(groups, "NriVgpuPluginAbsent"); r == nil || r.Expr.String() != `absent(up{job="gpu-nodes"})` {
			t.Errorf("NriVgpuPluginAbsent %+v, want the targetSelector", r)
		}
	})

	t.Run("refused values", func(t *testing.T) {
		for _, c := range []struct {
			set, want string
		}{
			{"metrics.prometheusRule.alerts.NriVgpuMemoryNearLimit.enabled=true", "no such alert"},
			{"metrics.prometheusRule.alerts.NriVgpuContainerThrottled.threshold=high", "is not a number"},
			{"metrics.prometheusRule.alerts.NriVgpuRegionSuspect.threshold=1", "does not end with one"},
			{"metrics.prometheusRule.alerts.NriVgpuScrapeErrors=null", "has no entry for NriVgpuScrapeErrors"},
		} {
			out, err := helmTemplate(t, "nri-vgpu", append(on, "--set", c.set)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("--set %s: %v, want a failure saying %q\n%s", c.set, err, c.want, out)
			}
		}
	})
}

// The ServiceMonitor gives every series the node of the NRI plugin's pod,
// which the dashboard and the alerts select on, before the user's own
// relabelings.
func TestChartServiceMonitorNode(t *testing.T) {
	on := []string{"--set", "metrics.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"}
	isNode := func(r monitoringv1.RelabelConfig) bool {
		return len(r.SourceLabels) == 1 && r.SourceLabels[0] == "__meta_kubernetes_pod_node_name" &&
			r.TargetLabel == "node" && (r.Action == "" || strings.EqualFold(r.Action, "replace"))
	}
	monitors := serviceMonitorsOf(render(t, append(on, "--set-json", `metrics.serviceMonitor.relabelings=[{"targetLabel":"cluster","replacement":"c1"}]`)...), "nri-plugin")
	if len(monitors) != 1 || len(monitors[0].Spec.Endpoints) != 1 {
		t.Fatalf("%d ServiceMonitors of the NRI plugin, want 1 with 1 endpoint", len(monitors))
	}
	rs := monitors[0].Spec.Endpoints[0].RelabelConfigs
	if len(rs) != 2 || !isNode(rs[0]) || rs[1].TargetLabel != "cluster" {
		t.Errorf("relabelings %+v, want node from __meta_kubernetes_pod_node_name, then the user's", rs)
	}
	monitors = serviceMonitorsOf(render(t, on...), "nri-plugin")
	if len(monitors) != 1 {
		t.Fatalf("%d ServiceMonitors of the NRI plugin, want 1", len(monitors))
	}
	if rs := monitors[0].Spec.Endpoints[0].RelabelConfigs; len(rs) != 1 || !isNode(rs[0]) {
		t.Errorf("relabelings %+v without the user's, want node from __meta_kubernetes_pod_node_name", rs)
	}
}
