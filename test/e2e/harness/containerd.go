// Package harness runs a real containerd (with runc and NRI) in a temporary
// root for end-to-end tests, and offers a CRI client with the few helpers the
// tests need. Everything it starts lives under one temporary directory and is
// torn down by Close, which goes on past errors: pods are removed through
// CRI, containerd is stopped, leftover containers (runc) and shims are
// killed, mounts under the directory are detached, and the directory is
// removed.
//
// It needs root, Debian's runc, and containerd binaries as installed by
// hack/e2e-deps.sh: v2.x, which has NRI on by default and reads a config of
// version 3, or v1.7, which needs NRI turned on in a config of version 2.
package harness

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nri-vgpu/nri-vgpu/internal/mountinfo"
)

// EnvBinDir names the directory of containerd, ctr and
// containerd-shim-runc-v2 of ContainerdVersion; without it, the cache
// directory of hack/e2e-deps.sh is used. Other versions always come from
// that cache.
const EnvBinDir = "NRI_VGPU_E2E_BIN"

// EnvContainerdVersions selects, as a space-separated list, the containerd
// versions the end-to-end tests run against (default: ContainerdVersions).
// hack/e2e-deps.sh reads it too, to install just those.
const EnvContainerdVersions = "NRI_VGPU_E2E_CONTAINERD"

// ContainerdVersion is the containerd 2.x that hack/e2e-deps.sh installs,
// the one the demo runs.
const ContainerdVersion = "v2.4.2"

// ContainerdVersion17 is the containerd 1.7 that hack/e2e-deps.sh installs:
// the newest 1.7 release, the oldest line with NRI.
const ContainerdVersion17 = "v1.7.35"

// ContainerdVersions are the versions hack/e2e-deps.sh installs and the
// end-to-end tests run against by default, in that order.
var ContainerdVersions = []string{ContainerdVersion, ContainerdVersion17}

// Namespace is the containerd namespace of CRI.
const Namespace = "k8s.io"

// Options configure Start.
type Options struct {
	// Version is the containerd to run, "v1.7.35" say. It picks BinDir when
	// that is empty, and the binaries found there must report it. Empty:
	// whatever version the binaries in BinDir are.
	Version string
	// BinDir holds containerd, ctr and containerd-shim-runc-v2 (default:
	// BinDir(Version), or DefaultBinDir() with no Version).
	BinDir string
	// Runc is the runc binary (default: runc on PATH, else /usr/sbin/runc).
	Runc string
	// Images are docker-archive tarballs imported into the k8s.io namespace.
	Images []string
	// SandboxImage is the pause image's reference; it must be in Images.
	SandboxImage string
	// NRIPlugins are pre-registered: containerd starts them itself.
	NRIPlugins []NRIPlugin
	// NRISocket is where containerd serves external NRI plugins (default:
	// Dir/nri/nri.sock). Set it when a plugin's configuration must name the
	// socket before containerd starts.
	NRISocket string
	// LogDir receives containerd's log and the NRI plugins' output (default:
	// Dir/logs). Set it to keep the logs after Close, which removes Dir.
	LogDir string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// PodAnnotations is the runc runtime's pod_annotations: pod annotations
	// matching these patterns are passed through to the containers' specs
	// (and so to NRI as container annotations).
	PodAnnotations []string
	// Validator turns on NRI's built-in default validator (containerd 2.x
	// only; Start refuses it for 1.x, whose NRI has none).
	Validator *Validator
	// CNI gives pods that are not on the host network a network: a bridge
	// (CNIBridge) with host-local addresses, from Debian's
	// containernetworking-plugins in CNIPluginDir. Without it only pods
	// on the host network start, and a kubelet reports its node's network
	// as not ready.
	CNI bool
}

// CNIPluginDir is where Debian's containernetworking-plugins installs the
// CNI plugins.
const CNIPluginDir = "/usr/lib/cni"

// CNIBridge is the bridge Options.CNI makes on the host; Close deletes it.
const CNIBridge = "nrivgpu-e2e0"

