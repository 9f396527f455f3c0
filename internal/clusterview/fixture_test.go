package clusterview

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// The cluster the tests list: what a cluster with the chart installed
// holds, written out by hand.

func gpuNode(name string, slices int64, labels map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if slices > 0 {
		q := *resource.NewQuantity(slices, resource.DecimalSI)
		n.Status.Capacity = corev1.ResourceList{"nvidia.com/gpu": q, corev1.ResourceCPU: resource.MustParse("8")}
		n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": q, corev1.ResourceCPU: resource.MustParse("8")}
	}
	return n
}

// pluginPod is the chart's NRI plugin pod on node, serving metrics on port
// (0: metrics.enabled off, no such port).
func pluginPod(name, node string, phase corev1.PodPhase, port int32) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, Labels: map[string]string{
			"app.kubernetes.io/name": "nri-vgpu", "app.kubernetes.io/instance": "nri-vgpu", "app.kubernetes.io/component": "nri-plugin"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "nri-plugin",
			Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: 9454}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
	if port != 0 {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "metrics", ContainerPort: port})
	}
	return p
}

// gpuPod is a pod whose one container (ctr) asks for slices.
func gpuPod(ns, name, node, ctr string, slices int64, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: ctr, Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(slices, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func draSlice(node, device, uuid, model string, index int64) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.nri-vgpu.io-x7k2p"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.nri-vgpu.io", NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: device, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid": {StringValue: ptr.To(uuid)}, "model": {StringValue: ptr.To(model)}, "index": {IntValue: ptr.To(index)}, "minor": {IntValue: ptr.To(index)},
			}}},
		},
	}
}

// draClaim is claim ns/name allocated on device of pool node, consuming
// memory and cores, reserved for pod.
func draClaim(ns, name, uid, node, device, memory, cores, pod string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "11111111-2222-3333-4444-555555555555"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: "gpu.nri-vgpu.io", Pool: node, Device: device,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory), "cores": resource.MustParse(cores)},
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: "pod-uid"}},
		},
	}
}

