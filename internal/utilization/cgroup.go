package utilization

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Owner is the container a host process runs in, read from the host's
// /proc/<pid>/cgroup: the 64-hex container ID that containerd (CRI or
// ctr), CRI-O and Docker name a container's cgroup by, and the Kubernetes
// pod UID where the kubelet's cgroup names it ("" for a container of no
// pod).
type Owner struct {
	ContainerID string
	PodUID      string
}

// containerIDPattern is a container ID alone in one cgroup path component
// once the runtime's decoration is taken off (containerIDDecorations).
var containerIDPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// containerIDDecorations are what runtimes wrap a container ID in under
// the systemd cgroup driver: "cri-containerd-<id>.scope" (containerd's CRI),
// "docker-<id>.scope" (Docker), "crio-<id>.scope" (CRI-O). Under cgroupfs
// the component is the ID itself ("/kubepods/.../<id>", "/<ns>/<id>" of a
// plain ctr container, "/docker/<id>").
var containerIDDecorations = []string{"cri-containerd-", "docker-", "crio-", "containerd-"}

// podUIDPattern is a pod's cgroup component: "pod<uid>" under cgroupfs
// ("/kubepods/burstable/pod<uid>"), "kubepods-<qos>-pod<uid with _>.slice"
// under systemd, where the slice name cannot hold a dash of the UID.
var podUIDPattern = regexp.MustCompile(`(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$`)

// containerIDOf returns the container ID a cgroup path component names, or
// "".
func containerIDOf(component string) string {
	c := strings.TrimSuffix(component, ".scope")
	for _, p := range containerIDDecorations {
		if rest, ok := strings.CutPrefix(c, p); ok {
			c = rest
			break
		}
	}
	if containerIDPattern.MatchString(c) {
		return c
	}
	return ""
}

// ownerOfPath finds the container of one cgroup path: the OUTERMOST
// component that is a container ID, and the pod UID of a component above
// it. Outermost, because a process that may make cgroups (a privileged
// pod, a delegated subtree) can only make them below its own: a
// sub-cgroup it names after another container's ID comes after its own
// container's and is not read. Components a cgroup namespace shows as ".."
// are skipped like any other that names nothing.
func ownerOfPath(path string) (Owner, bool) {
	var pod string
	for c := range strings.SplitSeq(path, "/") {
		if id := containerIDOf(c); id != "" {
			return Owner{ContainerID: id, PodUID: pod}, true
		}
		if m := podUIDPattern.FindStringSubmatch(c); m != nil && pod == "" {
			pod = strings.ReplaceAll(m[1], "_", "-")
		}
	}
	return Owner{}, false
}

// parseCgroup reads the contents of a /proc/<pid>/cgroup file: lines
// "hierarchy-ID:controllers:path" (cgroup v1, one per hierarchy; v2's one
// line is "0::path"). The first line whose path names a container gives
// the owner: the runtime puts a container's process in the same container
// cgroup in every hierarchy.
func parseCgroup(content string) (Owner, bool) {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 3)
		if len(fields) != 3 {
			continue
		}
		if o, ok := ownerOfPath(fields[2]); ok {
			return o, true
		}
	}
	return Owner{}, false
}

// ownerOf reads the container of host process pid from procRoot (the
// host's /proc). ok is false for a process of no container and for one
// that has exited since NVML sampled it; err only when the file exists but
// cannot be read.
func ownerOf(procRoot string, pid uint32) (o Owner, ok bool, err error) {
	if pid == 0 {
		return Owner{}, false, nil // no process: the kernel's idle task
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return Owner{}, false, nil
	}
	if err != nil {
		return Owner{}, false, err
	}
	o, ok = parseCgroup(string(b))
	return o, ok, nil
}
