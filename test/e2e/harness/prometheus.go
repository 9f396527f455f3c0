package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// EnvPrometheus names the prometheus binary the tests run (make test-e2e
// sets it from hack/prometheus.sh); without it, PrometheusBinary asks
// hack/prometheus.sh, which unpacks Debian's pinned package into the cache.
const EnvPrometheus = "NRI_VGPU_E2E_PROMETHEUS"

// PrometheusBinary is the path of the prometheus the tests run: the one
// $NRI_VGPU_E2E_PROMETHEUS names, else hack/prometheus.sh's. It is checked
// by running it with --version.
func PrometheusBinary(ctx context.Context) (string, error) {
	bin := os.Getenv(EnvPrometheus)
	if bin == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		var stderr strings.Builder
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "prometheus.sh"), "prometheus")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("harness: hack/prometheus.sh prometheus: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		bin = strings.TrimSpace(string(out))
	}
	if out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: prometheus %s (%s) does not run: %w: %s", bin, EnvPrometheus, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// ServiceJob is a scrape job that keeps the targets a Prometheus in the
// cluster keeps for a ServiceMonitor: the endpoints (EndpointSlices) of the
// Services in Namespace that carry ServiceLabels, on the Service port named
// Port, with the Kubernetes node of the endpoint's pod as the `node` label
// (docs/metrics.md's relabelling).
type ServiceJob struct {
	Name          string
	Namespace     string
	ServiceLabels map[string]string
	Port          string
}

// PrometheusOptions configure StartPrometheus.
type PrometheusOptions struct {
	// Binary is prometheus (PrometheusBinary).
	Binary string
	// Cluster is where the Jobs discover their targets, through its API
	// server with its credentials (kubesd.go).
	Cluster *Cluster
	Jobs    []ServiceJob
	// RuleFiles are loaded as rule_files.
	RuleFiles []string
	// Interval is both the scrape and the rule evaluation interval
	// (default 2 s: tests wait a few of them, not Prometheus' minute).
	Interval time.Duration
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
}

// Prometheus is a running prometheus serving on a loopback port, its
// configuration, credentials, data and log in Dir.
type Prometheus struct {
	Dir string
	// URL is its HTTP API's base, http://127.0.0.1:PORT.
	URL string
	API promv1.API

	proc   *Process
	sd     *http.Server // the HTTP service discovery of Jobs
	closed bool
}

// LogPath is where prometheus logs.
func (p *Prometheus) LogPath() string { return filepath.Join(p.Dir, "prometheus.log") }

// LogTail is the last n lines of its log.
func (p *Prometheus) LogTail(n int) string { return Tail(p.LogPath(), n) }

