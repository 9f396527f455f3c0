package ociruntime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/admission"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate/hoststatetest"
	"github.com/nri-vgpu/nri-vgpu/internal/pin/pintest"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci/ocitest"
)

// envMain makes the test binary act as nri-vgpu-runtime, so that the
// subprocess tests run the real Main with the real syscall.Exec.
const envMain = "OCIRUNTIME_TEST_AS_WRAPPER"

func TestMain(m *testing.M) {
	if os.Getenv(envMain) == "1" {
		os.Exit(Main(os.Args, os.Stderr))
	}
	os.Exit(m.Run())
}

// fakeRuntime is the next runtime of the tests: it records its argv, one
// argument per line, and the spec it was handed ($FAKE_RUNTIME_SPEC), into
// $FAKE_RUNTIME_RECORD, then exits with $FAKE_RUNTIME_EXIT (default 0).
const fakeRuntime = `#!/bin/sh
rec=${FAKE_RUNTIME_RECORD:?}
printf '%s\n' "$0" "$@" > "$rec/argv"
if [ -n "$FAKE_RUNTIME_SPEC" ] && [ -f "$FAKE_RUNTIME_SPEC" ]; then
	cp "$FAKE_RUNTIME_SPEC" "$rec/config.json"
fi
exit "${FAKE_RUNTIME_EXIT:-0}"
`

// testEnv is a node: fake device nodes, two simulated GPUs (16 and 8 GiB),
// run and state directories, a shim file, the config as a file, and the
// fake next runtime in its own PATH directory.
type testEnv struct {
	cfg     *config.Config
	cfgPath string
	devRoot string // holds the fake device nodes
	binDir  string // holds fake-runc
	next    string // binDir/fake-runc
}

func newTestEnv(t *testing.T, injection string) *testEnv {
	t.Helper()
	devRoot := ocitest.FakeDevRoot(t, ocitest.StandardNodes)
	dir := hoststatetest.RunDir(t) // holds run_dir
	binDir := filepath.Join(dir, "bin")
	for _, d := range []string{binDir, filepath.Join(dir, "cdi")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	next := filepath.Join(binDir, "fake-runc")
	if err := os.WriteFile(next, []byte(fakeRuntime), 0o755); err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(dir, "libvgpu-shim.so")
	if err := os.WriteFile(shim, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf(`
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = %q
name = "Sim"
memory = "16GiB"
minor = 0
[[gpu.simulated]]
uuid = %q
name = "Sim"
memory = "8GiB"
minor = 1

[driver]
injection = %q
dev_root = %q
cdi_dirs = [%q]

[paths]
state_dir = %q
run_dir = %q
shim_path = %q

[runtime]
next = ["not-installed-runtime", "fake-runc"]
`, uuid0, uuid1, injection, devRoot, filepath.Join(dir, "cdi"), filepath.Join(dir, "state"), filepath.Join(dir, "run"), shim)
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{cfg: cfg, cfgPath: cfgPath, devRoot: devRoot, binDir: binDir, next: next}
}

// baseSpec is a container spec shaped like Docker's.
func baseSpec(env ...string) *specs.Spec {
	mode := os.FileMode(0o666)
	return &specs.Spec{
		Version: "1.0.2-dev",
		Process: &specs.Process{
			Args: []string{"sh"},
			Env:  append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=0123456789ab"}, env...),
			Cwd:  "/",
		},
		Root:     &specs.Root{Path: "/var/lib/docker/rootfs"},
		Hostname: "0123456789ab",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229, FileMode: &mode}},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"},
				{Allow: true, Type: "c", Access: "m"},
			}},
			// Docker's default profile, in short: chroot allowed, clone
			// without namespace flags, clone3 ENOSYS.
			Seccomp: &specs.LinuxSeccomp{
				DefaultAction:   specs.ActErrno,
				DefaultErrnoRet: uintp(1),
				Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
				Syscalls: []specs.LinuxSyscall{
					{Names: []string{"read", "chroot", "write"}, Action: specs.ActAllow},
					{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 2114060288, Op: specs.OpMaskedEqual}}},
					{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: uintp(38)},
				},
			},
		},
	}
}

func uintp(v uint) *uint { return &v }

// writeBundle writes spec as <new dir>/config.json with mode 0600 (Docker
// writes 0644; a different mode shows that it is preserved) and returns the
// bundle directory and the file's bytes.
func writeBundle(t *testing.T, spec *specs.Spec) (string, []byte) {
	t.Helper()
	bundle := t.TempDir()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, SpecFileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return bundle, data
}

// execRecord is what the stubbed exec (or spawn) saw.
type execRecord struct {
	called  bool
	spawned bool // run as a child rather than exec'd
	path    string
	argv    []string
	spec    []byte // the bundle's config.json at the time of the exec
	// status is the exit status the stubbed spawn returns, and onSpawn
	// what the child does besides (e.g. remove its state directory).
	status  int
	onSpawn func()
}