// claimPod is a pod on node whose container ctr uses claim (as "gpu").
func claimPod(ns, name, node, ctr, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{NodeName: node,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
			Containers:     []corev1.Container{{Name: ctr, Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// gpuAMetrics is what node gpu-a's NRI plugin serves: two GPUs, a
// container with every series of the metric contract, and one whose region
// is suspect, of a release that still wrote cores_limit_percent.
const gpuAMetrics = `# HELP nri_vgpu_gpu_memory_total_bytes Total memory of the GPU, from the GPU inventory.
# TYPE nri_vgpu_gpu_memory_total_bytes gauge
nri_vgpu_gpu_memory_total_bytes{UUID="GPU-0000-a",gpu="0",name="NVIDIA A100-SXM4-40GB"} 4.294967296e+10
nri_vgpu_gpu_memory_total_bytes{UUID="GPU-1111-a",gpu="1",name="NVIDIA A100-SXM4-40GB"} 4.294967296e+10
# TYPE nri_vgpu_gpu_memory_allocated_bytes gauge
nri_vgpu_gpu_memory_allocated_bytes{UUID="GPU-0000-a",gpu="0",name="NVIDIA A100-SXM4-40GB"} 1.2884901888e+10
nri_vgpu_gpu_memory_allocated_bytes{UUID="GPU-1111-a",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
# TYPE nri_vgpu_gpu_memory_used_bytes gauge
nri_vgpu_gpu_memory_used_bytes{UUID="GPU-0000-a",gpu="0",name="NVIDIA A100-SXM4-40GB"} 3.221225472e+09
nri_vgpu_gpu_memory_used_bytes{UUID="GPU-1111-a",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
# TYPE nri_vgpu_gpu_sm_allocated_ratio gauge
nri_vgpu_gpu_sm_allocated_ratio{UUID="GPU-0000-a",gpu="0",name="NVIDIA A100-SXM4-40GB"} 0.3
nri_vgpu_gpu_sm_allocated_ratio{UUID="GPU-1111-a",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
# TYPE nri_vgpu_gpu_sm_utilization_ratio gauge
nri_vgpu_gpu_sm_utilization_ratio{UUID="GPU-0000-a",gpu="0",name="NVIDIA A100-SXM4-40GB"} 0.25
nri_vgpu_gpu_sm_utilization_ratio{UUID="GPU-1111-a",gpu="1",name="NVIDIA A100-SXM4-40GB"} 0
# TYPE nri_vgpu_container_memory_limit_bytes gauge
nri_vgpu_container_memory_limit_bytes{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 8.589934592e+09
nri_vgpu_container_memory_limit_bytes{UUID="GPU-0000-a",claim="",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 4.294967296e+09
# TYPE nri_vgpu_container_memory_used_bytes gauge
nri_vgpu_container_memory_used_bytes{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 2.147483648e+09
# TYPE nri_vgpu_container_memory_peak_bytes gauge
nri_vgpu_container_memory_peak_bytes{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 2.68435456e+09
# TYPE nri_vgpu_container_sm_limit_ratio gauge
nri_vgpu_container_sm_limit_ratio{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 0.2
# TYPE nri_vgpu_container_cores_limit_percent gauge
nri_vgpu_container_cores_limit_percent{UUID="GPU-0000-a",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 10
# TYPE nri_vgpu_container_sm_utilization_ratio gauge
nri_vgpu_container_sm_utilization_ratio{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 0.2
nri_vgpu_container_sm_utilization_ratio{UUID="GPU-0000-a",claim="",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 0.05
# TYPE nri_vgpu_container_sm_share_utilization_ratio gauge
nri_vgpu_container_sm_share_utilization_ratio{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 1
nri_vgpu_container_sm_share_utilization_ratio{UUID="GPU-0000-a",claim="",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 0.5
# TYPE nri_vgpu_container_sm_throttled_seconds_total counter
nri_vgpu_container_sm_throttled_seconds_total{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 12.5
# TYPE nri_vgpu_container_kernel_launches_total counter
nri_vgpu_container_kernel_launches_total{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 1234
# TYPE nri_vgpu_container_region_suspect gauge
nri_vgpu_container_region_suspect{UUID="GPU-0000-a",claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 0
nri_vgpu_container_region_suspect{UUID="GPU-0000-a",claim="",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 1
# TYPE nri_vgpu_container_processes gauge
nri_vgpu_container_processes{claim="",container="main",container_id="0123456789abcdef0123",namespace="default",pod="cuda-a"} 2
nri_vgpu_container_processes{claim="",container="worker",container_id="fedcba9876543210",namespace="ml",pod="train"} 1
# TYPE nri_vgpu_build_info gauge
nri_vgpu_build_info{version="v1.0.0"} 1
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 12
`

// draAMetrics is what node dra-a's NRI plugin serves: one GPU and the
// record of claim default/big, in the metric contract's form.
const draAMetrics = `# TYPE nri_vgpu_gpu_memory_total_bytes gauge
nri_vgpu_gpu_memory_total_bytes{UUID="GPU-2222-b",gpu="0",name="NVIDIA H100 80GB HBM3"} 8.589934592e+10
# TYPE nri_vgpu_gpu_memory_allocated_bytes gauge
nri_vgpu_gpu_memory_allocated_bytes{UUID="GPU-2222-b",gpu="0",name="NVIDIA H100 80GB HBM3"} 2.147483648e+10
# TYPE nri_vgpu_gpu_memory_used_bytes gauge
nri_vgpu_gpu_memory_used_bytes{UUID="GPU-2222-b",gpu="0",name="NVIDIA H100 80GB HBM3"} 5.36870912e+09
# TYPE nri_vgpu_gpu_sm_allocated_ratio gauge
nri_vgpu_gpu_sm_allocated_ratio{UUID="GPU-2222-b",gpu="0",name="NVIDIA H100 80GB HBM3"} 0.5
# TYPE nri_vgpu_gpu_sm_utilization_ratio gauge
nri_vgpu_gpu_sm_utilization_ratio{UUID="GPU-2222-b",gpu="0",name="NVIDIA H100 80GB HBM3"} 0.4
# TYPE nri_vgpu_container_memory_limit_bytes gauge
nri_vgpu_container_memory_limit_bytes{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 2.147483648e+10
# TYPE nri_vgpu_container_memory_used_bytes gauge
nri_vgpu_container_memory_used_bytes{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 5.36870912e+09
# TYPE nri_vgpu_container_memory_peak_bytes gauge
nri_vgpu_container_memory_peak_bytes{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 6.442450944e+09
# TYPE nri_vgpu_container_sm_limit_ratio gauge
nri_vgpu_container_sm_limit_ratio{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 0.5
# TYPE nri_vgpu_container_sm_utilization_ratio gauge
nri_vgpu_container_sm_utilization_ratio{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 0.4
# TYPE nri_vgpu_container_sm_share_utilization_ratio gauge
nri_vgpu_container_sm_share_utilization_ratio{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 0.8
# TYPE nri_vgpu_container_sm_throttled_seconds_total counter
nri_vgpu_container_sm_throttled_seconds_total{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 0
# TYPE nri_vgpu_container_kernel_launches_total counter
nri_vgpu_container_kernel_launches_total{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 10
# TYPE nri_vgpu_container_region_suspect gauge
nri_vgpu_container_region_suspect{UUID="GPU-2222-b",claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 0
# TYPE nri_vgpu_container_processes gauge
nri_vgpu_container_processes{claim="big",container="",container_id="claim-11111111-2222-3333-4444-555555555555",namespace="default",pod=""} 1
# TYPE nri_vgpu_claim_pod_info gauge
nri_vgpu_claim_pod_info{claim="big",namespace="default",pod="dra-pod"} 1
`

// cluster is the whole fixture: node gpu-a (device plugin, metrics read),
// gpu-b (device plugin, no NRI plugin pod), dra-a (DRA driver, metrics
// read) and cpu-1 (no GPU, not listed).
func cluster() []runtime.Object {
	return []runtime.Object{
		gpuNode("gpu-a", 20, map[string]string{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "kubernetes.io/hostname": "gpu-a"}),
		gpuNode("gpu-b", 10, nil),
		gpuNode("dra-a", 0, nil),
		gpuNode("cpu-1", 0, nil),
		pluginPod("nri-vgpu-nri-plugin-aaaaa", "gpu-a", corev1.PodRunning, 9455),
		pluginPod("nri-vgpu-nri-plugin-ccccc", "dra-a", corev1.PodRunning, 9455),
		gpuPod("default", "cuda-a", "gpu-a", "main", 2, corev1.PodRunning),
		gpuPod("ml", "train", "gpu-a", "worker", 1, corev1.PodRunning),
		gpuPod("default", "waiting", "gpu-a", "main", 1, corev1.PodPending),
		gpuPod("default", "done", "gpu-a", "main", 3, corev1.PodSucceeded),
		gpuPod("default", "stuck", "gpu-b", "main", 1, corev1.PodRunning),
		draSlice("dra-a", "gpu-2222-b", "GPU-2222-b", "NVIDIA H100 80GB HBM3", 0),
		draClaim("default", "big", "", "dra-a", "gpu-2222-b", "20Gi", "50", "dra-pod"),
		claimPod("default", "dra-pod", "dra-a", "app", "big"),
	}
}

// proxied is what a pod proxy GET answers.
type proxied struct {
	body []byte
	err  error
}

func (p proxied) DoRaw(context.Context) ([]byte, error) { return p.body, p.err }
func (p proxied) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(p.body))), p.err
}

// fakeClient is the fixture's API server; the pod proxy answers
// GET <namespace>/<pod>:<port>/metrics from metrics, keyed
// "namespace/pod:port", and 503 for any other.
func fakeClient(t *testing.T, objects []runtime.Object, metrics map[string]proxied) *fake.Clientset {
	t.Helper()
	client := fake.NewClientset(objects...)
	client.PrependProxyReactor("pods", func(action k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
		a := action.(k8stesting.ProxyGetAction)
		if a.GetPath() != "metrics" || a.GetScheme() != "" {
			return true, proxied{err: errors.New("unexpected proxy request " + a.GetScheme() + " " + a.GetPath())}, nil
		}
		if r, ok := metrics[a.GetNamespace()+"/"+a.GetName()+":"+a.GetPort()]; ok {
			return true, r, nil
		}
		return true, proxied{err: errors.New("the server is currently unable to handle the request")}, nil
	})
	return client
}
