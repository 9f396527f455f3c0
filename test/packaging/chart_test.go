package packaging

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const chartPath = "../../packaging/helm/nri-vgpu"

// render renders the chart with helm ($HELM, which hack/helm.sh check sets
// to its pinned build) into kube-system with the given --set/--set-json
// arguments, and decodes the result strictly.
func render(t *testing.T, args ...string) manifests {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Skip("HELM is not set: hack/helm.sh check runs these tests with its pinned helm")
	}
	cmd := exec.Command(helm, append([]string{"template", "nri-vgpu", chartPath,
		"--namespace", "kube-system", "--kube-version", "1.30.0"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("helm template %q: %v\n%s", args, err, stderr)
	}
	return decodeManifests(t, out)
}

func mainContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	if ds == nil {
		t.Fatal("DaemonSet not rendered")
	}
	return containerNamed(t, ds.Spec.Template.Spec.Containers, ds.Labels["app.kubernetes.io/component"])
}

// listenPort returns the port of the flag (--health-listen=:N) in the
// container's arguments, or 0.
func listenPort(t *testing.T, c corev1.Container, flag string) int32 {
	t.Helper()
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			_, port, ok := strings.Cut(v, ":")
			n, err := strconv.ParseInt(port, 10, 32)
			if !ok || err != nil {
				t.Fatalf("container %s: %s: want host:port", c.Name, a)
			}
			return int32(n)
		}
	}
	return 0
}

// containerPort resolves a probe's or Service's port (a name or a number)
// against the container's ports; 0 when nothing matches.
func containerPort(c corev1.Container, p intstr.IntOrString) int32 {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	return 0
}

// checkProbes holds a daemon's probes to its health listener: liveness on
// /healthz, readiness on /readyz, both on the port the flag (--health-listen,
// or the DRA driver's --metrics-listen) opens.
func checkProbes(t *testing.T, c corev1.Container, flag string) {
	t.Helper()
	health := listenPort(t, c, flag)
	if health == 0 {
		t.Fatalf("container %s: no %s in %q", c.Name, flag, c.Args)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("container %s: no HTTP %s probe", c.Name, p.name)
			continue
		}
		if got := containerPort(c, p.probe.HTTPGet.Port); p.probe.HTTPGet.Path != p.path || got != health {
			t.Errorf("container %s: %s probe GET %s on port %d, want %s on %d (%s)",
				c.Name, p.name, p.probe.HTTPGet.Path, got, p.path, health, flag)
		}
	}
}

func TestManifestsProbes(t *testing.T) {
	m := loadManifests(t)
	for _, component := range []string{"device-plugin", "nri-plugin"} {
		t.Run(component, func(t *testing.T) { checkProbes(t, mainContainer(t, m.daemonSets[component]), "--health-listen") })
	}
}

