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
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// uid is the dashboard's stable identity: Grafana replaces a dashboard of
// the same uid when the chart ships a new version.
const uid = "nri-vgpu"

// Label matchers of the dashboard's variables. Every series carries node
// (the scrape adds it); GPU series UUID; container series namespace and
// pod as well ("" for a DRA claim's record, which ".*" still matches).
const (
	nodeSel      = `node=~"$node"`
	gpuSel       = `node=~"$node", UUID=~"$gpu"`
	containerSel = `node=~"$node", UUID=~"$gpu", namespace=~"$namespace", pod=~"$pod"`
	// nri_vgpu_container_processes has no UUID: a container's processes
	// are counted once, whatever GPUs it has.
	processSel = `node=~"$node", namespace=~"$namespace", pod=~"$pod"`

	gpuLegend       = "{{node}} GPU {{gpu}} {{UUID}}"
	containerLegend = "{{namespace}}/{{pod}}/{{container}} {{claim}} {{UUID}}"
)

var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).LegendFormat(legend).Range()
}

// instant is a query for a table: the current value of each series, its
// labels as columns.
func instant(expr string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).Instant().Format(prometheus.PromQueryFormatTable)
}

func graph(title, description, unit string, width uint32, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(description).Datasource(datasource).
		Unit(unit).Span(width).Height(8).Min(0).FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).ShowLegend(true).Calcs([]string{"lastNotNull", "max"})).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
	for i, q := range queries {
		p.WithTarget(q.RefId(string(rune('A' + i))))
	}
	return p
}

// single is a stat panel of one number; red > 0 turns it red from there
// on (a value that asks for attention).
func single(title, description, unit, expr string, red float64) *stat.PanelBuilder {
	p := stat.NewPanelBuilder().Title(title).Description(description).Datasource(datasource).
		Unit(unit).Span(4).Height(4).GraphMode(common.BigValueGraphModeNone).Orientation(common.VizOrientationAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).Instant().RefId("A"))
	if red <= 0 {
		return p.ColorMode(common.BigValueColorModeNone)
	}
	return p.ColorMode(common.BigValueColorModeValue).
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
			{Color: "green"}, {Value: cog.ToPtr(red), Color: "red"},
		}))
}

func grid(title, description string, width uint32, expr string) *table.PanelBuilder {
	return table.NewPanelBuilder().Title(title).Description(description).Datasource(datasource).
		Span(width).Height(8).Filterable(true).
		// Grafana's own default; the builder leaves the reducer null, which
		// the dashboard schema does not allow.
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"})).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
			"excludeByName": map[string]bool{"Time": true, "__name__": true, "instance": true},
		}}).
		WithTarget(instant(expr).RefId("A"))
}

