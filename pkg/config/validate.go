package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/pkg/limits"
)

// Validate checks every value and returns all problems found, joined; nil
// when the configuration is usable. Parse and Load call it, with the line of
// each key; called on a Config built in code, errors name the key only.
func (c *Config) Validate() error { return c.validate(nil) }

// checker collects problems, each located by its key path.
type checker struct {
	file string
	loc  *locator
	errs []*Error
}

func (ck *checker) add(path, format string, args ...any) {
	ck.errs = append(ck.errs, &Error{
		File: ck.file,
		Line: ck.loc.line(path),
		Key:  path,
		Err:  fmt.Errorf(format, args...),
	})
}

func (c *Config) validate(loc *locator) error {
	ck := &checker{file: c.Source, loc: loc}
	c.DevicePlugin.validate(ck)
	c.GPU.validate(ck, &c.DevicePlugin)
	c.Driver.validate(ck)
	c.Paths.validate(ck)
	c.NRI.validate(ck)
	c.Runtime.validate(ck)
	c.Metrics.validate(ck)
	c.Limits.validate(ck)
	c.DRA.validate(ck)
	// Report in file order, as a compiler would.
	sort.SliceStable(ck.errs, func(i, j int) bool {
		return ck.errs[i].Line < ck.errs[j].Line
	})
	errs := make([]error, len(ck.errs))
	for i, e := range ck.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

func (d *DevicePlugin) validate(ck *checker) {
	if err := checkResourceName(d.ResourceName); err != nil {
		ck.add("device_plugin.resource_name", "%w", err)
	}
	checkSplitCount(ck, "device_plugin.split_count", d.SplitCount)
	checkScaling(ck, "device_plugin.memory_scaling", d.MemoryScaling)
	checkScaling(ck, "device_plugin.cores_scaling", d.CoresScaling)
	checkOneOf(ck, "device_plugin.allocation_policy", d.AllocationPolicy, PolicyBinpack, PolicySpread)
	checkAbs(ck, "device_plugin.socket_dir", d.SocketDir)
	if d.FeatureFile != "" {
		checkAbs(ck, "device_plugin.feature_file", d.FeatureFile)
		// Node Feature Discovery skips hidden files.
		if base := filepath.Base(d.FeatureFile); strings.HasPrefix(base, ".") {
			ck.add("device_plugin.feature_file", "must not name a hidden file (%q), which Node Feature Discovery does not read", base)
		}
	} else if d.FeatureNVIDIALabels {
		ck.add("device_plugin.feature_nvidia_labels", "needs device_plugin.feature_file")
	}
	seen := make(map[string]int)
	for i, m := range d.Models {
		p := indexPath("device_plugin.model", i)
		switch first, dup := seen[m.Name]; {
		case m.Name == "":
			ck.add(p+".name", `must be set to an NVML product name such as "NVIDIA A100-SXM4-40GB"`)
		case dup:
			ck.add(p+".name", "%q is already overridden by device_plugin.model[%d]", m.Name, first)
		default:
			seen[m.Name] = i
		}
		checkSplitCount(ck, p+".split_count", m.SplitCount)
	}
}

func checkSplitCount(ck *checker, path string, n int) {
	if n < MinSplitCount || n > MaxSplitCount {
		ck.add(path, "must be from %d to %d, not %d", MinSplitCount, MaxSplitCount, n)
	}
}

func checkScaling(ck *checker, path string, v float64) {
	// Written so that NaN fails too.
	if !(v > 0 && v <= MaxScaling) {
		ck.add(path, "must be more than 0 and at most %g, not %g", MaxScaling, v)
	}
}

// Kubernetes extended resource names: "<DNS subdomain>/<name>", outside the
// kubernetes.io domain (k8s.io/apimachinery validation, restated here to
// fail at start rather than at kubelet registration).
var (
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	resourceName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
)

func checkResourceName(s string) error {
	bad := func(why string) error {
		return fmt.Errorf(`%q is not an extended resource name such as "nvidia.com/gpu": %s`, s, why)
	}
	domain, name, ok := strings.Cut(s, "/")
	switch {
	case !ok || strings.Contains(name, "/"):
		return bad(`want exactly one "/" between a domain and a name`)
	case len(domain) > 253 || !dnsSubdomain.MatchString(domain):
		return bad("the domain must be a lower-case DNS name")
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return bad("the kubernetes.io domain is reserved")
	case len(name) > 63 || !resourceName.MatchString(name):
		return bad("the name must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
	}
	return nil
}

// uuidPattern accepts NVML UUIDs ("GPU-" and hex groups) and anything of the
// same alphabet, which keeps device IDs ("<uuid>::<slice>"), limits files
// and file names unambiguous.
var uuidPattern = regexp.MustCompile(`^GPU-[0-9A-Za-z][0-9A-Za-z-]*$`)

// pciBusIDPattern is NVML's form, "00000000:07:00.0" (4- or 8-digit domain).
var pciBusIDPattern = regexp.MustCompile(`^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

// The forms of a simulated GPU's description, as NVML reports them on a
// real one: "8.0" and "12.4" (major.minor), "550.54.15", and sysfs' name of
// a PCIe root complex.
var (
	majorMinorPattern    = regexp.MustCompile(`^[0-9]+\.[0-9]+$`)
	driverVersionPattern = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,2}$`)
	pcieRootPattern      = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)
)