// cniConfig is the network of Options.CNI: pods get addresses on a bridge
// of their own, which holds the gateway address, so that the kubelet on the
// host reaches them (HTTP probes). No masquerading: no iptables rules to
// clean up, and no pod needs to reach beyond the host.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "nri-vgpu-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "` + CNIBridge + `",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.234.77.0/24"}]],
        "dataDir": "{{DIR}}/cni/ipam"
      }
    }
  ]
}
`

// cniWorks checks the capability Options.CNI uses: the bridge plugin runs
// and speaks CNI 1.0.0.
func cniWorks() error {
	cmd := exec.Command(filepath.Join(CNIPluginDir, "bridge"))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), `"1.0.0"`) {
		return fmt.Errorf("harness: %s/bridge does not speak CNI 1.0.0 (%v, %q): install containernetworking-plugins (hack/k8s-deps.sh does)", CNIPluginDir, err, out)
	}
	return nil
}

// Validator is the [default_validator] table of containerd's NRI config.
type Validator struct {
	RequiredPlugins           []string
	TolerateMissingAnnotation string
	// RejectUnconfinedSeccomp refuses seccomp adjustments of containers
	// without a seccomp profile (reject_unconfined_seccomp_adjustment).
	RejectUnconfinedSeccomp bool
}

// tomlStrings renders ss as a TOML array of basic strings.
func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// NRIPlugin is a plugin placed in containerd's NRI plugin directory.
type NRIPlugin struct {
	// Name is the file name in the plugin directory: "NN-name", where NN is
	// the plugin index.
	Name string
	// Path is the plugin binary.
	Path string
	// Env is added to the plugin's environment. containerd starts plugins
	// with nothing but NRI_PLUGIN_{NAME,IDX,SOCKET}; the plugin directory
	// gets a small wrapper script that sets Env and sends the plugin's
	// output to PluginLog(Name).
	Env []string
	// Config, when set, is written to the plugin config directory as
	// Name.conf; containerd hands it to the plugin in Configure.
	Config string
}

// Containerd is a running containerd with its CRI clients.
type Containerd struct {
	// Version is what the containerd binary reports ("v1.7.35"); it
	// decides the config's format.
	Version string
	// Dir is the temporary directory everything lives in.
	Dir        string
	Address    string // containerd's gRPC socket
	ConfigPath string
	LogPath    string // containerd's log
	NRISocket  string
	// NRIPluginDir and NRIConfigDir are containerd's plugin_path and
	// plugin_config_path.
	NRIPluginDir string
	NRIConfigDir string
	RuncRoot     string

	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient

	opts Options
	logf func(format string, args ...any)

	mu     sync.Mutex
	proc   *Process // containerd; nil when stopped
	conn   *grpc.ClientConn
	closed bool
}

// DefaultBinDir is BinDir(ContainerdVersion).
func DefaultBinDir() string { return BinDir(ContainerdVersion) }

// BinDir is where hack/e2e-deps.sh installs containerd version (its
// NRI_VGPU_E2E_CACHE, else /var/cache/nri-vgpu-e2e as root or
// ~/.cache/nri-vgpu-e2e, then containerd-<version>/bin); for
// ContainerdVersion, $NRI_VGPU_E2E_BIN comes first.
func BinDir(version string) string {
	if d := os.Getenv(EnvBinDir); d != "" && version == ContainerdVersion {
		return d
	}
	cache := os.Getenv("NRI_VGPU_E2E_CACHE")
	if cache == "" {
		if os.Geteuid() == 0 {
			cache = "/var/cache/nri-vgpu-e2e"
		} else if d, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(d, "nri-vgpu-e2e")
		}
	}
	return filepath.Join(cache, "containerd-"+version, "bin")
}

// SelectedContainerdVersions are the versions named in
// $NRI_VGPU_E2E_CONTAINERD (space- or comma-separated), else
// ContainerdVersions. Each must be a release with NRI: v1.7.x or v2.x.y.
func SelectedContainerdVersions() ([]string, error) {
	env := os.Getenv(EnvContainerdVersions)
	if strings.TrimSpace(env) == "" {
		return slices.Clone(ContainerdVersions), nil
	}
	var versions []string
	for _, v := range strings.FieldsFunc(env, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' }) {
		if _, err := parseVersion(v); err != nil {
			return nil, fmt.Errorf("harness: %s: %w", EnvContainerdVersions, err)
		}
		if !slices.Contains(versions, v) {
			versions = append(versions, v)
		}
	}
	return versions, nil
}

// version is a containerd release number.
type version struct{ major, minor, patch int }

// versionRE matches a release number, with or without its "v" and with any
// build suffix ("2.4.2+unknown", as `go install` builds report).
var versionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$`)