// wrapper returns an in-process wrapper over e whose exec records instead
// of replacing the test process; specPath is read at exec time.
func (e *testEnv) wrapper(rec *execRecord, specPath string) *Wrapper {
	return &Wrapper{
		Config: e.cfg,
		Path:   e.binDir + ":/usr/bin:/bin",
		Self:   "/nonexistent/nri-vgpu-runtime",
		Now:    func() time.Time { return time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC) },
		Stdout: io.Discard,
		Exec: func(path string, argv, _ []string) error {
			rec.called, rec.path, rec.argv = true, path, argv
			if specPath != "" {
				rec.spec, _ = os.ReadFile(specPath)
			}
			return nil
		},
		Spawn: func(path string, argv, _ []string) (int, error) {
			rec.called, rec.spawned, rec.path, rec.argv = true, true, path, argv
			if rec.onSpawn != nil {
				rec.onSpawn()
			}
			return rec.status, nil
		},
	}
}

const ctrID = "a2fba5934a2e447f1a513088e8841cdf66caa93945ebbe6f5b7aef5961a7a471"

// vgpuSpec is the config.json the next runtime must read for a container
// with env holding the GPUs of the given minors: baseSpec(env...) with the
// Contract 3 edits written out by hand. NVIDIA_VISIBLE_DEVICES becomes
// visible in place; the control, UVM and GPU nodes are appended (type, mode
// and owner of the fake host nodes) with an rwm allow rule each; the shim,
// preload, limits and region bind mounts join the base mounts, all ordered
// by depth, then destination, as runtimes sort them.
func vgpuSpec(t *testing.T, e *testEnv, self string, env []string, visible string, minors ...int64) []byte {
	t.Helper()
	s := baseSpec(env...)
	for i, kv := range s.Process.Env {
		if strings.HasPrefix(kv, oci.EnvVisibleDevices+"=") {
			s.Process.Env[i] = oci.EnvVisibleDevices + "=" + visible
		}
	}
	type node struct {
		path         string
		major, minor int64
	}
	nodes := []node{{"/dev/nvidiactl", 195, 255}, {"/dev/nvidia-uvm", ocitest.UVMMajor, 0}, {"/dev/nvidia-uvm-tools", ocitest.UVMMajor, 1}}
	for _, m := range minors {
		nodes = append(nodes, node{fmt.Sprintf("/dev/nvidia%d", m), 195, m})
	}
	for _, n := range nodes {
		fi, err := os.Stat(filepath.Join(e.devRoot, n.path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		mode, uid, gid := fi.Mode().Perm(), st.Uid, st.Gid
		major, minor := n.major, n.minor
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: n.path, Type: "c", Major: major, Minor: minor, FileMode: &mode, UID: &uid, GID: &gid})
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"})
	}
	// The confinement: chroot leaves the allow rule and falls to Docker's
	// default (EPERM); the rest is Docker's.
	s.Linux.Seccomp.Syscalls[0].Names = []string{"read", "write"}
	dir := filepath.Join(e.cfg.Paths.RunDir, "containers", ctrID)
	proc, dev := s.Mounts[0], s.Mounts[1]
	s.Mounts = []specs.Mount{
		dev, proc,
		{Destination: "/etc/ld.so.preload", Type: "bind", Source: filepath.Join(e.cfg.Paths.RunDir, "ld.so.preload"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Destination: "/run/nri-vgpu/ledger", Type: "bind", Source: filepath.Join(dir, "ledger"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Destination: "/run/nri-vgpu/limits", Type: "bind", Source: filepath.Join(dir, "limits"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Destination: "/run/nri-vgpu/region", Type: "bind", Source: filepath.Join(dir, "region"), Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Destination: "/usr/local/nri-vgpu/libvgpu-shim.so", Type: "bind", Source: e.cfg.Paths.ShimPath, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
	}
	// The pin hook, run by the wrapper's own binary.
	timeout := 10
	s.Hooks = &specs.Hooks{CreateContainer: []specs.Hook{{Path: self, Args: []string{self, "hook", "pin"}, Timeout: &timeout}}}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// readRecord returns the admission record's content, read under its lock. The
// sentinel error keeps Update from writing the content back.
func readRecord(t *testing.T, e *testEnv) *admission.State {
	t.Helper()
	errRead := errors.New("read only")
	var s *admission.State
	if err := admission.New(e.cfg.Paths.StateDir).Update(func(st *admission.State) error { s = st; return errRead }); !errors.Is(err, errRead) {
		t.Fatalf("reading the admission record: %v", err)
	}
	return s
}

func TestCreate(t *testing.T) {
	argvForms := []struct {
		name string
		argv func(bundle string) []string
		root string
	}{
		{"docker", func(b string) []string {
			return []string{"--root", "/run/docker/runtime-runc/moby", "--log", filepath.Join(b, "log.json"), "--log-format", "json",
				"create", "--bundle", b, "--pid-file", filepath.Join(b, "init.pid"), ctrID}
		}, "/run/docker/runtime-runc/moby"},
		{"--bundle=", func(b string) []string { return []string{"--systemd-cgroup", "create", "--bundle=" + b, ctrID} }, ""},
		{"-b", func(b string) []string {
			return []string{"create", "--console-socket", "/s.sock", "-b", b, "--no-pivot", ctrID}
		}, ""},
		{"-b=", func(b string) []string { return []string{"--root=/r", "create", "-b=" + b, ctrID} }, "/r"},
		{"working directory", func(string) []string { return []string{"create", "--pid-file", "init.pid", ctrID} }, ""},
	}
	// GPU 0 has 16 GiB, GPU 1 8 GiB (newTestEnv).
	requests := []struct {
		name      string
		injection string
		env       []string
		visible   string  // NVIDIA_VISIBLE_DEVICES the next runtime sees
		minors    []int64 // /dev/nvidia<minor> nodes the container gets
		want      []limits.GPULimit
	}{
		{
			name:      "memory on GPU 0",
			injection: "none",
			env:       []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"},
			visible:   "void",
			minors:    []int64{0},
			want:      []limits.GPULimit{{UUID: uuid0, Memory: 1073741824, Cores: 100}}, // 1 GiB; no cores asked: 100
		},
		{
			name:      "whole GPU by UUID for nvidia-container-runtime",
			injection: "nvidia-runtime",
			env:       []string{"NVIDIA_VISIBLE_DEVICES=" + uuid1},
			visible:   uuid1,
			minors:    []int64{1},
			want:      []limits.GPULimit{{UUID: uuid1, Memory: 8589934592, Cores: 100}}, // all of GPU 1: 8 GiB
		},
		{
			// No CDI spec in cdi_dirs: auto falls back to nvidia-runtime.
			name:      "all GPUs, a share of each",
			injection: "auto",
			env:       []string{"NVIDIA_VISIBLE_DEVICES=all", "NRI_VGPU_MEMORY=50%", "NRI_VGPU_CORES=30%"},
			visible:   uuid0 + "," + uuid1,
			minors:    []int64{0, 1},
			want: []limits.GPULimit{
				{UUID: uuid0, Memory: 8589934592, Cores: 30}, // 50 % of 16 GiB = 8 GiB
				{UUID: uuid1, Memory: 4294967296, Cores: 30}, // 50 % of 8 GiB = 4 GiB
			},
		},
	}
	for _, form := range argvForms {
		for _, r := range requests {
			t.Run(form.name+"/"+r.name, func(t *testing.T) {
				e := newTestEnv(t, r.injection)
				bundle, _ := writeBundle(t, baseSpec(r.env...))
				specPath := filepath.Join(bundle, SpecFileName)
				if form.name == "working directory" {
					t.Chdir(bundle)
				}
				argv := append([]string{"/usr/bin/nri-vgpu-runtime"}, form.argv(bundle)...)
				var rec execRecord
				if err := e.wrapper(&rec, specPath).Run(ParseArgs(argv)); err != nil {
					t.Fatalf("Run: %v", err)
				}

				// The next runtime gets the command line untouched.
				if rec.path != e.next || !slices.Equal(rec.argv, append([]string{e.next}, argv[1:]...)) {
					t.Errorf("exec %s %q, want %s with the arguments unchanged", rec.path, rec.argv, e.next)
				}
				// The spec it reads is the original with the vGPU edits.
				if want := vgpuSpec(t, e, "/nonexistent/nri-vgpu-runtime", r.env, r.visible, r.minors...); !bytes.Equal(rec.spec, want) {
					t.Errorf("spec seen by the next runtime\n got %s\nwant %s", rec.spec, want)
				}
				if st, err := os.Stat(specPath); err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("config.json mode changed: %v %v", st.Mode(), err)
				}

				dir := hoststate.ContainerDir(e.cfg, ctrID)
				data, err := os.ReadFile(filepath.Join(dir, hoststate.LimitsFileName))
				if err != nil {
					t.Fatal(err)
				}
				lf, err := limits.ParseLimits(data)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(lf.GPUs, r.want) {
					t.Errorf("limits %+v, want %+v", lf.GPUs, r.want)
				}
				if st, err := os.Stat(filepath.Join(dir, hoststate.RegionDirName)); err != nil || st.Mode().Perm() != 0o777 {
					t.Errorf("region directory: %v %v", st, err)
				}
				info, err := hoststate.New(e.cfg).Info(ctrID)
				if err != nil || info.Source != hoststate.SourceRuntime || info.ID != ctrID {
					t.Errorf("container.json %+v: %v", info, err)
				}
				entry := readRecord(t, e).Containers[ctrID]
				if entry == nil || entry.RuntimeRoot != form.root || entry.Source != hoststate.SourceRuntime || len(entry.GPUs) != len(r.want) {
					t.Errorf("admission entry %+v", entry)
				}
			})
		}
	}
}

// TestCreateWithoutRequest checks that a container asking for no GPU is
// left exactly as it is, and nothing is recorded for it.
func TestCreateWithoutRequest(t *testing.T) {
	for _, env := range [][]string{nil, {"NVIDIA_VISIBLE_DEVICES=void"}, {"NVIDIA_VISIBLE_DEVICES=none"}, {"NVIDIA_VISIBLE_DEVICES="}} {
		t.Run(fmt.Sprint(env), func(t *testing.T) {
			e := newTestEnv(t, "none")
			bundle, orig := writeBundle(t, baseSpec(env...))
			specPath := filepath.Join(bundle, SpecFileName)
			argv := []string{"nri-vgpu-runtime", "create", "--bundle", bundle, ctrID}
			var rec execRecord
			if err := e.wrapper(&rec, specPath).Run(ParseArgs(argv)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rec.spec, orig) {
				t.Errorf("spec changed:\n%s\nwas\n%s", rec.spec, orig)
			}
			if !slices.Equal(rec.argv[1:], argv[1:]) {
				t.Errorf("argv %q", rec.argv)
			}
			if _, err := os.Stat(hoststate.ContainerDir(e.cfg, ctrID)); !os.IsNotExist(err) {
				t.Errorf("container directory made for a container without GPUs: %v", err)
			}
		})
	}
}

// TestCreateRefused checks requests that must fail: the message names the
// variable or says what is free, the next runtime is not run, the bundle
// is untouched and nothing is left on the host.
func TestCreateRefused(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"bad memory", []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=lots"}, `NRI_VGPU_MEMORY="lots": invalid memory quantity`},
		{"bad cores", []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_CORES=0"}, `NRI_VGPU_CORES="0"`},
		{"unknown GPU", []string{"NVIDIA_VISIBLE_DEVICES=2"}, `NVIDIA_VISIBLE_DEVICES="2": no GPU "2" on this node`},
		{"quota without GPU", []string{"NRI_VGPU_MEMORY=1GiB"}, `NRI_VGPU_MEMORY="1GiB": NVIDIA_VISIBLE_DEVICES names no GPU`},
		{"more than the GPU", []string{"NVIDIA_VISIBLE_DEVICES=1", "NRI_VGPU_MEMORY=9GiB"}, `NRI_VGPU_MEMORY="9GiB": more than GPU 1`},
		{"oversubscribed", []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=8GiB"},
			"not enough GPU capacity left: GPU 0 (" + uuid0 + "): 6GiB of 16GiB memory and 100% of cores free; asked for 8GiB (1 other container holds the rest)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, "none")
			// Another container holds 10GiB of GPU 0.
			holder, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=10GiB"))
			var rec execRecord
			if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", holder, "holder"})); err != nil {
				t.Fatal(err)
			}

			bundle, orig := writeBundle(t, baseSpec(tt.env...))
			rec = execRecord{}
			err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID}))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Run error\n got %v\nwant one containing %q", err, tt.want)
			}
			if rec.called {
				t.Error("the next runtime was run for a refused container")
			}
			if data, _ := os.ReadFile(filepath.Join(bundle, SpecFileName)); !bytes.Equal(data, orig) {
				t.Error("the bundle of a refused container was changed")
			}
			if _, err := os.Stat(hoststate.ContainerDir(e.cfg, ctrID)); !os.IsNotExist(err) {
				t.Errorf("container directory left for a refused container: %v", err)
			}
			if got := readRecord(t, e).IDs(); !slices.Equal(got, []string{"holder"}) {
				t.Errorf("admission record holds %v, want only the holder", got)
			}
		})
	}
}

