package main

// The SDK marks its classic dashboard types deprecated in favour of
// dashboardv2, the schema of Grafana 12's new dashboard API. The chart
// ships the classic JSON, which every Grafana the dashboard sidecar feeds
// (file provisioning) loads, older ones included.
//lint:file-ignore SA1019 the classic dashboard JSON is what the chart ships

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"sigs.k8s.io/yaml"
)

const (
	dashboardPath = "../../packaging/helm/nri-vgpu/dashboards/nri-vgpu.json"
	rulesPath     = "../../packaging/helm/nri-vgpu/rules/nri-vgpu.rules.yaml"
)

// contractMetrics are the series of THE METRIC CONTRACT (docs/metrics.md):
// those of the NRI plugin's endpoint, the device plugin's and the DRA
// driver's. Written out here, not taken from the exporters, so that a
// renamed series fails this test until the dashboard and the rules follow.
var contractMetrics = []string{
	"nri_vgpu_gpu_memory_total_bytes",
	"nri_vgpu_gpu_memory_allocated_bytes",
	"nri_vgpu_gpu_memory_used_bytes",
	"nri_vgpu_gpu_sm_allocated_ratio",
	"nri_vgpu_gpu_sm_utilization_ratio",
	"nri_vgpu_container_memory_limit_bytes",
	"nri_vgpu_container_memory_used_bytes",
	"nri_vgpu_container_memory_peak_bytes",
	"nri_vgpu_container_sm_limit_ratio",
	"nri_vgpu_container_sm_utilization_ratio",
	"nri_vgpu_container_sm_share_utilization_ratio",
	"nri_vgpu_container_sm_throttled_seconds_total",
	"nri_vgpu_container_kernel_launches_total",
	"nri_vgpu_container_region_suspect",
	"nri_vgpu_container_processes",
	"nri_vgpu_claim_pod_info",
	"nri_vgpu_build_info",
	"nri_vgpu_confinement_available",
	"nri_vgpu_scrape_errors_total",
	"nri_vgpu_device_plugin_registered",
	"nri_vgpu_device_plugin_registrations_total",
	"nri_vgpu_device_plugin_allocations_total",
	"nri_vgpu_device_plugin_allocation_refusals_total",
	"nri_vgpu_device_plugin_devices",
	"nri_vgpu_device_plugin_gpu_healthy",
	"nri_vgpu_device_plugin_health_changes_total",
	"nri_vgpu_dra_registered",
	"nri_vgpu_dra_prepares_total",
	"nri_vgpu_dra_unprepares_total",
	"nri_vgpu_dra_prepare_refusals_total",
	"nri_vgpu_dra_gpu_healthy",
	"nri_vgpu_dra_health_changes_total",
	"nri_vgpu_dra_resourceslice_publications_total",
}

// otherMetrics are the series of others the dashboard and the rules may
// use: Prometheus' own up, and dcgm-exporter's for the joins on UUID.
var otherMetrics = []string{"up", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}

// knownLabels are the contract's labels, node (added by the scrape), the
// target's job and instance, and dcgm-exporter's Hostname.
var knownLabels = []string{
	"node", "job", "instance", "UUID", "gpu", "name",
	"container_id", "namespace", "pod", "container", "claim",
	"resource", "reason", "health", "source", "version",
	"runtime", "runtime_version", "nri_version", "policy",
	"Hostname",
}

var functions = []string{"sum", "count", "avg", "max", "min", "rate", "increase", "absent", "vector"}

var (
	stringLit  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchers   = regexp.MustCompile(`\{[^{}]*\}`)
	ranges     = regexp.MustCompile(`\[[^\]]*\]`)
	grouping   = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
	identifier = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	keywords   = []string{"and", "or", "unless", "bool", "offset"}
)