// maxDescriptionLength is the longest architecture or brand: what a
// Kubernetes device attribute's string holds.
const maxDescriptionLength = 64

// MaxMinor is the largest minor of a /dev/nvidia<minor> GPU node; 255 is
// /dev/nvidiactl.
const MaxMinor = 254

func (g *GPU) validate(ck *checker, dp *DevicePlugin) {
	checkOneOf(ck, "gpu.backend", g.Backend, BackendNVML, BackendSimulated)
	if g.Backend == BackendSimulated && len(g.Simulated) == 0 {
		ck.add("gpu.backend", `is "simulated" but no [[gpu.simulated]] GPU is described`)
	}
	uuids := make(map[string]int)
	minors := make(map[int]int)
	buses := make(map[string]int)
	for i, s := range g.Simulated {
		p := indexPath("gpu.simulated", i)
		if !uuidPattern.MatchString(s.UUID) {
			ck.add(p+".uuid", `must look like "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f" ("GPU-" then letters, digits and "-"), not %q`, s.UUID)
		} else if err := limits.ValidateUUID(s.UUID); err != nil {
			// Too long for device IDs and the allocation: the GPU would
			// be advertised, but every Allocate of it refused.
			ck.add(p+".uuid", "%w", err)
		} else if first, dup := uuids[s.UUID]; dup {
			ck.add(p+".uuid", "%q is already used by gpu.simulated[%d]", s.UUID, first)
		} else {
			uuids[s.UUID] = i
		}
		if strings.TrimSpace(s.Name) == "" {
			ck.add(p+".name", `must be set to a product name such as "NVIDIA A100-SXM4-40GB"`)
		}
		if s.Minor < 0 || s.Minor > MaxMinor {
			ck.add(p+".minor", "must be from 0 to %d, not %d", MaxMinor, s.Minor)
		} else if first, dup := minors[s.Minor]; dup {
			ck.add(p+".minor", "%d is already used by gpu.simulated[%d]", s.Minor, first)
		} else {
			minors[s.Minor] = i
		}
		if s.PCIBusID != "" {
			if !pciBusIDPattern.MatchString(s.PCIBusID) {
				ck.add(p+".pci_bus_id", `must look like "00000000:07:00.0", not %q`, s.PCIBusID)
			} else if first, dup := buses[strings.ToLower(s.PCIBusID)]; dup {
				ck.add(p+".pci_bus_id", "%q is already used by gpu.simulated[%d]", s.PCIBusID, first)
			} else {
				buses[strings.ToLower(s.PCIBusID)] = i
			}
		}
		checkSimulatedMemory(ck, p+".memory", uint64(s.Memory), dp.SplitCountFor(s.Name), dp.MemoryScaling)
		checkSimulatedDescription(ck, p, s)
	}
}

// checkSimulatedDescription checks the optional description of a simulated
// GPU against the forms NVML gives, so that what the DRA driver publishes
// from it is what a real GPU would publish.
func checkSimulatedDescription(ck *checker, p string, s SimulatedGPU) {
	for _, f := range []struct{ key, v string }{{"architecture", s.Architecture}, {"brand", s.Brand}} {
		if f.v != "" && (strings.TrimSpace(f.v) != f.v || len(f.v) > maxDescriptionLength) {
			ck.add(p+"."+f.key, "must be at most %d characters without leading or trailing spaces, not %q", maxDescriptionLength, f.v)
		}
	}
	for _, f := range []struct{ key, v, example string }{
		{"cuda_compute_capability", s.CUDAComputeCapability, "8.0"},
		{"cuda_driver_version", s.CUDADriverVersion, "12.4"},
	} {
		if f.v != "" && !majorMinorPattern.MatchString(f.v) {
			ck.add(p+"."+f.key, "must be major.minor such as %q, not %q", f.example, f.v)
		}
	}
	if s.DriverVersion != "" && !driverVersionPattern.MatchString(s.DriverVersion) {
		ck.add(p+".driver_version", `must be a driver version such as "550.54.15", not %q`, s.DriverVersion)
	}
	if s.PCIeRoot != "" && !pcieRootPattern.MatchString(s.PCIeRoot) {
		ck.add(p+".pcie_root", `must be a PCIe root complex as sysfs names it, such as "pci0000:00", not %q`, s.PCIeRoot)
	}
}

