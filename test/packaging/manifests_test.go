// Package packaging tests what the project ships: the Kubernetes manifests
// rendered from the Helm chart (here), the node configuration of the
// deb/rpm packages (nodeconfig_test.go) and their systemd units
// (units_test.go). The packages themselves are installed and checked by
// packages.sh in this directory.
package packaging

import (
	"bytes"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

const manifestsPath = "../../packaging/manifests/nri-vgpu.yaml"

type manifests struct {
	configMaps      []corev1.ConfigMap
	serviceAccounts []corev1.ServiceAccount
	services        []corev1.Service
	serviceMonitors []monitoringv1.ServiceMonitor
	prometheusRules []monitoringv1.PrometheusRule
	daemonSets      map[string]*appsv1.DaemonSet // by app.kubernetes.io/component
	// The DRA driver's (draDriver.enabled) only.
	clusterRoles        []rbacv1.ClusterRole
	clusterRoleBindings []rbacv1.ClusterRoleBinding
	deviceClasses       []resourcev1.DeviceClass
}

// loadManifests decodes the rendered manifests (decodeManifests).
func loadManifests(t *testing.T) manifests {
	t.Helper()
	data, err := os.ReadFile(manifestsPath)
	if err != nil {
		t.Fatal(err)
	}
	return decodeManifests(t, data)
}

// decodeManifests decodes every document of a multi-document YAML stream
// into the Kubernetes API type of its kind, strictly: an unknown or misspelt
// field, a duplicate key or a wrong type fails, as the API server would
// refuse it. The ServiceMonitor is decoded into the Prometheus Operator's
// own Go type, from which its CRD's schema is generated.
func decodeManifests(t *testing.T, data []byte) manifests {
	t.Helper()
	m := manifests{daemonSets: map[string]*appsv1.DaemonSet{}}
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		switch gvk := tm.APIVersion + "/" + tm.Kind; gvk {
		case "v1/ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict([]byte(doc), &cm); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.configMaps = append(m.configMaps, cm)
		case "v1/ServiceAccount":
			var sa corev1.ServiceAccount
			if err := yaml.UnmarshalStrict([]byte(doc), &sa); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.serviceAccounts = append(m.serviceAccounts, sa)
		case "v1/Service":
			var svc corev1.Service
			if err := yaml.UnmarshalStrict([]byte(doc), &svc); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.services = append(m.services, svc)
		case "monitoring.coreos.com/v1/ServiceMonitor":
			var sm monitoringv1.ServiceMonitor
			if err := yaml.UnmarshalStrict([]byte(doc), &sm); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.serviceMonitors = append(m.serviceMonitors, sm)
		case "monitoring.coreos.com/v1/PrometheusRule":
			var pr monitoringv1.PrometheusRule
			if err := yaml.UnmarshalStrict([]byte(doc), &pr); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.prometheusRules = append(m.prometheusRules, pr)
		case "apps/v1/DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict([]byte(doc), &ds); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.daemonSets[ds.Labels["app.kubernetes.io/component"]] = &ds
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			var r rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.clusterRoles = append(m.clusterRoles, r)
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.clusterRoleBindings = append(m.clusterRoleBindings, b)
		case "resource.k8s.io/v1/DeviceClass":
			var dc resourcev1.DeviceClass
			if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
				t.Fatalf("document %d (%s): %v", i, gvk, err)
			}
			m.deviceClasses = append(m.deviceClasses, dc)
		default:
			// Nothing else is needed: the RBAC is the DRA driver's, the
			// one daemon that talks to the API server.
			t.Fatalf("document %d: unexpected %s %q", i, gvk, tm.Kind)
		}
	}
	return m
}

func stripComments(doc []byte) []byte {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAll(doc, nil)
}