// TestDeleteReleases checks that delete frees what create reserved, so that
// the same request fits again, and passes the command line on.
func TestDeleteReleases(t *testing.T) {
	e := newTestEnv(t, "none")
	env := []string{"NVIDIA_VISIBLE_DEVICES=1", "NRI_VGPU_MEMORY=6GiB", "NRI_VGPU_CORES=60"}
	create := func(id string) error {
		bundle, _ := writeBundle(t, baseSpec(env...))
		var rec execRecord
		return e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, id}))
	}
	if err := create("first"); err != nil {
		t.Fatal(err)
	}
	var over *admission.OversubscribedError
	if err := create("second"); !errors.As(err, &over) {
		t.Fatalf("second create while the first holds the GPU: %v", err)
	}
	argv := []string{"x", "--root", "/r", "delete", "--force", "first"}
	var rec execRecord
	if err := e.wrapper(&rec, "").Run(ParseArgs(argv)); err != nil {
		t.Fatal(err)
	}
	if !rec.spawned || !slices.Equal(rec.argv, append([]string{e.next}, argv[1:]...)) {
		t.Errorf("delete ran %q (as a child: %v), want the next runtime as a child with the arguments unchanged", rec.argv, rec.spawned)
	}
	if _, err := os.Stat(hoststate.ContainerDir(e.cfg, "first")); !os.IsNotExist(err) {
		t.Errorf("container directory after delete: %v", err)
	}
	if err := create("second"); err != nil {
		t.Fatalf("create after the holder's delete: %v", err)
	}
}

