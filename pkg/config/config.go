// Package config holds the one TOML configuration file that every nri-vgpu
// binary reads (/etc/nri-vgpu/config.toml). Every key has a default, so an
// empty file is a valid configuration.
package config

import "github.com/nri-vgpu/nri-vgpu/pkg/limits"

// DefaultPath is where the binaries look when neither --config nor
// NRI_VGPU_CONFIG names a file.
const DefaultPath = "/etc/nri-vgpu/config.toml"

// EnvPath is the environment variable that names the config file when no
// --config flag is given.
const EnvPath = "NRI_VGPU_CONFIG"

// Config is the whole file. Parse and Load return it validated; a Config
// changed in code can be checked again with Validate.
type Config struct {
	DevicePlugin DevicePlugin `toml:"device_plugin"`
	GPU          GPU          `toml:"gpu"`
	Driver       Driver       `toml:"driver"`
	Paths        Paths        `toml:"paths"`
	NRI          NRI          `toml:"nri"`
	Runtime      Runtime      `toml:"runtime"`
	Metrics      Metrics      `toml:"metrics"`
	Limits       Limits       `toml:"limits"`
	DRA          DRA          `toml:"dra"`

	// Source is the file the configuration was read from ("" for defaults).
	Source string `toml:"-"`
}

// DevicePlugin configures how GPUs are split into slices (Contract 1).
type DevicePlugin struct {
	ResourceName     string  `toml:"resource_name"`     // default "nvidia.com/gpu"
	SplitCount       int     `toml:"split_count"`       // default 10, 1..1024
	MemoryScaling    float64 `toml:"memory_scaling"`    // default 1.0, (0, 10]
	CoresScaling     float64 `toml:"cores_scaling"`     // default 1.0, (0, 10]
	AllocationPolicy string  `toml:"allocation_policy"` // "binpack" (default) | "spread"
	SocketDir        string  `toml:"socket_dir"`        // default "/var/lib/kubelet/device-plugins"
	// FeatureFile is the Node Feature Discovery local feature file the
	// plugin writes the node's GPU sharing labels to (docs/design.md,
	// "Node labels"); "" turns it off.
	FeatureFile string `toml:"feature_file"` // default DefaultFeatureFile
	// FeatureNVIDIALabels also writes the nvidia.com/gpu.* labels NVIDIA's
	// GPU Feature Discovery writes; only where GFD does not run.
	FeatureNVIDIALabels bool            `toml:"feature_nvidia_labels"` // default false
	Models              []ModelOverride `toml:"model"`
}

// DefaultFeatureFile is device_plugin.feature_file by default: a file of
// Node Feature Discovery's local source, which reads every file of
// features.d whose name does not start with a dot.
const DefaultFeatureFile = "/etc/kubernetes/node-feature-discovery/features.d/nri-vgpu"

// SplitCountFor returns the split count for GPUs whose NVML product name is
// model: the split_count of the [[device_plugin.model]] entry with exactly
// that name, else the global split_count.
func (d DevicePlugin) SplitCountFor(model string) int {
	for _, m := range d.Models {
		if m.Name == model {
			return m.SplitCount
		}
	}
	return d.SplitCount
}

// Bounds of DevicePlugin.SplitCount and ModelOverride.SplitCount. Above 1024
// slices kubelet's device list and the per-slice memory become unwieldy.
const (
	MinSplitCount = 1
	MaxSplitCount = 1024
)

// MaxScaling bounds DevicePlugin.MemoryScaling and CoresScaling: more than
// ten times oversubscription is a typo, not a plan.
const MaxScaling = 10.0

// ModelOverride sets a different split count for GPUs whose NVML product name
// equals Name.
type ModelOverride struct {
	Name       string `toml:"name"`
	SplitCount int    `toml:"split_count"`
}

// Policies for DevicePlugin.AllocationPolicy.
const (
	PolicyBinpack = "binpack"
	PolicySpread  = "spread"
)