// parseVersion parses a containerd release number that has NRI (1.7 or
// newer).
func parseVersion(s string) (version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return version{}, fmt.Errorf("containerd version %q: want vMAJOR.MINOR.PATCH", s)
	}
	var v version
	v.major, _ = strconv.Atoi(m[1])
	v.minor, _ = strconv.Atoi(m[2])
	v.patch, _ = strconv.Atoi(m[3])
	if v.major < 1 || v.major == 1 && v.minor < 7 {
		return version{}, fmt.Errorf("containerd %s has no NRI: want v1.7 or newer", s)
	}
	return v, nil
}

func (v version) String() string { return fmt.Sprintf("v%d.%d.%d", v.major, v.minor, v.patch) }

// BinaryVersion is the version the containerd binary in binDir reports
// ("v1.7.35"), from `containerd --version`: "containerd <module> <version>
// <revision>".
func BinaryVersion(binDir string) (string, error) {
	bin := filepath.Join(binDir, "containerd")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("harness: %s --version: %w", bin, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "", fmt.Errorf("harness: %s --version printed %q, want \"containerd <module> <version> ...\"", bin, out)
	}
	v, err := parseVersion(fields[2])
	if err != nil {
		return "", fmt.Errorf("harness: %s: %w", bin, err)
	}
	return v.String(), nil
}

// Preflight reports what is missing to run containerd here, or nil.
func Preflight(binDir, runc string) error {
	var problems []string
	if os.Geteuid() != 0 {
		problems = append(problems, "must run as root")
	}
	for _, b := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			problems = append(problems, fmt.Sprintf("%s not found in %s", b, binDir))
		}
	}
	if _, err := os.Stat(runc); err != nil {
		problems = append(problems, fmt.Sprintf("runc not found (%s)", runc))
	}
	if len(problems) > 0 {
		return fmt.Errorf("harness: cannot run containerd: %s (hack/e2e-deps.sh installs what is missing)", strings.Join(problems, "; "))
	}
	return nil
}

// DefaultRunc is runc on PATH, else Debian's /usr/sbin/runc.
func DefaultRunc() string {
	if p, err := exec.LookPath("runc"); err == nil {
		return p
	}
	return "/usr/sbin/runc"
}

