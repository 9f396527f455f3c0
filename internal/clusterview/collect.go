package clusterview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"

	"github.com/nri-vgpu/nri-vgpu/pkg/draclaim"
)

// Defaults of Options: the chart's and the configuration's.
const (
	DefaultResource       = "nvidia.com/gpu"  // device_plugin.resource_name
	DefaultDRADriver      = "gpu.nri-vgpu.io" // dra.driver_name
	DefaultPluginSelector = "app.kubernetes.io/name=nri-vgpu,app.kubernetes.io/component=nri-plugin"
	// MetricsPortName is the name of the NRI plugin container's metrics
	// port in the chart (metrics.enabled).
	MetricsPortName = "metrics"
)

// Options say what Collect lists.
type Options struct {
	// Namespace limits the pods, containers and claims to one namespace;
	// empty: every namespace. Nodes and GPUs are listed whole.
	Namespace string
	// Nodes limits the view to these nodes; empty: every node that offers
	// vGPUs.
	Nodes []string
	// Resource is the device plugin's extended resource (slices).
	Resource string
	// DRADriver is the DRA driver's name, as in its ResourceSlices.
	DRADriver string
	// PluginSelector selects the NRI plugin pods, in every namespace.
	PluginSelector string
	// ScrapeTimeout bounds the read of one node's metrics.
	ScrapeTimeout time.Duration
}

// maxScrapes is how many nodes' metrics are read at once.
const maxScrapes = 8

// Collect reads the cluster's vGPU state. Failing to list nodes or pods is
// an error; failing to list the DRA objects (an API server without
// resource.k8s.io/v1, no permission) is a warning, and a node whose metrics
// cannot be read carries its Error: the rest is shown all the same.
func Collect(ctx context.Context, client kubernetes.Interface, opts Options) (*View, []string, error) {
	opts.Resource = cmp.Or(opts.Resource, DefaultResource)
	opts.DRADriver = cmp.Or(opts.DRADriver, DefaultDRADriver)
	opts.PluginSelector = cmp.Or(opts.PluginSelector, DefaultPluginSelector)
	opts.ScrapeTimeout = cmp.Or(opts.ScrapeTimeout, 10*time.Second)
	var warnings []string

	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(opts.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing pods%s: %w", inNamespace(opts.Namespace), err)
	}
	plugins, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: opts.PluginSelector})
	if err != nil {
		// The view still has what the API server knows; every node then
		// says why it has no metrics.
		warnings = append(warnings, fmt.Sprintf("listing the NRI plugin pods (%s) in every namespace: %v", opts.PluginSelector, err))
		plugins = &corev1.PodList{}
	}
	var rslices []resourceapi.ResourceSlice
	if l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err == nil {
		rslices = l.Items
	} else if !apierrors.IsNotFound(err) {
		warnings = append(warnings, fmt.Sprintf("listing ResourceSlices: %v", err))
	}
	var claims []resourceapi.ResourceClaim
	if l, err := client.ResourceV1().ResourceClaims(opts.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		claims = l.Items
	} else if !apierrors.IsNotFound(err) {
		warnings = append(warnings, fmt.Sprintf("listing ResourceClaims%s: %v", inNamespace(opts.Namespace), err))
	}

	c := &collector{opts: opts, pods: map[string]*corev1.Pod{}, podsOn: map[string][]*corev1.Pod{},
		devices: map[string]sliceDevice{}, plugin: map[string]*corev1.Pod{}}
	for i := range pods.Items {
		p := &pods.Items[i]
		c.pods[p.Namespace+"/"+p.Name] = p
		if p.Spec.NodeName != "" {
			c.podsOn[p.Spec.NodeName] = append(c.podsOn[p.Spec.NodeName], p)
		}
	}
	for i := range plugins.Items {
		c.addPlugin(&plugins.Items[i])
	}
	dra := map[string]bool{}
	for _, s := range rslices {
		if s.Spec.Driver != opts.DRADriver || s.Spec.NodeName == nil {
			continue
		}
		node := *s.Spec.NodeName
		dra[node] = true
		for _, d := range s.Spec.Devices {
			c.devices[s.Spec.Pool.Name+"/"+d.Name] = sliceDevice{node: node, device: d}
		}
	}

	var selected []*corev1.Node
	found := map[string]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		found[n.Name] = true
		if len(opts.Nodes) > 0 {
			if slices.Contains(opts.Nodes, n.Name) {
				selected = append(selected, n)
			}
			continue
		}
		q := n.Status.Capacity[corev1.ResourceName(opts.Resource)]
		if !q.IsZero() || dra[n.Name] || c.plugin[n.Name] != nil {
			selected = append(selected, n)
		}
	}
	for _, name := range opts.Nodes {
		if !found[name] {
			return nil, warnings, fmt.Errorf("node %q: not found", name)
		}
	}

	view := &View{Version: SchemaVersion, Nodes: make([]Node, len(selected))}
	metrics := make([]*nodeMetrics, len(selected))
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxScrapes)
	for i, n := range selected {
		view.Nodes[i] = c.node(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			m, from, err := c.scrape(ctx, client, n.Name)
			view.Nodes[i].MetricsPod = from
			if err != nil {
				view.Nodes[i].Error = err.Error()
				return
			}
			metrics[i] = m
		}()
	}
	wg.Wait()
	for i := range view.Nodes {
		c.fill(&view.Nodes[i], metrics[i], claims)
	}
	slices.SortFunc(view.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	return view, warnings, nil
}