// checkSimulatedMemory rejects memory that is 0 or too small to split: a
// slice is rounded down to a whole MiB, and a slice of 0 bytes would be
// written as 0 in the limits file, which means "no limit".
func checkSimulatedMemory(ck *checker, path string, memory uint64, split int, scaling float64) {
	if memory == 0 {
		ck.add(path, `must be more than 0; write bytes or a quantity such as "40GiB"`)
		return
	}
	if split < MinSplitCount || split > MaxSplitCount || !(scaling > 0 && scaling <= MaxScaling) {
		return // reported on its own key
	}
	// The scaled memory exactly as the device plugin computes it (the
	// scaling as the decimal it is written as): in floats, 0.7 × 90MiB / 63
	// falls just short of the 1MiB it is.
	scaled := limits.Quota(memory, split, split, scaling, 1).Memory
	if scaled/uint64(split) < limits.MiB {
		ck.add(path, "%s split into %d slices (memory_scaling %g) leaves less than 1MiB per slice", Bytes(memory), split, scaling)
	}
}

func (d *Driver) validate(ck *checker) {
	checkOneOf(ck, "driver.injection", d.Injection, InjectionAuto, InjectionCDI, InjectionGenerate, InjectionNVIDIARuntime, InjectionNone)
	if d.Injection == InjectionCDI && len(d.CDIDirs) == 0 {
		ck.add("driver.cdi_dirs", `is empty, but driver.injection = "cdi" needs the directories of the NVIDIA CDI spec`)
	}
	for i, dir := range d.CDIDirs {
		checkAbs(ck, indexPath("driver.cdi_dirs", i), dir)
	}
	checkAbs(ck, "driver.dev_root", d.DevRoot)
	checkAbs(ck, "driver.driver_root", d.DriverRoot)
	for i, dir := range d.LibraryDirs {
		checkAbs(ck, indexPath("driver.library_dirs", i), dir)
	}
}

func (p *Paths) validate(ck *checker) {
	checkAbs(ck, "paths.state_dir", p.StateDir)
	checkAbs(ck, "paths.run_dir", p.RunDir)
	checkAbs(ck, "paths.shim_path", p.ShimPath)
	if p.HookPath != "" {
		checkAbs(ck, "paths.hook_path", p.HookPath)
	}
}

func (n *NRI) validate(ck *checker) {
	if len(n.PluginIndex) != 2 || !isDigit(n.PluginIndex[0]) || !isDigit(n.PluginIndex[1]) {
		ck.add("nri.plugin_index", `must be two digits such as "10" (NRI orders plugins by it), not %q`, n.PluginIndex)
	}
	checkAbs(ck, "nri.socket_path", n.SocketPath)
	seen := make(map[Exemption]int)
	for i, e := range n.Exempt {
		p := indexPath("nri.exempt", i)
		if e.Namespace == "" && e.RuntimeHandler == "" {
			ck.add(p, "sets neither namespace nor runtime_handler; an exemption must name at least one")
			continue
		}
		if e.Namespace != "" && !isDNSLabel(e.Namespace) {
			ck.add(p+".namespace", "%q is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)", e.Namespace)
		}
		if e.RuntimeHandler != "" && !isDNSLabel(e.RuntimeHandler) {
			ck.add(p+".runtime_handler", "%q is not a RuntimeClass handler name (lower-case letters, digits and '-', at most 63)", e.RuntimeHandler)
		}
		if first, dup := seen[e]; dup {
			ck.add(p, "repeats nri.exempt[%d]", first)
		} else {
			seen[e] = i
		}
	}
	checkOneOf(ck, "nri.confinement", n.Confinement, ConfinementBestEffort, ConfinementRequired)
	seenNS := make(map[string]int)
	for i, e := range n.ConfinementExempt {
		p := indexPath("nri.confinement_exempt", i)
		switch first, dup := seenNS[e.Namespace]; {
		case e.Namespace == "":
			ck.add(p+".namespace", "must be set to the namespace whose GPU containers run without the confinement")
		case !isDNSLabel(e.Namespace):
			ck.add(p+".namespace", "%q is not a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)", e.Namespace)
		case dup:
			ck.add(p+".namespace", "%q is already exempt by nri.confinement_exempt[%d]", e.Namespace, first)
		default:
			seenNS[e.Namespace] = i
		}
	}
}

