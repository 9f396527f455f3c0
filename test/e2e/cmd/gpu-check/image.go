package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/harness"
	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

// appEnv is the application image's environment: where NVIDIA's CUDA base
// images have the driver's libraries. The edits that nri-vgpu generates
// mount them at their paths beneath the driver root; the loader of a busybox
// image has no cache that names them.
var appEnv = []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"}

// buildAppImage writes the image of every pod: busybox and the glibc
// libraries that the shim, the test programs and (nvml mode) the host's
// Python and nvidia-smi load, as ldd finds them on this host. No NVIDIA
// file goes in: libcuda*, libnvidia-* and anything from the driver's
// directories are left out, so that a GPU container has the driver only
// from nri-vgpu's edits.
func (n *node) buildAppImage(dir string) (string, error) {
	roots := []string{
		filepath.Join(n.o.bundle, "lib", "libvgpu-shim.so"),
		filepath.Join(n.o.bundle, "test", "cudaprog"),
		filepath.Join(n.o.bundle, "test", "nvmlprocs"),
	}
	var files []image.File
	links := map[string]string{}
	if n.python != nil {
		files = append(files, image.File{Src: n.python.Exe, Dst: n.python.Exe})
		// The links from --python to the interpreter that the mounts do
		// not bring (a venv's bin/python3 -> /usr/bin/python3.12, or a
		// pyenv's python3 -> python3.11).
		chain, err := linkChain(n.o.python)
		if err != nil {
			return "", err
		}
		for link, target := range chain {
			if !n.underPythonMount(link) {
				links[link] = target
			}
		}
		roots = append(roots, n.python.Exe)
		roots = append(roots, n.python.Libs...)
		if smi, err := exec.LookPath("nvidia-smi"); err == nil {
			roots = append(roots, smi)
		}
	}
	libs, err := lddClosure(roots, n.excluded)
	if err != nil {
		return "", err
	}
	for _, l := range libs {
		files = append(files, image.File{Src: l, Dst: l})
	}
	return harness.BuildBusyboxImageFrom(n.bin("busybox"), dir, appImage, appEnv, links, files...)
}

// linkChain returns the symbolic links met on the way from path to the
// file it names (link -> target as the link holds it), directories'
// links included.
func linkChain(path string) (map[string]string, error) {
	chain := map[string]string{}
	p := filepath.Clean(path)
	for hops := 0; hops < 40; hops++ {
		// Resolve the directory first: only the last element may be a link
		// still to follow.
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			return nil, err
		}
		if dir != filepath.Dir(p) {
			sub, err := linkChain(filepath.Dir(p))
			if err != nil {
				return nil, err
			}
			for k, v := range sub {
				chain[k] = v
			}
		}
		p = filepath.Join(dir, filepath.Base(p))
		target, err := os.Readlink(p)
		if err != nil {
			return chain, nil // not a link: the end
		}
		chain[p] = target
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = filepath.Clean(target)
	}
	return nil, fmt.Errorf("%s: too many levels of symbolic links", path)
}