func inNamespace(ns string) string {
	if ns == "" {
		return " in every namespace"
	}
	return " in namespace " + ns
}

type collector struct {
	opts    Options
	pods    map[string]*corev1.Pod   // "namespace/name"
	podsOn  map[string][]*corev1.Pod // by node
	devices map[string]sliceDevice   // "pool/device" of the DRA driver
	plugin  map[string]*corev1.Pod   // the NRI plugin pod of each node
}

type sliceDevice struct {
	node   string
	device resourceapi.Device
}

// addPlugin records p as its node's NRI plugin pod, preferring a running
// pod to one that is not (a DaemonSet's rollout may show both).
func (c *collector) addPlugin(p *corev1.Pod) {
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil && c.plugin[p.Spec.NodeName] != nil {
		return
	}
	if old := c.plugin[p.Spec.NodeName]; old != nil && old.DeletionTimestamp == nil && (old.Status.Phase == corev1.PodRunning || p.Status.Phase != corev1.PodRunning) {
		return
	}
	c.plugin[p.Spec.NodeName] = p
}

// scrape reads a node's metrics from its NRI plugin pod through the API
// server's pod proxy, and returns "namespace/pod:port" of what it read.
func (c *collector) scrape(ctx context.Context, client kubernetes.Interface, node string) (*nodeMetrics, string, error) {
	p := c.plugin[node]
	if p == nil {
		return nil, "", fmt.Errorf("no NRI plugin pod (label selector %s) on the node", c.opts.PluginSelector)
	}
	name := p.Namespace + "/" + p.Name
	if p.Status.Phase != corev1.PodRunning {
		return nil, "", fmt.Errorf("NRI plugin pod %s is %s, not Running", name, cmp.Or(string(p.Status.Phase), "without a phase"))
	}
	port := metricsPort(p)
	if port == 0 {
		return nil, "", fmt.Errorf("NRI plugin pod %s has no container port named %q (the chart serves metrics with metrics.enabled=true)", name, MetricsPortName)
	}
	from := name + ":" + strconv.Itoa(int(port))
	ctx, cancel := context.WithTimeout(ctx, c.opts.ScrapeTimeout)
	defer cancel()
	raw, err := proxyGet(ctx, client.CoreV1().Pods(p.Namespace).ProxyGet("", p.Name, strconv.Itoa(int(port)), "metrics", nil))
	if err != nil {
		return nil, from, fmt.Errorf("reading the metrics of NRI plugin pod %s through the API server's pod proxy: %w", from, trimProxyError(err))
	}
	m, err := parseMetrics(raw)
	if err != nil {
		return nil, from, fmt.Errorf("metrics of NRI plugin pod %s: %w", from, err)
	}
	return m, from, nil
}

