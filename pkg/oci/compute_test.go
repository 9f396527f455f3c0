package oci

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

const (
	uuid0 = "GPU-8e1c5f2a-0b7d-4c1e-9a3f-3d2b1c0a9e01"
	uuid1 = "GPU-1f0e2d3c-4b5a-4968-8776-5a4b3c2d1e02"
)

// testFiles are where the host files of a container would be; Compute only
// names them in mounts.
var testFiles = HostFiles{
	Preload: "/run/nri-vgpu/ld.so.preload",
	Limits:  "/run/nri-vgpu/containers/0123456789abcdef/limits",
	Region:  "/run/nri-vgpu/containers/0123456789abcdef/region",
	Ledger:  "/run/nri-vgpu/containers/0123456789abcdef/ledger",
	Hook:    "/usr/bin/nri-vgpu",
}

type env struct {
	cfg  *config.Config
	host *HostFS
	root string
}

// newEnv returns a config and host over fake device nodes; withCDI puts the
// nvidia-ctk-shaped fixture in the CDI spec directory.
func newEnv(t *testing.T, injection string, withCDI bool, nodes []ocitest.Node) env {
	t.Helper()
	root := ocitest.FakeDevRoot(t, nodes)
	cfg := config.Default()
	cfg.Driver.DevRoot = root
	cfg.Driver.Injection = injection
	cdiDir := t.TempDir()
	if withCDI {
		data, err := os.ReadFile("testdata/nvidia.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cdiDir, "nvidia.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Driver.CDIDirs = []string{cdiDir}
	run := t.TempDir()
	cfg.Paths.RunDir = run
	cfg.Paths.StateDir = t.TempDir()
	cfg.Paths.ShimPath = filepath.Join(run, "libvgpu-shim.so")
	if err := os.WriteFile(cfg.Paths.ShimPath, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := NewHost(cfg, false)
	host.ProcDevices = filepath.Join(root, "proc-devices") // absent unless a test writes it
	return env{cfg: cfg, host: host, root: root}
}

func gpus(g ...allocation.GPU) []allocation.GPU { return g }

var (
	gpu0 = allocation.GPU{UUID: uuid0, Minor: 0, Slices: 2, Memory: 8 << 30, Cores: 50}
	gpu1 = allocation.GPU{UUID: uuid1, Minor: 1, Slices: 1, Memory: 4 << 30, Cores: 25}
)

func devicePaths(devs []specs.LinuxDevice) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Path)
	}
	return out
}