// variable is a multi-value query variable whose "All" is ".*", so that
// the empty label values (a claim record's pod) match too.
func variable(name, label, expr, labelName string) *dashboard.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s, %s)", expr, labelName)
	return dashboard.NewQueryVariableBuilder(name).Label(label).Datasource(datasource).
		Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).Definition(q).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).IncludeAll(true).AllValue(".*").
		Current(dashboard.VariableOption{Text: dashboard.StringOrArrayOfString{String: cog.ToPtr("All")},
			Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")}})
}

func build() *dashboard.DashboardBuilder {
	sel := func(metric, matchers string) string { return metric + "{" + matchers + "}" }
	rate := func(metric, matchers string) string {
		return "rate(" + sel(metric, matchers) + "[$__rate_interval])"
	}
	increase := func(metric, matchers string) string {
		return "increase(" + sel(metric, matchers) + "[$__rate_interval])"
	}
	return dashboard.NewDashboardBuilder("nri-vgpu").Uid(uid).
		Description("GPUs shared by nri-vgpu: per node, GPU and container memory and SM time, throttling, allocations and health. docs/metrics.md describes every series.").
		Tags([]string{"nri-vgpu", "gpu", "kubernetes"}).
		Refresh("1m").Time("now-3h", "now").Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).Editable().
		Link(dashboard.NewDashboardLinkBuilder("nri-vgpu metrics").Type(dashboard.DashboardLinkTypeLink).
			Url("https://github.com/nri-vgpu/nri-vgpu/blob/main/docs/metrics.md").TargetBlank(true).Icon("doc")).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(variable("node", "Node", "nri_vgpu_build_info", "node")).
		WithVariable(variable("gpu", "GPU (UUID)", sel("nri_vgpu_gpu_memory_allocated_bytes", nodeSel), "UUID")).
		WithVariable(variable("namespace", "Namespace", sel("nri_vgpu_container_memory_limit_bytes", gpuSel), "namespace")).
		WithVariable(variable("pod", "Pod", sel("nri_vgpu_container_memory_limit_bytes", gpuSel+`, namespace=~"$namespace"`), "pod")).
		WithRow(dashboard.NewRowBuilder("Overview")).
		WithPanel(single("GPUs", "GPUs nri-vgpu shares on the selected nodes.", "none",
			"count("+sel("nri_vgpu_gpu_memory_allocated_bytes", gpuSel)+")", 0)).
		WithPanel(single("GPU containers", "Containers and DRA claim records holding GPU slices (each once, whatever its GPUs).", "none",
			"count(count by (node, container_id) ("+sel("nri_vgpu_container_memory_limit_bytes", containerSel)+"))", 0)).
		WithPanel(single("Memory handed out", "Sum of the containers' memory limits over the GPUs' memory.", "percentunit",
			"sum("+sel("nri_vgpu_gpu_memory_allocated_bytes", gpuSel)+") / sum("+sel("nri_vgpu_gpu_memory_total_bytes", gpuSel)+")", 1)).
		WithPanel(single("SM time handed out", "Mean over the GPUs of the containers' SM shares (1: every GPU fully handed out).", "percentunit",
			"avg("+sel("nri_vgpu_gpu_sm_allocated_ratio", gpuSel)+")", 1)).
		WithPanel(single("Suspect regions", "Containers whose usage region holds impossible counters: their usage is not exported (alert NriVgpuRegionSuspect).", "none",
			"sum("+sel("nri_vgpu_container_region_suspect", containerSel)+") or vector(0)", 1)).
		WithPanel(single("Scrape errors", "Files the NRI plugins could not read, per second (alert NriVgpuScrapeErrors).", "short",
			"sum("+rate("nri_vgpu_scrape_errors_total", nodeSel)+") or vector(0)", 0.001)).
		WithRow(dashboard.NewRowBuilder("GPUs")).
		WithPanel(graph("GPU memory: used, allocated, total",
			"Per GPU: memory its vGPU containers use, the sum of their limits, and the GPU's memory.", "bytes", 12,
			query(sel("nri_vgpu_gpu_memory_used_bytes", gpuSel), gpuLegend+" used"),
			query(sel("nri_vgpu_gpu_memory_allocated_bytes", gpuSel), gpuLegend+" allocated"),
			query(sel("nri_vgpu_gpu_memory_total_bytes", gpuSel), gpuLegend+" total"))).
		WithPanel(graph("GPU SM time: used, allocated",
			"Per GPU: the SM utilisation of its vGPU containers' processes (NVML, read on the host) and the sum of their SM shares.", "percentunit", 12,
			query(sel("nri_vgpu_gpu_sm_utilization_ratio", gpuSel), gpuLegend+" used"),
			query(sel("nri_vgpu_gpu_sm_allocated_ratio", gpuSel), gpuLegend+" allocated"))).
		WithPanel(graph("GPU utilisation: nri-vgpu's containers and dcgm-exporter",
			"nri-vgpu's sum over its containers next to dcgm-exporter's DCGM_FI_DEV_GPU_UTIL of the same GPU (joined on UUID); dcgm-exporter's line is missing where it is not installed. The gap is work outside nri-vgpu's containers.", "percentunit", 12,
			query(sel("nri_vgpu_gpu_sm_utilization_ratio", gpuSel), gpuLegend+" nri-vgpu"),
			query(`max by (UUID) (DCGM_FI_DEV_GPU_UTIL{UUID=~"$gpu"}) / 100`, "{{UUID}} dcgm-exporter"))).
		WithPanel(graph("GPU memory outside nri-vgpu's containers (dcgm-exporter)",
			"dcgm-exporter's DCGM_FI_DEV_FB_USED (MiB) less the memory nri-vgpu's containers use on the same GPU (joined on UUID): the driver, processes of other pods. Empty without dcgm-exporter.", "bytes", 12,
			query(`max by (UUID) (DCGM_FI_DEV_FB_USED{UUID=~"$gpu"}) * 2^20 - on (UUID) max by (UUID) (`+sel("nri_vgpu_gpu_memory_used_bytes", gpuSel)+")", "{{UUID}}"))).
		WithPanel(graph("GPU health",
			"1 healthy, 0 unhealthy, as the device plugin and the DRA driver see each GPU (alert NriVgpuGPUUnhealthy).", "none", 12,
			query(sel("nri_vgpu_device_plugin_gpu_healthy", gpuSel), gpuLegend+" device plugin"),
			query(sel("nri_vgpu_dra_gpu_healthy", gpuSel), gpuLegend+" DRA driver")).Max(1)).
		WithPanel(graph("GPU health changes",
			"Health transitions the device plugin and the DRA driver saw.", "none", 12,
			query("sum by (node, UUID, gpu) ("+increase("nri_vgpu_device_plugin_health_changes_total", gpuSel)+")", gpuLegend+" device plugin"),
			query("sum by (node, UUID, gpu) ("+increase("nri_vgpu_dra_health_changes_total", gpuSel)+")", gpuLegend+" DRA driver"))).
		WithRow(dashboard.NewRowBuilder("Containers: memory")).
		WithPanel(graph("Memory used",
			"GPU memory each container's processes hold (from its usage region; left out while the region is suspect).", "bytes", 8,
			query(sel("nri_vgpu_container_memory_used_bytes", containerSel), containerLegend))).
		WithPanel(graph("Memory used of the limit",
			"Memory used over the container's limit; containers without a limit are left out (alert NriVgpuContainerMemoryNearLimit).", "percentunit", 8,
			query(sel("nri_vgpu_container_memory_used_bytes", containerSel)+" / ("+sel("nri_vgpu_container_memory_limit_bytes", containerSel)+" > 0)", containerLegend))).
		WithPanel(graph("Memory peak and limit",
			"The most memory the container's processes have held, and its limit (0: none).", "bytes", 8,
			query(sel("nri_vgpu_container_memory_peak_bytes", containerSel), containerLegend+" peak"),
			query(sel("nri_vgpu_container_memory_limit_bytes", containerSel), containerLegend+" limit"))).
		WithRow(dashboard.NewRowBuilder("Containers: SM time")).
		WithPanel(graph("SM utilisation of the GPU",
			"Share of the GPU's SMs the container's processes used (NVML, read on the host; the container cannot forge it).", "percentunit", 8,
			query(sel("nri_vgpu_container_sm_utilization_ratio", containerSel), containerLegend))).
		WithPanel(graph("SM utilisation of its share",
			"SM utilisation over the container's SM limit: 1 is its whole share (above 1 only in burst mode).", "percentunit", 8,
			query(sel("nri_vgpu_container_sm_share_utilization_ratio", containerSel), containerLegend))).
		WithPanel(graph("SM limit",
			"The container's SM share (1: not throttled).", "percentunit", 8,
			query(sel("nri_vgpu_container_sm_limit_ratio", containerSel), containerLegend))).
		WithPanel(graph("Throttled seconds per second",
			"Seconds the container's processes waited on the SM limiter, per second, summed over its processes: 1 is one process held back all the time (alert NriVgpuContainerThrottled).", "short", 8,
			query(rate("nri_vgpu_container_sm_throttled_seconds_total", containerSel), containerLegend))).
		WithPanel(graph("Kernel launches per second", "Kernel launches of the container's processes.", "ops", 8,
			query(rate("nri_vgpu_container_kernel_launches_total", containerSel), containerLegend))).
		WithPanel(graph("Processes", "Processes of the container using a GPU.", "none", 8,
			query(sel("nri_vgpu_container_processes", processSel), "{{namespace}}/{{pod}}/{{container}} {{claim}}"))).
		WithRow(dashboard.NewRowBuilder("Containers: suspect regions and claims")).
		WithPanel(grid("Suspect regions",
			"Containers whose usage region holds impossible counters (written by the container, or broken): their memory used, peak, throttled time and kernel launches on that GPU are not exported.", 12,
			sel("nri_vgpu_container_region_suspect", containerSel)+" == 1")).
		WithPanel(grid("DRA claims and their pods", "The pods each DRA claim record serves.", 12,
			sel("nri_vgpu_claim_pod_info", `node=~"$node", namespace=~"$namespace", pod=~"$pod"`))).
		WithRow(dashboard.NewRowBuilder("Allocations: device plugin and DRA driver")).
		WithPanel(graph("Device plugin allocations per second", "Allocate calls the device plugin answered.", "ops", 8,
			query("sum by (node, resource) ("+rate("nri_vgpu_device_plugin_allocations_total", nodeSel)+")", "{{node}} {{resource}}"))).
		WithPanel(graph("Refused allocations by reason",
			"Allocations the device plugin and claims the DRA driver refused, by reason (alert NriVgpuAllocationsRefused).", "none", 8,
			query("sum by (node, resource, reason) ("+increase("nri_vgpu_device_plugin_allocation_refusals_total", nodeSel)+")", "{{node}} {{resource}} {{reason}}"),
			query("sum by (node, reason) ("+increase("nri_vgpu_dra_prepare_refusals_total", nodeSel)+")", "{{node}} DRA {{reason}}"))).
		WithPanel(graph("DRA claims prepared and unprepared per second", "", "ops", 8,
			query("sum by (node) ("+rate("nri_vgpu_dra_prepares_total", nodeSel)+")", "{{node}} prepared"),
			query("sum by (node) ("+rate("nri_vgpu_dra_unprepares_total", nodeSel)+")", "{{node}} unprepared"))).
		WithPanel(graph("Slices advertised", "Slices the device plugin advertises to the kubelet, by health.", "none", 8,
			query("sum by (node, resource, health) ("+sel("nri_vgpu_device_plugin_devices", nodeSel)+")", "{{node}} {{resource}} {{health}}"))).
		WithPanel(graph("Registered with the kubelet",
			"1 while the device plugin or the DRA driver is registered; registrations (re-registrations after kubelet restarts count).", "none", 8,
			query(sel("nri_vgpu_device_plugin_registered", nodeSel), "{{node}} device plugin registered"),
			query(sel("nri_vgpu_dra_registered", nodeSel), "{{node}} DRA driver registered"),
			query("sum by (node) ("+increase("nri_vgpu_device_plugin_registrations_total", nodeSel)+")", "{{node}} device plugin registrations"))).
		WithPanel(graph("ResourceSlice publications per second", "ResourceSlices the DRA driver published.", "ops", 8,
			query("sum by (node) ("+rate("nri_vgpu_dra_resourceslice_publications_total", nodeSel)+")", "{{node}}"))).
		WithRow(dashboard.NewRowBuilder("nri-vgpu")).
		WithPanel(graph("Scrape errors per second by source",
			"Files the NRI plugin could not read while serving metrics (docs/metrics.md, Scrape errors): the series that depend on them are missing.", "short", 24,
			query("sum by (node, source) ("+rate("nri_vgpu_scrape_errors_total", nodeSel)+")", "{{node}} {{source}}"))).
		WithPanel(grid("Versions", "The build of nri-vgpu each node runs.", 12,
			sel("nri_vgpu_build_info", nodeSel))).
		WithPanel(grid("Confinement",
			"1 where the container runtime applies the confinement of GPU containers, 0 where it cannot; policy is what happens to a container that cannot be confined.", 12,
			sel("nri_vgpu_confinement_available", nodeSel)))
}

// generate returns the dashboard's JSON as the chart ships it.
func generate() ([]byte, error) {
	d, err := build().Build()
	if err != nil {
		return nil, fmt.Errorf("building the dashboard: %w", err)
	}
	// Grafana tells panels (links, the panel editor, ?viewPanel=) apart by
	// their id, which the builder leaves out.
	for i := range d.Panels {
		id := uint32(i + 1)
		if p := d.Panels[i].Panel; p != nil {
			p.Id = &id
		} else if r := d.Panels[i].RowPanel; r != nil {
			r.Id = id
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	// PromQL's <, > and & stay readable in the file.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, fmt.Errorf("encoding the dashboard: %w", err)
	}
	return buf.Bytes(), nil
}

func write(path string) error {
	data, err := generate()
	if err != nil {
		return err
	}
	if !strings.HasSuffix(path, ".json") {
		return fmt.Errorf("%s: want a .json file", path)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing the dashboard: %w", err)
	}
	return nil
}