// proxyGet does the pod proxy request. DoRaw's error of a refused request
// says only that the server cannot handle it; the Status the API server
// answered says why (the pod refused the connection, say), so a real
// client's request is done with Do, whose Result decodes it.
func proxyGet(ctx context.Context, w restclient.ResponseWrapper) ([]byte, error) {
	req, ok := w.(*restclient.Request)
	if !ok {
		return w.DoRaw(ctx)
	}
	res := req.Do(ctx)
	raw, err := res.Raw()
	if err != nil {
		return nil, res.Error()
	}
	return raw, nil
}

// trimProxyError shortens a proxy error whose body is a whole HTML or
// Status page to its message.
func trimProxyError(err error) error {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if msg := strings.TrimSpace(st.Status().Message); msg != "" && len(msg) < 500 {
			return errors.New(msg)
		}
	}
	return err
}

func metricsPort(p *corev1.Pod) int32 {
	for _, ctr := range p.Spec.Containers {
		for _, port := range ctr.Ports {
			if port.Name == MetricsPortName {
				return port.ContainerPort
			}
		}
	}
	return 0
}

// labelPrefixes are the node labels the view keeps: GPU feature discovery's
// and nri-vgpu's own (node feature discovery's local features).
var labelPrefixes = []string{"nvidia.com/", "nri-vgpu"}