// TestDeleteRefused checks that a container is released only when the next
// runtime deleted it: a refused delete (a running container without
// --force) leaves it counted, with its host directory, and the wrapper
// exits with the runtime's status.
func TestDeleteRefused(t *testing.T) {
	tests := []struct {
		name      string
		root      bool // pass --root
		status    int
		stateGone bool // the runtime's <root>/<id> is gone after the delete
		released  bool
	}{
		{name: "deleted", root: true, status: 0, released: true},
		{name: "deleted, state gone", root: true, status: 0, stateGone: true, released: true},
		{name: "refused, still running", root: true, status: 1},
		{name: "failed, state gone", root: true, status: 1, stateGone: true, released: true},
		{name: "failed without --root", status: 1},
		{name: "killed by a signal", root: true, status: 137},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, "none")
			root := t.TempDir()
			bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=2GiB"))
			var rec execRecord
			if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "--root", root, "create", "--bundle", bundle, ctrID})); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(root, ctrID) // what the runtime made at create
			if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}

			argv := []string{"x", "delete", ctrID}
			if tt.root {
				argv = []string{"x", "--root", root, "delete", ctrID}
			}
			rec = execRecord{status: tt.status, onSpawn: func() {
				if tt.stateGone {
					_ = os.Remove(state)
				}
			}}
			err := e.wrapper(&rec, "").Run(ParseArgs(argv))
			var exit *ExitStatusError
			switch {
			case tt.status == 0 && err != nil:
				t.Fatalf("Run: %v", err)
			case tt.status != 0 && (!errors.As(err, &exit) || exit.Status != tt.status):
				t.Fatalf("Run error %v, want exit status %d", err, tt.status)
			}
			if !rec.spawned {
				t.Fatal("the next runtime's delete was exec'd: the wrapper cannot see its result")
			}
			_, statErr := os.Stat(hoststate.ContainerDir(e.cfg, ctrID))
			s := readRecord(t, e)
			if tt.released {
				if !os.IsNotExist(statErr) || len(s.Containers) != 0 {
					t.Errorf("container not released: directory %v, admission record %v", statErr, s.IDs())
				}
			} else if statErr != nil || s.Containers[ctrID] == nil {
				t.Errorf("a container the runtime did not delete was released: directory %v, admission record %v", statErr, s.IDs())
			}
		})
	}
}

