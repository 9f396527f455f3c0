//go:build e2e

package docker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/admission"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/ociruntime"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/region"
)

func setup(t *testing.T) context.Context {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	t.Cleanup(func() { checkReleased(t) })
	return ctx
}

// docker runs the client and fails the test on error.
func docker(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := env.d.docker(ctx, args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// vgpuRun is `docker run --rm --network none --runtime nri-vgpu` with the
// given -e variables, then image and command.
func vgpuRun(vars []string, cmd ...string) []string {
	args := []string{"run", "--rm", "--network", "none", "--runtime", runtimeName}
	for _, v := range vars {
		args = append(args, "-e", v)
	}
	return append(append(args, busyboxImage), cmd...)
}

// readRecord returns the wrapper's admission record, read under its lock as
// the wrapper reads it; the sentinel error keeps Update from writing back.
func readRecord() (*admission.State, error) {
	errRead := errors.New("read only")
	var s *admission.State
	if err := admission.New(env.state).Update(func(st *admission.State) error { s = st; return errRead }); !errors.Is(err, errRead) {
		return nil, err
	}
	return s, nil
}

// checkReleased checks, once a test's containers are gone, that every
// container directory and admission entry went with them (delete ran).
func checkReleased(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		dirs, _ := os.ReadDir(filepath.Join(env.runDir, hoststate.ContainersDirName))
		s, err := readRecord()
		if err != nil {
			t.Errorf("reading the admission record: %v", err)
			return
		}
		if len(dirs) == 0 && len(s.Containers) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("after the test's containers were removed: %d container directories and admission entries %v remain", len(dirs), s.IDs())
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestVGPUContainer runs a container with a 1 GiB slice of GPU 0 and checks
// from inside that it has what Contract 3 gives it.
func TestVGPUContainer(t *testing.T) {
	ctx := setup(t)
	script := strings.Join([]string{
		`cat /run/nri-vgpu/limits`,
		`echo "preload=$(cat /etc/ld.so.preload)"`,
		`test -f /usr/local/nri-vgpu/libvgpu-shim.so && echo shim=present`,
		`for n in /dev/nvidiactl /dev/nvidia0 /dev/nvidia-uvm; do stat -c "node %n %F %t:%T" $n; done`,
		`test -e /dev/nvidia1 || echo nvidia1=absent`,
		`touch /run/nri-vgpu/region/probe && echo region=writable`,
		`echo x 2>/dev/null >/run/nri-vgpu/limits || echo limits=read-only`,
		`echo x 2>/dev/null >/etc/ld.so.preload || echo preload=read-only`,
		`echo "visible=$NVIDIA_VISIBLE_DEVICES"`,
		`grep "^c 195:" /sys/fs/cgroup/devices/devices.list | sed "s/^/cgroup /"`,
		`ls /run/nri-vgpu/region | sed "s/^/region-file /"`,
	}, "; ")
	out := docker(t, ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"}, "sh", "-c", script)...)
	for _, want := range []string{
		"gpu.0.uuid=" + uuid0 + "\n",
		"gpu.0.memory=1073741824\n",
		"gpu.0.cores=100\n",
		"preload=" + oci.ContainerShimPath + "\n",
		"shim=present\n",
		"node /dev/nvidiactl character special file c3:ff\n",
		"node /dev/nvidia0 character special file c3:0\n",
		"node /dev/nvidia-uvm character special file 1ff:0\n",
		"nvidia1=absent\n",
		"region=writable\n",
		"limits=read-only\n",
		"preload=read-only\n",
		// driver.injection auto without a CDI spec: nvidia-container-runtime's variable.
		"visible=" + uuid0 + "\n",
		"cgroup c 195:0 rwm\n",
		"cgroup c 195:255 rwm\n",
		"region-file probe\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("container output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "gpu.1.") || strings.Contains(out, "c 195:1 ") {
		t.Errorf("the container got GPU 1 too:\n%s", out)
	}
}

// TestShimRefusesPastLimit runs the shim's test program against the fake
// driver inside a container with a 1 GiB slice: the shim, loaded through the
// injected /etc/ld.so.preload and reading the injected limits, refuses an
// allocation past 1 GiB, reports 1 GiB as the total, and records usage in
// the injected region.
func TestShimRefusesPastLimit(t *testing.T) {
	ctx := setup(t)
	if !env.haveShim {
		t.Skip("shim/build lacks the shim, its fake driver or cudaprog: run make -C shim")
	}
	prog := cudaprogDir + "/cudaprog"
	fake := []string{"LD_LIBRARY_PATH=" + cudaprogDir + "/fake", "FAKECUDA_DEVICES=" + uuid0 + ":4GiB:108"}
	// alloc:SIZE:2 expects CUDA_ERROR_OUT_OF_MEMORY; cudaprog prints "ok"
	// when every step gave what it expected.
	script := prog + " init alloc:768MiB alloc:512MiB:2 info:256MiB:1GiB alloc:256MiB alloc:1:2 && ls /run/nri-vgpu/region"
	out := docker(t, ctx, vgpuRun(append(fake, "NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"), "sh", "-c", script)...)
	for _, want := range []string{"info free=268435456 total=1073741824\n", "ok\n", "GPU memory quota exceeded", "usage\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// The same program in a container without a request is not limited:
	// what refused it above is the injected shim and limits.
	out = docker(t, ctx, vgpuRun(fake, prog, "init", "alloc:768MiB", "alloc:512MiB", "info:-:4GiB")...)
	if !strings.Contains(out, "ok\n") || strings.Contains(out, "quota") {
		t.Errorf("unlimited run:\n%s", out)
	}
}

// TestBadRequestFailsDockerRun checks that an unusable request fails
// `docker run` with the wrapper's message, naming the variable.
func TestBadRequestFailsDockerRun(t *testing.T) {
	ctx := setup(t)
	tests := []struct {
		vars []string
		want string
	}{
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=lots"}, `nri-vgpu-runtime: NRI_VGPU_MEMORY="lots": invalid memory quantity`},
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=5GiB"}, `nri-vgpu-runtime: NRI_VGPU_MEMORY="5GiB": more than GPU 0 (` + uuid0 + `) can give: 4GiB`},
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_CORES=150"}, `nri-vgpu-runtime: NRI_VGPU_CORES="150"`},
		{[]string{"NVIDIA_VISIBLE_DEVICES=3"}, `nri-vgpu-runtime: NVIDIA_VISIBLE_DEVICES="3": no GPU "3" on this node`},
		{[]string{"NRI_VGPU_MEMORY=1GiB"}, `nri-vgpu-runtime: NRI_VGPU_MEMORY="1GiB": NVIDIA_VISIBLE_DEVICES names no GPU`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.vars, " "), func(t *testing.T) {
			out, err := env.d.docker(ctx, vgpuRun(tt.vars, "true")...)
			if err == nil {
				t.Fatalf("docker run succeeded:\n%s", out)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("docker run output lacks %q:\n%s", tt.want, out)
			}
		})
	}
}

// TestOversubscriptionRefused fills GPU 0 with one container and checks that
// a request beyond what is left is refused with what is free, that other
// GPUs and a restart of the holder are unaffected, and that the slice is
// free again once the holder is gone.
func TestOversubscriptionRefused(t *testing.T) {
	ctx := setup(t)
	holder := "vgpu-holder"
	docker(t, ctx, "run", "-d", "--name", holder, "--network", "none", "--runtime", runtimeName,
		"-e", "NVIDIA_VISIBLE_DEVICES="+uuid0, "-e", "NRI_VGPU_MEMORY=3GiB", "-e", "NRI_VGPU_CORES=60", busyboxImage)
	t.Cleanup(func() { _, _ = env.d.docker(context.Background(), "rm", "-f", holder) })

	want := "nri-vgpu-runtime: not enough GPU capacity left: GPU 0 (" + uuid0 +
		"): 1GiB of 4GiB memory and 40% of cores free; asked for 2GiB and 50% (1 other container holds the rest)"
	second := vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=2GiB", "NRI_VGPU_CORES=50"}, "true")
	out, err := env.d.docker(ctx, second...)
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("second container on GPU 0: %v\n%s\nwant a refusal containing %q", err, out, want)
	}
	// What is left still fits, and so does the other GPU.
	docker(t, ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB", "NRI_VGPU_CORES=40"}, "true")...)
	docker(t, ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=1", "NRI_VGPU_MEMORY=2GiB", "NRI_VGPU_CORES=50"}, "true")...)

	// A restart deletes and re-creates the task: the holder is re-admitted
	// in its own place.
	docker(t, ctx, "restart", "-t", "1", holder)
	if got := strings.TrimSpace(docker(t, ctx, "inspect", "-f", "{{.State.Running}}", holder)); got != "true" {
		t.Fatalf("holder after restart: running=%s", got)
	}
	s, err := readRecord()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(docker(t, ctx, "inspect", "-f", "{{.Id}}", holder))
	if e := s.Containers[id]; len(s.Containers) != 1 || e == nil || e.Source != hoststate.SourceRuntime || e.RuntimeRoot == "" {
		t.Errorf("admission record with the holder running: %+v", s.Containers)
	}

	docker(t, ctx, "rm", "-f", holder)
	docker(t, ctx, second...)
}

// TestContainerWithoutRequestUntouched checks that a container asking for
// no GPU runs exactly as with runc: no devices, no preload, no limits.
func TestContainerWithoutRequestUntouched(t *testing.T) {
	ctx := setup(t)
	script := `ls /dev; test -e /etc/ld.so.preload && echo preload=present; test -e /run/nri-vgpu && echo run-dir=present; env | sort`
	for _, vars := range [][]string{nil, {"NVIDIA_VISIBLE_DEVICES=void"}} {
		got := docker(t, ctx, vgpuRun(vars, "sh", "-c", script)...)
		args := []string{"run", "--rm", "--network", "none"}
		for _, v := range vars {
			args = append(args, "-e", v)
		}
		want := docker(t, ctx, append(args, busyboxImage, "sh", "-c", script)...)
		// HOSTNAME differs between any two containers.
		host := regexp.MustCompile(`(?m)^HOSTNAME=.*$`)
		got, want = host.ReplaceAllString(got, "HOSTNAME="), host.ReplaceAllString(want, "HOSTNAME=")
		if got != want {
			t.Errorf("with %v through nri-vgpu:\n%s\nwith runc:\n%s", vars, got, want)
		}
		if strings.Contains(got, "nvidia") || strings.Contains(got, "present") {
			t.Errorf("container without a request got GPU files:\n%s", got)
		}
	}
}

// TestShimAsNonRootUser runs the shim's test program as an unprivileged
// user: the bind mounts reach the container although the host's
// containers directory is open to root only, and the user reports into the
// usage region the host made (root's, 0666) rather than making its own in
// the 0777 directory (which it would do, silently, if it could not open
// the host's for writing).
func TestShimAsNonRootUser(t *testing.T) {
	ctx := setup(t)
	if !env.haveShim {
		t.Skip("shim/build lacks the shim, its fake driver or cudaprog: run make -C shim")
	}
	vars := []string{"LD_LIBRARY_PATH=" + cudaprogDir + "/fake", "FAKECUDA_DEVICES=" + uuid0 + ":4GiB:108",
		"NVIDIA_VISIBLE_DEVICES=0", "NRI_VGPU_MEMORY=1GiB"}
	script := "id -u; " + cudaprogDir + "/cudaprog init alloc:768MiB alloc:512MiB:2 info:256MiB:1GiB && ls -n /run/nri-vgpu/region"
	args := vgpuRun(vars, "sh", "-c", script)
	args = append([]string{args[0], "--user", "1000:1000"}, args[1:]...)
	out := docker(t, ctx, args...)
	for _, want := range []string{"1000\n", "info free=268435456 total=1073741824\n", "ok\n", "GPU memory quota exceeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	hosts := false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		hosts = hosts || len(f) > 4 && f[len(f)-1] == region.FileName && f[0] == "-rw-rw-rw-" && f[2] == "0" && f[3] == "0"
	}
	if !hosts {
		t.Errorf("no usage region of root's, mode 0666, in the listing:\n%s", out)
	}
	st, err := os.Stat(filepath.Join(env.runDir, hoststate.ContainersDirName))
	if err != nil || st.Mode().Perm() != hoststate.ContainersDirMode {
		t.Errorf("host containers directory: %v %v, want mode %#o", st.Mode(), err, hoststate.ContainersDirMode)
	}
}

// runWrapper runs nri-vgpu-runtime as containerd's shim would, with the
// test's config, and returns its combined output.
func runWrapper(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, env.wrapper, args...)
	cmd.Env = append(os.Environ(), "NRI_VGPU_CONFIG="+env.cfg)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startHolder starts a detached vGPU container with a 1 GiB slice of GPU 0,
// removed when the test ends, and returns its ID and admission entry.
func startHolder(t *testing.T, ctx context.Context, name string) (string, *admission.Entry) {
	t.Helper()
	docker(t, ctx, "run", "-d", "--name", name, "--network", "none", "--runtime", runtimeName,
		"-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "NRI_VGPU_MEMORY=1GiB", busyboxImage)
	t.Cleanup(func() { _, _ = env.d.docker(context.Background(), "rm", "-f", name) })
	id := strings.TrimSpace(docker(t, ctx, "inspect", "-f", "{{.Id}}", name))
	s, err := readRecord()
	if err != nil {
		t.Fatal(err)
	}
	e := s.Containers[id]
	if e == nil || e.RuntimeRoot == "" {
		t.Fatalf("admission entry of %s: %+v", name, e)
	}
	return id, e
}

// TestRefusedDeleteKeepsReservation runs the runtime's delete of a running
// container without --force, which runc refuses: the wrapper must fail
// with runc's status and keep the container counted, with its host files.
func TestRefusedDeleteKeepsReservation(t *testing.T) {
	ctx := setup(t)
	id, e := startHolder(t, ctx, "vgpu-running")
	out, err := runWrapper(ctx, "--root", e.RuntimeRoot, "delete", id)
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || !strings.Contains(out, "running") {
		t.Fatalf("delete of a running container: %v\n%s\nwant runc's refusal", err, out)
	}
	if strings.Contains(out, ociruntime.Name) {
		t.Errorf("the wrapper added a message to runc's own: %s", out)
	}
	s, err := readRecord()
	if err != nil {
		t.Fatal(err)
	}
	if s.Containers[id] == nil {
		t.Errorf("the running container lost its admission entry: %v", s.IDs())
	}
	for _, f := range []string{hoststate.LimitsFileName, hoststate.RegionDirName, hoststate.InfoFileName} {
		if _, err := os.Stat(filepath.Join(env.runDir, hoststate.ContainersDirName, id, f)); err != nil {
			t.Errorf("the running container lost its host files: %v", err)
		}
	}
	if got := strings.TrimSpace(docker(t, ctx, "inspect", "-f", "{{.State.Running}}", "vgpu-running")); got != "true" {
		t.Errorf("container running=%s after the refused delete", got)
	}
	// docker rm -f deletes it for real; checkReleased sees it released.
	docker(t, ctx, "rm", "-f", "vgpu-running")
}

// TestBrokenConfigStillStops breaks config.toml while a vGPU container
// runs: new vGPU containers are refused with the file and line, but the
// running one can still be stopped and removed. Its host directory, left
// alone then, is swept by the next create once the config is fixed.
func TestBrokenConfigStillStops(t *testing.T) {
	ctx := setup(t)
	good, err := os.ReadFile(env.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(env.cfg, good, 0o644); err != nil {
			t.Errorf("restoring the config: %v", err)
		}
	})
	id, _ := startHolder(t, ctx, "vgpu-stoppable")
	// Another create reconciles the admission record while the holder runs, so that
	// its state directory is known to the admission record.
	docker(t, ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=1"}, "true")...)

	if err := os.WriteFile(env.cfg, []byte("[runtime]\nnext = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := env.d.docker(ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=1"}, "true")...)
	if want := ociruntime.Name + ": " + env.cfg + ":2"; err == nil || !strings.Contains(out, want) {
		t.Errorf("docker run with a broken config: %v\n%s\nwant a failure naming %q", err, out, want)
	}
	docker(t, ctx, "rm", "-f", "vgpu-stoppable")
	if out := docker(t, ctx, "ps", "-aq", "--no-trunc"); strings.Contains(out, id) {
		t.Errorf("container still listed after docker rm -f:\n%s", out)
	}

	if err := os.WriteFile(env.cfg, good, 0o644); err != nil {
		t.Fatal(err)
	}
	docker(t, ctx, vgpuRun([]string{"NVIDIA_VISIBLE_DEVICES=1"}, "true")...)
	// checkReleased: the holder's directory and entry are gone.
}