// Start creates a temporary root, writes containerd's config, pre-registers
// the NRI plugins, starts containerd, waits for CRI to answer and imports the
// images. On an error everything started so far is cleaned up.
func Start(ctx context.Context, opts Options) (*Containerd, error) {
	if opts.BinDir == "" {
		opts.BinDir = DefaultBinDir()
		if opts.Version != "" {
			opts.BinDir = BinDir(opts.Version)
		}
	}
	if opts.Runc == "" {
		opts.Runc = DefaultRunc()
	}
	if opts.SandboxImage == "" {
		return nil, errors.New("harness: Options.SandboxImage is required")
	}
	if err := Preflight(opts.BinDir, opts.Runc); err != nil {
		return nil, err
	}
	got, err := BinaryVersion(opts.BinDir)
	if err != nil {
		return nil, err
	}
	if opts.Version != "" && got != opts.Version {
		return nil, fmt.Errorf("harness: %s holds containerd %s, want %s (hack/e2e-deps.sh installs it)", opts.BinDir, got, opts.Version)
	}
	// A short path: unix socket paths are limited to 108 bytes, and
	// containerd nests sockets below its state directory.
	dir, err := MkdirTemp("ctd")
	if err != nil {
		return nil, err
	}
	c := &Containerd{
		Version:      got,
		Dir:          dir,
		Address:      filepath.Join(dir, "containerd.sock"),
		ConfigPath:   filepath.Join(dir, "config.toml"),
		LogPath:      filepath.Join(cmp.Or(opts.LogDir, filepath.Join(dir, "logs")), "containerd.log"),
		NRISocket:    filepath.Join(dir, "nri", "nri.sock"),
		NRIPluginDir: filepath.Join(dir, "nri", "plugins"),
		NRIConfigDir: filepath.Join(dir, "nri", "conf.d"),
		RuncRoot:     filepath.Join(dir, "runc"),
		opts:         opts,
		logf:         opts.Logf,
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	if opts.NRISocket != "" {
		c.NRISocket = opts.NRISocket
	}
	if err := c.setup(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	for _, img := range opts.Images {
		if err := c.Import(ctx, img); err != nil {
			return nil, errors.Join(err, c.Close())
		}
	}
	return c, nil
}

func (c *Containerd) setup() error {
	for _, d := range []string{"root", "state", "logs", "runc", "cni/bin", "cni/conf", "cdi", "opt",
		"nri/plugins", "nri/conf.d"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	if err := os.MkdirAll(c.logDir(), 0o755); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	tmpl, err := configTemplateFor(c.Version)
	if err != nil {
		return err
	}
	var cfg bytes.Buffer
	if c.opts.Validator != nil && strings.HasPrefix(c.Version, "v1.") {
		return fmt.Errorf("harness: containerd %s has no NRI validator", c.Version)
	}
	vars := map[string]string{
		"CNIBinDir":    filepath.Join(c.Dir, "cni/bin"),
		"Dir":          c.Dir,
		"Address":      c.Address,
		"Runc":         c.opts.Runc,
		"RuncRoot":     c.RuncRoot,
		"SandboxImage": c.opts.SandboxImage,
		"NRISocket":    c.NRISocket,
		"NRIPluginDir": c.NRIPluginDir,
		"NRIConfigDir": c.NRIConfigDir,
	}
	if len(c.opts.PodAnnotations) > 0 {
		vars["PodAnnotations"] = tomlStrings(c.opts.PodAnnotations)
	}
	if c.opts.CNI {
		if err := cniWorks(); err != nil {
			return err
		}
		vars["CNIBinDir"] = CNIPluginDir
		conf := strings.ReplaceAll(cniConfig, "{{DIR}}", c.Dir)
		if err := os.WriteFile(filepath.Join(c.Dir, "cni/conf/10-nri-vgpu-e2e.conflist"), []byte(conf), 0o644); err != nil {
			return fmt.Errorf("harness: %w", err)
		}
	}
	if v := c.opts.Validator; v != nil {
		vars["Validator"] = fmt.Sprintf("enable = true\n    required_plugins = %s\n    tolerate_missing_plugins_annotation = %s\n    reject_unconfined_seccomp_adjustment = %t",
			tomlStrings(v.RequiredPlugins), strconv.Quote(v.TolerateMissingAnnotation), v.RejectUnconfinedSeccomp)
	}
	if err := tmpl.Execute(&cfg, vars); err != nil {
		return fmt.Errorf("harness: containerd config: %w", err)
	}
	if err := os.WriteFile(c.ConfigPath, cfg.Bytes(), 0o644); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	for _, p := range c.opts.NRIPlugins {
		if err := c.installPlugin(p); err != nil {
			return err
		}
	}
	return nil
}

// installPlugin writes the wrapper script that containerd starts as the
// plugin.
func (c *Containerd) installPlugin(p NRIPlugin) error {
	idx, base, ok := strings.Cut(p.Name, "-")
	if !ok || len(idx) != 2 || !isDigit(idx[0]) || !isDigit(idx[1]) || base == "" {
		return fmt.Errorf("harness: NRI plugin name %q: want NN-name", p.Name)
	}
	if _, err := os.Stat(p.Path); err != nil {
		return fmt.Errorf("harness: NRI plugin %s: %w", p.Name, err)
	}
	var script strings.Builder
	script.WriteString("#!/bin/sh\n# Started by containerd as NRI plugin " + p.Name + ".\n")
	for _, kv := range p.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("harness: NRI plugin %s: env entry %q is not KEY=value", p.Name, kv)
		}
		fmt.Fprintf(&script, "export %s=%s\n", k, shellQuote(v))
	}
	fmt.Fprintf(&script, "exec %s \"$@\" >>%s 2>&1\n", shellQuote(p.Path), shellQuote(c.PluginLog(p.Name)))
	if err := os.WriteFile(filepath.Join(c.NRIPluginDir, p.Name), []byte(script.String()), 0o755); err != nil {
		return fmt.Errorf("harness: NRI plugin %s: %w", p.Name, err)
	}
	if p.Config != "" {
		if err := os.WriteFile(filepath.Join(c.NRIConfigDir, p.Name+".conf"), []byte(p.Config), 0o644); err != nil {
			return fmt.Errorf("harness: NRI plugin %s config: %w", p.Name, err)
		}
	}
	return nil
}

// PluginLog is where the output of the pre-registered NRI plugin name goes.
func (c *Containerd) PluginLog(name string) string {
	return filepath.Join(c.logDir(), "nri-"+name+".log")
}

// logDir is Options.LogDir, else Dir/logs.
func (c *Containerd) logDir() string {
	return cmp.Or(c.opts.LogDir, filepath.Join(c.Dir, "logs"))
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// start runs containerd and waits until CRI answers.
func (c *Containerd) start(ctx context.Context) error {
	cmd := exec.Command(filepath.Join(c.opts.BinDir, "containerd"), "--config", c.ConfigPath)
	// The shim is looked up on PATH; runc is named in the config.
	cmd.Env = append(os.Environ(), "PATH="+c.opts.BinDir+":"+os.Getenv("PATH"))
	// A process group of its own (StartProcess), so that a Ctrl-C of the
	// test does not reach it before Close has removed the pods.
	proc, err := StartProcess(cmd, c.LogPath)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.proc = proc
	c.mu.Unlock()
	c.logf("containerd %s started (pid %d, root %s)", c.Version, proc.Pid(), c.Dir)

	conn, err := grpc.NewClient("unix://"+c.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("harness: CRI client: %w", err)
	}
	c.mu.Lock()
	c.conn = conn
	c.Runtime = runtimeapi.NewRuntimeServiceClient(conn)
	c.Images = runtimeapi.NewImageServiceClient(conn)
	c.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.Runtime.Version(vctx, &runtimeapi.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-proc.Exited():
			return fmt.Errorf("harness: containerd exited during start-up: %s", c.LogTail(30))
		case <-ctx.Done():
			return fmt.Errorf("harness: waiting for CRI: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("harness: CRI did not answer within 60s (last error: %v): %s", err, c.LogTail(30))
		}
	}
}

// stop ends containerd (SIGTERM, SIGKILL after 15 s) without touching the
// containers, which outlive it as they do in production.
func (c *Containerd) stop() error {
	c.mu.Lock()
	proc, conn := c.proc, c.conn
	c.proc, c.conn = nil, nil
	c.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	if proc == nil {
		return nil
	}
	err := proc.Stop(15 * time.Second)
	c.logf("containerd stopped")
	return err
}

// Restart stops containerd and starts it again on the same root and config;
// containers keep running, pre-registered NRI plugins are started again by
// containerd, and the CRI clients are replaced.
func (c *Containerd) Restart(ctx context.Context) error {
	if err := c.stop(); err != nil {
		return err
	}
	return c.start(ctx)
}

// Alive reports whether the containerd process is running.
func (c *Containerd) Alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return false
	}
	select {
	case <-c.proc.Exited():
		return false
	default:
		return true
	}
}