// TestDeleteLeavesOthers checks that delete does not touch what it did not
// prepare: a container directory of the NRI plugin, or nothing at all.
func TestDeleteLeavesOthers(t *testing.T) {
	e := newTestEnv(t, "none")
	info := &hoststate.Info{ID: "nri-ctr", AllocationID: "00112233445566778899aabbccddeeff", Source: "nri",
		GPUs: []allocation.GPU{{UUID: uuid0, Slices: 1, Memory: 1 << 30, Cores: 10}}}
	if _, err := hoststate.New(e.cfg).Provision(info, &limits.LimitsFile{GPUs: []limits.GPULimit{{UUID: uuid0, Memory: 1 << 30, Cores: 10}}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"nri-ctr", "never-created", "../escape"} {
		var rec execRecord
		if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "delete", id})); err != nil || !rec.called || rec.spawned {
			t.Fatalf("delete %s: %v (exec'd: %v, as a child: %v)", id, err, rec.called, rec.spawned)
		}
	}
	if _, err := os.Stat(hoststate.ContainerDir(e.cfg, "nri-ctr")); err != nil {
		t.Errorf("the NRI plugin's directory was removed: %v", err)
	}
}

// TestPassThrough checks that verbs other than create and delete reach the
// next runtime with their arguments untouched and touch nothing.
func TestPassThrough(t *testing.T) {
	e := newTestEnv(t, "none")
	for _, args := range [][]string{
		{"--root", "/r", "--log", "/nonexistent/log.json", "--log-format", "json", "start", ctrID},
		{"--root", "/r", "kill", ctrID, "9"},
		{"state", ctrID},
		{"exec", "--process", "/tmp/p.json", "--detach", ctrID},
		{"--version"},
		{},
		{"features"},
		{"run", "--bundle", "/nonexistent", ctrID},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			argv := append([]string{"nri-vgpu-runtime"}, args...)
			var rec execRecord
			if err := e.wrapper(&rec, "").Run(ParseArgs(argv)); err != nil {
				t.Fatal(err)
			}
			if rec.path != e.next || !slices.Equal(rec.argv, append([]string{e.next}, args...)) {
				t.Errorf("exec %s %q", rec.path, rec.argv)
			}
		})
	}
	if _, err := os.Stat(e.cfg.Paths.StateDir); !os.IsNotExist(err) {
		t.Errorf("pass-through verbs touched the state directory: %v", err)
	}
}