// names returns the metric names and the label names a PromQL expression
// uses, and the functions it calls. A tokeniser, not a parser: promtool
// checks the syntax (TestQueriesArePromQL); this checks the vocabulary.
func names(expr string) (metrics, labels, funcs []string) {
	s := stringLit.ReplaceAllString(expr, `""`)
	for _, m := range matchers.FindAllString(s, -1) {
		labels = append(labels, identifier.FindAllString(m, -1)...)
	}
	s = matchers.ReplaceAllString(s, " ")
	s = ranges.ReplaceAllString(s, " ")
	for _, g := range grouping.FindAllStringSubmatch(s, -1) {
		labels = append(labels, identifier.FindAllString(g[2], -1)...)
	}
	s = grouping.ReplaceAllString(s, " ")
	for _, loc := range identifier.FindAllStringIndex(s, -1) {
		word := s[loc[0]:loc[1]]
		if loc[0] > 0 && strings.ContainsAny(s[loc[0]-1:loc[0]], "0123456789.") {
			continue // an exponent: 1e9
		}
		if slices.Contains(keywords, word) {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " "); strings.HasPrefix(rest, "(") {
			funcs = append(funcs, word)
			continue
		}
		metrics = append(metrics, word)
	}
	return metrics, labels, funcs
}

// checkVocabulary fails for a metric, label or function outside the
// known ones, naming where it was used.
func checkVocabulary(t *testing.T, where, expr string) []string {
	t.Helper()
	metrics, labels, funcs := names(expr)
	for _, m := range metrics {
		if !slices.Contains(contractMetrics, m) && !slices.Contains(otherMetrics, m) {
			t.Errorf("%s: unknown metric %q in %s", where, m, expr)
		}
	}
	for _, l := range labels {
		if !slices.Contains(knownLabels, l) {
			t.Errorf("%s: unknown label %q in %s", where, l, expr)
		}
	}
	for _, f := range funcs {
		if !slices.Contains(functions, f) {
			t.Errorf("%s: unexpected function %q in %s", where, f, expr)
		}
	}
	if len(metrics) == 0 {
		t.Errorf("%s: no metric in %s", where, expr)
	}
	return metrics
}

// The tokeniser itself, on expressions whose names are known.
func TestNames(t *testing.T) {
	metrics, labels, funcs := names(`sum by (node, UUID) (rate(a_total{pod=~"x{y}", job="j"}[$__rate_interval])) / on (UUID) group_left () max(b) * 2^20 > 1e9 or vector(0)`)
	if !slices.Equal(metrics, []string{"a_total", "b"}) || !slices.Equal(labels, []string{"pod", "job", "node", "UUID", "UUID"}) ||
		!slices.Equal(funcs, []string{"sum", "rate", "max", "vector"}) {
		t.Errorf("names: metrics %q, labels %q, functions %q", metrics, labels, funcs)
	}
}

type promQuery struct {
	where, expr string
}