// GPU selects the inventory backend.
type GPU struct {
	Backend   string         `toml:"backend"` // "nvml" (default) | "simulated"
	Simulated []SimulatedGPU `toml:"simulated"`
}

// Backends for GPU.Backend.
const (
	BackendNVML      = "nvml"
	BackendSimulated = "simulated"
)

// SimulatedGPU describes one GPU of the simulated backend.
type SimulatedGPU struct {
	UUID     string `toml:"uuid"`
	Name     string `toml:"name"`
	Memory   Bytes  `toml:"memory"` // integer bytes or a quantity string such as "16GiB"
	Minor    int    `toml:"minor"`
	PCIBusID string `toml:"pci_bus_id"` // optional; derived from the minor when empty
	Healthy  *bool  `toml:"healthy"`    // default true
	// MIG puts the GPU in MIG mode: served elsewhere (NVIDIA's device
	// plugin or DRA driver serves its MIG devices), so nri-vgpu never
	// advertises it and only shows it in status.
	MIG bool `toml:"mig"`

	// What the GPU is, as the NVML backend reports it. Each is optional:
	// a GPU without one is published without that attribute.
	Architecture          string `toml:"architecture"`            // e.g. "Ampere"
	Brand                 string `toml:"brand"`                   // e.g. "Nvidia"
	CUDAComputeCapability string `toml:"cuda_compute_capability"` // "major.minor", e.g. "8.0"
	DriverVersion         string `toml:"driver_version"`          // e.g. "550.54.15"
	CUDADriverVersion     string `toml:"cuda_driver_version"`     // "major.minor", e.g. "12.4"
	PCIeRoot              string `toml:"pcie_root"`               // sysfs' name, e.g. "pci0000:00"
}

// IsHealthy reports the configured health (true when unset).
func (g SimulatedGPU) IsHealthy() bool { return g.Healthy == nil || *g.Healthy }

// Driver configures how the driver's user-space files reach a container.
type Driver struct {
	Injection string   `toml:"injection"` // "auto" (default) | "cdi" | "generate" | "nvidia-runtime" | "none"
	CDIDirs   []string `toml:"cdi_dirs"`  // default ["/etc/cdi", "/var/run/cdi"]
	DevRoot   string   `toml:"dev_root"`  // default "/": the host's root as this process sees it
	// DriverRoot is where the NVIDIA driver is installed on the host, as
	// nvidia-ctk's --driver-root: "/run/nvidia/driver" under the GPU
	// Operator's driver container, whose device nodes are beneath it.
	DriverRoot string `toml:"driver_root"` // default "/"
	// LibraryDirs are directories, beneath the driver root, searched for the
	// driver's libraries (libnvidia-ml.so.1, libcuda.so.1) besides the
	// loader's cache and the usual ones: drivers installed outside the
	// loader's view, as under /usr/local/nvidia/lib64.
	LibraryDirs []string `toml:"library_dirs"` // default ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"]
}

// Injection modes for Driver.Injection.
const (
	InjectionAuto          = "auto"
	InjectionCDI           = "cdi"
	InjectionGenerate      = "generate"
	InjectionNVIDIARuntime = "nvidia-runtime"
	InjectionNone          = "none"
)

// Paths are the host directories and files the binaries use.
type Paths struct {
	StateDir string `toml:"state_dir"` // default "/var/lib/nri-vgpu"
	RunDir   string `toml:"run_dir"`   // default "/run/nri-vgpu"
	ShimPath string `toml:"shim_path"` // default "/usr/lib/nri-vgpu/libvgpu-shim.so"
	// HookPath is the host path of the nri-vgpu binary that the container
	// runtime runs as the pin hook of vGPU containers (`hook pin`,
	// Contract 3); default "": the running binary itself. Set it where the
	// binary that computes the edits is not on the host (a DaemonSet), to
	// a host copy of nri-vgpu-hook; nri-vgpu --hook-path overrides it.
	HookPath string `toml:"hook_path"`
}

