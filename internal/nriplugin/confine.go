package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/logging"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
)

// ErrUnconfined refuses a GPU container that cannot get the confinement
// while nri.confinement is "required".
var ErrUnconfined = errors.New(`GPU container refused: nri.confinement = "required"`)

// seccompNRIVersion is the first NRI version whose runtime side applies a
// plugin's seccomp policy (ContainerAdjustment.SetLinuxSeccompPolicy) and
// passes the container's seccomp profile to plugins: containerd 2.2.
const seccompNRIVersion = "v0.10.0"

// runtimeInfo is what the plugin learned of the runtime at Configure.
type runtimeInfo struct {
	name, version, nriVersion string
	// confines: the runtime's NRI applies seccomp adjustments; reason says
	// why not. cannot: its NRI version is known to predate them. Where the
	// version is not known, each container decides: a runtime whose NRI
	// applies seccomp adjustments passes the container's seccomp profile.
	confines, cannot bool
	reason           string
}

// Configure records which runtime the plugin serves and whether it can
// apply the confinement, says so in the log (a warning where it cannot),
// and writes it to <run_dir>/runtime.json for status and metrics.
func (p *Plugin) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	nriVersion := ""
	p.mu.Lock()
	if p.stub != nil {
		nriVersion = p.stub.RuntimeNRIVersion()
	}
	p.mu.Unlock()
	if !versionKnown(nriVersion) {
		// Inferred from the runtime's version when the runtime does not
		// report it (containerd 1.7), which may come without its "v" and
		// with build metadata ("1.7.35+unknown" from go install).
		if v, err := api.InferVersionFromRuntime(runtime, releaseVersion(version)); err == nil {
			nriVersion = v
		}
	}
	rt := &runtimeInfo{name: runtime, version: version, nriVersion: nriVersion}
	switch {
	case !versionKnown(nriVersion):
		rt.reason = fmt.Sprintf("%s %s reports no NRI version: GPU containers are confined where the runtime passes their seccomp profile (NRI %s, containerd 2.2, and later do)",
			runtime, version, seccompNRIVersion)
	case !versionAtLeast(nriVersion, seccompNRIVersion):
		rt.cannot = true
		rt.reason = fmt.Sprintf("%s %s (NRI %s) does not apply NRI seccomp adjustments; NRI %s (containerd 2.2) and later do",
			runtime, version, nriVersion, seccompNRIVersion)
	default:
		rt.confines = true
	}
	p.runtime.Store(rt)

	log := p.log.With("runtime", runtime, "runtime_version", version, "nri_version", nriVersion)
	if rt.confines {
		log.Info("the runtime applies the confinement of GPU containers (NRI seccomp adjustment)")
	} else if !rt.cannot {
		log.Warn("cannot tell whether the runtime applies the confinement of GPU containers", "reason", rt.reason)
	} else if p.cfg.NRI.Confinement == config.ConfinementRequired {
		log.Warn(`the runtime cannot confine GPU containers: they are refused (nri.confinement = "required")`, "reason", rt.reason)
	} else {
		log.Warn(`the runtime cannot confine GPU containers: they run without the confinement, and their processes can run programs without the limiter (nri.confinement = "best-effort")`, "reason", rt.reason)
	}
	record := &hoststate.Runtime{
		Name: runtime, Version: version, NRIVersion: nriVersion,
		Confinement: rt.confines, Reason: rt.reason,
		ConfinementPolicy: p.cfg.NRI.Confinement, Connected: time.Now().UTC(),
	}
	// Written under p.mu, as recordDriverFiles writes, so that neither
	// write undoes the other.
	p.mu.Lock()
	if p.record != nil {
		record.DriverFiles = p.record.DriverFiles // until resolved again, below
	}
	p.record = record
	if err := hoststate.WriteRuntime(p.cfg, record); err != nil {
		// Status and metrics then show what they knew; containers are
		// handled as decided above either way.
		log.Error("cannot record the runtime for status and metrics", "err", err)
	}
	p.mu.Unlock()
	go p.resolveDriverFiles()
	return 0, nil
}

// resolveDriverFiles resolves how GPU containers will get the driver's
// files and records it in runtime.json, so that status shows it before the
// first GPU container. It runs beside the connection: generating a CDI spec
// opens NVML, which on a real GPU may take longer than the runtime waits for
// Configure; the spec it generates is kept for the containers
// (oci.HostFS.GeneratedCDISpec), which wait for it if they come first.
func (p *Plugin) resolveDriverFiles() {
	// One at a time; a later one finds a generated spec kept.
	p.resolveMu.Lock()
	defer p.resolveMu.Unlock()
	df, warnings, err := oci.ResolveDriverFiles(p.cfg, p.host, p.hook)
	for _, w := range warnings {
		p.log.Warn(w)
	}
	if err != nil {
		p.log.Error("GPU containers cannot get the driver's files", "err", err)
		df = oci.DriverFiles{Source: "unavailable: " + err.Error()}
	}
	p.recordDriverFiles(df)
}