// metrics.enabled opens the NRI plugin's metrics port behind a headless
// Service; the ServiceMonitor, behind its own value, scrapes that Service.
func TestChartMetrics(t *testing.T) {
	t.Run("metrics on", func(t *testing.T) {
		m := render(t, "--set", "metrics.enabled=true", "--set", "metrics.port=9999")
		ds := m.daemonSets["nri-plugin"]
		c := mainContainer(t, ds)
		if got := listenPort(t, c, "--metrics-listen"); got != 9999 {
			t.Errorf("--metrics-listen port %d, want metrics.port 9999; args %q", got, c.Args)
		}
		checkProbes(t, c, "--health-listen")
		checkHostProc(t, ds, true)
		services := servicesOf(m, "nri-plugin")
		if len(services) != 1 {
			t.Fatalf("%d Services of the NRI plugin, want the metrics Service", len(services))
		}
		svc := services[0]
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("Service clusterIP %q, want None: each node's plugin is its own target", svc.Spec.ClusterIP)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
			t.Errorf("Service selector %v does not match the NRI plugin pods %v", svc.Spec.Selector, ds.Spec.Template.Labels)
		}
		if dp := m.daemonSets["device-plugin"]; labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dp.Spec.Template.Labels)) {
			t.Errorf("Service selector %v also matches the device plugin pods, which serve no metrics", svc.Spec.Selector)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || containerPort(c, svc.Spec.Ports[0].TargetPort) != 9999 {
			t.Errorf("Service ports %+v, want metrics targeting the container's port 9999", svc.Spec.Ports)
		}
		if len(m.serviceMonitors) != 0 {
			t.Errorf("%d ServiceMonitors without metrics.serviceMonitor.enabled", len(m.serviceMonitors))
		}
	})
	t.Run("service monitor", func(t *testing.T) {
		m := render(t, "--set", "metrics.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
			"--set", "metrics.serviceMonitor.additionalLabels.release=prom", "--set", "metrics.serviceMonitor.interval=15s")
		monitors, services := serviceMonitorsOf(m, "nri-plugin"), servicesOf(m, "nri-plugin")
		if len(monitors) != 1 || len(services) != 1 {
			t.Fatalf("%d ServiceMonitors and %d Services of the NRI plugin, want 1 and 1", len(monitors), len(services))
		}
		sm, svc := monitors[0], services[0]
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v does not match the Service's labels %v", sel, svc.Labels)
		}
		if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{svc.Namespace}) && !sm.Spec.NamespaceSelector.Any {
			t.Errorf("ServiceMonitor namespaceSelector %+v misses the Service's namespace %s", sm.Spec.NamespaceSelector, svc.Namespace)
		}
		if sm.Labels["release"] != "prom" {
			t.Errorf("ServiceMonitor labels %v lack additionalLabels release=prom", sm.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor endpoints %+v, want 1", sm.Spec.Endpoints)
		}
		ep := sm.Spec.Endpoints[0]
		if ep.Port != svc.Spec.Ports[0].Name || ep.Path != "/metrics" || ep.Interval != "15s" {
			t.Errorf("ServiceMonitor endpoint %+v, want port %s, /metrics, interval 15s", ep, svc.Spec.Ports[0].Name)
		}
		// The series' namespace, pod and container are the GPU
		// containers': they must win over the target's.
		if !ep.HonorLabels {
			t.Error("ServiceMonitor endpoint honorLabels false: the series' namespace/pod/container would be renamed exported_*")
		}
	})
	t.Run("metrics without SM utilisation", func(t *testing.T) {
		checkHostProc(t, render(t, "--set", "metrics.enabled=true", "--set", "metrics.smUtilization=false").daemonSets["nri-plugin"], false)
	})
	t.Run("service monitor without metrics", func(t *testing.T) {
		m := render(t, "--set", "metrics.serviceMonitor.enabled=true")
		checkHostProc(t, m.daemonSets["nri-plugin"], false)
		if len(m.serviceMonitors) != 0 || len(m.services) != 0 {
			t.Errorf("%d ServiceMonitors, %d Services with metrics off, want none", len(m.serviceMonitors), len(m.services))
		}
		if c := mainContainer(t, m.daemonSets["nri-plugin"]); listenPort(t, c, "--metrics-listen") != 0 || containerPort(c, intstr.FromString("metrics")) != 0 {
			t.Errorf("metrics off, yet the NRI plugin opens a metrics port: args %q, ports %+v", c.Args, c.Ports)
		}
	})
}

// checkHostProc holds the NRI plugin's pod to what the SM utilisation
// needs (want) or to nothing of it: the host's /proc read-only at
// /host/proc, named by --host-proc, the pod in its own pid namespace.
func checkHostProc(t *testing.T, ds *appsv1.DaemonSet, want bool) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	c := mainContainer(t, ds)
	vm, mounted := hostMounts(pod, c)["/proc"]
	flag := slices.Contains(c.Args, "--host-proc=/host/proc")
	if !want {
		if mounted || flag {
			t.Errorf("no SM utilisation, yet the host's /proc is mounted (%v) or named (%v): args %q", mounted, flag, c.Args)
		}
		return
	}
	if !mounted || vm.MountPath != "/host/proc" || !vm.ReadOnly || !flag {
		t.Errorf("the host's /proc: mounted %v at %q read-only %v, --host-proc=/host/proc %v (args %q); want all", mounted, vm.MountPath, vm.ReadOnly, flag, c.Args)
	}
	if pod.HostPID {
		t.Error("hostPID: the pod needs only the host's /proc, not its pid namespace")
	}
}

