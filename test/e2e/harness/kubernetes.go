package harness

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
)

// KubernetesVersion is the newest Kubernetes release hack/k8s-deps.sh
// builds and the cluster tests run: kubelet, kube-apiserver,
// kube-scheduler, kube-controller-manager and kubectl, with the etcd it
// requires. The demo runs it.
const KubernetesVersion = "v1.37.2"

// KubernetesVersions are the releases the cluster tests run by default:
// KubernetesVersion and the newest release of the minor before it, the
// first on which the DRA features the driver relies on (consumable
// capacity, extended resources from a DeviceClass, device taints) are
// beta and on by default.
var KubernetesVersions = []string{KubernetesVersion, "v1.36.3"}

// EnvKubernetesVersions selects, as a space- or comma-separated list, the
// Kubernetes releases the cluster tests run against (default:
// KubernetesVersions). hack/k8s-deps.sh reads it too, to build just
// those; v1.34.4, the newest release of an older minor, is known to pass
// TestCluster and TestHelmChart (the DRA tests need consumable capacity,
// off by default before 1.36).
const EnvKubernetesVersions = "NRI_VGPU_E2E_KUBERNETES"

// kubernetesVersionRE matches the releases hack/k8s-deps.sh builds.
var kubernetesVersionRE = regexp.MustCompile(`^v1\.(3[4-9]|[4-9][0-9])\.[0-9]+$`)

// SelectedKubernetesVersions are the releases named in
// $NRI_VGPU_E2E_KUBERNETES, else KubernetesVersions.
func SelectedKubernetesVersions() ([]string, error) {
	env := os.Getenv(EnvKubernetesVersions)
	var versions []string
	for _, v := range strings.FieldsFunc(env, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' }) {
		if !kubernetesVersionRE.MatchString(v) {
			return nil, fmt.Errorf("harness: %s: Kubernetes version %q: want v1.MINOR.PATCH, v1.34.0 or newer", EnvKubernetesVersions, v)
		}
		if !slices.Contains(versions, v) {
			versions = append(versions, v)
		}
	}
	if len(versions) == 0 {
		versions = slices.Clone(KubernetesVersions)
	}
	return versions, nil
}

// EnvKubernetesBinDir names a directory holding the binaries of
// KubernetesVersion; without it, hack/k8s-deps.sh's cache is used.
const EnvKubernetesBinDir = "NRI_VGPU_E2E_KUBERNETES_BIN"

// DevicePluginDir is the kubelet's device-plugin directory. The kubelet
// serves kubelet.sock there whatever its --root-dir, so only one kubelet
// can run on a machine at a time.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// KubernetesBinDir is where hack/k8s-deps.sh puts the binaries of version
// (the same cache as containerd's, then kubernetes-<version>/bin); for
// KubernetesVersion, $NRI_VGPU_E2E_KUBERNETES_BIN comes first.
func KubernetesBinDir(version string) string {
	if d := os.Getenv(EnvKubernetesBinDir); d != "" && version == KubernetesVersion {
		return d
	}
	return filepath.Join(filepath.Dir(filepath.Dir(BinDir(version))), "kubernetes-"+version, "bin")
}

// kubernetesBinaries are the programs a cluster runs.
var kubernetesBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}

// versionLine finds a release number in a program's --version output
// ("Kubernetes v1.37.2", "etcd Version: 3.7.0").
var versionLine = regexp.MustCompile(`(?m)^(?:Kubernetes v(\S+)|etcd Version: (\S+))$`)

// KubernetesPreflight runs each program of a cluster in binDir with
// --version and reports which are missing, do not run, or are not of
// version (etcd: any release); nil when all are there.
func KubernetesPreflight(binDir, version string) error {
	var problems []string
	for _, b := range kubernetesBinaries {
		got, err := ProgramVersion(filepath.Join(binDir, b))
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case b != "etcd" && got != version:
			problems = append(problems, fmt.Sprintf("%s is %s, want %s", b, got, version))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("harness: cannot run Kubernetes %s from %s: %s (hack/k8s-deps.sh builds it)", version, binDir, strings.Join(problems, "; "))
	}
	return nil
}