// isDNSLabel reports whether s is an RFC 1123 label, the form Kubernetes
// requires of namespace names and of RuntimeClass handlers.
func isDNSLabel(s string) bool { return len(s) <= 63 && dnsLabel.MatchString(s) }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// runtimeSelf is the wrapper's own name: naming it in runtime.next would make
// it exec itself forever.
const runtimeSelf = "nri-vgpu-runtime"

func (r *Runtime) validate(ck *checker) {
	if len(r.Next) == 0 {
		ck.add("runtime.next", `is empty; list the runtimes to run after nri-vgpu-runtime, e.g. ["nvidia-container-runtime", "runc"]`)
	}
	for i, next := range r.Next {
		p := indexPath("runtime.next", i)
		switch {
		case next == "" || strings.TrimSpace(next) != next:
			ck.add(p, "must be a program name or an absolute path, not %q", next)
		case strings.Contains(next, "/") && !filepath.IsAbs(next):
			ck.add(p, "%q is a relative path; write a name looked up on PATH or an absolute path", next)
		case filepath.Base(next) == runtimeSelf:
			ck.add(p, "%q is this wrapper itself; name the runtime it should run instead", next)
		}
	}
}

func (m *Metrics) validate(ck *checker) {
	if m.Listen == "" {
		return
	}
	_, port, err := net.SplitHostPort(m.Listen)
	if err != nil {
		ck.add("metrics.listen", `must be "host:port" or ":port" (empty turns metrics off), not %q`, m.Listen)
		return
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		ck.add("metrics.listen", "port %q of %q is not a number from 0 to 65535", port, m.Listen)
	}
}

func (l *Limits) validate(ck *checker) {
	checkOneOf(ck, "limits.cores_policy", l.CoresPolicy, limits.CoresPolicyHard, limits.CoresPolicyBurst)
	checkOneOf(ck, "limits.log_level", l.LogLevel, limits.LogLevelError, limits.LogLevelWarn, limits.LogLevelInfo, limits.LogLevelDebug)
}

func (d *DRA) validate(ck *checker) {
	for i, u := range d.GPUs {
		p := indexPath("dra.gpus", i)
		if !uuidPattern.MatchString(u) {
			// An index or a typo would hand no GPU to the driver and leave
			// the intended one with the device plugin.
			ck.add(p, `must be a GPU UUID such as "GPU-8e1c3f5a-0d2b-4c6e-9f71-2a3b4c5d6e7f", not %q`, u)
			continue
		}
		for j, prev := range d.GPUs[:i] {
			if prev == u {
				ck.add(p, "%q is already listed as dra.gpus[%d]", u, j)
			}
		}
	}
	if len(d.GPUs) > 0 && !d.Enabled {
		ck.add("dra.gpus", "lists GPUs but dra.enabled is false; set it to true to hand them to the DRA driver")
	}
	if err := checkDriverName(d.DriverName); err != nil {
		ck.add("dra.driver_name", "%w", err)
	}
	checkAbs(ck, "dra.cdi_dir", d.CDIDir)
	checkOneOf(ck, "dra.unhealthy_taint_effect", d.UnhealthyTaintEffect, TaintEffectNoSchedule, TaintEffectNoExecute)
}

// checkDriverName requires what Kubernetes requires of a DRA driver name: a
// lower-case DNS subdomain of at most 63 characters.
func checkDriverName(s string) error {
	if s == "" || len(s) > 63 {
		return fmt.Errorf("must be a lower-case DNS subdomain of 1 to 63 characters such as %q, not %q", DefaultDRADriverName, s)
	}
	for _, label := range strings.Split(s, ".") {
		if !dnsLabel.MatchString(label) {
			return fmt.Errorf("must be a lower-case DNS subdomain such as %q, not %q", DefaultDRADriverName, s)
		}
	}
	return nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func checkOneOf(ck *checker, path, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	ck.add(path, "must be one of %s, not %q", quoteList(allowed), v)
}

func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// checkAbs requires an absolute path: the binaries run as services whose
// working directory is not something to rely on.
func checkAbs(ck *checker, path, v string) {
	if !filepath.IsAbs(v) {
		ck.add(path, "must be an absolute path, not %q", v)
	}
}
