package clusterview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nri-vgpu/nri-vgpu/internal/version"
)

// Name is the program's name; kubectl runs it as `kubectl nri-vgpu`.
const Name = "kubectl-nri_vgpu"

const usage = `usage: kubectl nri-vgpu [flags]

The cluster's vGPUs: for each node that offers them, each GPU with the memory
and SM time it has handed out and in use, and under it the device-plugin
containers and the DRA claims (with their pods) that hold it, each with its
memory used, limit and peak, SM utilisation and limit, and the time the
limiter held it back. From the API server and each node's nri-vgpu metrics,
read through the API server's proxy to the node's NRI plugin pod (the chart's
metrics.enabled=true; RBAC: list nodes, pods, resourceslices and
resourceclaims, get pods/proxy).

A value that is not known is "-": a series the node does not serve, or a node
whose metrics could not be read. Such a node is listed with what the API
server knows, and an error naming the node goes to stderr.

Exit status: 0 when the view was printed, even if some node's metrics could
not be read (the node names its error on stderr and in the JSON and YAML
output); 1 when the API server could not be read; 2 for bad usage.

flags:
`

// Main is the whole program; it returns the exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet(Name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	output := fs.StringP("output", "o", "", "output format: wide, json or yaml; empty: a table")
	allNamespaces := fs.BoolP("all-namespaces", "A", false, "list the pods and claims of every namespace (the default without --namespace)")
	nodes := fs.StringSlice("node", nil, "list only these nodes (repeat or separate by commas)")
	resource := fs.String("resource", DefaultResource, "the device plugin's extended resource (device_plugin.resource_name)")
	draDriver := fs.String("dra-driver", DefaultDRADriver, "the DRA driver's name (dra.driver_name)")
	selector := fs.String("plugin-selector", DefaultPluginSelector, "label selector of the NRI plugin pods, in every namespace")
	scrapeTimeout := fs.Duration("scrape-timeout", 10*time.Second, "how long to wait for one node's metrics")
	showVersion := fs.Bool("version", false, "print the version and exit")
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&loading.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	overrides := &clientcmd.ConfigOverrides{}
	clientcmd.BindOverrideFlags(overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stdout, "%s %s\n", Name, version.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", Name, fs.Args())
		return 2
	}
	switch *output {
	case OutputTable, OutputWide, OutputJSON, OutputYAML:
	default:
		fmt.Fprintf(stderr, "%s: --output %q: want wide, json or yaml\n", Name, *output)
		return 2
	}
	// The view is cluster-wide unless --namespace names one: a namespace
	// in the kubeconfig's context does not narrow it.
	namespace := overrides.Context.Namespace
	if *allNamespaces {
		namespace = ""
	}

	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides).ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	view, warnings, err := Collect(ctx, client, Options{Namespace: namespace, Nodes: *nodes, Resource: *resource,
		DRADriver: *draDriver, PluginSelector: *selector, ScrapeTimeout: *scrapeTimeout})
	for _, w := range warnings {
		fmt.Fprintf(stderr, "%s: warning: %s\n", Name, w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	if err := Write(stdout, view, *output); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	WriteErrors(stderr, Name, view)
	return 0
}