// node is what the API server knows of n itself.
func (c *collector) node(n *corev1.Node) Node {
	out := Node{Name: n.Name, GPUs: []GPU{}}
	for k, v := range n.Labels {
		for _, p := range labelPrefixes {
			if strings.HasPrefix(k, p) || strings.Contains(k, "/"+p) {
				if out.Labels == nil {
					out.Labels = map[string]string{}
				}
				out.Labels[k] = v
			}
		}
	}
	rn := corev1.ResourceName(c.opts.Resource)
	if capacity, ok := n.Status.Capacity[rn]; ok {
		alloc := n.Status.Allocatable[rn]
		r := Resource{Name: c.opts.Resource, Capacity: capacity.Value(), Allocatable: alloc.Value()}
		for _, p := range c.podsOn[n.Name] {
			if !finished(p) {
				r.Requested += podRequest(p, rn)
			}
		}
		out.Resources = append(out.Resources, r)
	}
	return out
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// podRequest is what the pod holds of resource rn: as the scheduler counts
// it, the larger of its containers' sum and its largest init container.
func podRequest(p *corev1.Pod, rn corev1.ResourceName) int64 {
	var sum, initMax int64
	for _, ctr := range p.Spec.Containers {
		sum += containerRequest(ctr, rn)
	}
	for _, ctr := range p.Spec.InitContainers {
		initMax = max(initMax, containerRequest(ctr, rn))
	}
	return max(sum, initMax)
}

// containerRequest is the container's request of rn (an extended
// resource's request, when only its limit is written, is its limit).
func containerRequest(ctr corev1.Container, rn corev1.ResourceName) int64 {
	if q, ok := ctr.Resources.Requests[rn]; ok {
		return q.Value()
	}
	if q, ok := ctr.Resources.Limits[rn]; ok {
		return q.Value()
	}
	return 0
}

// fill adds the node's GPUs, containers and claims, from its metrics (nil
// when they could not be read), the DRA driver's devices and the claims.
func (c *collector) fill(n *Node, m *nodeMetrics, claims []resourceapi.ResourceClaim) {
	gpus := map[string]*GPU{}
	gpuOf := func(uuid string) *GPU {
		g := gpus[uuid]
		if g == nil {
			g = &GPU{UUID: uuid, Containers: []Container{}, Claims: []Claim{}}
			gpus[uuid] = g
		}
		return g
	}
	byDevice := map[string]string{} // DRA device name -> UUID
	for _, sd := range c.devices {
		if sd.node != n.Name {
			continue
		}
		uuid := stringAttr(sd.device, "uuid")
		if uuid == "" {
			continue
		}
		g := gpuOf(uuid)
		g.DRADevice = sd.device.Name
		g.Model = stringAttr(sd.device, "model")
		if a, ok := sd.device.Attributes["index"]; ok && a.IntValue != nil {
			i := int(*a.IntValue)
			g.Index = &i
		}
		byDevice[sd.device.Name] = uuid
	}
	if m != nil {
		for uuid, s := range m.gpus {
			g := gpuOf(uuid)
			if i, err := strconv.Atoi(s.index); err == nil {
				g.Index = &i
			}
			g.Model = cmp.Or(s.name, g.Model)
			g.MemoryTotalBytes, g.MemoryAllocatedBytes, g.MemoryUsedBytes = s.total, s.allocated, s.used
			g.SMAllocatedRatio, g.SMUtilizationRatio = s.smAllocated, s.smUtilization
			if name, err := draclaim.DeviceName(uuid); err == nil && byDevice[name] == "" {
				byDevice[name] = uuid
			}
		}
	}

	// Device-plugin containers, from the metrics.
	placed := map[string]bool{} // "namespace/pod/container"
	claimRecords := map[recordKey]*recordSeries{}
	if m != nil {
		for k, r := range m.records {
			if r.isClaim(k.containerID) {
				claimRecords[k] = r
				continue
			}
			if c.opts.Namespace != "" && r.namespace != c.opts.Namespace {
				continue
			}
			ctr := Container{Namespace: r.namespace, Pod: r.pod, Container: r.container, ContainerID: k.containerID, Usage: r.usage}
			if n, ok := m.processes[k.containerID]; ok {
				ctr.Processes = &n
			}
			if p := c.pods[r.namespace+"/"+r.pod]; p != nil {
				ctr.Phase = string(p.Status.Phase)
				ctr.Slices = slicesOf(p, r.container, corev1.ResourceName(c.opts.Resource))
			}
			placed[r.namespace+"/"+r.pod+"/"+r.container] = true
			g := gpuOf(k.uuid)
			g.Containers = append(g.Containers, ctr)
		}
	}
	rn := corev1.ResourceName(c.opts.Resource)
	for _, p := range c.podsOn[n.Name] {
		if finished(p) {
			continue
		}
		for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if containerRequest(ctr, rn) == 0 || placed[p.Namespace+"/"+p.Name+"/"+ctr.Name] {
				continue
			}
			n.Unplaced = append(n.Unplaced, Container{Namespace: p.Namespace, Pod: p.Name, Container: ctr.Name,
				Phase: string(p.Status.Phase), Slices: containerRequest(ctr, rn)})
		}
	}

	// Claims: what the API server allocated on this node's GPUs, with the
	// usage of their records; then records of claims it did not list.
	seen := map[recordKey]bool{}
	for i := range claims {
		cl := &claims[i]
		for uuid, share := range c.claimShares(cl, n.Name, byDevice) {
			out := Claim{Namespace: cl.Namespace, Name: cl.Name, UID: string(cl.UID), RecordID: claimRecordPrefix + string(cl.UID),
				AllocatedMemoryBytes: share.memory, AllocatedSMRatio: share.sm, Pods: c.claimPods(cl)}
			k := recordKey{out.RecordID, uuid}
			if r := claimRecords[k]; r != nil {
				out.Usage = r.usage
				seen[k] = true
			}
			if n, ok := m.processCount(out.RecordID); ok {
				out.Processes = &n
			}
			g := gpuOf(uuid)
			if g.DRADevice == "" {
				g.DRADevice = share.device
			}
			g.Claims = append(g.Claims, out)
		}
	}
	for k, r := range claimRecords {
		if seen[k] || c.opts.Namespace != "" && r.namespace != c.opts.Namespace {
			continue
		}
		out := Claim{Namespace: r.namespace, Name: r.claimName(), UID: strings.TrimPrefix(k.containerID, claimRecordPrefix),
			RecordID: k.containerID, Usage: r.usage, Pods: []ClaimPod{}}
		if n, ok := m.processes[k.containerID]; ok {
			out.Processes = &n
		}
		pods := m.claimPods[r.namespace+"/"+out.Name]
		if len(pods) == 0 && r.pod != "" {
			pods = strings.Split(r.pod, ",") // before nri_vgpu_claim_pod_info
		}
		for _, name := range pods {
			out.Pods = append(out.Pods, c.claimPod(r.namespace, name, out.Name))
		}
		g := gpuOf(k.uuid)
		g.Claims = append(g.Claims, out)
	}

	for _, uuid := range slices.Sorted(maps.Keys(gpus)) {
		g := gpus[uuid]
		slices.SortFunc(g.Containers, func(a, b Container) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container), cmp.Compare(a.ContainerID, b.ContainerID))
		})
		slices.SortFunc(g.Claims, func(a, b Claim) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
		})
		n.GPUs = append(n.GPUs, *g)
	}
	// By index; GPUs without one (not in the node's inventory) last.
	slices.SortStableFunc(n.GPUs, func(a, b GPU) int {
		switch {
		case a.Index != nil && b.Index != nil:
			return cmp.Compare(*a.Index, *b.Index)
		case a.Index != nil:
			return -1
		case b.Index != nil:
			return 1
		}
		return 0
	})
	slices.SortFunc(n.Unplaced, func(a, b Container) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container))
	})
}