// dashboardQueries returns every PromQL expression of the committed
// dashboard: the panels' targets and the inner selector of the
// variables' label_values().
func dashboardQueries(t *testing.T) []promQuery {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var qs []promQuery
	labelValues := regexp.MustCompile(`^label_values\((.+), *([A-Za-z_]+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		if !slices.Contains(knownLabels, m[2]) {
			t.Errorf("variable %s: unknown label %q", v.Name, m[2])
		}
		qs = append(qs, promQuery{"variable " + v.Name, m[1]})
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, promQuery{fmt.Sprintf("panel %d %q query %s", p.ID, p.Title, tg.RefID), tg.Expr})
		}
	}
	if len(qs) < 10 {
		t.Fatalf("%d queries in %s", len(qs), dashboardPath)
	}
	return qs
}

// The committed dashboard is what dashboard.go generates.
func TestDashboardUpToDate(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from a fresh generation: run go generate ./hack/dashboard", dashboardPath)
	}
}

// sdkError turns the SDK's empty error list, which it returns as a
// non-nil error, into nil.
func sdkError(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}

// The dashboard decodes strictly into the SDK's types (Grafana's dashboard
// schema), its panels have distinct ids and fit the 24-column grid, every
// query uses the dashboard's data source variable, and every variable a
// query names exists.
func TestDashboardShape(t *testing.T) {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := sdkError(d.UnmarshalJSONStrict(data)); err != nil {
		t.Fatalf("%s does not decode strictly as a dashboard: %v", dashboardPath, err)
	}
	// The SDK's strict decoding of the dashboard loses its panels (each
	// panel's empty error list stops it): decode each strictly here, and
	// the whole leniently for the checks below.
	var raw struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for i, p := range raw.Panels {
		var kind struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(p, &kind); err != nil {
			t.Fatal(err)
		}
		var err error
		if kind.Type == "row" {
			err = new(dashboard.RowPanel).UnmarshalJSONStrict(p)
		} else {
			err = new(dashboard.Panel).UnmarshalJSONStrict(p)
		}
		if err := sdkError(err); err != nil {
			t.Errorf("panel %d does not decode strictly as a %s panel: %v", i, kind.Type, err)
		}
	}
	d = dashboard.Dashboard{}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if len(d.Panels) != len(raw.Panels) || len(d.Panels) == 0 {
		t.Fatalf("%d panels decoded of %d", len(d.Panels), len(raw.Panels))
	}
	if err := sdkError(d.Validate()); err != nil {
		t.Errorf("%s: %v", dashboardPath, err)
	}
	vars := map[string]bool{"__rate_interval": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	ids := map[uint32]string{}
	for _, p := range d.Panels {
		var id uint32
		var title string
		var pos *dashboard.GridPos
		switch {
		case p.Panel != nil:
			if p.Panel.Id != nil {
				id = *p.Panel.Id
			}
			title, pos = *p.Panel.Title, p.Panel.GridPos
			if ds := p.Panel.Datasource; ds == nil || ds.Uid == nil || *ds.Uid != "${datasource}" {
				t.Errorf("panel %q: data source %+v, want ${datasource}", title, ds)
			}
		case p.RowPanel != nil:
			id, title, pos = p.RowPanel.Id, *p.RowPanel.Title, p.RowPanel.GridPos
		default:
			t.Fatalf("a panel decoded as neither a panel nor a row")
		}
		if other, dup := ids[id]; dup || id == 0 {
			t.Errorf("panel %q: id %d (also %q)", title, id, other)
		}
		ids[id] = title
		if pos == nil || pos.X+pos.W > 24 {
			t.Errorf("panel %q: grid position %+v beyond the 24 columns", title, pos)
		}
	}
	for _, q := range dashboardQueries(t) {
		for _, m := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(q.expr, -1) {
			if !vars[m[1]] {
				t.Errorf("%s: no variable %s: %s", q.where, m[1], q.expr)
			}
		}
	}
}

// Every query of the dashboard names only the contract's metrics and
// labels (and dcgm-exporter's for the joins), and every metric of the
// contract is on the dashboard.
func TestDashboardVocabulary(t *testing.T) {
	shown := map[string]bool{}
	for _, q := range dashboardQueries(t) {
		for _, m := range checkVocabulary(t, q.where, q.expr) {
			shown[m] = true
		}
	}
	for _, m := range contractMetrics {
		if !shown[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// The alerting rules name only the contract's metrics and labels too.
func TestRulesVocabulary(t *testing.T) {
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			checkVocabulary(t, "alert "+r.Alert, r.Expr)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no rules in %s", rulesPath)
	}
}

// Every query of the dashboard is valid PromQL: promtool checks them as the
// expressions of recording rules, with Grafana's variables replaced by
// values of their kind.
func TestQueriesArePromQL(t *testing.T) {
	out, err := exec.Command("../prometheus.sh", "promtool").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Skipf("no promtool: hack/prometheus.sh promtool: %v: %s", err, stderr)
	}
	promtool := strings.TrimSpace(string(out))

	interval := regexp.MustCompile(`\$\{?__(rate_)?interval\}?`)
	variable := regexp.MustCompile(`\$\{?\w+\}?`)
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	where := map[string]string{}
	for i, q := range dashboardQueries(t) {
		expr := interval.ReplaceAllString(q.expr, "5m")
		// Variables stand in label matchers' regular expressions.
		expr = variable.ReplaceAllString(expr, ".*")
		name := fmt.Sprintf("dashboard:query_%d", i)
		rules = append(rules, rule{name, expr})
		where[name] = q.where
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		keys := make([]string, 0, len(where))
		for k := range where {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var legend strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&legend, "%s: %s\n", k, where[k])
		}
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s\n%s", err, out, legend.String())
	}
}