func TestManifestsObjects(t *testing.T) {
	m := loadManifests(t)
	if len(m.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want 1", len(m.configMaps))
	}
	if len(m.serviceAccounts) != 1 {
		t.Fatalf("%d ServiceAccounts, want 1", len(m.serviceAccounts))
	}
	if sa := m.serviceAccounts[0]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount automountServiceAccountToken %v, want false", sa.AutomountServiceAccountToken)
	}
	// Metrics are off by default: no port, no Service, no alerts.
	if len(m.services) != 0 || len(m.serviceMonitors) != 0 || len(m.prometheusRules) != 0 {
		t.Errorf("%d Services, %d ServiceMonitors and %d PrometheusRules with the default values, want none",
			len(m.services), len(m.serviceMonitors), len(m.prometheusRules))
	}
	for _, component := range []string{"device-plugin", "nri-plugin"} {
		ds := m.daemonSets[component]
		if ds == nil {
			t.Fatalf("no %s DaemonSet", component)
		}
		t.Run(component, func(t *testing.T) {
			if ds.Namespace != "kube-system" {
				t.Errorf("namespace %q, want kube-system", ds.Namespace)
			}
			sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
				t.Errorf("selector %v does not match the pod labels %v", sel, ds.Spec.Template.Labels)
			}
			// containerd's NRI validator (set by nri-vgpu configure
			// containerd) refuses every pod while nri-vgpu is away, ours
			// included, unless it carries this.
			if got := ds.Spec.Template.Annotations["nri-vgpu.io/tolerate-missing-plugin"]; got != "true" {
				t.Errorf("pod annotation nri-vgpu.io/tolerate-missing-plugin = %q, want \"true\"", got)
			}
			pod := ds.Spec.Template.Spec
			if len(pod.NodeSelector) == 0 || len(pod.Tolerations) == 0 || pod.PriorityClassName != "system-node-critical" {
				t.Errorf("pod placement: nodeSelector %v, tolerations %v, priority class %q", pod.NodeSelector, pod.Tolerations, pod.PriorityClassName)
			}
			// Neither daemon talks to the API server: a ServiceAccount of
			// their own, no token.
			if len(m.serviceAccounts) != 1 || pod.ServiceAccountName != m.serviceAccounts[0].Name {
				t.Errorf("pod service account %q, want the chart's own (%d rendered)", pod.ServiceAccountName, len(m.serviceAccounts))
			}
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Errorf("pod automountServiceAccountToken %v, want false", pod.AutomountServiceAccountToken)
			}
			volumes := map[string]corev1.Volume{}
			for _, v := range pod.Volumes {
				volumes[v.Name] = v
			}
			for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
				for _, vm := range c.VolumeMounts {
					if _, ok := volumes[vm.Name]; !ok {
						t.Errorf("container %s mounts undefined volume %q", c.Name, vm.Name)
					}
				}
				if c.Image == "" || len(c.Command) == 0 {
					t.Errorf("container %s: image %q, command %q", c.Name, c.Image, c.Command)
				}
			}
		})
	}
}

// hostMounts maps the host paths a container mounts to where it mounts them.
func hostMounts(pod corev1.PodSpec, c corev1.Container) map[string]corev1.VolumeMount {
	out := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.HostPath != nil {
				out[v.HostPath.Path] = vm
			}
		}
	}
	return out
}