// ProgramVersion runs bin --version and returns the release it reports,
// "v1.37.2" or (etcd) "v3.7.0".
func ProgramVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("%s --version printed %q, want a line \"Kubernetes vX.Y.Z\" or \"etcd Version: X.Y.Z\"", bin, strings.TrimSpace(string(out)))
	}
	return "v" + m[1] + m[2], nil
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Version is the Kubernetes release (default KubernetesVersion); the
	// binaries must report it.
	Version string
	// BinDir holds the binaries (default KubernetesBinDir(Version)).
	BinDir string
	// Containerd is the container runtime the kubelet uses. It should
	// have been started with Options.CNI, or the node's pods are limited
	// to the host network.
	Containerd *Containerd
	// NodeName is the node's name (default "nri-vgpu-e2e"). The API server
	// reaches the kubelet (kubectl exec and logs) only when it is
	// "localhost": the kubelet listens on loopback alone.
	NodeName string
	// NodeLabels are set on the node at registration.
	NodeLabels map[string]string
	// LogDir receives each component's log (default Dir/logs).
	LogDir string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// ControlPlaneOnly runs no kubelet, so tests that need only the API
	// server and the scheduler (placing pods and allocating claims) run
	// beside a test that runs the one kubelet a machine may have: the
	// node is an object the test creates (CreateNode), Containerd is not
	// needed, the controllers are the ones claims need (resourceclaim,
	// garbagecollector) and the kubelet's device-plugin directory is
	// left alone.
	ControlPlaneOnly bool
	// RBAC has the API server authorize by RBAC instead of allowing every
	// request, so that a test can hold an account to the rules it is
	// given. Client and Kubeconfig are system:masters either way.
	RBAC bool
}

// Cluster is a single-node Kubernetes cluster: etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager on loopback ports, and a
// kubelet on the harness's containerd. Everything but the kubelet's
// device-plugin directory lives under Dir.
type Cluster struct {
	Version    string
	Dir        string
	NodeName   string
	Kubeconfig string
	// Client talks to the API server as a member of system:masters.
	Client kubernetes.Interface
	// Config is Client's configuration.
	Config *rest.Config

	opts    ClusterOptions
	logf    func(format string, args ...any)
	logDir  string
	mu      sync.Mutex
	procs   map[string]*Process // running components by name
	kubelet []string            // the kubelet's command line
	closed  bool
	// nodeLock is held while this cluster's kubelet may run (NodeLockPath).
	nodeLock *os.File
}

// NodeLockPath is locked (flock) by each cluster with a kubelet for its
// whole life: two kubelets would share DevicePluginDir, each deleting the
// other's kubelet.sock, and device plugins would register with the wrong
// one. A second test run waits for the first.
const NodeLockPath = "/var/lib/kubelet/.nri-vgpu-e2e-node.lock"