// Import loads a docker-archive tarball into the k8s.io namespace with ctr.
func (c *Containerd) Import(ctx context.Context, tarball string) error {
	out, err := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, "ctr"),
		"--address", c.Address, "--namespace", Namespace, "images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("harness: ctr images import %s: %w: %s", tarball, err, strings.TrimSpace(string(out)))
	}
	c.logf("imported %s", filepath.Base(tarball))
	return nil
}

// LogTail returns the last n lines of containerd's log.
func (c *Containerd) LogTail(n int) string { return Tail(c.LogPath, n) }

// Tail returns the last n lines of the file at path (or why it cannot).
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return TailLines(string(data), n)
}

// TailLines returns the last n lines of s.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ExecResult is the outcome of a command run in a container.
type ExecResult struct {
	Stdout, Stderr string
	ExitCode       int32
}

// Exec runs cmd in the container through CRI ExecSync (30 s limit). A
// non-zero exit is not an error: check ExitCode.
func (c *Containerd) Exec(ctx context.Context, containerID string, cmd ...string) (ExecResult, error) {
	resp, err := c.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: cmd, Timeout: 30})
	if err != nil {
		return ExecResult{}, fmt.Errorf("harness: exec %q in %.12s: %w", cmd, containerID, err)
	}
	return ExecResult{Stdout: string(resp.Stdout), Stderr: string(resp.Stderr), ExitCode: resp.ExitCode}, nil
}