func (m *nodeMetrics) processCount(id string) (uint64, bool) {
	if m == nil {
		return 0, false
	}
	n, ok := m.processes[id]
	return n, ok
}

func stringAttr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// slicesOf is the request of container name of pod p.
func slicesOf(p *corev1.Pod, name string, rn corev1.ResourceName) int64 {
	for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		if ctr.Name == name {
			return containerRequest(ctr, rn)
		}
	}
	return 0
}

type claimShare struct {
	device string
	memory *uint64
	sm     *float64
}

// claimShares is what claim cl was allocated on each GPU of node (by UUID),
// from its allocation results of the DRA driver: the consumed capacities,
// added up per GPU (Contract 8). A result without consumed capacity has the
// GPU whole, which the view leaves as unknown amounts.
func (c *collector) claimShares(cl *resourceapi.ResourceClaim, node string, byDevice map[string]string) map[string]claimShare {
	if cl.Status.Allocation == nil {
		return nil
	}
	out := map[string]claimShare{}
	for _, r := range cl.Status.Allocation.Devices.Results {
		if r.Driver != c.opts.DRADriver {
			continue
		}
		// The driver's pool is its node (Contract 8); its ResourceSlice
		// says so when it still publishes the device.
		onNode := r.Pool
		if sd, ok := c.devices[r.Pool+"/"+r.Device]; ok {
			onNode = sd.node
		}
		if onNode != node {
			continue
		}
		uuid := byDevice[r.Device]
		if uuid == "" {
			uuid = r.Device // neither published nor in the metrics
		}
		s := out[uuid]
		s.device = r.Device
		if q, ok := r.ConsumedCapacity["memory"]; ok && q.Sign() > 0 {
			v := uint64(q.Value()) + deref(s.memory)
			s.memory = &v
		}
		if q, ok := r.ConsumedCapacity["cores"]; ok && q.Sign() > 0 {
			v := min(float64(q.Value())/100+derefF(s.sm), 1)
			s.sm = &v
		}
		out[uuid] = s
	}
	return out
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

func derefF(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// claimPods are the pods claim cl is reserved for.
func (c *collector) claimPods(cl *resourceapi.ResourceClaim) []ClaimPod {
	out := []ClaimPod{}
	for _, ref := range cl.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			out = append(out, c.claimPod(cl.Namespace, ref.Name, cl.Name))
		}
	}
	slices.SortFunc(out, func(a, b ClaimPod) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// claimPod is pod namespace/name with its containers that use claim.
func (c *collector) claimPod(namespace, name, claim string) ClaimPod {
	out := ClaimPod{Namespace: namespace, Name: name}
	p := c.pods[namespace+"/"+name]
	if p == nil {
		return out
	}
	out.Phase = string(p.Status.Phase)
	// The pod's names for the claim: a claim named in the spec, or one
	// made from a template (named in the status).
	refs := map[string]bool{}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil && *rc.ResourceClaimName == claim {
			refs[rc.Name] = true
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil && *st.ResourceClaimName == claim {
			refs[st.Name] = true
		}
	}
	for _, ctr := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		for _, rc := range ctr.Resources.Claims {
			if refs[rc.Name] && !slices.Contains(out.Containers, ctr.Name) {
				out.Containers = append(out.Containers, ctr.Name)
			}
		}
	}
	return out
}