// NRI configures the NRI plugin.
type NRI struct {
	PluginIndex     string `toml:"plugin_index"` // default "10"; two digits
	SocketPath      string `toml:"socket_path"`  // default "/var/run/nri/nri.sock"
	HideUnrequested bool   `toml:"hide_unrequested"`
	// Exempt lists the pods whose containers without an nri-vgpu
	// allocation are left exactly as their image and runtime made them:
	// the node's own GPU agents (the GPU Operator, dcgm-exporter), which
	// need every GPU without asking the device plugin for one.
	Exempt []Exemption `toml:"exempt"`
	// Confinement decides what happens to a GPU container where the
	// runtime cannot apply the confinement's seccomp policy (containerd
	// before 2.2): "required" refuses it, "best-effort" lets it run
	// unconfined (said at start, in status and in metrics).
	Confinement string `toml:"confinement"` // "best-effort" (default) | "required"
	// ConfinementExempt lists the namespaces whose GPU containers run
	// without the confinement (rootless builders, sandboxes that need user
	// namespaces); they can then run programs without the shim.
	ConfinementExempt []ConfinementExemption `toml:"confinement_exempt"`
}

// Values of NRI.Confinement.
const (
	ConfinementRequired   = "required"
	ConfinementBestEffort = "best-effort"
)

// ConfinementExemption matches a pod by its namespace, as the kubelet passes
// it to the runtime (never by anything in the pod's own spec).
type ConfinementExemption struct {
	Namespace string `toml:"namespace"`
}

// ConfinementExemptFor reports whether GPU containers of pods in namespace
// run without the confinement.
func (n NRI) ConfinementExemptFor(namespace string) bool {
	for _, e := range n.ConfinementExempt {
		if e.Namespace != "" && e.Namespace == namespace {
			return true
		}
	}
	return false
}

// Exemption matches a pod by what the kubelet and the cluster's
// administrators decide, never by anything its own spec can claim: its
// namespace, and the handler of its RuntimeClass. Each key that is set must
// match; at least one is set.
type Exemption struct {
	Namespace      string `toml:"namespace"`
	RuntimeHandler string `toml:"runtime_handler"`
}

// Matches reports whether a pod in namespace whose sandbox runs under
// runtime handler (empty: the runtime's default) is exempt.
func (e Exemption) Matches(namespace, handler string) bool {
	if e.Namespace == "" && e.RuntimeHandler == "" {
		return false // never valid; matching every pod would be the wrong way to fail
	}
	return (e.Namespace == "" || e.Namespace == namespace) &&
		(e.RuntimeHandler == "" || e.RuntimeHandler == handler)
}

// ExemptionFor returns the first exemption that matches the pod, if any.
func (n NRI) ExemptionFor(namespace, handler string) (Exemption, bool) {
	for _, e := range n.Exempt {
		if e.Matches(namespace, handler) {
			return e, true
		}
	}
	return Exemption{}, false
}

// Runtime configures the OCI runtime wrapper.
type Runtime struct {
	// Next lists the runtimes to exec after editing the bundle; the first one
	// found (absolute path, or on PATH) is used.
	Next []string `toml:"next"` // default ["nvidia-container-runtime", "runc"]
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Listen string `toml:"listen"` // empty = off
}

// Limits sets the optional keys of every vGPU container's limits file
// (Contract 4) on this node.
type Limits struct {
	// CoresPolicy is how the shim treats a container's cores quota:
	// "hard" holds it to its share; "burst" lets it use SM time the rest of
	// the GPU leaves idle. The device plugin signs it into each allocation
	// (so it is fixed when the slices are handed out, and a plugin instance
	// per resource can offer each policy under its own resource name); the
	// runtime wrapper uses it for Docker containers that do not set
	// NRI_VGPU_CORES_POLICY.
	CoresPolicy string `toml:"cores_policy"` // "hard" (default) | "burst"
	// LogLevel is how much the shim writes to a container's stderr.
	LogLevel string `toml:"log_level"` // "warn" (default) | "error" | "info" | "debug"
}

