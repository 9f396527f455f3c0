package dra

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nri-vgpu/nri-vgpu/internal/daemonflags"
	"github.com/nri-vgpu/nri-vgpu/internal/reload"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
)

// ProgramName is the DRA driver's program, cmd/dra-driver.
const ProgramName = "nri-vgpu-dra-driver"

// Main is the whole program, given its arguments (less the program name) and
// the signals that reload the configuration; ctx ends it. It returns the
// exit status: 0 after a clean stop, 1 when it cannot serve, 2 for bad
// usage.
func Main(ctx context.Context, args []string, stderr io.Writer, reloadSig <-chan os.Signal) int {
	fs := flag.NewFlagSet(ProgramName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	common := daemonflags.Register(fs, ProgramName)
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: $KUBECONFIG); empty: the pod's service account")
	pluginDir := fs.String("plugin-dir", "", "the driver's directory for its kubelet socket (default: /var/lib/kubelet/plugins/<driver name>)")
	registryDir := fs.String("registry-dir", "", "the kubelet's plugin registration directory (default: /var/lib/kubelet/plugins_registry)")
	taintEffect := fs.String("unhealthy-taint-effect", "", "the effect of an unhealthy GPU's taint, NoSchedule or NoExecute, over dra.unhealthy_taint_effect (default: the configuration's)")
	if code, done := common.Parse(fs, args, stderr); done {
		return code
	}
	if *nodeName == "" {
		fmt.Fprintf(stderr, "%s: the node name is required: --node-name or $NODE_NAME\n", ProgramName)
		return 2
	}
	if e := *taintEffect; e != "" && e != config.TaintEffectNoSchedule && e != config.TaintEffectNoExecute {
		fmt.Fprintf(stderr, "%s: --unhealthy-taint-effect must be %s or %s, not %q\n", ProgramName, config.TaintEffectNoSchedule, config.TaintEffectNoExecute, e)
		return 2
	}
	logger, cfg, code := common.Setup(stderr)
	if logger == nil {
		return code
	}
	if *taintEffect != "" {
		cfg.DRA.UnhealthyTaintEffect = *taintEffect
	}
	logger.Info("starting", "program", ProgramName, "version", version.Version, "config", cmp.Or(cfg.Source, "(defaults)"),
		"driver", cfg.DRA.DriverName, "node", *nodeName, "backend", cfg.GPU.Backend)
	if !cfg.DRA.Enabled {
		logger.Warn("dra.enabled is false: no GPU of this node is published (the device plugin serves them)")
	}

	var (
		restCfg *rest.Config
		err     error
	)
	if *kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		logger.Error("cannot configure the API server client", "err", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		logger.Error("cannot create the API server client", "err", err)
		return 1
	}

	backend, err := gpu.New(cfg)
	if err != nil {
		logger.Error("cannot set up the GPU backend", "err", err)
		return 1
	}
	defer backend.Close()

	driver, err := New(Options{Config: cfg, Inventory: backend, NodeName: *nodeName, Logger: logger})
	if err != nil {
		logger.Error("cannot start the DRA driver", "err", err)
		return 1
	}
	defer common.ServeMetrics(driver.Ready, logger, driver.Collector())()
	// Health changes of reloaded simulated GPUs reach the driver as health
	// events, which publish the slice again.
	go reload.Watcher{ConfigPath: common.ConfigPath(), Current: cfg, Backend: backend, Logger: logger,
		RestartOnly: func(current, next *config.Config) string {
			// The flag stands over the file at each reload as at start.
			if *taintEffect != "" {
				next.DRA.UnhealthyTaintEffect = *taintEffect
			}
			return reloadRestartOnly(current, next)
		}}.Run(ctx, reloadSig)

	opts := RunOptions{Client: client, Backend: backend, PluginDir: *pluginDir, RegistryDir: *registryDir}
	if err := driver.Run(ctx, opts); err != nil {
		logger.Error("DRA driver stopped", "err", err)
		return 1
	}
	logger.Info("stopped")
	return 0
}

// reloadRestartOnly names what a reload does not apply to the DRA driver.
func reloadRestartOnly(current, next *config.Config) string {
	if !reflect.DeepEqual(next.DRA, current.DRA) || !reflect.DeepEqual(next.DevicePlugin, current.DevicePlugin) ||
		next.Paths != current.Paths || next.GPU.Backend != current.GPU.Backend {
		return "dra, device_plugin, paths and gpu.backend"
	}
	return ""
}