// StartPrometheus writes the configuration for opts and starts prometheus,
// and waits until it is ready. Its directory is made by MkdirTemp, so that
// SweepStale stops a prometheus a killed test run left behind.
func StartPrometheus(ctx context.Context, opts PrometheusOptions) (*Prometheus, error) {
	if opts.Binary == "" {
		return nil, errors.New("harness: PrometheusOptions.Binary is required")
	}
	if opts.Interval == 0 {
		opts.Interval = 2 * time.Second
	}
	dir, err := MkdirTemp("prometheus")
	if err != nil {
		return nil, err
	}
	p := &Prometheus{Dir: dir}
	if err := p.start(ctx, opts); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

func (p *Prometheus) start(ctx context.Context, opts PrometheusOptions) error {
	sdURL := ""
	if opts.Cluster != nil {
		// Discovery through the API server (kubesd.go).
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		p.sd = &http.Server{Handler: &kubernetesSDServer{client: opts.Cluster.Client}, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = p.sd.Serve(l) }()
		sdURL = "http://" + l.Addr().String()
	}
	config, err := prometheusConfig(opts, sdURL)
	if err != nil {
		return err
	}
	configPath := filepath.Join(p.Dir, "prometheus.yml")
	if err := os.WriteFile(configPath, config, 0o644); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	p.URL = "http://" + listen
	client, err := api.NewClient(api.Config{Address: p.URL})
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	p.API = promv1.NewAPI(client)
	cmd := exec.Command(opts.Binary,
		"--config.file", configPath,
		"--storage.tsdb.path", filepath.Join(p.Dir, "data"),
		"--web.listen-address", listen,
		// Not the console files of a packaged install: there are none.
		"--web.console.templates", filepath.Join(p.Dir, "consoles"),
		"--web.console.libraries", filepath.Join(p.Dir, "console_libraries"))
	if p.proc, err = StartProcess(cmd, p.LogPath()); err != nil {
		return err
	}
	if opts.Logf != nil {
		opts.Logf("prometheus started (pid %d) on %s", p.proc.Pid(), p.URL)
	}
	return p.waitReady(ctx)
}

// waitReady waits until /-/ready answers 200.
func (p *Prometheus) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/-/ready", nil)
		if err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-p.proc.Exited():
			return fmt.Errorf("harness: prometheus exited (%v): %s", p.proc.Err(), p.LogTail(20))
		case <-ctx.Done():
			return fmt.Errorf("harness: prometheus not ready (%s): %s", last, p.LogTail(20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Query evaluates the instant query q now and returns its vector; any other
// result type is an error.
func (p *Prometheus) Query(ctx context.Context, q string) (model.Vector, error) {
	v, _, _, err := p.API.Query(ctx, q, time.Now())
	if err != nil {
		return nil, fmt.Errorf("harness: query %s: %w", q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("harness: query %s: a %s, want a vector", q, v.Type())
	}
	return vec, nil
}

// Targets describes the active targets and why the last scrape of each
// failed, for failure messages.
func (p *Prometheus) Targets(ctx context.Context) string {
	r, err := p.API.Targets(ctx)
	if err != nil {
		return "targets: " + err.Error()
	}
	var lines []string
	for _, t := range r.Active {
		lines = append(lines, fmt.Sprintf("%s %s health=%s labels=%v lastError=%q", t.ScrapePool, t.ScrapeURL, t.Health, t.Labels, t.LastError))
	}
	if len(lines) == 0 {
		return fmt.Sprintf("no active target (%d dropped)", len(r.Dropped))
	}
	return strings.Join(lines, "\n")
}

// Close stops prometheus and removes its directory.
func (p *Prometheus) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.proc != nil {
		if err := p.proc.Stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if p.sd != nil {
		p.sd.Close()
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		errs = append(errs, fmt.Errorf("harness: removing %s: %w", p.Dir, err))
	}
	return errors.Join(errs...)
}

// Pid is prometheus' process ID.
func (p *Prometheus) Pid() int { return p.proc.Pid() }

// labelNameChars are the characters Prometheus replaces with '_' when it
// turns a Kubernetes label into a __meta_kubernetes_*_label_ name.
var labelNameChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// prometheusConfig is prometheus.yml for opts.
// sdURL is the base URL of the HTTP service discovery that answers for a
// namespace what kubernetes_sd_configs would discover there.
func prometheusConfig(opts PrometheusOptions, sdURL string) ([]byte, error) {
	interval := model.Duration(opts.Interval).String()
	var jobs []map[string]any
	for _, j := range opts.Jobs {
		if sdURL == "" {
			return nil, fmt.Errorf("harness: job %s discovers its targets in a cluster: PrometheusOptions.Cluster is required", j.Name)
		}
		if j.Name == "" || j.Namespace == "" || j.Port == "" || len(j.ServiceLabels) == 0 {
			return nil, fmt.Errorf("harness: job %+v: Name, Namespace, Port and ServiceLabels are required", j)
		}
		// The Service's labels and port name, as a ServiceMonitor selects
		// (the chart's selects the same labels and port).
		keys := make([]string, 0, len(j.ServiceLabels))
		for k := range j.ServiceLabels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var relabel []map[string]any
		for _, k := range keys {
			relabel = append(relabel, map[string]any{
				"action":        "keep",
				"source_labels": []string{"__meta_kubernetes_service_label_" + labelNameChars.ReplaceAllString(k, "_")},
				"regex":         regexp.QuoteMeta(j.ServiceLabels[k]),
			})
		}
		relabel = append(relabel,
			map[string]any{
				"action":        "keep",
				"source_labels": []string{"__meta_kubernetes_endpointslice_port_name"},
				"regex":         regexp.QuoteMeta(j.Port),
			},
			// docs/metrics.md: nri-vgpu's series carry no node label;
			// the scrape adds the node of the pod it scraped.
			map[string]any{
				"action":        "replace",
				"source_labels": []string{"__meta_kubernetes_pod_node_name"},
				"target_label":  "node",
			})
		jobs = append(jobs, map[string]any{
			"job_name": j.Name,
			// The series' own namespace, pod and container (the GPU
			// containers') are kept, as the chart's ServiceMonitor does.
			"honor_labels": true,
			// kubernetes_sd_configs: [{role: endpointslice, namespaces:
			// {names: [Namespace]}}] in a cluster (kubesd.go).
			"http_sd_configs": []map[string]any{{
				"url":              sdURL + "/" + url.PathEscape(j.Namespace),
				"refresh_interval": interval,
			}},
			"relabel_configs": relabel,
		})
	}
	config := map[string]any{
		"global": map[string]any{
			"scrape_interval":     interval,
			"scrape_timeout":      interval,
			"evaluation_interval": interval,
		},
		"scrape_configs": jobs,
	}
	if len(opts.RuleFiles) > 0 {
		config["rule_files"] = opts.RuleFiles
	}
	out, err := yaml.Marshal(config)
	if err != nil {
		return nil, fmt.Errorf("harness: prometheus config: %w", err)
	}
	return out, nil
}