// RemoveAllPods stops and removes every pod sandbox (and so its containers)
// that containerd knows.
func (c *Containerd) RemoveAllPods(ctx context.Context) error {
	resp, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("harness: listing pods: %w", err)
	}
	var errs []error
	for _, sb := range resp.Items {
		if _, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping pod %s: %w", sb.Metadata.GetName(), err))
		}
		if _, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing pod %s: %w", sb.Metadata.GetName(), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	return nil
}

// Close tears everything down and removes Dir; see the package comment. It
// returns every problem it met but always goes to the end.
func (c *Containerd) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if c.Alive() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := c.RemoveAllPods(ctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	if err := c.stop(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.killLeftovers()...)
	if err := mountinfo.UnmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	}
	if c.opts.CNI {
		errs = append(errs, deleteBridge())
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("harness: removing %s: %w", c.Dir, err))
	}
	return errors.Join(errs...)
}

// deleteBridge deletes CNIBridge, which the bridge plugin leaves behind.
func deleteBridge() error {
	if _, err := os.Stat("/sys/class/net/" + CNIBridge); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", CNIBridge).CombinedOutput(); err != nil {
		return fmt.Errorf("harness: ip link delete %s: %w: %s", CNIBridge, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// killLeftovers force-deletes containers runc still has under our root and
// kills the shims serving our containerd: both outlive containerd, and a
// failed test may leave some behind.
func (c *Containerd) killLeftovers() []error {
	var errs []error
	if out, err := exec.Command(c.opts.Runc, "--root", c.RuncRoot+"/"+Namespace, "list", "-q").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			if o, err := exec.Command(c.opts.Runc, "--root", c.RuncRoot+"/"+Namespace, "delete", "--force", id).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("harness: runc delete --force %s: %w: %s", id, err, strings.TrimSpace(string(o))))
			}
		}
	}
	for _, sh := range shimsOf(c.Address) {
		if err := syscall.Kill(sh.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("harness: killing shim %d: %w", sh.pid, err))
		}
		if err := removeShimSocket(sh.socket); err != nil {
			errs = append(errs, err)
		}
	}
	// A shim that died already cannot have removed its socket either; each
	// task's bundle names it, in bootstrap.json (containerd 2.x) or in a
	// file "address" (1.7).
	bundles := filepath.Join(c.Dir, "state", "io.containerd.runtime.v2.task", "*", "*")
	files, _ := filepath.Glob(filepath.Join(bundles, "bootstrap.json"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var bootstrap struct {
			Address string `json:"address"`
		}
		if json.Unmarshal(raw, &bootstrap) != nil {
			continue
		}
		if err := removeShimSocket(strings.TrimPrefix(bootstrap.Address, "unix://")); err != nil {
			errs = append(errs, err)
		}
	}
	files, _ = filepath.Glob(filepath.Join(bundles, "address"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if err := removeShimSocket(strings.TrimPrefix(strings.TrimSpace(string(raw)), "unix://")); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// shimProcess is a containerd-shim-runc-v2 process and its socket.
type shimProcess struct {
	pid    int
	socket string
}

// shimsOf finds the containerd-shim-runc-v2 processes started for the
// containerd at address (their command line names it), with the socket each
// serves: /run/containerd/s/<sha256 of address/namespace/id>, as the shim
// names it.
func shimsOf(address string) []shimProcess {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var shims []shimProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		flags := map[string]string{}
		for i := 1; i+1 < len(args); i++ {
			if strings.HasPrefix(args[i], "-") {
				flags[strings.TrimLeft(args[i], "-")] = args[i+1]
			}
		}
		if flags["address"] != address {
			continue
		}
		sp := shimProcess{pid: pid}
		if flags["namespace"] != "" && flags["id"] != "" {
			sum := sha256.Sum256([]byte(filepath.Join(address, flags["namespace"], flags["id"])))
			sp.socket = filepath.Join(shimSocketDir, hex.EncodeToString(sum[:]))
		}
		shims = append(shims, sp)
	}
	return shims
}

// shimSocketDir is where shims put their sockets, whatever containerd's
// config says.
const shimSocketDir = "/run/containerd/s"

// removeShimSocket removes a socket file a killed shim left in shimSocketDir.
func removeShimSocket(sock string) error {
	if filepath.Dir(sock) != shimSocketDir {
		return nil
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return nil
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("harness: removing shim socket %s: %w", sock, err)
	}
	return nil
}

// configTemplateFor picks the config template for containerd version:
// config version 2 with the CRI plugin of 1.7 for 1.x, version 3 with the
// split CRI plugins of 2.x otherwise.
func configTemplateFor(v string) (*template.Template, error) {
	parsed, err := parseVersion(v)
	if err != nil {
		return nil, fmt.Errorf("harness: containerd config: %w", err)
	}
	if parsed.major == 1 {
		return configTemplate17, nil
	}
	return configTemplate, nil
}

// configShared holds what the configs of both containerd lines say alike,
// as templates they include: the daemon's own paths and sockets, the
// options of the runc runtime, and the keys of the NRI table (whose plugin
// ID is the same in both). Settings changed here reach both lines.
var configShared = template.Must(template.New("shared").Parse(`{{define "daemon"}}root = "{{.Dir}}/root"
state = "{{.Dir}}/state"

[grpc]
  address = "{{.Address}}"

[ttrpc]
  address = "{{.Address}}.ttrpc"

[debug]
  level = "debug"
{{end}}{{define "runc"}}{{with .PodAnnotations}}      pod_annotations = {{.}}
{{end}}{{end}}{{define "runc options"}}        BinaryName = "{{.Runc}}"
        Root = "{{.RuncRoot}}"
        SystemdCgroup = false
{{end}}{{define "nri"}}  disable = false
  socket_path = "{{.NRISocket}}"
  plugin_path = "{{.NRIPluginDir}}"
  plugin_config_path = "{{.NRIConfigDir}}"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "5s"
{{with .Validator}}  [plugins.'io.containerd.nri.v1.nri'.default_validator]
    {{.}}
{{end}}{{end}}`))

// withShared parses text as a template that may include configShared's.
func withShared(name, text string) *template.Template {
	return template.Must(template.Must(configShared.Clone()).New(name).Parse(text))
}

// configTemplate is containerd 2.x's config (version 3). Settings this needs on
// a root-without-CAP_SYS_RESOURCE, cgroup v1, no-AppArmor machine:
// restrict_oom_score_adj (else every sandbox fails on oom_score_adj),
// disable_apparmor, cgroupfs (no systemd), runc state under our root, a
// locally imported pause image, and NRI on with its socket, plugin and
// config directories in our root. CNI and CDI point at empty directories so
// that nothing of the host's leaks in; pods use the host network.
var configTemplate = withShared("config", `version = 3
{{template "daemon" .}}
[plugins.'io.containerd.internal.v1.opt']
  path = "{{.Dir}}/opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{{.SandboxImage}}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_cdi = true
  cdi_spec_dirs = ["{{.Dir}}/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{{.CNIBinDir}}"]
    conf_dir = "{{.Dir}}/cni/conf"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{{template "runc" .}}      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
{{template "runc options" .}}
[plugins.'io.containerd.nri.v1.nri']
{{template "nri" .}}`)

// configTemplate17 is containerd 1.7's config (version 2): the settings of
// configTemplate under 1.7's single CRI plugin, io.containerd.grpc.v1.cri,
// where the sandbox image is sandbox_image and the snapshotter belongs to
// the containerd table. NRI is off by default in 1.7; disable = false
// turns it on.
var configTemplate17 = withShared("config17", `version = 2
{{template "daemon" .}}
[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  sandbox_image = "{{.SandboxImage}}"
  enable_cdi = true
  cdi_spec_dirs = ["{{.Dir}}/cdi"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{.CNIBinDir}}"
    conf_dir = "{{.Dir}}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{{template "runc" .}}      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
{{template "runc options" .}}
[plugins."io.containerd.nri.v1.nri"]
{{template "nri" .}}`)