// TestVersion: --version prints the wrapper's own version and then execs
// the next runtime's --version, unchanged; a verb's own flags named the
// same print nothing.
func TestVersion(t *testing.T) {
	e := newTestEnv(t, "none")
	for _, tc := range []struct {
		args []string
		ours bool
	}{
		{[]string{"--version"}, true},
		{[]string{"-v"}, true},
		{[]string{"--root", "/r", "-version"}, true},
		{[]string{"state", "--version", ctrID}, false},
		{[]string{"features"}, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var rec execRecord
			var out bytes.Buffer
			w := e.wrapper(&rec, "")
			w.Stdout = &out
			if err := w.Run(ParseArgs(append([]string{"nri-vgpu-runtime"}, tc.args...))); err != nil {
				t.Fatal(err)
			}
			if got := strings.HasPrefix(out.String(), "nri-vgpu-runtime version "); got != tc.ours {
				t.Errorf("output %q: want our version line %v", out.String(), tc.ours)
			}
			if tc.ours && !strings.Contains(out.String(), e.next) {
				t.Errorf("output %q does not name the next runtime %s", out.String(), e.next)
			}
			if rec.path != e.next || !slices.Equal(rec.argv, append([]string{e.next}, tc.args...)) {
				t.Errorf("exec %s %q", rec.path, rec.argv)
			}
		})
	}
}

// TestExecFailureReleases checks that a reservation is taken back when the
// next runtime cannot be started.
func TestExecFailureReleases(t *testing.T) {
	e := newTestEnv(t, "none")
	bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0"))
	var rec execRecord
	w := e.wrapper(&rec, "")
	w.Exec = func(string, []string, []string) error { return errors.New("exec format error") }
	err := w.Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID}))
	if err == nil || !strings.Contains(err.Error(), "exec next runtime "+e.next) {
		t.Fatalf("Run error %v", err)
	}
	if _, err := os.Stat(hoststate.ContainerDir(e.cfg, ctrID)); !os.IsNotExist(err) {
		t.Errorf("container directory after a failed exec: %v", err)
	}
	if s := readRecord(t, e); len(s.Containers) != 0 {
		t.Errorf("admission record after a failed exec: %v", s.IDs())
	}
}

// TestComputeFailureReleases checks that a container whose edits cannot be
// computed (the host lost /dev/nvidiactl) after it was admitted and its host
// files provisioned fails with the reason, and leaves neither its host
// directory, its reservation nor an edited bundle behind.
func TestComputeFailureReleases(t *testing.T) {
	e := newTestEnv(t, "none")
	if err := os.Remove(filepath.Join(e.devRoot, "dev", "nvidiactl")); err != nil {
		t.Fatal(err)
	}
	bundle, orig := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0"))
	var rec execRecord
	err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID}))
	if err == nil || !strings.Contains(err.Error(), "compute edits: device node /dev/nvidiactl") {
		t.Fatalf("Run error %v, want one naming /dev/nvidiactl", err)
	}
	if rec.called {
		t.Error("the next runtime was run for a container without its edits")
	}
	if data, _ := os.ReadFile(filepath.Join(bundle, SpecFileName)); !bytes.Equal(data, orig) {
		t.Error("the bundle was changed")
	}
	if _, err := os.Stat(filepath.Join(e.cfg.Paths.RunDir, "containers", ctrID)); !os.IsNotExist(err) {
		t.Errorf("container directory after a failed create: %v", err)
	}
	if s := readRecord(t, e); len(s.Containers) != 0 {
		t.Errorf("admission record after a failed create: %v", s.IDs())
	}
}

// runMain runs the test binary as nri-vgpu-runtime with args, the config
// of e, and PATH = path; the fake runtime records into a new directory,
// which is returned with the combined output.
func runMain(t *testing.T, e *testEnv, path string, specPath string, args ...string) (rec string, out []byte, err error) {
	t.Helper()
	rec = t.TempDir()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envMain+"=1", "NRI_VGPU_CONFIG="+e.cfgPath, "PATH="+path,
		"FAKE_RUNTIME_RECORD="+rec, "FAKE_RUNTIME_SPEC="+specPath)
	out, err = cmd.CombinedOutput()
	return rec, out, err
}