// checkHookInstalled holds the NRI plugin's pod to the pin hook's needs:
// runc runs the hook on the host, so the plugin must name a host file
// (--hook-path=<hostDir>/nri-vgpu-hook, in place of its own binary, which
// is the pod's), and the init container must put the image's copy there:
// executable, and by a rename from a temporary name in the same directory,
// so that a runc running the old file is not handed a half-written one.
func checkHookInstalled(t *testing.T, nri corev1.PodSpec, hostDir string) {
	t.Helper()
	want := path.Join(hostDir, "nri-vgpu-hook")
	plugin := containerNamed(t, nri.Containers, "nri-plugin")
	var got []string
	for _, a := range plugin.Args {
		if v, ok := strings.CutPrefix(a, "--hook-path="); ok {
			got = append(got, v)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("nri-plugin --hook-path %q, want %s", got, want)
	}
	if vm, ok := hostMounts(nri, plugin)[hostDir]; !ok || vm.MountPath != hostDir {
		// The plugin checks at start that the hook is there.
		t.Errorf("nri-plugin must mount host %s at %s, has %+v", hostDir, hostDir, vm)
	}
	if len(nri.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the shim installer", len(nri.InitContainers))
	}
	initC := nri.InitContainers[0]
	vm, ok := hostMounts(nri, initC)[hostDir]
	if !ok {
		t.Fatalf("the init container does not mount %s", hostDir)
	}
	script := initC.Command[len(initC.Command)-1]
	mv := regexp.MustCompile(`(?m)^mv -f (` + regexp.QuoteMeta(vm.MountPath) + `/[^/\s]+) ` + regexp.QuoteMeta(vm.MountPath+"/nri-vgpu-hook") + `$`).FindStringSubmatch(script)
	if mv == nil || mv[1] == vm.MountPath+"/nri-vgpu-hook" {
		t.Fatalf("the init container does not rename a file of %s to nri-vgpu-hook there:\n%s", vm.MountPath, script)
	}
	if !regexp.MustCompile(`(?m)^cp /usr/lib/nri-vgpu/nri-vgpu-hook ` + regexp.QuoteMeta(mv[1]) + `$`).MatchString(script) {
		t.Errorf("the init container does not copy the image's /usr/lib/nri-vgpu/nri-vgpu-hook to %s:\n%s", mv[1], script)
	}
	if !regexp.MustCompile(`(?m)^chmod 0?755 ` + regexp.QuoteMeta(mv[1]) + `$`).MatchString(script) {
		t.Errorf("the init container does not make %s mode 0755 before the rename:\n%s", mv[1], script)
	}
}

func containerNamed(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// TestManifestsMatchTheConfig holds the pods to the contracts: the NRI plugin
// hands host paths (limits files, the shim, the preload file) to containerd,
// so run_dir, state_dir and the shim's directory must be mounted at their
// host paths, and the config in the ConfigMap must be valid and agree.
func TestManifestsMatchTheConfig(t *testing.T) {
	m := loadManifests(t)
	data, ok := m.configMaps[0].Data["config.toml"]
	if !ok {
		t.Fatal("the ConfigMap has no config.toml")
	}
	cfg, err := config.Parse("ConfigMap config.toml", []byte(data))
	if err != nil {
		t.Fatalf("the ConfigMap's config is invalid: %v", err)
	}
	if cfg.GPU.Backend != config.BackendNVML {
		t.Errorf("backend %q, want nvml on a cluster", cfg.GPU.Backend)
	}

	nri := m.daemonSets["nri-plugin"].Spec.Template.Spec
	plugin := containerNamed(t, nri.Containers, "nri-plugin")
	mounts := hostMounts(nri, plugin)
	for _, p := range []string{cfg.Paths.RunDir, cfg.Paths.StateDir, path.Dir(cfg.Paths.ShimPath)} {
		vm, ok := mounts[p]
		if !ok || vm.MountPath != p {
			t.Errorf("nri-plugin must mount host %s at %s, has %+v", p, p, vm)
		}
	}
	// It writes the limits files and may create the allocation key.
	for _, p := range []string{cfg.Paths.RunDir, cfg.Paths.StateDir} {
		if vm := mounts[p]; vm.ReadOnly {
			t.Errorf("nri-plugin must mount host %s read-write, has %+v", p, vm)
		}
	}
	if vm, ok := mounts[path.Dir(cfg.NRI.SocketPath)]; !ok || vm.MountPath != path.Dir(cfg.NRI.SocketPath) || vm.ReadOnly {
		t.Errorf("nri-plugin must mount the NRI socket directory %s read-write, has %+v", path.Dir(cfg.NRI.SocketPath), vm)
	}
	if vm, ok := mounts["/dev"]; !ok || vm.MountPath != path.Join(cfg.Driver.DevRoot, "dev") {
		t.Errorf("host /dev must be at dev_root/dev = %s, has %+v", path.Join(cfg.Driver.DevRoot, "dev"), vm)
	}
	for _, dir := range cfg.Driver.CDIDirs {
		if vm, ok := mounts[dir]; !ok || vm.MountPath != dir {
			t.Errorf("nri-plugin must mount the CDI directory %s, has %+v", dir, vm)
		}
	}
	// The plugin mounts a size-limited tmpfs on each region directory
	// under run_dir: the mount must reach the host (Bidirectional, which
	// needs privileged).
	if vm := mounts[cfg.Paths.RunDir]; vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("nri-plugin must mount run_dir %s with Bidirectional propagation, has %+v", cfg.Paths.RunDir, vm)
	}
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Errorf("the NRI plugin mounts region file systems for the host: it must be privileged, has %+v", plugin.SecurityContext)
	}

	// The init container puts the shim into the host directory of shim_path.
	if len(nri.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the shim installer", len(nri.InitContainers))
	}
	initMounts := hostMounts(nri, nri.InitContainers[0])
	vm, ok := initMounts[path.Dir(cfg.Paths.ShimPath)]
	if !ok {
		t.Fatalf("the init container does not mount %s", path.Dir(cfg.Paths.ShimPath))
	}
	script := nri.InitContainers[0].Command[len(nri.InitContainers[0].Command)-1]
	if want := vm.MountPath + "/" + path.Base(cfg.Paths.ShimPath); !regexp.MustCompile(`mv -f \S+ ` + regexp.QuoteMeta(want) + `\b`).MatchString(script) {
		t.Errorf("the init container does not move the shim to %s:\n%s", want, script)
	}
	checkHookInstalled(t, nri, path.Dir(cfg.Paths.ShimPath))
	// kubelet creates a missing hostPath directory 0755; the allocation
	// key's directory must be root's alone.
	if vm, ok := initMounts[cfg.Paths.StateDir]; !ok {
		t.Errorf("the init container does not mount the state directory %s", cfg.Paths.StateDir)
	} else if !regexp.MustCompile(`(?m)^chmod 0?700 ` + regexp.QuoteMeta(vm.MountPath) + `/?$`).MatchString(script) {
		t.Errorf("the init container does not make the state directory (at %s) mode 0700:\n%s", vm.MountPath, script)
	}

	dp := m.daemonSets["device-plugin"].Spec.Template.Spec
	dpContainer := containerNamed(t, dp.Containers, "device-plugin")
	dpMounts := hostMounts(dp, dpContainer)
	for _, p := range []string{cfg.DevicePlugin.SocketDir, cfg.Paths.StateDir} {
		if vm, ok := dpMounts[p]; !ok || vm.MountPath != p || vm.ReadOnly {
			t.Errorf("device-plugin must mount host %s read-write at the same path, has %+v", p, vm)
		}
	}

	// Both daemons open the GPU backend: with NVML, the NVIDIA container
	// toolkit must give each the management library and the GPUs. The NRI
	// plugin checks every allocation's GPUs against it and refuses them
	// all without.
	if cfg.GPU.Backend == config.BackendNVML {
		for _, c := range []struct {
			pod  corev1.PodSpec
			ctr  corev1.Container
			name string
		}{{dp, dpContainer, "device-plugin"}, {nri, plugin, "nri-plugin"}} {
			env := map[string]string{}
			for _, e := range c.ctr.Env {
				env[e.Name] = e.Value
			}
			if env["NVIDIA_VISIBLE_DEVICES"] != "all" {
				t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want all: NVML needs the GPUs", c.name, env["NVIDIA_VISIBLE_DEVICES"])
			}
			if caps := env["NVIDIA_DRIVER_CAPABILITIES"]; caps != "all" && !slices.Contains(strings.Split(caps, ","), "utility") {
				t.Errorf("%s: NVIDIA_DRIVER_CAPABILITIES=%q lacks utility (NVML)", c.name, caps)
			}
		}
		if !reflect.DeepEqual(dp.RuntimeClassName, nri.RuntimeClassName) {
			t.Errorf("runtime classes differ: device-plugin %v, nri-plugin %v; both need NVML", dp.RuntimeClassName, nri.RuntimeClassName)
		}
	}
}
