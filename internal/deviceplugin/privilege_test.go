package deviceplugin

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nri-vgpu/nri-vgpu/internal/kubelettest"
	"github.com/nri-vgpu/nri-vgpu/internal/syncbuf"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
)

// asProgram makes the test binary run the program itself (run with its
// arguments), so that a test can start it under setpriv and unshare.
const asProgram = "NRI_VGPU_TEST_RUN_DEVICE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(asProgram) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// procStatus returns the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// rootMountOptions returns the mount options of / as the process sees it.
func rootMountOptions(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		// id parent major:minor root mountpoint options ...
		if f := strings.Fields(line); len(f) > 5 && f[4] == "/" {
			return f[5]
		}
	}
	t.Fatal("no / in mountinfo")
	return ""
}

// The device plugin needs no privilege beyond its GPUs (which NVML reads,
// and the NVIDIA toolkit or privileged mode provides): run as root with no
// capability at all (empty bounding set, no new privileges) on a read-only
// root file system with only its two host directories writable, as the
// chart's unprivileged devicePlugin.securityContext leaves it, it creates
// the allocation key, registers with the kubelet and answers Allocate.
func TestRunsWithoutCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the device plugin's pod runs as root, without capabilities")
	}
	for _, tool := range []string{"setpriv", "unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s (util-linux) not found", tool)
		}
	}
	dir := shortDir(t) // socket_dir; root's, 0700 like a fresh kubelet's
	state := filepath.Join(dir, "state")
	path := filepath.Join(dir, "config.toml")
	// The feature file: a hostPath volume in the pod.
	writeConfig(t, path, fmt.Sprintf(`[device_plugin]
socket_dir = %q
feature_file = %q
split_count = 2
[paths]
state_dir = %q
[gpu]
backend = "simulated"
[[gpu.simulated]]
uuid = "GPU-aaaa"
name = "Sim"
memory = "16GiB"
minor = 0
`, dir, filepath.Join(dir, "features.d", "nri-vgpu"), state))
	k, err := kubelettest.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()

	// A mount namespace of its own: the test directory stays writable (a
	// bind mount, as a hostPath volume is), everything else is read-only.
	script := `mount --bind "$1" "$1"
mount -o remount,bind,ro /
shift
exec setpriv --no-new-privs --inh-caps=-all --bounding-set=-all -- "$@"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", script, "sh",
		dir, os.Args[0], "--config", path)
	cmd.Env = append(os.Environ(), asProgram+"=1")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("device plugin: %v; output:\n%s", err, out.String())
			}
		case <-time.After(waitTimeout):
			_ = cmd.Process.Kill()
			t.Errorf("device plugin did not stop on SIGTERM; output:\n%s", out.String())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	reg, err := k.WaitRegistration(ctx)
	if err != nil {
		t.Fatalf("no registration: %v; output:\n%s", err, out.String())
	}
	defer reg.Close()

	// unshare, sh and setpriv exec one another: the registered process is
	// cmd's. It runs as meant: root, no capability, / read-only.
	st := procStatus(t, cmd.Process.Pid)
	if !strings.HasPrefix(st["Uid"], "0\t") || st["CapEff"] != "0000000000000000" || st["CapBnd"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Fatalf("the program runs with Uid %q, CapEff %s, CapBnd %s, NoNewPrivs %s; want root without capabilities",
			st["Uid"], st["CapEff"], st["CapBnd"], st["NoNewPrivs"])
	}
	if opts := rootMountOptions(t, cmd.Process.Pid); !strings.HasPrefix(opts, "ro") {
		t.Fatalf("the program's / is mounted %s, want ro", opts)
	}

	list, err := reg.NextList(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("device list %v, %v; output:\n%s", list, err, out.String())
	}
	rsp, err := reg.Client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{list[0].ID}},
	}})
	if err != nil {
		t.Fatalf("Allocate: %v; output:\n%s", err, out.String())
	}
	if len(rsp.ContainerResponses) != 1 || rsp.ContainerResponses[0].Annotations[allocation.AnnotationKey] == "" {
		t.Errorf("Allocate answered %v, want the signed allocation annotation", rsp)
	}
	if _, err := os.Stat(filepath.Join(state, "allocation.key")); err != nil {
		t.Errorf("allocation key: %v", err)
	}
}
