// Command demo-cluster is `make demo-cluster`: the story of `make demo` told
// with kubectl against a real single-node Kubernetes cluster. It starts
// containerd (NRI on, nri-vgpu pre-registered), etcd, the control plane and a
// kubelet (hack/k8s-deps.sh builds them), and the device plugin, then runs
// each step as the kubectl command a user would type, printing the command
// and its output: the node's slices, two GPU pods, what one of them received,
// a program refused past its slice, a pod asking for more than the node has
// staying Pending, and `nri-vgpu status`. Everything lives in temporary
// directories, removed when it ends (success, failure or Ctrl-C); the
// kubelet's device-plugin directory is /var/lib/kubelet/device-plugins, so
// it must not run on a node whose own kubelet runs.
//
//	hack/e2e-deps.sh && hack/k8s-deps.sh && make build && go run ./test/e2e/cmd/demo-cluster
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
)

const (
	name         = "demo-cluster"
	resourceName = "nvidia.com/gpu"
	appImage     = "nri-vgpu.demo/cuda-app:latest"
	splitCount   = 4
	gpuUUID      = "GPU-4a7b3c1e-9d2f-4e8a-b6c5-1f0e2d3c4b5a"
	gpuName      = "NVIDIA A100-SXM4-40GB"
	gpuMemory    = 40 << 30
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	harness.ChainFlags
	kubernetesBin string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return nil, err
	}
	o := &options{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.Register(fs, root)
	fs.StringVar(&o.kubernetesBin, "kubernetes-bin", harness.KubernetesBinDir(harness.KubernetesVersion), "directory of the Kubernetes binaries and etcd (hack/k8s-deps.sh)")
	if err := harness.ParseAll(fs, args); err != nil {
		return nil, err
	}
	return o, nil
}

// demo is one run: what it started and where.
type demo struct {
	o          *options
	w          io.Writer
	base       string
	config     string
	kubectlBin string
	c          *harness.Containerd
	k          *harness.Cluster
	dp         *harness.Process
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	start := time.Now()
	if _, err := harness.SweepStale(o.Runc); err != nil {
		fmt.Fprintf(stderr, "%s: cleaning up after an earlier run: %v\n", name, err)
		return 1
	}
	base, err := harness.MkdirTemp("demo-cluster")
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	d := &demo{o: o, w: stdout, base: base, kubectlBin: filepath.Join(o.kubernetesBin, "kubectl")}
	fmt.Fprintf(stdout, "nri-vgpu on a real single-node Kubernetes %s: one simulated %s, split %d ways\n", harness.KubernetesVersion, gpuName, splitCount)
	runErr := d.setup(ctx)
	if runErr == nil {
		runErr = d.story(ctx)
	}
	closeErr := d.close()
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "%s: interrupted; everything it started is removed\n", name)
		return 130
	case runErr != nil:
		fmt.Fprintf(stderr, "\n%s FAILED: %v\n", name, runErr)
		return 1
	case closeErr != nil:
		fmt.Fprintf(stderr, "%s: cleaning up: %v\n", name, closeErr)
		return 1
	}
	fmt.Fprintf(stdout, "\nCleaned up. nri-vgpu demo-cluster: all steps passed in %.0fs\n", time.Since(start).Seconds())
	return 0
}

