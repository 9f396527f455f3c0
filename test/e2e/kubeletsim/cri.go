package kubeletsim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Label and annotation keys kubelet sets on CRI objects
// (pkg/kubelet/types/labels.go and pkg/kubelet/kuberuntime/labels.go).
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"

	AnnotationContainerHash                     = "io.kubernetes.container.hash"
	AnnotationContainerRestartCount             = "io.kubernetes.container.restartCount"
	AnnotationContainerTerminationMessagePath   = "io.kubernetes.container.terminationMessagePath"
	AnnotationContainerTerminationMessagePolicy = "io.kubernetes.container.terminationMessagePolicy"
	AnnotationPodTerminationGracePeriod         = "io.kubernetes.pod.terminationGracePeriod"
	AnnotationContainerType                     = "io.kubernetes.container.type"
)

// defaultGracePeriod is kubelet's default terminationGracePeriodSeconds.
const defaultGracePeriod = 30 * time.Second

func (p *Pod) namespace() string {
	if p.Namespace == "" {
		return "default"
	}
	return p.Namespace
}

func (p *Pod) gracePeriod() time.Duration {
	if p.TerminationGracePeriod <= 0 {
		return defaultGracePeriod
	}
	return p.TerminationGracePeriod
}

// namespaces is the pods' namespace setup: the node's network namespace, so
// that no CNI is needed; a PID namespace per container (or the node's, with
// hostPID) and an IPC namespace per pod, kubelet's defaults.
func (p *Pod) namespaces() *runtimeapi.NamespaceOption {
	pid := runtimeapi.NamespaceMode_CONTAINER
	if p.HostPID {
		pid = runtimeapi.NamespaceMode_NODE
	}
	return &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_NODE,
		Pid:     pid,
		Ipc:     runtimeapi.NamespaceMode_POD,
	}
}

// SandboxConfig is the PodSandboxConfig kubelet sends for pod (host network,
// so no hostname: the runtime rejects one with the node's network).
func (k *Kubelet) SandboxConfig(pod *Pod, attempt uint32) *runtimeapi.PodSandboxConfig {
	labels := map[string]string{}
	for key, v := range pod.Labels {
		labels[key] = v
	}
	labels[LabelPodName] = pod.Name
	labels[LabelPodNamespace] = pod.namespace()
	labels[LabelPodUID] = pod.UID
	annotations := map[string]string{}
	for key, v := range pod.Annotations {
		annotations[key] = v
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      pod.Name,
			Uid:       pod.UID,
			Namespace: pod.namespace(),
			Attempt:   attempt,
		},
		LogDirectory: filepath.Join(k.logDir, pod.namespace()+"_"+pod.Name+"_"+pod.UID),
		Labels:       labels,
		Annotations:  annotations,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: pod.namespaces()},
			CgroupParent:    pod.CgroupParent,
		},
	}
}

// ContainerConfig is the ContainerConfig kubelet sends for container c of
// pod, given what the device plugins returned for it (nil: nothing).
//
// Annotations are built as kubelet's newContainerAnnotations builds them:
// the device plugins' annotations, then kubelet's own keys, which win a
// conflict. c.ExtraAnnotations (tests only) go in before both. Environment:
// the plugins' Envs, then the container's own (the later one wins in the
// runtime). Mounts: the plugins', then the container's volumes. Devices and
// CDI devices from the plugins are passed on, then the container's Devices.
func (k *Kubelet) ContainerConfig(pod *Pod, c *Container, a *Allocation, restartCount int) (*runtimeapi.ContainerConfig, error) {
	annotations := map[string]string{}
	for key, v := range c.ExtraAnnotations {
		annotations[key] = v
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: uint32(restartCount)},
		Image:    &runtimeapi.ImageSpec{Image: c.Image, UserSpecifiedImage: c.Image},
		Command:  c.Command,
		Args:     c.Args,
		Labels: map[string]string{
			LabelPodName:       pod.Name,
			LabelPodNamespace:  pod.namespace(),
			LabelPodUID:        pod.UID,
			LabelContainerName: c.Name,
		},
		LogPath: filepath.Join(c.Name, strconv.Itoa(restartCount)+".log"),
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: pod.namespaces(), ReadonlyRootfs: c.ReadOnlyRootFilesystem},
		},
	}
	if c.RunAsUser != nil {
		cfg.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: *c.RunAsUser}
		cfg.Linux.SecurityContext.RunAsGroup = &runtimeapi.Int64Value{Value: *c.RunAsUser}
	}
	if c.SeccompRuntimeDefault {
		cfg.Linux.SecurityContext.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
	}
	if a != nil {
		fromPlugins, err := a.Annotations()
		if err != nil {
			return nil, err
		}
		for key, v := range fromPlugins {
			annotations[key] = v
		}
		for _, res := range sortedKeys(a.Responses) {
			resp := a.Responses[res]
			for _, key := range sortedKeys(resp.Envs) {
				cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: key, Value: []byte(resp.Envs[key])})
			}
			for _, m := range resp.Mounts {
				cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
			}
			for _, d := range resp.Devices {
				cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
			}
			for _, d := range resp.CdiDevices {
				cfg.CDIDevices = append(cfg.CDIDevices, &runtimeapi.CDIDevice{Name: d.Name})
			}
		}
	}
	for _, e := range c.Env {
		cfg.Envs = append(cfg.Envs, &runtimeapi.KeyValue{Key: e.Name, Value: []byte(e.Value)})
	}
	for _, m := range c.Mounts {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly})
	}
	for _, d := range c.Devices {
		cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	annotations[AnnotationContainerHash] = containerHash(c)
	annotations[AnnotationContainerRestartCount] = strconv.Itoa(restartCount)
	annotations[AnnotationContainerTerminationMessagePath] = "/dev/termination-log"
	annotations[AnnotationContainerTerminationMessagePolicy] = "File"
	annotations[AnnotationPodTerminationGracePeriod] = strconv.FormatInt(int64(pod.gracePeriod()/time.Second), 10)
	annotations[AnnotationContainerType] = "container"
	cfg.Annotations = annotations
	return cfg, nil
}