// TestMainExecsNextRuntime runs the wrapper as a process, exec'ing the fake
// runtime found on PATH, past a copy of the wrapper itself that comes first.
func TestMainExecsNextRuntime(t *testing.T) {
	e := newTestEnv(t, "none")
	// The wrapper installed under the next runtime's name, earlier on PATH:
	// it must be skipped, not exec'd forever.
	selfDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(selfDir, "fake-runc")); err != nil {
		t.Fatal(err)
	}
	env := []string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=2GiB", "NRI_VGPU_CORES=25"}
	bundle, _ := writeBundle(t, baseSpec(env...))
	specPath := filepath.Join(bundle, SpecFileName)
	args := []string{"--root", "/run/r", "--log", filepath.Join(bundle, "log.json"), "--log-format", "json", "create", "--bundle", bundle, ctrID}
	rec, out, err := runMain(t, e, selfDir+":"+e.binDir+":/usr/bin:/bin", specPath, args...)
	if err != nil {
		t.Fatalf("wrapper: %v\n%s", err, out)
	}
	if len(out) != 0 {
		t.Errorf("wrapper wrote %q; during create its stderr is the container's", out)
	}
	argv, err := os.ReadFile(filepath.Join(rec, "argv"))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(append([]string{e.next}, args...), "\n") + "\n"; string(argv) != want {
		t.Errorf("next runtime's argv\n got %q\nwant %q", argv, want)
	}
	seen, err := os.ReadFile(filepath.Join(rec, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := vgpuSpec(t, e, self, env, "void", 0); !bytes.Equal(seen, want) {
		t.Errorf("spec seen by the next runtime\n got %s\nwant %s", seen, want)
	}
	// The runtime log holds JSON lines only: containerd parses them.
	for _, l := range logLines(t, filepath.Join(bundle, "log.json")) {
		if l["level"] != "info" || !strings.HasPrefix(l["msg"].(string), Name+": ") {
			t.Errorf("runtime log entry %v", l)
		}
	}
}

// logLines decodes a JSON runtime log.
func logLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("runtime log line %q: %v", sc.Text(), err)
		}
		if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["time"])); err != nil {
			t.Errorf("runtime log time: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// TestMainReportsErrors checks the two channels of an error: stderr, and
// the runtime log's last "error" entry, which containerd's runc shim puts
// into the error `docker run` prints.
func TestMainReportsErrors(t *testing.T) {
	e := newTestEnv(t, "none")
	bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=lots"))
	logPath := filepath.Join(bundle, "log.json")
	rec, out, err := runMain(t, e, e.binDir+":/usr/bin:/bin", "",
		"--log", logPath, "--log-format", "json", "create", "--bundle", bundle, ctrID)
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("wrapper: %v, want exit status 1\n%s", err, out)
	}
	want := `nri-vgpu-runtime: NRI_VGPU_MEMORY="lots": invalid memory quantity`
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("stderr %q, want it to start with %q", out, want)
	}
	lines := logLines(t, logPath)
	if len(lines) == 0 || lines[len(lines)-1]["level"] != "error" || !strings.HasPrefix(lines[len(lines)-1]["msg"].(string), want) {
		t.Errorf("runtime log %v, want a last error entry starting with %q", lines, want)
	}
	if _, err := os.Stat(filepath.Join(rec, "argv")); !os.IsNotExist(err) {
		t.Error("the next runtime ran after an error")
	}

	// A text-format log gets logrus' text shape.
	textLog := filepath.Join(bundle, "log.txt")
	if _, _, err := runMain(t, e, e.binDir, "", "--log", textLog, "create", "--bundle", bundle, ctrID); err == nil {
		t.Fatal("wrapper succeeded")
	}
	data, err := os.ReadFile(textLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `level=error msg="nri-vgpu-runtime: NRI_VGPU_MEMORY=\"lots\"`) {
		t.Errorf("text runtime log %q", data)
	}
}