// setup starts the node: containerd with nri-vgpu, the cluster, the device
// plugin.
func (d *demo) setup(ctx context.Context) error {
	o := d.o
	fmt.Fprintf(d.w, "\nSetting up in %s\n", d.base)
	for _, p := range []string{filepath.Join(o.BinDir, "nri-vgpu"), filepath.Join(o.BinDir, "nri-vgpu-device-plugin"), filepath.Join(o.ShimBuild, "libvgpu-shim.so")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (make build)", err)
		}
	}
	devRoot := filepath.Join(d.base, "devroot")
	if err := harness.MakeFakeNVIDIADevRoot(devRoot, []int{0}); err != nil {
		return err
	}
	nriSocket := filepath.Join(d.base, "nri", "nri.sock")
	if err := os.MkdirAll(filepath.Dir(nriSocket), 0o755); err != nil {
		return err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[device_plugin]\nsplit_count = %d\n\n[gpu]\nbackend = \"simulated\"\n", splitCount)
	harness.WriteSimulatedGPU(&cfg, gpuUUID, gpuName, gpuMemory, 0)
	harness.WriteNodePaths(&cfg, harness.NodePaths{DevRoot: devRoot, StateDir: filepath.Join(d.base, "state"),
		RunDir: filepath.Join(d.base, "run"), Shim: filepath.Join(o.ShimBuild, "libvgpu-shim.so"), NRISocket: nriSocket})
	d.config = filepath.Join(d.base, "config.toml")
	if err := os.WriteFile(d.config, []byte(cfg.String()), 0o644); err != nil {
		return err
	}
	imgDir := filepath.Join(d.base, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return err
	}
	pause, err := harness.BuildPauseImage(ctx, imgDir)
	if err != nil {
		return err
	}
	app, err := harness.BuildCudaTestImage(imgDir, appImage, o.ShimBuild,
		[]string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"})
	if err != nil {
		return err
	}
	d.c, err = harness.Start(ctx, harness.Options{
		BinDir: o.ContainerdBin, Runc: o.Runc, Images: []string{pause, app}, SandboxImage: harness.PauseImage,
		NRIPlugins: []harness.NRIPlugin{{Name: "10-nri-vgpu", Path: filepath.Join(o.BinDir, "nri-vgpu"),
			Env: []string{"NRI_VGPU_CONFIG=" + d.config}}},
		NRISocket: nriSocket,
		// The node is Ready only with a pod network, though the demo's
		// pods use the host's.
		CNI: true,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(d.w, "  containerd %s, NRI on, nri-vgpu pre-registered\n", d.c.Version)
	d.k, err = harness.StartCluster(ctx, harness.ClusterOptions{BinDir: o.kubernetesBin, Containerd: d.c,
		// kubectl exec reaches the kubelet, which listens on loopback.
		NodeName: "localhost"})
	if err != nil {
		return err
	}
	fmt.Fprintf(d.w, "  etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubelet: node %s Ready\n", d.k.NodeName)
	d.dp, err = harness.StartProcess(exec.Command(filepath.Join(o.BinDir, "nri-vgpu-device-plugin"), "--config", d.config),
		filepath.Join(d.base, "device-plugin.log"))
	if err != nil {
		return err
	}
	fmt.Fprintf(d.w, "  nri-vgpu-device-plugin, registering with the kubelet\n")
	return nil
}

// pod is a pod manifest of the story: the app image, on the host network
// (the node has no pod network), asking for slices.
func pod(name string, slices int, command string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: cuda
    image: %s
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", %q]
    resources:
      limits:
        %s: %d
`, name, appImage, command, resourceName, slices)
}

// story runs the steps; each fails the demo when kubectl fails or its
// output lacks what the step is about.
func (d *demo) story(ctx context.Context) error {
	sleep := "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
	env := fmt.Sprintf("FAKECUDA_DEVICES=%s:40GiB:108 FAKECUDA_STATE=/tmp", gpuUUID)
	steps := []struct {
		title string
		fn    func() error
	}{
		{"The node advertises its GPU's slices", func() error {
			return d.waitOutput(ctx, "4", "get", "node", d.k.NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/gpu}`)
		}},
		{"Two pods ask for slices: pod-a 2, pod-b 1", func() error {
			for _, p := range []struct {
				n string
				s int
			}{{"pod-a", 2}, {"pod-b", 1}} {
				if err := d.apply(ctx, p.n, pod(p.n, p.s, sleep)); err != nil {
					return err
				}
			}
			if _, err := d.kubectl(ctx, "wait", "--for=condition=Ready", "pod/pod-a", "pod/pod-b", "--timeout=90s"); err != nil {
				return err
			}
			_, err := d.kubectl(ctx, "get", "pods", "-o", "wide")
			return err
		}},
		{"What pod-a received: its limits file, the shim preloaded read-only", func() error {
			out, err := d.kubectl(ctx, "exec", "pod-a", "--", "cat", "/run/nri-vgpu/limits", "/etc/ld.so.preload")
			if err == nil && !strings.Contains(out, "gpu.0.memory=21474836480") {
				err = errors.New("pod-a's limits file does not give it 20 GiB (two 10 GiB slices)")
			}
			return err
		}},
		{"A program in pod-a allocating past its 20 GiB is refused (CUDA_ERROR_OUT_OF_MEMORY = 2)", func() error {
			_, err := d.kubectl(ctx, "exec", "pod-a", "--", "sh", "-c",
				env+" cudaprog -m direct init info:20GiB:20GiB alloc:16GiB alloc:8GiB:2 alloc:4GiB info:0:20GiB")
			return err
		}},
		{"pod-c asks for 5 slices, more than the node has free: it stays Pending", func() error {
			if err := d.apply(ctx, "pod-c", pod("pod-c", 5, sleep)); err != nil {
				return err
			}
			return d.waitOutput(ctx, "Unschedulable", "get", "pod", "pod-c", "-o", `jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}`)
		}},
		{"nri-vgpu status on the node", func() error {
			fmt.Fprintf(d.w, "$ nri-vgpu status\n")
			cmd := exec.CommandContext(ctx, filepath.Join(d.o.BinDir, "nri-vgpu"), "--config", d.config, "status")
			out, err := cmd.CombinedOutput()
			d.w.Write(indent(out))
			if err == nil && !strings.Contains(string(out), "pod-a") {
				err = errors.New("nri-vgpu status does not list pod-a")
			}
			return err
		}},
		{"The pods are deleted: the slices are free again", func() error {
			if _, err := d.kubectl(ctx, "delete", "pod", "pod-a", "pod-b", "pod-c", "--wait=true"); err != nil {
				return err
			}
			return d.waitOutput(ctx, "4", "get", "node", d.k.NodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/gpu}`)
		}},
	}
	for i, s := range steps {
		fmt.Fprintf(d.w, "\n[%d] %s\n", i+1, s.title)
		if err := s.fn(); err != nil {
			return fmt.Errorf("[%d] %s: %w", i+1, s.title, err)
		}
	}
	return nil
}

// kubectl runs kubectl against the cluster, printing the command and its
// output.
func (d *demo) kubectl(ctx context.Context, args ...string) (string, error) {
	fmt.Fprintf(d.w, "$ kubectl %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, d.kubectlBin, append([]string{"--kubeconfig", d.k.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	d.w.Write(indent(out))
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w", args[0], err)
	}
	return string(out), nil
}

// apply writes manifest to a file named after the pod and applies it.
func (d *demo) apply(ctx context.Context, pod, manifest string) error {
	f := filepath.Join(d.base, pod+".yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(d.w, "$ cat %s.yaml\n", pod)
	d.w.Write(indent([]byte(manifest)))
	_, err := d.kubectl(ctx, "apply", "-f", f)
	return err
}

// waitOutput runs kubectl until it prints want (up to a minute); it prints
// the last run only.
func (d *demo) waitOutput(ctx context.Context, want string, args ...string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		cmd := exec.CommandContext(ctx, d.kubectlBin, append([]string{"--kubeconfig", d.k.Kubeconfig}, args...)...)
		out, err := cmd.Output()
		if err == nil && strings.TrimSpace(string(out)) == want || time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Fprintf(d.w, "$ kubectl %s\n", strings.Join(args, " "))
			d.w.Write(indent(out))
			if strings.TrimSpace(string(out)) != want {
				return fmt.Errorf("kubectl %s printed %q, want %q", args[0], strings.TrimSpace(string(out)), want)
			}
			return nil
		}
		time.Sleep(time.Second)
	}
}

func indent(b []byte) []byte {
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return nil
	}
	return []byte("    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n")
}

// close stops everything and removes the demo's directory: the cluster
// first (it deletes the pods), then the device plugin and containerd.
func (d *demo) close() error {
	var errs []error
	if d.k != nil {
		errs = append(errs, d.k.Close())
	}
	if d.dp != nil {
		errs = append(errs, d.dp.Stop(10*time.Second))
	}
	if d.c != nil {
		errs = append(errs, d.c.Close())
	}
	errs = append(errs, mountinfo.UnmountUnder(d.base), os.RemoveAll(d.base))
	return errors.Join(errs...)
}