// The conventions of NVIDIA's and HAMi's charts: namespaceOverride, a
// settable updateStrategy, per-component placement and security contexts,
// extraArgs/extraEnv, the ServiceAccount.
func TestChartValues(t *testing.T) {
	t.Run("namespaceOverride", func(t *testing.T) {
		m := render(t, "--set", "namespaceOverride=gpu-system", "--set", "metrics.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
		var got []string
		for _, o := range m.configMaps {
			got = append(got, o.Namespace)
		}
		for _, o := range m.serviceAccounts {
			got = append(got, o.Namespace)
		}
		for _, o := range m.services {
			got = append(got, o.Namespace)
		}
		for _, o := range m.serviceMonitors {
			got = append(got, o.Namespace)
			got = append(got, o.Spec.NamespaceSelector.MatchNames...)
		}
		for _, o := range m.daemonSets {
			got = append(got, o.Namespace)
		}
		// The NRI plugin's and the device plugin's metrics Services and
		// ServiceMonitors.
		if len(got) != 10 {
			t.Errorf("%d namespaced objects, want 8 and the ServiceMonitors' namespaceSelectors", len(got))
		}
		for _, ns := range got {
			if ns != "gpu-system" {
				t.Errorf("namespaces %q, want gpu-system everywhere", got)
				break
			}
		}
	})
	t.Run("per-component placement and strategy", func(t *testing.T) {
		m := render(t,
			"--set-json", `devicePlugin.nodeSelector={"pool":"gpu-a"}`,
			"--set-json", `nriPlugin.tolerations=[{"operator":"Exists"}]`,
			"--set-json", `nriPlugin.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"k","operator":"Exists"}]}]}}}`,
			"--set-json", `nriPlugin.updateStrategy={"type":"OnDelete"}`,
			"--set", "updateStrategy.rollingUpdate.maxUnavailable=3")
		dp, nri := m.daemonSets["device-plugin"].Spec, m.daemonSets["nri-plugin"].Spec
		if got := dp.Template.Spec.NodeSelector; len(got) != 1 || got["pool"] != "gpu-a" {
			t.Errorf("device plugin nodeSelector %v, want its own pool=gpu-a", got)
		}
		if got := nri.Template.Spec.NodeSelector; got["nvidia.com/gpu.present"] != "true" {
			t.Errorf("NRI plugin nodeSelector %v, want the global one", got)
		}
		if got := nri.Template.Spec.Tolerations; len(got) != 1 || got[0].Operator != corev1.TolerationOpExists || got[0].Key != "" {
			t.Errorf("NRI plugin tolerations %+v, want its own", got)
		}
		if got := dp.Template.Spec.Tolerations; len(got) != 1 || got[0].Key != "nvidia.com/gpu" {
			t.Errorf("device plugin tolerations %+v, want the global ones", got)
		}
		if nri.Template.Spec.Affinity == nil || dp.Template.Spec.Affinity != nil {
			t.Errorf("affinity: NRI plugin %v, device plugin %v; want only the NRI plugin's", nri.Template.Spec.Affinity, dp.Template.Spec.Affinity)
		}
		if nri.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
			t.Errorf("NRI plugin updateStrategy %+v, want its own OnDelete", nri.UpdateStrategy)
		}
		if ru := dp.UpdateStrategy.RollingUpdate; dp.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 3 {
			t.Errorf("device plugin updateStrategy %+v, want the global RollingUpdate with maxUnavailable 3", dp.UpdateStrategy)
		}
	})
	t.Run("extraArgs, extraEnv, security contexts", func(t *testing.T) {
		m := render(t,
			"--set-json", `devicePlugin.extraArgs=["--log-level=debug"]`,
			"--set-json", `nriPlugin.extraEnv=[{"name":"GODEBUG","value":"madvdontneed=1"}]`,
			"--set-json", `devicePlugin.securityContext={"privileged":false,"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}`,
			"--set-json", `devicePlugin.podSecurityContext={"runAsUser":0}`,
			"--set-json", `nriPlugin.podSecurityContext={"seccompProfile":{"type":"RuntimeDefault"}}`)
		dpDS, nriDS := m.daemonSets["device-plugin"], m.daemonSets["nri-plugin"]
		dp, nri := mainContainer(t, dpDS), mainContainer(t, nriDS)
		if !slices.Contains(dp.Args, "--log-level=debug") || listenPort(t, dp, "--health-listen") == 0 {
			t.Errorf("device plugin args %q, want --health-listen and the extra --log-level=debug", dp.Args)
		}
		env := map[string]string{}
		for _, e := range nri.Env {
			env[e.Name] = e.Value
		}
		if env["GODEBUG"] != "madvdontneed=1" || env["NRI_VGPU_CONFIG"] == "" {
			t.Errorf("NRI plugin env %v, want the chart's and the extra GODEBUG", env)
		}
		if sc := dp.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("device plugin securityContext %+v, want the override", sc)
		}
		if psc := dpDS.Spec.Template.Spec.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 0 {
			t.Errorf("device plugin podSecurityContext %+v, want runAsUser 0", psc)
		}
		if psc := nriDS.Spec.Template.Spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("NRI plugin podSecurityContext %+v, want its own seccomp profile", psc)
		}
		if sc := nri.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
			t.Errorf("NRI plugin securityContext %+v, want the default (privileged)", sc)
		}
	})
	t.Run("shimDir", func(t *testing.T) {
		// The pin hook follows the shim's directory (a read-only /usr).
		m := render(t, "--set", "hostPaths.shimDir=/opt/nri-vgpu/lib")
		checkHookInstalled(t, m.daemonSets["nri-plugin"].Spec.Template.Spec, "/opt/nri-vgpu/lib")
	})
	t.Run("existing service account", func(t *testing.T) {
		m := render(t, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=gpu-agents")
		if len(m.serviceAccounts) != 0 {
			t.Errorf("%d ServiceAccounts with serviceAccount.create=false", len(m.serviceAccounts))
		}
		for component, ds := range m.daemonSets {
			if pod := ds.Spec.Template.Spec; pod.ServiceAccountName != "gpu-agents" || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Errorf("%s: service account %q, automount %v; want gpu-agents, false", component, pod.ServiceAccountName, pod.AutomountServiceAccountToken)
			}
		}
	})
}