// TestMainConfigErrors checks what a broken configuration does: create
// fails with a message naming the file and line, while every other verb
// reports it and goes to the default next runtime untouched (a typo must
// not make existing containers unstoppable); and that no next runtime is
// an error too.
func TestMainConfigErrors(t *testing.T) {
	e := newTestEnv(t, "none")
	// A container prepared while the configuration was good.
	bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0"))
	var rec execRecord
	if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID})); err != nil {
		t.Fatal(err)
	}
	dir := hoststate.ContainerDir(e.cfg, ctrID)
	if err := os.WriteFile(e.cfgPath, []byte("[runtime]\nnext = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The default next runtime, runc, on PATH.
	defaultDir := t.TempDir()
	if err := os.Symlink(e.next, filepath.Join(defaultDir, "runc")); err != nil {
		t.Fatal(err)
	}
	wantMsg := "nri-vgpu-runtime: " + e.cfgPath + ":2"

	_, out, err := runMain(t, e, defaultDir, "", "create", "--bundle", bundle, ctrID)
	if err == nil || !strings.HasPrefix(string(out), wantMsg) {
		t.Errorf("create with a broken config: %v, %q; want a failure starting with %q", err, out, wantMsg)
	}
	for _, args := range [][]string{
		{"--root", "/r", "kill", ctrID, "9"},
		{"state", ctrID},
		{"--root", "/r", "delete", "--force", ctrID},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "log.json")
			args := append([]string{"--log", logPath, "--log-format", "json"}, args...)
			rec, out, err := runMain(t, e, defaultDir, "", args...)
			if err != nil {
				t.Fatalf("wrapper: %v\n%s", err, out)
			}
			if !strings.HasPrefix(string(out), wantMsg) {
				t.Errorf("stderr %q, want the config error %q", out, wantMsg)
			}
			if lines := logLines(t, logPath); len(lines) != 1 || lines[0]["level"] != "error" || !strings.HasPrefix(lines[0]["msg"].(string), wantMsg) {
				t.Errorf("runtime log %v, want the config error", lines)
			}
			argv, err := os.ReadFile(filepath.Join(rec, "argv"))
			if want := strings.Join(append([]string{filepath.Join(defaultDir, "runc")}, args...), "\n") + "\n"; err != nil || string(argv) != want {
				t.Errorf("next runtime's argv %q (%v), want %q", argv, err, want)
			}
			// Host directories are left for a later sweep.
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("container directory touched: %v", err)
			}
		})
	}

	if err := os.WriteFile(e.cfgPath, []byte("[runtime]\nnext = [\"no-such-runtime\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, out, err = runMain(t, e, e.binDir, "", "start", ctrID)
	if err == nil || !strings.Contains(string(out), "no next runtime found: none of no-such-runtime is installed") {
		t.Errorf("no next runtime: %v, %q", err, out)
	}
}

// TestMainDelete runs delete as a process: the next runtime runs as a
// child with the wrapper's stdio, its exit status is the wrapper's, and the
// container is released only when it succeeded.
func TestMainDelete(t *testing.T) {
	for _, status := range []int{1, 0} {
		t.Run(fmt.Sprint("status ", status), func(t *testing.T) {
			e := newTestEnv(t, "none")
			bundle, _ := writeBundle(t, baseSpec("NVIDIA_VISIBLE_DEVICES=0"))
			var rec execRecord
			if err := e.wrapper(&rec, "").Run(ParseArgs([]string{"x", "create", "--bundle", bundle, ctrID})); err != nil {
				t.Fatal(err)
			}
			t.Setenv("FAKE_RUNTIME_EXIT", fmt.Sprint(status))
			args := []string{"--root", t.TempDir(), "delete", ctrID}
			// The runtime's state directory exists: only its status says
			// whether it deleted the container.
			if err := os.Mkdir(filepath.Join(args[1], ctrID), 0o700); err != nil {
				t.Fatal(err)
			}
			recDir, out, err := runMain(t, e, e.binDir, "", args...)
			var exitErr *exec.ExitError
			if status == 0 && err != nil || status != 0 && (!errors.As(err, &exitErr) || exitErr.ExitCode() != status) {
				t.Fatalf("wrapper: %v, want exit status %d\n%s", err, status, out)
			}
			if len(out) != 0 {
				t.Errorf("wrapper wrote %q; the next runtime reports its own errors", out)
			}
			if argv, err := os.ReadFile(filepath.Join(recDir, "argv")); err != nil || string(argv) != strings.Join(append([]string{e.next}, args...), "\n")+"\n" {
				t.Errorf("next runtime's argv %q (%v)", argv, err)
			}
			_, err = os.Stat(hoststate.ContainerDir(e.cfg, ctrID))
			if released := os.IsNotExist(err); released != (status == 0) {
				t.Errorf("container released: %v, want %v", released, status == 0)
			}
		})
	}
}

// A container Docker runs with --security-opt seccomp=unconfined gets the
// confinement alone: everything allowed but the ways around the preload.
func TestCreateUnconfinedIsConfined(t *testing.T) {
	e := newTestEnv(t, "none")
	spec := baseSpec("NVIDIA_VISIBLE_DEVICES=0")
	spec.Linux.Seccomp = nil
	bundle, _ := writeBundle(t, spec)
	var rec execRecord
	if err := e.wrapper(&rec, filepath.Join(bundle, SpecFileName)).Run(ParseArgs([]string{"nri-vgpu-runtime", "create", "--bundle", bundle, ctrID})); err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(rec.spec, &got); err != nil {
		t.Fatal(err)
	}
	sc := got.Linux.Seccomp
	if sc == nil || sc.DefaultAction != specs.ActAllow {
		t.Fatalf("seccomp %+v, want default SCMP_ACT_ALLOW with denials", sc)
	}
	denied := func(name string, errno uint) bool {
		return slices.ContainsFunc(sc.Syscalls, func(r specs.LinuxSyscall) bool {
			return r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == errno && len(r.Args) == 0 && slices.Contains(r.Names, name)
		})
	}
	for _, name := range []string{"mount", "chroot", "pivot_root", "setns", "open_tree", "move_mount"} {
		if !denied(name, 1) {
			t.Errorf("%s is not refused with EPERM", name)
		}
	}
	if !denied("clone3", 38) {
		t.Errorf("clone3 does not fail with ENOSYS")
	}
}

// TestMainRunsThePinHook runs the wrapper's binary the way runc runs the
// hook it puts into the spec ("hook pin", the state on stdin), for a root
// whose /etc/ld.so.preload is a symbolic link: it refuses, naming the path,
// instead of taking "hook" for a runtime verb.
func TestMainRunsThePinHook(t *testing.T) {
	bundle := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp/preload", filepath.Join(bundle, "rootfs", "etc", "ld.so.preload")); err != nil {
		t.Fatal(err)
	}
	pintest.WriteBundle(t, bundle)
	cmd := exec.Command(os.Args[0], "hook", "pin")
	cmd.Env = append(os.Environ(), envMain+"=1", "NRI_VGPU_CONFIG=/nonexistent/config.toml")
	state, err := json.Marshal(specs.State{ID: ctrID, Bundle: bundle})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = bytes.NewReader(state)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("hook pin: %v, want exit status 1", err)
	}
	if want := "nri-vgpu-runtime: /etc/ld.so.preload in the image is a symbolic link; refusing\n"; string(out) != want {
		t.Errorf("hook pin wrote %q, want %q", out, want)
	}
}
