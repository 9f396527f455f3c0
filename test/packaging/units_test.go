package packaging

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

// unit is a systemd unit file: every value of every key, sections merged
// (the keys checked here occur in one section only).
type unit map[string][]string

func readUnit(t *testing.T, file string) unit {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not key=value: %q", file, line)
		}
		u[k] = append(u[k], v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// words is every space-separated word of every value of key.
func (u unit) words(key string) []string {
	var out []string
	for _, v := range u[key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// writable is what the sandbox (ProtectSystem=strict) leaves writable:
// the state, runtime and ReadWritePaths directories.
func (u unit) writable() []string {
	var out []string
	for _, d := range u.words("StateDirectory") {
		out = append(out, "/var/lib/"+d)
	}
	for _, d := range u.words("RuntimeDirectory") {
		out = append(out, "/run/"+d)
	}
	for _, p := range u.words("ReadWritePaths") {
		out = append(out, strings.TrimLeft(p, "-+"))
	}
	return out
}

// hostPath folds /var/run, a link to /run on every systemd host, into /run.
func hostPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/var/run/"); ok {
		return "/run/" + rest
	}
	return p
}

func isBelow(p string, dirs []string) bool {
	p = hostPath(path.Clean(p))
	for _, d := range dirs {
		d = hostPath(path.Clean(d))
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// packagedFiles is every destination of packaging/nfpm.yaml.
func packagedFiles(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../packaging/nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Contents []struct {
			Dst string `json:"dst"`
		} `json:"contents"`
	}
	if err := yaml.Unmarshal(data, &spec); err != nil {
		t.Fatalf("nfpm.yaml: %v", err)
	}
	var out []string
	for _, c := range spec.Contents {
		out = append(out, c.Dst)
	}
	return out
}

// mountNamespaceKeys are the unit settings that run a service in a mount
// namespace of its own (systemd.exec(5)); mounts made there stay there.
var mountNamespaceKeys = []string{
	"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts", "ProtectKernelTunables",
	"ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "ProcSubset",
	"ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths", "TemporaryFileSystem",
	"BindPaths", "BindReadOnlyPaths", "MountFlags", "RootDirectory", "RootImage", "MountAPIVFS",
}

// TestSystemdUnits holds the packaged units to what the daemons do with the
// packaged configuration: under ProtectSystem=strict every directory a daemon
// writes must be made writable, the GPUs must stay reachable, and the
// program must be one the package installs.
func TestSystemdUnits(t *testing.T) {
	out, err := exec.Command("../../hack/node-config.sh", "../../packaging/config.toml").Output()
	if err != nil {
		t.Fatalf("hack/node-config.sh: %v", err)
	}
	cfg, err := config.Parse("node config.toml", out)
	if err != nil {
		t.Fatal(err)
	}
	files := packagedFiles(t)
	for _, tc := range []struct {
		file    string
		program string
		// Directories the daemon creates files in.
		writes []string
		// The NRI plugin's run directory holds what running containers
		// mount: it must outlive a restart of the service.
		preserveRuntime bool
		caps            []string
		// The daemon mounts each usage region's tmpfs, which the
		// container runtime must see: the unit must leave it in the
		// host's mount namespace.
		mountsRegions bool
		// Environment the program needs from the unit.
		env []string
	}{
		{
			file:    "nri-vgpu-device-plugin.service",
			program: "/usr/bin/nri-vgpu-device-plugin",
			writes:  []string{cfg.DevicePlugin.SocketDir, cfg.Paths.StateDir, path.Dir(cfg.DevicePlugin.FeatureFile)},
		},
		{
			file:    "nri-vgpu.service",
			program: "/usr/bin/nri-vgpu",
			// The limits and regions, the allocation key (created by
			// whichever daemon starts first), the NRI socket.
			writes:          []string{cfg.Paths.RunDir, cfg.Paths.StateDir, path.Dir(cfg.NRI.SocketPath)},
			preserveRuntime: true,
			// Mounting each container's region tmpfs; removing a
			// container's region, whose files belong to the container's
			// users.
			caps:          []string{"CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"},
			mountsRegions: true,
		},
		{
			file:          "nri-vgpu-dra-driver.service",
			program:       "/usr/bin/nri-vgpu-dra-driver",
			mountsRegions: true,
			// Preparing a claim mounts its region; unpreparing removes
			// files of the containers' users.
			caps: []string{"CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"},
			// It exits at once without a node name, and needs credentials
			// for the API server outside a pod.
			env: []string{"NODE_NAME", "KUBECONFIG"},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			u := readUnit(t, "../../packaging/systemd/"+tc.file)
			if !slices.Contains(files, "/usr/lib/systemd/system/"+tc.file) {
				t.Errorf("nfpm.yaml does not install %s", tc.file)
			}
			// No flags: the daemons take their settings from the config
			// file, and containerd starts the NRI plugin without any.
			if got := u["ExecStart"]; len(got) != 1 || got[0] != tc.program {
				t.Errorf("ExecStart=%q, want %s", got, tc.program)
			}
			if !slices.Contains(files, tc.program) {
				t.Errorf("ExecStart %s is not installed by nfpm.yaml", tc.program)
			}
			if slices.Contains(u.words("ProtectSystem"), "strict") {
				for _, dir := range tc.writes {
					if !isBelow(dir, u.writable()) {
						t.Errorf("%s is read-only under ProtectSystem=strict; writable: %q", dir, u.writable())
					}
				}
			}
			if slices.Contains(u.words("StateDirectory"), path.Base(cfg.Paths.StateDir)) {
				if got := u.words("StateDirectoryMode"); !slices.Equal(got, []string{"0700"}) {
					t.Errorf("StateDirectoryMode=%q: the allocation key's directory must be 0700", got)
				}
			}
			// All load NVML, which opens the GPUs' device nodes.
			for _, k := range []string{"PrivateDevices", "DevicePolicy"} {
				if v := u.words(k); len(v) > 0 && v[0] != "no" && v[0] != "auto" {
					t.Errorf("%s=%s hides the NVIDIA device nodes", k, v[0])
				}
			}
			// ProtectClock=yes implies DeviceAllow=char-rtc r, which on
			// systemd 245 to 251 (Ubuntu 22.04 has 249) closes every other
			// device, the NVIDIA ones included.
			if v := u.words("ProtectClock"); len(v) > 0 && v[0] == "yes" && len(u["DeviceAllow"]) == 0 {
				t.Errorf("ProtectClock=yes without DeviceAllow= for the NVIDIA devices: systemd 245 to 251 then refuses /dev/nvidia*")
			}
			if fams := u.words("RestrictAddressFamilies"); len(fams) > 0 {
				for _, want := range []string{"AF_UNIX", "AF_NETLINK"} {
					if !slices.Contains(fams, want) {
						t.Errorf("RestrictAddressFamilies=%q lacks %s (unix sockets; NVML)", fams, want)
					}
				}
			}
			if tc.preserveRuntime && !slices.Equal(u.words("RuntimeDirectoryPreserve"), []string{"yes"}) {
				t.Errorf("RuntimeDirectoryPreserve=%q: stopping the service would delete what running containers mount", u["RuntimeDirectoryPreserve"])
			}
			if tc.mountsRegions {
				for _, k := range mountNamespaceKeys {
					if v := u.words(k); len(v) > 0 && !slices.Contains([]string{"no", "false", "0"}, v[0]) {
						t.Errorf("%s=%s gives the service a mount namespace of its own: the region mounts would not reach the container runtime", k, v[0])
					}
				}
			}
			for _, name := range tc.env {
				if !slices.ContainsFunc(u.words("Environment"), func(w string) bool { return strings.HasPrefix(w, name+"=") }) {
					t.Errorf("Environment=%q does not set %s", u["Environment"], name)
				}
			}
			if caps, ok := u["CapabilityBoundingSet"]; ok {
				for _, c := range tc.caps {
					if !slices.Contains(u.words("CapabilityBoundingSet"), c) {
						t.Errorf("CapabilityBoundingSet=%q lacks %s", caps, c)
					}
				}
			}
		})
	}
}