// The DRA driver answers /healthz and /readyz beside its metrics: with
// metrics.enabled its pod is probed there (not ready until it has registered
// with the kubelet), and without it, where nothing listens, not at all.
func TestChartDRADriverProbes(t *testing.T) {
	c := mainContainer(t, render(t, "--set", "draDriver.enabled=true", "--set", "metrics.enabled=true").daemonSets["dra-driver"])
	checkProbes(t, c, "--metrics-listen")
	c = mainContainer(t, render(t, "--set", "draDriver.enabled=true", "--set", "metrics.enabled=false").daemonSets["dra-driver"])
	if c.LivenessProbe != nil || c.ReadinessProbe != nil {
		t.Errorf("DRA driver without metrics: probes %+v, %+v on no listener", c.LivenessProbe, c.ReadinessProbe)
	}
}

// draDriver.enabled adds the DRA driver: a DaemonSet under an account of its
// own whose token it mounts, bound to a role that reads claims and writes
// ResourceSlices, privileged with the run directory shared back to the
// host, and the DeviceClass that selects its devices. Off (the default),
// none of it is rendered and no pod gets a token.
func TestChartDRADriver(t *testing.T) {
	off := render(t)
	if _, ok := off.daemonSets["dra-driver"]; ok || len(off.clusterRoles)+len(off.clusterRoleBindings)+len(off.deviceClasses) != 0 {
		t.Fatalf("the DRA driver is rendered by default")
	}

	m := render(t, "--set", "draDriver.enabled=true", "--set", "draDriver.driverName=vgpu.example.com")
	ds, ok := m.daemonSets["dra-driver"]
	if !ok {
		t.Fatal("no dra-driver DaemonSet with draDriver.enabled=true")
	}
	spec := ds.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Errorf("the DRA driver's pod mounts no API token (automountServiceAccountToken %v)", spec.AutomountServiceAccountToken)
	}
	for _, other := range []string{"device-plugin", "nri-plugin"} {
		if o := m.daemonSets[other]; o != nil && o.Spec.Template.Spec.ServiceAccountName == spec.ServiceAccountName {
			t.Errorf("the DRA driver shares the account %s with the %s", spec.ServiceAccountName, other)
		}
	}
	c := mainContainer(t, ds)
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Errorf("the DRA driver container is not privileged: it cannot mount the claims' region file systems for the host")
	}
	bidirectional := false
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == "/run/nri-vgpu" && vm.MountPropagation != nil && *vm.MountPropagation == corev1.MountPropagationBidirectional {
			bidirectional = true
		}
	}
	if !bidirectional {
		t.Errorf("run_dir is not mounted Bidirectional: %+v", c.VolumeMounts)
	}
	if !slices.Contains(c.Args, "--plugin-dir=/var/lib/kubelet/plugins/vgpu.example.com") {
		t.Errorf("args %q lack the driver's plugin directory", c.Args)
	}

	if len(m.clusterRoleBindings) != 1 || len(m.clusterRoles) != 1 {
		t.Fatalf("%d ClusterRoles and %d bindings, want 1 each", len(m.clusterRoles), len(m.clusterRoleBindings))
	}
	b := m.clusterRoleBindings[0]
	if b.RoleRef.Name != m.clusterRoles[0].Name || len(b.Subjects) != 1 || b.Subjects[0].Name != spec.ServiceAccountName {
		t.Errorf("binding %+v does not give role %s to the driver's account %s", b, m.clusterRoles[0].Name, spec.ServiceAccountName)
	}
	allowed := map[string][]string{}
	for _, r := range m.clusterRoles[0].Rules {
		for _, res := range r.Resources {
			allowed[res] = append(allowed[res], r.Verbs...)
		}
	}
	for res, verb := range map[string]string{"resourceclaims": "get", "resourceslices": "create", "nodes": "get",
		"resourceclaims/status": "patch", "resourceclaims/driver": "associated-node:patch"} {
		if !slices.Contains(allowed[res], verb) {
			t.Errorf("the role does not allow %s on %s: %v", verb, res, allowed)
		}
	}
	// The driver may write the status.devices entries of its own name
	// only, and only from a pod on the claim's node.
	for _, r := range m.clusterRoles[0].Rules {
		if slices.Contains(r.Resources, "resourceclaims/driver") &&
			(!slices.Equal(r.ResourceNames, []string{"vgpu.example.com"}) || !slices.Equal(r.Verbs, []string{"associated-node:patch"})) {
			t.Errorf("the rule on resourceclaims/driver is %+v, want associated-node:patch of vgpu.example.com only", r)
		}
	}

	if len(m.deviceClasses) != 1 {
		t.Fatalf("%d DeviceClasses, want 1", len(m.deviceClasses))
	}
	dc := m.deviceClasses[0]
	if dc.Name != "vgpu.example.com" || len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil ||
		dc.Spec.Selectors[0].CEL.Expression != `device.driver == "vgpu.example.com"` {
		t.Errorf("DeviceClass %s selects %+v, want the devices of driver vgpu.example.com", dc.Name, dc.Spec.Selectors)
	}
}