// recordDriverFiles updates runtime.json when a container got the driver's
// files otherwise than recorded (a CDI spec appeared, the driver changed).
func (p *Plugin) recordDriverFiles(df oci.DriverFiles) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.record == nil || p.record.DriverFiles == df.Source {
		return
	}
	rec := *p.record
	rec.DriverFiles = df.Source
	p.log.Info("driver files of GPU containers", "injection", p.cfg.Driver.Injection, "driver_files", df.Source)
	if err := hoststate.WriteRuntime(p.cfg, &rec); err != nil {
		p.log.Error("cannot record the driver files for status", "err", err)
		return
	}
	p.record = &rec
}

// confine decides the seccomp policy of a GPU container: the confinement
// of its own policy, unless its namespace is exempt (nri.confinement_exempt)
// or the runtime cannot apply it, in which case nri.confinement decides
// between refusing the container and letting it run unconfined.
func (p *Plugin) confine(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, edits *oci.Edits) error {
	log := logging.FromContext(ctx)
	if p.cfg.NRI.ConfinementExemptFor(pod.GetNamespace()) {
		log.Info("GPU container not confined: its namespace is exempt (nri.confinement_exempt)", "namespace", pod.GetNamespace())
		return nil
	}
	own, err := p.ownSeccomp(ctr)
	if err == nil {
		edits.ConfineSeccomp(own)
		return nil
	}
	if p.cfg.NRI.Confinement == config.ConfinementRequired {
		return fmt.Errorf("%w, and %w", ErrUnconfined, err)
	}
	log.Warn("GPU container runs without the confinement (nri.confinement = \"best-effort\")", "reason", err)
	return nil
}

// ownSeccomp returns the seccomp policy the runtime would give the container
// (nil: unconfined), or why it cannot be known or replaced. A runtime whose
// NRI applies seccomp adjustments passes the policy of the container's spec
// (containerd: Linux.SeccompPolicy from the spec, whatever set it: the pod,
// or the runtime's default for pods that set none); an older one passes
// neither policy nor profile and drops the adjustment. Replacing a policy
// nri-vgpu was not shown would widen it, so where the runtime's support is
// not known, the container's seccomp profile (passed by the same NRI
// versions) must be there.
func (p *Plugin) ownSeccomp(ctr *api.Container) (*specs.LinuxSeccomp, error) {
	rt := p.runtime.Load()
	if rt != nil && rt.cannot {
		return nil, errors.New(rt.reason)
	}
	lc := ctr.GetLinux()
	profile := lc.GetSeccompProfile()
	if (rt == nil || !rt.confines) && profile == nil {
		return nil, errors.New("the runtime passed no seccomp profile of the container: nri-vgpu cannot tell whether it applies NRI seccomp adjustments (NRI " + seccompNRIVersion + ", containerd 2.2, and later do)")
	}
	policy := lc.GetSeccompPolicy()
	if policy == nil {
		if profile != nil && profile.GetProfileType() != api.SecurityProfile_UNCONFINED {
			return nil, fmt.Errorf("the runtime passed the container's %s seccomp profile but not its policy, which the confinement would have to keep", profile.GetProfileType())
		}
		return nil, nil
	}
	return seccompToOCI(policy), nil
}

// seccompToOCI converts a seccomp policy as NRI passes it to the OCI form.
func seccompToOCI(p *api.LinuxSeccomp) *specs.LinuxSeccomp {
	out := &specs.LinuxSeccomp{
		DefaultAction:    specs.LinuxSeccompAction(p.GetDefaultAction()),
		ListenerPath:     p.GetListenerPath(),
		ListenerMetadata: p.GetListenerMetadata(),
		Syscalls:         api.ToOCILinuxSyscalls(p.GetSyscalls()),
	}
	if e := p.GetDefaultErrno(); e != nil {
		v := uint(e.GetValue())
		out.DefaultErrnoRet = &v
	}
	for _, a := range p.GetArchitectures() {
		out.Architectures = append(out.Architectures, specs.Arch(a))
	}
	for _, f := range p.GetFlags() {
		out.Flags = append(out.Flags, specs.LinuxSeccompFlag(f))
	}
	return out
}

// releaseVersion returns "vMAJOR.MINOR.PATCH" of a version such as
// "1.7.35+unknown" or "v2.4.2-rc.1".
func releaseVersion(v string) string {
	v, _, _ = strings.Cut(v, "+")
	v, _, _ = strings.Cut(v, "-")
	if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}
	return v
}

// versionKnown reports whether v is a release version ("v0.12.3"), not
// NRI's placeholders for unknown and development builds.
func versionKnown(v string) bool {
	_, _, ok := majorMinor(v)
	return ok && v != api.UnknownVersion && v != api.DevelVersion
}

// versionAtLeast compares the major and minor numbers of two versions
// "vMAJOR.MINOR.PATCH".
func versionAtLeast(v, min string) bool {
	vmaj, vmin, ok1 := majorMinor(v)
	mmaj, mmin, ok2 := majorMinor(min)
	if !ok1 || !ok2 {
		return false
	}
	return vmaj > mmaj || (vmaj == mmaj && vmin >= mmin)
}

func majorMinor(v string) (int, int, bool) {
	v, ok := strings.CutPrefix(v, "v")
	if !ok {
		return 0, 0, false
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return major, minor, err1 == nil && err2 == nil
}