// containerHash stands in for kubelet's hash of the container spec: a stable
// hex value that changes with the spec.
func containerHash(c *Container) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%q\x00%q\x00%v\x00%v", c.Name, c.Image, c.Command, c.Args, c.Env, c.Limits)
	return strconv.FormatUint(h.Sum64(), 16)
}

// RunningPod is a pod that RunPod started (or started in part).
type RunningPod struct {
	Pod           *Pod
	SandboxID     string
	SandboxConfig *runtimeapi.PodSandboxConfig
	// Containers by name; a container whose creation failed is absent.
	Containers map[string]*RunningContainer
}

// RunningContainer is one container of a RunningPod.
type RunningContainer struct {
	ID         string
	Config     *runtimeapi.ContainerConfig
	Allocation *Allocation
}

// ContainerID returns the ID of the named container, "" if it is not running.
func (rp *RunningPod) ContainerID(name string) string {
	if c := rp.Containers[name]; c != nil {
		return c.ID
	}
	return ""
}

// RunPod does what kubelet does to start a pod on the node: admission
// (device allocation for every container), RunPodSandbox, then for each
// container CreateContainer, PreStartContainer where a plugin asked for it,
// and StartContainer. On an error it returns the pod as far as it got, so
// that the caller can inspect and remove it with KillPod; devices stay
// allocated until then, as they do in kubelet until the pod is terminated.
func (k *Kubelet) RunPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, pod *Pod) (*RunningPod, error) {
	allocs, err := k.Allocate(ctx, pod)
	if err != nil {
		return nil, err
	}
	rp := &RunningPod{Pod: pod, SandboxConfig: k.SandboxConfig(pod, 0), Containers: map[string]*RunningContainer{}}
	sb, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: rp.SandboxConfig})
	if err != nil {
		return rp, fmt.Errorf("kubeletsim: RunPodSandbox for pod %s: %w", pod.Name, err)
	}
	rp.SandboxID = sb.PodSandboxId
	for i := range pod.Containers {
		c := &pod.Containers[i]
		a := allocs[c.Name]
		cfg, err := k.ContainerConfig(pod, c, a, 0)
		if err != nil {
			return rp, fmt.Errorf("kubeletsim: pod %s container %s: %w", pod.Name, c.Name, err)
		}
		created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			PodSandboxId:  rp.SandboxID,
			Config:        cfg,
			SandboxConfig: rp.SandboxConfig,
		})
		if err != nil {
			return rp, fmt.Errorf("kubeletsim: CreateContainer %s of pod %s: %w", c.Name, pod.Name, err)
		}
		rp.Containers[c.Name] = &RunningContainer{ID: created.ContainerId, Config: cfg, Allocation: a}
		if err := k.preStart(ctx, a); err != nil {
			return rp, fmt.Errorf("kubeletsim: pod %s container %s: %w", pod.Name, c.Name, err)
		}
		if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
			return rp, fmt.Errorf("kubeletsim: StartContainer %s of pod %s: %w", c.Name, pod.Name, err)
		}
	}
	return rp, nil
}

// KillPod does what kubelet and its garbage collector do for a deleted pod:
// stop every container (SIGTERM, SIGKILL after the grace period), stop the
// sandbox, remove the containers and the sandbox, and free the pod's
// devices. It goes on past errors and returns them all; rp may be one that
// RunPod returned with an error.
func (k *Kubelet) KillPod(ctx context.Context, rt runtimeapi.RuntimeServiceClient, rp *RunningPod) error {
	if rp == nil {
		return nil
	}
	var errs []error
	grace := int64(rp.Pod.gracePeriod() / time.Second)
	for _, name := range sortedKeys(rp.Containers) {
		id := rp.Containers[name].ID
		if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: grace}); err != nil {
			errs = append(errs, fmt.Errorf("StopContainer %s: %w", name, err))
		}
	}
	if rp.SandboxID != "" {
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: rp.SandboxID}); err != nil {
			errs = append(errs, fmt.Errorf("StopPodSandbox: %w", err))
		}
	}
	for _, name := range sortedKeys(rp.Containers) {
		if _, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: rp.Containers[name].ID}); err != nil {
			errs = append(errs, fmt.Errorf("RemoveContainer %s: %w", name, err))
		}
	}
	if rp.SandboxID != "" {
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: rp.SandboxID}); err != nil {
			errs = append(errs, fmt.Errorf("RemovePodSandbox: %w", err))
		}
	}
	k.Release(rp.Pod.UID)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubeletsim: removing pod %s: %w", rp.Pod.Name, err)
	}
	return nil
}

// NewUID returns a random pod UID in the shape the API server gives (a
// version 4 UUID). Each pod needs its own: the NRI plugin binds allocations
// to pod UIDs.
func NewUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("kubeletsim: reading random bytes: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	s := hex.EncodeToString(b[:])
	return strings.Join([]string{s[0:8], s[8:12], s[12:16], s[16:20], s[20:32]}, "-")
}