func envValue(envs []string, key string) (string, bool) {
	for _, kv := range envs {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

func findMount(mounts []specs.Mount, dst string) (specs.Mount, bool) {
	for _, m := range mounts {
		if m.Destination == dst {
			return m, true
		}
	}
	return specs.Mount{}, false
}

func TestCompute(t *testing.T) {
	tests := []struct {
		name       string
		injection  string
		withCDI    bool
		gpus       []allocation.GPU
		wantDevs   []string
		wantVisble string
		wantHooks  int // createContainer hooks
		wantLib    bool
	}{
		{
			name: "cdi, GPU by uuid", injection: config.InjectionCDI, withCDI: true, gpus: gpus(gpu0),
			wantDevs:   []string{"/dev/nvidia0", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl", "/dev/dri/card1", "/dev/dri/renderD128"},
			wantVisble: "void", wantHooks: 5, wantLib: true,
		},
		{
			name: "auto with a spec, two GPUs", injection: config.InjectionAuto, withCDI: true, gpus: gpus(gpu0, gpu1),
			wantDevs: []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl",
				"/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card2", "/dev/dri/renderD129"},
			wantVisble: "void", wantHooks: 6, wantLib: true,
		},
		{
			name: "auto without a spec", injection: config.InjectionAuto, gpus: gpus(gpu0, gpu1),
			wantDevs:   []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1"},
			wantVisble: uuid0 + "," + uuid1, wantHooks: 1,
		},
		{
			name: "nvidia-runtime ignores a spec", injection: config.InjectionNVIDIARuntime, withCDI: true, gpus: gpus(gpu1),
			wantDevs:   []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1"},
			wantVisble: uuid1, wantHooks: 1,
		},
		{
			name: "none", injection: config.InjectionNone, withCDI: true, gpus: gpus(gpu0),
			wantDevs:   []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"},
			wantVisble: "void", wantHooks: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.injection, tt.withCDI, ocitest.StandardNodes)
			edits, err := Compute(tt.gpus, e.cfg, e.host, testFiles)
			if err != nil {
				t.Fatal(err)
			}
			got, want := devicePaths(edits.Devices), slices.Clone(tt.wantDevs)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("devices = %v, want %v", got, want)
			}
			// Every device has an rwm allow rule with its host major:minor.
			for _, d := range edits.Devices {
				if !slices.ContainsFunc(edits.DeviceRules, func(r specs.LinuxDeviceCgroup) bool {
					return r.Allow && r.Type == "c" && *r.Major == d.Major && *r.Minor == d.Minor && r.Access == "rwm"
				}) {
					t.Errorf("no rwm allow rule for %s (%d:%d)", d.Path, d.Major, d.Minor)
				}
			}
			for _, d := range edits.Devices {
				if d.Path == "/dev/nvidia-uvm" && (d.Major != ocitest.UVMMajor || d.Minor != 0) {
					t.Errorf("nvidia-uvm = %d:%d, want the host node's %d:0", d.Major, d.Minor, ocitest.UVMMajor)
				}
			}
			if v, _ := envValue(edits.Env, EnvVisibleDevices); v != tt.wantVisble {
				t.Errorf("%s = %q, want %q", EnvVisibleDevices, v, tt.wantVisble)
			}
			if got := len(edits.Hooks.CreateContainer); got != tt.wantHooks {
				t.Errorf("createContainer hooks = %d, want %d", got, tt.wantHooks)
			}
			// The pin hook comes last, after the CDI spec's own hooks.
			if n := len(edits.Hooks.CreateContainer); n > 0 {
				checkPinHook(t, edits.Hooks.CreateContainer[n-1])
			}
			_, lib := findMount(edits.Mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
			if lib != tt.wantLib {
				t.Errorf("libcuda mount present = %v, want %v", lib, tt.wantLib)
			}
			for _, want := range []specs.Mount{
				{Destination: "/usr/local/nri-vgpu/libvgpu-shim.so", Type: "bind", Source: e.cfg.Paths.ShimPath, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
				{Destination: "/etc/ld.so.preload", Type: "bind", Source: "/run/nri-vgpu/ld.so.preload", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
				{Destination: "/run/nri-vgpu/limits", Type: "bind", Source: "/run/nri-vgpu/containers/0123456789abcdef/limits", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
				{Destination: "/run/nri-vgpu/region", Type: "bind", Source: "/run/nri-vgpu/containers/0123456789abcdef/region", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
				{Destination: "/run/nri-vgpu/ledger", Type: "bind", Source: "/run/nri-vgpu/containers/0123456789abcdef/ledger", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
			} {
				got, ok := findMount(edits.Mounts, want.Destination)
				if !ok {
					t.Errorf("mount %s missing", want.Destination)
					continue
				}
				if got.Source != want.Source || got.Type != want.Type || !slices.Equal(got.Options, want.Options) {
					t.Errorf("mount %s = %+v, want %+v", want.Destination, got, want)
				}
			}
			if len(edits.RemoveDevices) != 0 {
				t.Errorf("RemoveDevices = %v, want none", edits.RemoveDevices)
			}
		})
	}
}

func without(nodes []ocitest.Node, paths ...string) []ocitest.Node {
	return slices.DeleteFunc(slices.Clone(nodes), func(n ocitest.Node) bool { return slices.Contains(paths, n.Path) })
}

func TestComputeErrors(t *testing.T) {
	tests := []struct {
		name      string
		injection string
		withCDI   bool
		nodes     []ocitest.Node
		gpus      []allocation.GPU
		files     HostFiles
		wantErr   string
	}{
		{"no nvidiactl", config.InjectionNone, false, without(ocitest.StandardNodes, "dev/nvidiactl"), gpus(gpu0), testFiles, "/dev/nvidiactl"},
		{"no GPU node", config.InjectionNone, false, without(ocitest.StandardNodes, "dev/nvidia1"), gpus(gpu0, gpu1), testFiles, "/dev/nvidia1"},
		{"cdi without a spec", config.InjectionCDI, false, ocitest.StandardNodes, gpus(gpu0), testFiles, "no nvidia.com/gpu CDI spec"},
		{"GPU not in the CDI spec", config.InjectionCDI, true, append(slices.Clone(ocitest.StandardNodes), ocitest.Node{Path: "dev/nvidia7", Major: 195, Minor: 7}),
			gpus(allocation.GPU{UUID: "GPU-77777777-7777-7777-7777-777777777777", Minor: 7, Slices: 1, Memory: 1 << 30, Cores: 10}), testFiles, "no nvidia.com/gpu CDI device for GPU GPU-7777"},
		{"CDI node missing on the host", config.InjectionCDI, true, without(ocitest.StandardNodes, "dev/dri/card1"), gpus(gpu0), testFiles, "/dev/dri/card1"},
		{"no GPUs", config.InjectionNone, false, ocitest.StandardNodes, gpus(), testFiles, "no GPUs"},
		{"relative limits file", config.InjectionNone, false, ocitest.StandardNodes, gpus(gpu0),
			HostFiles{Preload: testFiles.Preload, Limits: "containers/x/limits", Region: testFiles.Region, Hook: testFiles.Hook}, `host path of the limits file "containers/x/limits" is not absolute`},
		{"no region directory", config.InjectionNone, false, ocitest.StandardNodes, gpus(gpu0),
			HostFiles{Preload: testFiles.Preload, Limits: testFiles.Limits, Hook: testFiles.Hook}, `host path of the usage region directory "" is not absolute`},
		{"no preload file", config.InjectionNone, false, ocitest.StandardNodes, gpus(gpu0),
			HostFiles{Limits: testFiles.Limits, Region: testFiles.Region, Hook: testFiles.Hook}, `host path of the preload file "" is not absolute`},
		{"no pin hook", config.InjectionNone, false, ocitest.StandardNodes, gpus(gpu0),
			HostFiles{Preload: testFiles.Preload, Limits: testFiles.Limits, Region: testFiles.Region}, `host path of the pin hook binary "" is not absolute`},
		{"relative ledger directory", config.InjectionNone, false, ocitest.StandardNodes, gpus(gpu0),
			HostFiles{Preload: testFiles.Preload, Limits: testFiles.Limits, Region: testFiles.Region, Ledger: "containers/x/ledger", Hook: testFiles.Hook},
			`host path of the ledger directory "containers/x/ledger" is not absolute`},
		{"unknown injection", "magic", false, ocitest.StandardNodes, gpus(gpu0), testFiles, `unknown driver.injection "magic"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.injection, tt.withCDI, tt.nodes)
			_, err := Compute(tt.gpus, e.cfg, e.host, tt.files)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Compute error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// A record of the previous release has no ledger directory: its container
// gets every other mount and none at the ledger's path, where the image's
// own directory (if any) is never read, its limits file naming no shards.
func TestComputeWithoutLedger(t *testing.T) {
	e := newEnv(t, config.InjectionNone, false, ocitest.StandardNodes)
	files := testFiles
	files.Ledger = ""
	edits, err := Compute(gpus(gpu0), e.cfg, e.host, files)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range edits.Mounts {
		got = append(got, m.Destination)
	}
	want := []string{"/usr/local/nri-vgpu/libvgpu-shim.so", "/etc/ld.so.preload", "/run/nri-vgpu/limits", "/run/nri-vgpu/region"}
	if !slices.Equal(got, want) {
		t.Errorf("mounts = %q, want %q", got, want)
	}
}

func TestComputeOptionalUVM(t *testing.T) {
	e := newEnv(t, config.InjectionNone, false, without(ocitest.StandardNodes, "dev/nvidia-uvm", "dev/nvidia-uvm-tools"))
	edits, err := Compute(gpus(gpu0), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := devicePaths(edits.Devices), []string{"/dev/nvidiactl", "/dev/nvidia0"}; !slices.Equal(got, want) {
		t.Errorf("devices = %v, want %v", got, want)
	}
}

// writeCDISpec writes a CDI spec as JSON into dir.
func writeCDISpec(t *testing.T, dir string, spec *cdispec.Spec) {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFixture(t *testing.T) *cdispec.Spec {
	t.Helper()
	return readFixtureFile(t, "testdata/nvidia.yaml")
}

func readFixtureFile(t *testing.T, name string) *cdispec.Spec {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cdi.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// A spec written with --device-name-strategy=index only: the GPU is found by
// its /dev/nvidia<minor> node.
func TestComputeCDIIndexNames(t *testing.T) {
	e := newEnv(t, config.InjectionCDI, false, ocitest.StandardNodes)
	raw := readFixture(t)
	raw.Devices = slices.DeleteFunc(raw.Devices, func(d cdispec.Device) bool { return strings.HasPrefix(d.Name, "GPU-") })
	writeCDISpec(t, e.cfg.Driver.CDIDirs[0], raw)
	edits, err := Compute(gpus(gpu1), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	paths := devicePaths(edits.Devices)
	for _, want := range []string{"/dev/nvidia1", "/dev/dri/card2", "/dev/dri/renderD129"} {
		if !slices.Contains(paths, want) {
			t.Errorf("devices %v lack %s", paths, want)
		}
	}
	if slices.Contains(paths, "/dev/nvidia0") {
		t.Errorf("devices %v hold /dev/nvidia0 of another GPU", paths)
	}
}

// The CDI translation must do what the CDI library does to a spec, for
// specs of a driver on the host and of one under the GPU Operator's driver
// root (device nodes with a hostPath beneath it).
func TestCDITranslationMatchesLibrary(t *testing.T) {
	for _, tt := range []struct {
		fixture string
		nodes   []ocitest.Node
	}{
		{"testdata/nvidia.yaml", ocitest.StandardNodes},
		{"testdata/nvidia-driver-root.yaml", underDriverRoot()},
	} {
		t.Run(filepath.Base(tt.fixture), func(t *testing.T) { testCDITranslationMatchesLibrary(t, tt.fixture, tt.nodes) })
	}
}

func testCDITranslationMatchesLibrary(t *testing.T, fixture string, nodes []ocitest.Node) {
	e := newEnv(t, config.InjectionCDI, false, nodes)
	raw := readFixtureFile(t, fixture)
	// The library stats host paths directly: point them at the fake nodes.
	fix := func(ce *cdispec.ContainerEdits) {
		for _, n := range ce.DeviceNodes {
			n.HostPath = filepath.Join(e.root, cmp.Or(n.HostPath, n.Path))
		}
	}
	fix(&raw.ContainerEdits)
	for i := range raw.Devices {
		fix(&raw.Devices[i].ContainerEdits)
	}
	writeCDISpec(t, e.cfg.Driver.CDIDirs[0], raw)

	base := func() *specs.Spec {
		return &specs.Spec{
			Process: &specs.Process{Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}},
			Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}, {Destination: "/etc/hosts", Type: "bind", Source: "/tmp/hosts"}},
			Linux:   &specs.Linux{Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}},
		}
	}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(e.cfg.Driver.CDIDirs...), cdi.WithAutoRefresh(false))
	want := base()
	if _, err := cache.InjectDevices(want, "nvidia.com/gpu="+uuid0, "nvidia.com/gpu=1"); err != nil {
		t.Fatal(err)
	}

	host := NewHost(e.cfg, false)
	host.DevRoot = "/"
	gpuSpecs, err := host.CDISpecs()
	if err != nil {
		t.Fatal(err)
	}
	var sources []cdiSource
	for _, s := range gpuSpecs {
		sources = append(sources, cdiSource{name: s.GetPath(), spec: s.Spec})
	}
	edits := &Edits{}
	if err := addCDIEdits(edits, sources, gpus(gpu0, gpu1), host); err != nil {
		t.Fatal(err)
	}
	got := base()
	if err := edits.ApplyToSpec(got); err != nil {
		t.Fatal(err)
	}
	// The library orders mounts of equal depth by insertion, NRI (and so
	// ApplyToSpec) by destination: both are valid orders of the same mounts.
	SortMounts(want.Mounts)
	gj, _ := json.MarshalIndent(got, "", " ")
	wj, _ := json.MarshalIndent(want, "", " ")
	if string(gj) != string(wj) {
		t.Errorf("translated CDI edits differ from the CDI library's:\n got: %s\nwant: %s", gj, wj)
	}
}

func TestHide(t *testing.T) {
	e := newEnv(t, config.InjectionAuto, false, ocitest.StandardNodes)
	procDevices := "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-nvswitch\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n509 nvidia-not-a-char\n"
	if err := os.WriteFile(e.host.ProcDevices, []byte(procDevices), 0o644); err != nil {
		t.Fatal(err)
	}
	edits, err := Hide(e.host, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := envValue(edits.Env, EnvVisibleDevices); v != "void" {
		t.Errorf("%s = %q, want void", EnvVisibleDevices, v)
	}
	var majors []int64
	nodeDenies := 0
	for _, r := range edits.DeviceRules {
		if r.Allow || r.Type != "c" || r.Access != "rw" {
			t.Errorf("rule %+v: want a char deny rule for rw", r)
		}
		if r.Minor == nil {
			majors = append(majors, *r.Major)
		} else {
			nodeDenies++
		}
	}
	if want := []int64{195, 508, 510, 511}; !slices.Equal(majors, want) {
		t.Errorf("denied majors = %v, want %v", majors, want)
	}
	wantNodes := []string{"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"}
	if !slices.Equal(edits.RemoveDevices, wantNodes) {
		t.Errorf("RemoveDevices = %v, want %v", edits.RemoveDevices, wantNodes)
	}
	if nodeDenies != len(wantNodes) {
		t.Errorf("%d per-node deny rules, want %d", nodeDenies, len(wantNodes))
	}
	if len(edits.Devices) != 0 || len(edits.Mounts) != 0 {
		t.Errorf("Hide adds devices %v / mounts %v", edits.Devices, edits.Mounts)
	}
}

// TestHideKeepsGrantedNodes: the nodes another plugin put in the container's
// spec (a MIG device: its parent GPU's node mapped elsewhere, the control
// node and its /dev/nvidia-caps node) are neither removed nor denied; every
// other NVIDIA node still is.
func TestHideKeepsGrantedNodes(t *testing.T) {
	e := newEnv(t, config.InjectionAuto, false, ocitest.StandardNodes)
	granted := []specs.LinuxDevice{
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 1}, // host /dev/nvidia1, mapped as nvidia0
		{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255},
		{Path: "/dev/nvidia-caps/nvidia-cap1", Type: "c", Major: 510, Minor: 1},
		{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229}, // not NVIDIA's: no effect
	}
	edits, err := Hide(e.host, granted)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := envValue(edits.Env, EnvVisibleDevices); v != "void" {
		t.Errorf("%s = %q, want void: the environment cannot tell a grant from the pod spec", EnvVisibleDevices, v)
	}
	var denied []string
	for _, r := range edits.DeviceRules {
		if r.Minor != nil {
			denied = append(denied, fmt.Sprintf("%d:%d", *r.Major, *r.Minor))
		}
	}
	slices.Sort(denied)
	want := []string{"195:0", "195:254", fmt.Sprintf("%d:0", ocitest.UVMMajor), fmt.Sprintf("%d:1", ocitest.UVMMajor)}
	slices.Sort(want)
	if !slices.Equal(denied, want) {
		t.Errorf("per-node denies = %v, want %v (never the granted 195:1, 195:255, 510:1)", denied, want)
	}
	// /dev/nvidia0 is the container's path of the granted GPU: kept too.
	wantRemoved := []string{"/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	if !slices.Equal(edits.RemoveDevices, wantRemoved) {
		t.Errorf("RemoveDevices = %v, want %v", edits.RemoveDevices, wantRemoved)
	}
}

func TestParseProcDevices(t *testing.T) {
	got := parseProcDevices([]byte("Character devices:\n  4 tty\n195 nvidia-frontend\n236 nvidia-caps\n237 nvidia-uvm\nbogus\nBlock devices:\n240 nvidia-x\n"))
	if want := []int64{195, 236, 237}; !slices.Equal(got, want) {
		t.Errorf("parseProcDevices = %v, want %v", got, want)
	}
}

func TestApplyToAdjustmentShape(t *testing.T) {
	e := newEnv(t, config.InjectionNVIDIARuntime, false, ocitest.StandardNodes)
	edits, err := Compute(gpus(gpu0), e.cfg, e.host, testFiles)
	if err != nil {
		t.Fatal(err)
	}
	adj := &api.ContainerAdjustment{}
	edits.ApplyToAdjustment(adj, nil)
	// nvidia-runtime injection of GPU 0: the control, UVM and GPU nodes,
	// an allow rule each, and the five mounts of Contract 3.
	var devs, rules, mounts []string
	for _, d := range adj.GetLinux().GetDevices() {
		devs = append(devs, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	for _, r := range adj.GetLinux().GetResources().GetDevices() {
		rules = append(rules, fmt.Sprintf("%v %s %d:%d %s", r.Allow, r.Type, r.Major.GetValue(), r.Minor.GetValue(), r.Access))
	}
	for _, m := range adj.GetMounts() {
		mounts = append(mounts, m.Destination)
	}
	uvm := ocitest.UVMMajor
	wantDevs := []string{"/dev/nvidiactl 195:255", fmt.Sprintf("/dev/nvidia-uvm %d:0", uvm), fmt.Sprintf("/dev/nvidia-uvm-tools %d:1", uvm), "/dev/nvidia0 195:0"}
	wantRules := []string{"true c 195:255 rwm", fmt.Sprintf("true c %d:0 rwm", uvm), fmt.Sprintf("true c %d:1 rwm", uvm), "true c 195:0 rwm"}
	wantMounts := []string{"/usr/local/nri-vgpu/libvgpu-shim.so", "/etc/ld.so.preload", "/run/nri-vgpu/limits", "/run/nri-vgpu/region", "/run/nri-vgpu/ledger"}
	if !slices.Equal(devs, wantDevs) {
		t.Errorf("adjustment devices = %q, want %q", devs, wantDevs)
	}
	if !slices.Equal(rules, wantRules) {
		t.Errorf("adjustment device rules = %q, want %q", rules, wantRules)
	}
	if !slices.Equal(mounts, wantMounts) {
		t.Errorf("adjustment mounts = %q, want %q", mounts, wantMounts)
	}
	if len(adj.GetEnv()) != 1 || adj.GetEnv()[0].Key != EnvVisibleDevices || adj.GetEnv()[0].Value != uuid0 {
		t.Errorf("adjustment env = %v", adj.GetEnv())
	}
}

func TestAllowsAllDevices(t *testing.T) {
	deny := specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}
	allowAll := specs.LinuxDeviceCgroup{Allow: true, Access: "rwm"}
	mknodAny := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Access: "m"}
	charAll := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Access: "rwm"}
	null := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"}
	tests := []struct {
		name  string
		rules []specs.LinuxDeviceCgroup
		want  bool
	}{
		{"no rules", nil, false},
		{"default container", []specs.LinuxDeviceCgroup{deny, mknodAny, null}, false},
		{"privileged", []specs.LinuxDeviceCgroup{deny, null, allowAll}, true},
		{"privileged then denied again", []specs.LinuxDeviceCgroup{allowAll, deny, null}, false},
		{"c *:* rwm", []specs.LinuxDeviceCgroup{deny, charAll}, true},
		{"c *:* allowed then denied", []specs.LinuxDeviceCgroup{deny, charAll, {Allow: false, Type: "c", Access: "rw"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AllowsAllDevices(tt.rules); got != tt.want {
				t.Errorf("AllowsAllDevices = %v, want %v", got, tt.want)
			}
		})
	}
}

// checkPinHook wants h to be the pin hook run by testFiles.Hook.
func checkPinHook(t *testing.T, h specs.Hook) {
	t.Helper()
	if h.Path != "/usr/bin/nri-vgpu" || !slices.Equal(h.Args, []string{"/usr/bin/nri-vgpu", "hook", "pin"}) ||
		h.Timeout == nil || *h.Timeout != 10 || len(h.Env) != 0 {
		t.Errorf("pin hook = %+v (timeout %v), want /usr/bin/nri-vgpu hook pin with a 10 s timeout", h, h.Timeout)
	}
}