// lockNode takes the lock file at path (NodeLockPath), waiting while
// another holder has it (it says so once) until ctx ends. The kernel
// releases the lock when its holder dies.
func lockNode(ctx context.Context, path string, logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	for said := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("harness: locking %s: %w", path, err)
		}
		if !said {
			holder, _ := os.ReadFile(path)
			logf("another test run's kubelet holds %s (pid %s); waiting", path, strings.TrimSpace(string(holder)))
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("harness: another kubelet of the tests holds %s: %w", path, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	// Who holds it, for the next one that waits.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// StartCluster starts a cluster whose node runs on opts.Containerd and
// waits until the node is registered and Ready. On an error, what was
// started is stopped again.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if opts.Containerd == nil && !opts.ControlPlaneOnly {
		return nil, errors.New("harness: ClusterOptions.Containerd is required")
	}
	if opts.Version == "" {
		opts.Version = KubernetesVersion
	}
	if opts.BinDir == "" {
		opts.BinDir = KubernetesBinDir(opts.Version)
	}
	if opts.NodeName == "" {
		opts.NodeName = "nri-vgpu-e2e"
	}
	if err := KubernetesPreflight(opts.BinDir, opts.Version); err != nil {
		return nil, err
	}
	dir, err := MkdirTemp("k8s")
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Version:    opts.Version,
		Dir:        dir,
		NodeName:   opts.NodeName,
		Kubeconfig: filepath.Join(dir, "kubeconfig"),
		opts:       opts,
		logf:       opts.Logf,
		logDir:     opts.LogDir,
		procs:      map[string]*Process{},
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if c.logDir == "" {
		c.logDir = filepath.Join(dir, "logs")
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// freePorts returns n distinct TCP ports free on loopback right now.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("harness: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) start(ctx context.Context) error {
	for _, d := range []string{"etcd", "pki", "kubelet", "kubelet-pki", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	// The kubelet's device-plugin directory is fixed (DevicePluginDir):
	// one kubelet at a time on this machine.
	if !c.opts.ControlPlaneOnly {
		if err := os.MkdirAll(DevicePluginDir, 0o755); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
		lock, err := lockNode(ctx, NodeLockPath, c.logf)
		if err != nil {
			return err
		}
		c.nodeLock = lock
	}
	ports, err := freePorts(7)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, cmPort, schedPort, kubeletPort, healthzPort := ports[0], ports[1], ports[2], ports[3], ports[4], ports[5], ports[6]

	// One key signs and verifies service-account tokens; a static token
	// authenticates every client as a member of system:masters.
	saKey := filepath.Join(c.Dir, "pki", "sa.key")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("harness: service-account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("harness: service-account key: %w", err)
	}
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	token := hex.EncodeToString(tok[:])
	tokens := filepath.Join(c.Dir, "pki", "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
`, server, token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return fmt.Errorf("harness: %w", err)
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	// No fsync: the data dies with the test, and the disk is shared.
	if err := c.run("etcd", "--name", "e2e", "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--unsafe-no-fsync"); err != nil {
		return err
	}
	authorization := "AlwaysAllow"
	if c.opts.RBAC {
		authorization = "RBAC"
	}
	if err := c.run("kube-apiserver",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		// Nothing reaches the API server through the kubernetes Service
		// (no pod talks to it), and its endpoint may not be loopback.
		"--endpoint-reconciler-type", "none",
		"--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(c.Dir, "pki"),
		"--token-auth-file", tokens,
		"--authorization-mode", authorization,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/24",
		// The chart's DaemonSets run privileged.
		"--allow-privileged=true",
		// The kubelet serves on loopback only (anonymous, AlwaysAllow);
		// a node named localhost is reached there (kubectl exec, logs).
		"--kubelet-preferred-address-types", "Hostname,InternalIP",
		// No pod here talks to the API server: without service-account
		// token volumes, no controller has to publish the root CA first.
		"--disable-admission-plugins", "ServiceAccount"); err != nil {
		return err
	}
	if err := c.waitAPI(ctx); err != nil {
		return err
	}
	// The controllers the tests rely on: DaemonSets (the chart), the
	// garbage collector, which deletes a DaemonSet's pods with it (helm
	// uninstall), the node lifecycle controller, which lifts the
	// not-ready taint the API server puts on a new node once it is Ready,
	// and the EndpointSlices of Services, through which a Prometheus finds
	// the pods it scrapes.
	controllers := "daemonset,garbagecollector,nodelifecycle,endpointslice"
	if c.opts.ControlPlaneOnly {
		// No node lifecycle: the node has no kubelet to report it Ready,
		// and would be tainted unreachable. The resourceclaim controller
		// frees the claims of deleted pods; the device taint eviction
		// controller evicts the pods whose claims use a device tainted
		// NoExecute.
		controllers = "garbagecollector,resourceclaim-controller,device-taint-eviction-controller"
	}
	if err := c.run("kube-controller-manager", "--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--controllers", controllers,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(cmPort)); err != nil {
		return err
	}
	if err := c.run("kube-scheduler", "--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(schedPort)); err != nil {
		return err
	}
	if c.opts.ControlPlaneOnly {
		return nil
	}
	if err := c.writeKubeletConfig(kubeletPort, healthzPort); err != nil {
		return err
	}
	var labels []string
	for k, v := range c.opts.NodeLabels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	c.kubelet = []string{
		"--config", filepath.Join(c.Dir, "kubelet.yaml"),
		"--kubeconfig", c.Kubeconfig,
		"--root-dir", filepath.Join(c.Dir, "kubelet"),
		"--cert-dir", filepath.Join(c.Dir, "kubelet-pki"),
		"--hostname-override", c.NodeName,
		"--v", "2",
	}
	if len(labels) > 0 {
		c.kubelet = append(c.kubelet, "--node-labels", strings.Join(labels, ","))
	}
	if err := c.StartKubelet(ctx); err != nil {
		return err
	}
	return c.WaitNodeReady(ctx)
}

// writeKubeletConfig writes the kubelet's configuration file. What this
// machine needs: cgroup v1 allowed (1.35 and later refuse it otherwise),
// cgroupfs, no QoS cgroups or node-allocatable enforcement, swap allowed.
// What the tests need: no image garbage collection (the images are
// imported, not pullable) and eviction only at the very end of the disk.
func (c *Cluster) writeKubeletConfig(port, healthzPort int) error {
	f, t := false, true
	cfg := kubeletconfig.KubeletConfiguration{
		TypeMeta:                    metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Address:                     "127.0.0.1",
		Port:                        int32(port),
		ReadOnlyPort:                0,
		HealthzBindAddress:          "127.0.0.1",
		HealthzPort:                 ptr(int32(healthzPort)),
		ContainerRuntimeEndpoint:    "unix://" + c.opts.Containerd.Address,
		CgroupDriver:                "cgroupfs",
		CgroupsPerQOS:               &f,
		EnforceNodeAllocatable:      []string{},
		FailSwapOn:                  &f,
		FailCgroupV1:                &f,
		PodLogsDir:                  filepath.Join(c.Dir, "pod-logs"),
		ImageGCHighThresholdPercent: ptr(int32(100)),
		ImageGCLowThresholdPercent:  ptr(int32(99)),
		EvictionHard: map[string]string{
			"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%",
		},
		Authentication: kubeletconfig.KubeletAuthentication{
			Anonymous: kubeletconfig.KubeletAnonymousAuthentication{Enabled: &t},
			Webhook:   kubeletconfig.KubeletWebhookAuthentication{Enabled: &f},
		},
		Authorization:             kubeletconfig.KubeletAuthorization{Mode: kubeletconfig.KubeletAuthorizationModeAlwaysAllow},
		NodeStatusUpdateFrequency: metav1.Duration{Duration: 5 * time.Second},
		NodeStatusReportFrequency: metav1.Duration{Duration: 10 * time.Second},
	}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("harness: kubelet config: %w", err)
	}
	// An empty list is what turns enforcement off, and omitempty drops it
	// (the default is ["pods"], which needs QoS cgroups).
	raw = append(raw, "enforceNodeAllocatable: []\n"...)
	if err := os.WriteFile(filepath.Join(c.Dir, "kubelet.yaml"), raw, 0o644); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// run starts component name from the cluster's binaries, logging to
// LogPath(name).
func (c *Cluster) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(c.opts.BinDir, name), args...)
	p, err := StartProcess(cmd, c.LogPath(name))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	c.logf("%s started (pid %d)", name, p.Pid())
	return nil
}

// LogPath is where component name ("kubelet", "etcd", ...) logs.
func (c *Cluster) LogPath(name string) string { return filepath.Join(c.logDir, name+".log") }

// LogTail is the last n lines of component name's log.
func (c *Cluster) LogTail(name string, n int) string { return Tail(c.LogPath(name), n) }

// waitAPI waits until the API server answers /readyz.
func (c *Cluster) waitAPI(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	for {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			c.logf("kube-apiserver ready")
			return nil
		}
		last = err
		if err := c.exitedEarly(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: kube-apiserver not ready (last error: %v): %s", last, c.LogTail("kube-apiserver", 20))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// exitedEarly reports a component that has exited.
func (c *Cluster) exitedEarly() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, p := range c.procs {
		select {
		case <-p.Exited():
			return fmt.Errorf("harness: %s exited (%v): %s", name, p.Err(), Tail(c.LogPath(name), 20))
		default:
		}
	}
	return nil
}

// CreateNode registers the node of a ControlPlaneOnly cluster as a kubelet
// would: Ready, with capacity for pods, and without the not-ready taint the
// API server gives a new node (no node lifecycle controller lifts it here).
func (c *Cluster) CreateNode(ctx context.Context) error {
	nodes := c.Client.CoreV1().Nodes()
	node, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.NodeName, Labels: c.opts.NodeLabels}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("harness: creating node %s: %w", c.NodeName, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node.Status = corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("harness: node %s status: %w", c.NodeName, err)
	}
	node.Spec.Taints = nil
	if _, err := nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("harness: node %s taints: %w", c.NodeName, err)
	}
	return nil
}

// StartKubelet starts the kubelet (again, after StopKubelet).
func (c *Cluster) StartKubelet(ctx context.Context) error {
	c.mu.Lock()
	_, running := c.procs["kubelet"]
	c.mu.Unlock()
	if running {
		return errors.New("harness: the kubelet is already running")
	}
	return c.run("kubelet", c.kubelet...)
}

// StopKubelet stops the kubelet; pods keep running, as they do when a
// node's kubelet restarts.
func (c *Cluster) StopKubelet() error {
	return c.stopComponent("kubelet")
}

func (c *Cluster) stopComponent(name string) error {
	c.mu.Lock()
	p := c.procs[name]
	delete(c.procs, name)
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	err := p.Stop(20 * time.Second)
	c.logf("%s stopped", name)
	return err
}

// WaitNodeReady waits until the node reports Ready and has no taints
// (the node lifecycle controller lifts the not-ready taint once it sees
// the node Ready).
func (c *Cluster) WaitNodeReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err == nil {
			for _, cond := range node.Status.Conditions {
				if cond.Type != corev1.NodeReady {
					continue
				}
				last = cond.Reason + ": " + cond.Message
				if cond.Status == corev1.ConditionTrue {
					if len(node.Spec.Taints) == 0 {
						c.logf("node %s ready", c.NodeName)
						return nil
					}
					last = fmt.Sprintf("ready, with taints %v", node.Spec.Taints)
				}
			}
		} else {
			last = err.Error()
		}
		if err := c.exitedEarly(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: node %s not ready (%s): kubelet log:\n%s", c.NodeName, last, c.LogTail("kubelet", 30))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Close deletes every pod the cluster runs (so the kubelet removes their
// containers and volumes), stops the components, removes what the kubelet
// left in its device-plugin directory and in /var/log/containers, detaches
// the mounts under Dir and removes it. It goes on past errors.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	_, kubeletRunning := c.procs["kubelet"]
	c.mu.Unlock()
	var errs []error
	// The controllers first, so that no DaemonSet pod comes back.
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		if err := c.stopComponent(name); err != nil {
			errs = append(errs, err)
		}
	}
	if kubeletRunning && c.Client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		if err := c.deleteAllPods(ctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	for _, name := range []string{"kubelet", "kube-apiserver", "etcd"} {
		if err := c.stopComponent(name); err != nil {
			errs = append(errs, err)
		}
	}
	// The kubelet's own files there; a device plugin's socket is its
	// owner's to remove. Without a kubelet of its own, the files there
	// are another cluster's.
	for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
		if c.opts.ControlPlaneOnly {
			break
		}
		if err := os.Remove(filepath.Join(DevicePluginDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("harness: %w", err))
		}
	}
	errs = append(errs, c.removeContainerLogLinks()...)
	if err := mountinfo.UnmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("harness: removing %s: %w", c.Dir, err))
	}
	if c.nodeLock != nil {
		// Closing the file releases the lock.
		c.nodeLock.Close()
	}
	return errors.Join(errs...)
}

// deleteAllPods deletes every pod and waits until the kubelet has
// confirmed each deletion (its containers are stopped).
func (c *Cluster) deleteAllPods(ctx context.Context) error {
	// A second of grace, not zero: zero removes a bound pod from the API
	// at once, before the kubelet has stopped anything.
	grace := int64(1)
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("harness: listing pods: %w", err)
	}
	for _, p := range pods.Items {
		_ = c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	}
	for {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: pods still there after deleting them all (%v): %w", err, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// removeContainerLogLinks removes the links the kubelet made in
// /var/log/containers to logs under Dir.
func (c *Cluster) removeContainerLogLinks() []error {
	links, _ := filepath.Glob("/var/log/containers/*.log")
	var errs []error
	for _, l := range links {
		target, err := os.Readlink(l)
		if err != nil || !strings.HasPrefix(target, c.Dir+"/") {
			continue
		}
		if err := os.Remove(l); err != nil {
			errs = append(errs, fmt.Errorf("harness: %w", err))
		}
	}
	return errs
}
