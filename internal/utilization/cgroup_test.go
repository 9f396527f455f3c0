package utilization

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

const (
	idA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	idB = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	uid = "6f1c2b7e-3d4a-4e5f-8a9b-0c1d2e3f4a5b"
)

func TestParseCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          Owner
		ok            bool
	}{
		{"cgroupfs v1 kubelet", "12:devices:/kubepods/burstable/pod" + uid + "/" + idA + "\n11:memory:/kubepods/burstable/pod" + uid + "/" + idA + "\n0::/\n",
			Owner{idA, uid}, true},
		{"cgroupfs v2 besteffort", "0::/kubepods/besteffort/pod" + uid + "/" + idA + "\n", Owner{idA, uid}, true},
		{"systemd driver", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2b7e_3d4a_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + idA + ".scope\n",
			Owner{idA, uid}, true},
		{"guaranteed pod, systemd", "0::/kubepods.slice/kubepods-pod6f1c2b7e_3d4a_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + idA + ".scope\n",
			Owner{idA, uid}, true},
		{"plain ctr", "5:cpu,cpuacct:/default/" + idA + "\n", Owner{idA, ""}, true},
		{"docker, systemd", "0::/system.slice/docker-" + idA + ".scope\n", Owner{idA, ""}, true},
		{"docker, cgroupfs", "4:pids:/docker/" + idA + "\n", Owner{idA, ""}, true},
		{"CRI-O", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6f1c2b7e_3d4a_4e5f_8a9b_0c1d2e3f4a5b.slice/crio-" + idA + ".scope\n",
			Owner{idA, uid}, true},
		// Seen from a reader in a cgroup namespace of its own (a pod on
		// cgroup v2): the path goes up first.
		{"from a cgroup namespace", "0::/../../kubepods-besteffort-pod6f1c2b7e_3d4a_4e5f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-" + idA + ".scope\n",
			Owner{idA, uid}, true},
		// A tenant that may make cgroups makes them below its own: the
		// victim's ID below is not read.
		{"sub-cgroup named after another container", "0::/kubepods/besteffort/pod" + uid + "/" + idA + "/" + idB + "\n", Owner{idA, uid}, true},
		{"the pod's own cgroup, no container", "0::/kubepods/besteffort/pod" + uid + "\n", Owner{}, false},
		{"host service", "0::/system.slice/containerd.service\n1:name=systemd:/user.slice\n", Owner{}, false},
		{"63 hex digits", "0::/default/" + idA[1:] + "\n", Owner{}, false},
		{"upper-case hex is no runtime's", "0::/default/0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef\n", Owner{}, false},
		{"empty", "", Owner{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseCgroup(tc.content)
			if ok != tc.ok || got != tc.want {
				t.Errorf("parseCgroup = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// fakeProc writes a /proc tree holding, for each pid, its cgroup file.
func fakeProc(t *testing.T, cgroups map[uint32]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, content := range cgroups {
		dir := filepath.Join(root, strconv.Itoa(int(pid)))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestOwnerOf(t *testing.T) {
	root := fakeProc(t, map[uint32]string{
		100: "0::/kubepods/besteffort/pod" + uid + "/" + idA + "\n",
		200: "0::/system.slice/sshd.service\n",
	})
	if o, ok, err := ownerOf(root, 100); err != nil || !ok || o != (Owner{idA, uid}) {
		t.Errorf("pid 100: %+v, %v, %v; want container A of the pod", o, ok, err)
	}
	for _, pid := range []uint32{200, 300, 0} { // host process, gone, none
		if o, ok, err := ownerOf(root, pid); err != nil || ok {
			t.Errorf("pid %d: %+v, %v, %v; want no owner and no error", pid, o, ok, err)
		}
	}
	// A cgroup that exists but cannot be read is an error, not "no
	// container".
	if err := os.Mkdir(filepath.Join(root, "400"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "400", "cgroup"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ownerOf(root, 400); err == nil || ok {
		t.Errorf("pid 400 (cgroup unreadable): ok %v, err %v; want an error", ok, err)
	}
}