// DRA decides which GPUs of the node the DRA driver serves (Contract 8).
// A GPU is served either by the device plugin or by the DRA driver, never
// both: both read this table, the device plugin leaves the DRA GPUs out and
// the driver publishes only them.
type DRA struct {
	Enabled bool     `toml:"enabled"` // default false: every GPU goes to the device plugin
	GPUs    []string `toml:"gpus"`    // UUIDs; empty = every GPU of the node
	// DriverName is the DRA driver's name, the DeviceClass's selector.
	DriverName string `toml:"driver_name"` // default "gpu.nri-vgpu.io"
	// CDIDir is where the driver writes a CDI spec per prepared claim;
	// containerd must read CDI specs from it.
	CDIDir string `toml:"cdi_dir"` // default "/var/run/cdi"
	// UnhealthyTaintEffect is the effect of the taint an unhealthy GPU is
	// published with: NoSchedule keeps the claims already on it and
	// places no new one there; NoExecute also evicts the pods whose
	// claims use it.
	UnhealthyTaintEffect string `toml:"unhealthy_taint_effect"` // "NoSchedule" (default) | "NoExecute"
}

// The effects an unhealthy GPU's taint can have (DRA.UnhealthyTaintEffect),
// spelled as Kubernetes spells them.
const (
	TaintEffectNoSchedule = "NoSchedule"
	TaintEffectNoExecute  = "NoExecute"
)

// Serves reports whether the GPU with this UUID goes to the DRA driver.
func (d DRA) Serves(uuid string) bool {
	if !d.Enabled {
		return false
	}
	if len(d.GPUs) == 0 {
		return true
	}
	for _, g := range d.GPUs {
		if g == uuid {
			return true
		}
	}
	return false
}

// DefaultDRADriverName is DRA.DriverName's default.
const DefaultDRADriverName = "gpu.nri-vgpu.io"

// Default returns the configuration used for every key that a file leaves
// out. Each call returns a new value that the caller may change.
func Default() *Config {
	return &Config{
		DevicePlugin: DevicePlugin{
			ResourceName:     "nvidia.com/gpu",
			SplitCount:       10,
			MemoryScaling:    1.0,
			CoresScaling:     1.0,
			AllocationPolicy: PolicyBinpack,
			SocketDir:        "/var/lib/kubelet/device-plugins",
			FeatureFile:      DefaultFeatureFile,
		},
		GPU: GPU{
			Backend: BackendNVML,
		},
		Driver: Driver{
			Injection:   InjectionAuto,
			CDIDirs:     []string{"/etc/cdi", "/var/run/cdi"},
			DevRoot:     "/",
			DriverRoot:  "/",
			LibraryDirs: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"},
		},
		Paths: Paths{
			StateDir: "/var/lib/nri-vgpu",
			RunDir:   "/run/nri-vgpu",
			ShimPath: "/usr/lib/nri-vgpu/libvgpu-shim.so",
		},
		NRI: NRI{
			PluginIndex:     "10",
			SocketPath:      "/var/run/nri/nri.sock",
			HideUnrequested: true,
			Confinement:     ConfinementBestEffort,
		},
		Runtime: Runtime{
			Next: []string{"nvidia-container-runtime", "runc"},
		},
		Metrics: Metrics{
			Listen: "",
		},
		Limits: Limits{
			CoresPolicy: limits.CoresPolicyHard,
			LogLevel:    limits.LogLevelWarn,
		},
		DRA: DRA{
			DriverName: DefaultDRADriverName,
			CDIDir:     "/var/run/cdi",

			UnhealthyTaintEffect: TaintEffectNoSchedule,
		},
	}
}