// draDriver.unhealthyTaintEffect reaches the driver as its flag, over the
// configuration's; empty (the default) leaves the configuration's. A value
// the driver would refuse fails the render instead of a pod.
func TestChartDRAUnhealthyTaintEffect(t *testing.T) {
	for _, tt := range []struct {
		set  []string
		want string // the flag, "" for none
	}{
		{nil, ""},
		{[]string{"--set", "draDriver.unhealthyTaintEffect=NoExecute"}, "--unhealthy-taint-effect=NoExecute"},
		{[]string{"--set", "draDriver.unhealthyTaintEffect=NoSchedule"}, "--unhealthy-taint-effect=NoSchedule"},
	} {
		m := render(t, append([]string{"--set", "draDriver.enabled=true"}, tt.set...)...)
		c := mainContainer(t, m.daemonSets["dra-driver"])
		var got string
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--unhealthy-taint-effect") {
				got = a
			}
		}
		if got != tt.want {
			t.Errorf("%q: the driver's taint effect flag is %q, want %q", tt.set, got, tt.want)
		}
	}
	out, err := exec.Command(os.Getenv("HELM"), "template", "nri-vgpu", chartPath, "--kube-version", "1.30.0", "--set", "draDriver.enabled=true",
		"--set", "draDriver.unhealthyTaintEffect=PreferNoSchedule").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `draDriver.unhealthyTaintEffect must be NoSchedule or NoExecute, not "PreferNoSchedule"`) {
		t.Errorf("an unknown effect renders (err %v):\n%.300s", err, out)
	}
}

// draDriver.extendedResourceName names the extended resource the
// DeviceClass serves; empty (the default), the class serves none.
func TestChartDRAExtendedResourceName(t *testing.T) {
	m := render(t, "--set", "draDriver.enabled=true")
	if len(m.deviceClasses) != 1 || m.deviceClasses[0].Spec.ExtendedResourceName != nil {
		t.Errorf("by default the DeviceClass serves an extended resource: %+v", m.deviceClasses)
	}
	m = render(t, "--set", "draDriver.enabled=true", "--set", "draDriver.extendedResourceName=nvidia.com/gpu")
	if len(m.deviceClasses) != 1 || m.deviceClasses[0].Spec.ExtendedResourceName == nil || *m.deviceClasses[0].Spec.ExtendedResourceName != "nvidia.com/gpu" {
		t.Errorf("DeviceClass %+v, want extendedResourceName nvidia.com/gpu", m.deviceClasses)
	}
}