// underPythonMount reports whether p is inside a directory the containers
// get mounted from the host.
func (n *node) underPythonMount(p string) bool {
	for _, d := range n.pythonMounts() {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// driverLib matches the file names of the NVIDIA driver's libraries.
var driverLib = regexp.MustCompile(`^lib(cuda|nvidia-|nvcuvid|nvoptix)`)

// excluded reports whether a library must stay out of the image: one of
// the driver's, or one the containers get from a read-only mount anyway.
func (n *node) excluded(lib string) bool {
	if driverLib.MatchString(filepath.Base(lib)) {
		return true
	}
	if n.driverRoot != "/" && strings.HasPrefix(lib, n.driverRoot+"/") {
		return true
	}
	for _, d := range append([]string{"/usr/local/nvidia/"}, n.pythonMounts()...) {
		if strings.HasPrefix(lib, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

func (n *node) pythonMounts() []string {
	if n.python == nil {
		return nil
	}
	return n.python.mounts()
}

// lddLine matches "name => /path (0x...)" and "/path (0x...)".
var lddLine = regexp.MustCompile(`^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$`)

// lddClosure returns the libraries (and the loader) that the ELF files in
// roots load, as ldd resolves them here, without those skip rejects.
// Libraries ldd does not find are left out: the driver's (from the edits)
// and the ones the roots find beside themselves through their RUNPATH.
func lddClosure(roots []string, skip func(string) bool) ([]string, error) {
	seen := map[string]bool{}
	for _, r := range roots {
		cmd := exec.Command("ldd", r)
		// The host's own library path must not decide what goes in.
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "LD_LIBRARY_PATH=") })
		out, err := cmd.CombinedOutput()
		if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
			continue
		}
		if err != nil && !bytes.Contains(out, []byte("not found")) {
			return nil, fmt.Errorf("ldd %s: %w: %s", r, err, strings.TrimSpace(string(out)))
		}
		for _, l := range strings.Split(string(out), "\n") {
			if m := lddLine.FindStringSubmatch(l); m != nil && !skip(m[1]) {
				seen[m[1]] = true
			}
		}
	}
	libs := make([]string, 0, len(seen))
	for l := range seen {
		libs = append(libs, l)
	}
	slices.Sort(libs)
	return libs, nil
}

// pythonInfo is the host's Python with PyTorch, as the containers get it.
type pythonInfo struct {
	Exe        string   `json:"exe"`         // the interpreter, links resolved: copied into the image
	Prefix     string   `json:"prefix"`      // sys.prefix: the venv, mounted read-only
	BasePrefix string   `json:"base_prefix"` // sys.base_prefix: Prefix too when there is no venv
	Site       string   `json:"site"`        // the directory holding the torch package, mounted read-only
	Stdlib     string   `json:"stdlib"`      // mounted read-only
	PlatStdlib string   `json:"platstdlib"`  // mounted read-only
	Libs       []string `json:"libs"`        // extension modules whose libraries the image needs
	Torch      string   `json:"torch"`       // torch.__version__
	DriverLibs []string `json:"driver_libs"` // libcuda*/libnvidia-ml* inside the mounts: must be none
}

// pythonProbe prints pythonInfo as JSON. It imports torch only to find
// its libraries; it does not initialise CUDA.
const pythonProbe = `
import glob, json, os, sys, sysconfig
import torch
dyn = glob.glob(os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload", "*.so"))
tl = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*.so*"))
print(json.dumps({"exe": os.path.realpath(sys.executable), "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "site": os.path.dirname(os.path.dirname(torch.__file__)),
    "stdlib": sysconfig.get_path("stdlib"), "platstdlib": sysconfig.get_path("platstdlib"),
    "libs": dyn + tl, "torch": torch.__version__}))
`

// inspectPython asks the interpreter at path where its parts are.
// Real-GPU assumption: the lent machine's /opt/torch/.venv is a venv whose
// interpreter is a link to a system Python (/usr/bin/python3.12) with its
// standard library in /usr/lib/python3.12; whatever they are, the
// interpreter says so here.
func inspectPython(ctx context.Context, path string) (*pythonInfo, error) {
	cmd := exec.CommandContext(ctx, path, "-c", pythonProbe)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", path, err, harness.TailLines(stderr.String(), 3))
	}
	var p pythonInfo
	if err := json.Unmarshal(out, &p); err != nil {
		return nil, fmt.Errorf("%s printed %q: %w", path, out, err)
	}
	for _, d := range p.mounts() {
		_ = filepath.WalkDir(d, func(f string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && loadedDriverLib.MatchString(e.Name()) {
				p.DriverLibs = append(p.DriverLibs, f)
			}
			return nil
		})
	}
	return &p, nil
}

// loadedDriverLib matches the driver's libraries that CUDA and NVML users
// load by soname (libcuda.so.1, libnvidia-ml.so.1) and the files behind
// those names; an unversioned stub (libcuda.so) is never loaded that way.
var loadedDriverLib = regexp.MustCompile(`^lib(cuda|nvidia-ml)\.so\.`)

// mounts are the host directories a container needs for the interpreter
// (each once, none inside another): the venv, the standard library and
// torch's site-packages. An interpreter outside a venv has the system's
// prefix (/usr): that is never mounted whole.
func (p *pythonInfo) mounts() []string {
	dirs := []string{p.Stdlib, p.PlatStdlib, p.Site}
	if p.Prefix != p.BasePrefix {
		dirs = append([]string{p.Prefix}, dirs...)
	}
	// Parents first, so that a directory inside another is dropped.
	slices.SortStableFunc(dirs, func(a, b string) int { return len(a) - len(b) })
	var out []string
	for _, d := range dirs {
		if d == "" || slices.ContainsFunc(out, func(o string) bool { return d == o || strings.HasPrefix(d, o+"/") }) {
			continue
		}
		out = append(out, d)
	}
	return out
}
