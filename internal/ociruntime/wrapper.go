// Package ociruntime is nri-vgpu-runtime, the OCI runtime wrapper that gives
// Docker containers their vGPU (Contract 6 of the design). Docker runs it
// with runc's command line; on create it reads the container's request from
// its environment, admits it against the node's admission record, provisions its host
// files (internal/hoststate), applies the same edits as the NRI plugin
// (pkg/oci) to the bundle's config.json, and execs the next runtime with
// the command line unchanged. Every other verb goes straight to the next
// runtime, except the delete of a container this wrapper prepared: that
// runs the next runtime as a child, and releases the container's host
// directory and admission entry once the runtime has deleted it.
package ociruntime

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nri-vgpu/nri-vgpu/internal/admission"
	"github.com/nri-vgpu/nri-vgpu/internal/hoststate"
	"github.com/nri-vgpu/nri-vgpu/internal/pin"
	"github.com/nri-vgpu/nri-vgpu/internal/version"
	"github.com/nri-vgpu/nri-vgpu/pkg/allocation"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
	"github.com/nri-vgpu/nri-vgpu/pkg/gpu"
	"github.com/nri-vgpu/nri-vgpu/pkg/oci"
	"github.com/nri-vgpu/nri-vgpu/pkg/quantity"
)

// Name is the program's name, which starts every message it writes.
const Name = "nri-vgpu-runtime"

// Wrapper is one invocation of the runtime wrapper. Zero-valued hooks take
// the real node's: tests replace them.
type Wrapper struct {
	Config *config.Config
	// Log receives what the wrapper did (the runtime log, see openRuntimeLog).
	Log *slog.Logger

	// Devices lists the node's GPUs (default: the configured gpu backend).
	Devices func() ([]gpu.Device, error)
	// Host is the node as pkg/oci sees it (default: oci.NewHost).
	Host oci.Host
	// Exec replaces the process with the next runtime; it returns only on
	// failure (default: syscall.Exec).
	Exec func(path string, argv, env []string) error
	// Spawn runs the next runtime as a child process with the wrapper's
	// stdio and returns its exit status; err only when it could not be run
	// (default: runChild).
	Spawn func(path string, argv, env []string) (status int, err error)
	// Environ is the environment passed to the next runtime (default:
	// os.Environ).
	Environ func() []string
	// Path is the PATH the next runtime is looked up in, and Self the
	// wrapper's own executable, which is never exec'd.
	Path, Self string
	// Now is the clock (default: time.Now).
	Now func() time.Time
	// PassThrough skips the wrapper's own work: every verb, create
	// included, only execs the next runtime. Main sets it when the
	// configuration cannot be loaded, so that existing containers can
	// still be stopped and deleted.
	PassThrough bool
	// Stdout receives the wrapper's own version line before the next
	// runtime prints its version (default: os.Stdout).
	Stdout io.Writer
}

// ExitStatusError is the failure of a next runtime that ran as a child: the
// wrapper exits with Status and adds no message of its own, since the
// runtime has already reported why.
type ExitStatusError struct {
	Path   string
	Status int
}

func (e *ExitStatusError) Error() string {
	return fmt.Sprintf("next runtime %s exited with status %d", e.Path, e.Status)
}

// Run handles one command line: the work of create, then the exec of the
// next runtime with argv unchanged. It returns only on error, or, with a
// test's Exec, after "exec". The delete of a container this wrapper
// prepared is the exception: the next runtime runs as a child, and Run
// returns its failure as an *ExitStatusError.
func (w *Wrapper) Run(a *Args) error {
	w.defaults()
	next, err := FindNext(w.Config.Runtime.Next, w.Path, w.Self)
	if err != nil {
		return err
	}
	w.Log.Debug("invoked", "argv", a.Argv, "next", next, "pass_through", w.PassThrough)
	argv := []string{next}
	if len(a.Argv) > 1 {
		argv = append(argv, a.Argv[1:]...)
	}
	var undo func()
	switch {
	case w.PassThrough:
	case a.Verb == "create":
		if undo, err = w.create(a); err != nil {
			return err
		}
	case a.Verb == "delete" && w.prepared(a.ContainerID):
		return w.delete(a, next, argv)
	case versionAsked(a):
		// Our version first, then the next runtime's, as wrappers of runc
		// do: dockerd reads the last "version" line as the runtime's.
		fmt.Fprintf(w.Stdout, "%s version %s\nnext runtime: %s\n\n", Name, version.Version, next)
	}
	if err := w.Exec(next, argv, w.Environ()); err != nil {
		if undo != nil {
			undo()
		}
		return fmt.Errorf("exec next runtime %s: %w", next, err)
	}
	return nil
}

func (w *Wrapper) defaults() {
	if w.Log == nil {
		w.Log = slog.New(slog.DiscardHandler)
	}
	if w.Devices == nil {
		w.Devices = func() ([]gpu.Device, error) { return listGPUs(w.Config) }
	}
	if w.Exec == nil {
		w.Exec = syscall.Exec
	}
	if w.Spawn == nil {
		w.Spawn = runChild
	}
	if w.Environ == nil {
		w.Environ = os.Environ
	}
	if w.Now == nil {
		w.Now = time.Now
	}
	if w.Stdout == nil {
		w.Stdout = os.Stdout
	}
}

// versionAsked reports whether the command line asks for the runtime's
// version (runc's --version / -v, with no verb).
func versionAsked(a *Args) bool {
	if a.Verb != "" {
		return false
	}
	for _, arg := range a.Argv[1:] {
		if name, _, _ := splitFlag(arg); isFlag(arg) && (name == "version" || name == "v") {
			return true
		}
	}
	return false
}

func listGPUs(cfg *config.Config) ([]gpu.Device, error) {
	b, err := gpu.New(cfg)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	return b.Devices()
}

// create edits the bundle of a container that asks for vGPUs. It returns a
// function that takes the reservation back if the next runtime cannot be
// started; nil (and no error) for a container that asks for none, whose
// bundle is left as it is. It reads verify → provision → apply: the request
// is resolved against the node's GPUs, admitted and provisioned under the
// admission record's lock, and the edits that mount the provisioned files are applied
// to the bundle.
func (w *Wrapper) create(a *Args) (undo func(), err error) {
	id := a.ContainerID
	if id == "" {
		return nil, nil // not a create the next runtime accepts; let it say so
	}
	spec, err := LoadSpec(a.Bundle)
	if err != nil {
		return nil, err
	}
	req, err := RequestFromEnv(spec.Env())
	if err != nil || req == nil {
		return nil, err
	}
	if err := hoststate.ValidID(id); err != nil {
		return nil, err
	}
	cfg := w.Config
	devices, err := w.Devices()
	if err != nil {
		return nil, fmt.Errorf("list the node's GPUs for %s: %w", EnvDevices, err)
	}
	now := w.Now()
	dec, err := req.Resolve(devices, cfg, id, now)
	if err != nil {
		return nil, err
	}

	info := &hoststate.Info{
		ID:           id,
		AllocationID: dec.Allocation.ID,
		GPUs:         dec.Allocation.GPUs,
		Source:       hoststate.SourceRuntime,
		Created:      now.UTC(),
	}
	lf := dec.Allocation.Limits(cfg.Limits.LogLevel)
	var files oci.HostFiles
	err = w.record().Update(func(s *admission.State) error {
		w.sync(s)
		if err := s.Check(id, dec.Reservations, dec.Capacity); err != nil {
			return err
		}
		// Provisioned under the lock: a concurrent create's Sync must not
		// see the reservation without its directory, nor the reverse.
		f, err := w.state().Provision(info, lf)
		if err != nil {
			return err
		}
		files = f
		s.Add(admission.Entry{ID: id, Source: hoststate.SourceRuntime, Created: now.UTC(), RuntimeRoot: a.Root, GPUs: dec.Reservations})
		return nil
	})
	if err != nil {
		var over *admission.OversubscribedError
		if !errors.As(err, &over) {
			// A directory provisioned but not recorded (the record could
			// not be written) is not accounted.
			if rmErr := w.state().Release(id); rmErr != nil {
				w.Log.Warn("cannot remove the container directory", "container", id, "err", rmErr)
			}
		}
		return nil, err
	}
	undo = func() { w.release(id) }

	if err := w.apply(spec, dec.Allocation.GPUs, files, id); err != nil {
		undo()
		return nil, err
	}
	for _, g := range dec.Allocation.GPUs {
		w.Log.Info("vGPU container", "container", id, "gpu", g.UUID,
			"memory", quantity.FormatBytes(g.Memory), "cores", g.Cores, "cores_policy", lf.CoresPolicy)
	}
	return undo, nil
}

// apply computes the edits of the GPUs whose host files were provisioned
// at files and writes them into the bundle's spec.
func (w *Wrapper) apply(spec *Spec, gpus []allocation.GPU, files oci.HostFiles, id string) error {
	host := w.Host
	if host == nil {
		h := oci.NewHost(w.Config, false)
		defer h.Close()
		host = h
	}
	// This binary is the pin hook too (Main) unless paths.hook_path
	// names another: the one Docker runs is on the host, where runc runs
	// the hook.
	files.Hook = cmp.Or(w.Config.Paths.HookPath, w.Self)
	edits, err := oci.Compute(gpus, w.Config, host, files)
	if err != nil {
		return err
	}
	for _, warning := range edits.Warnings {
		w.Log.Warn(warning, "container", id)
	}
	err = spec.Modify(func(s *specs.Spec) error {
		// The confinement (Contract 3) of the policy Docker wrote: its
		// default profile, a --security-opt one, or none (unconfined).
		var own *specs.LinuxSeccomp
		if s.Linux != nil {
			own = s.Linux.Seccomp
		}
		edits.ConfineSeccomp(own)
		return edits.ApplyToSpec(s)
	})
	if err != nil {
		return err
	}
	return spec.Flush()
}

// record is the node's admission record, logging to the runtime log.
func (w *Wrapper) record() *admission.Record {
	l := admission.New(w.Config.Paths.StateDir)
	l.Log = w.Log
	return l
}

// state is the node's container records.
func (w *Wrapper) state() *hoststate.Store { return hoststate.New(w.Config) }

// sync reconciles the admission record with the host directories and logs what that
// changed.
func (w *Wrapper) sync(s *admission.State) {
	res, err := s.Sync(w.Config, hoststate.SourceRuntime)
	if err != nil {
		// Without the directory listing the record is all there is; it
		// errs on the side of refusing.
		w.Log.Warn("cannot reconcile the admission record with the container directories", "err", err)
		return
	}
	if len(res.Added)+len(res.Dropped)+len(res.Gone) > 0 {
		w.Log.Info("admission record reconciled", "added", res.Added, "dropped", res.Dropped, "gone", res.Gone)
	}
	for _, err := range res.Errors {
		w.Log.Warn("cannot remove the directory of a gone container", "err", err)
	}
}

// release removes a container's host directory and admission entry.
func (w *Wrapper) release(id string) {
	err := w.record().Update(func(s *admission.State) error {
		if err := w.state().Release(id); err != nil {
			return err
		}
		s.Remove(id)
		return nil
	})
	if err != nil {
		w.Log.Warn("cannot release the container's GPUs", "container", id, "err", err)
	}
}

// prepared reports whether id names a container whose host directory this
// wrapper provisioned. A directory without a readable container.json
// counts: only the NRI plugin's own (Source "nri") are left to it.
func (w *Wrapper) prepared(id string) bool {
	info, err := w.state().Info(id)
	switch {
	case errors.Is(err, hoststate.ErrInvalidID), errors.Is(err, hoststate.ErrNotFound):
		return false // not a vGPU container (or already released)
	case err == nil && info.Source != hoststate.SourceRuntime:
		return false // provisioned by the NRI plugin, which removes its own
	}
	return true
}

// delete runs the next runtime's delete of a container this wrapper
// prepared, and releases the container only once the runtime has deleted
// it: a delete the runtime refuses (without --force, of a running
// container) leaves the container running, and it must stay counted and
// keep its limits and usage region. The container is taken as deleted when
// the runtime succeeded or when its state directory (<root>/<id>) is gone
// afterwards (a delete of a container the runtime never knew fails, and
// there is nothing left to keep).
func (w *Wrapper) delete(a *Args, next string, argv []string) error {
	id := a.ContainerID
	status, err := w.Spawn(next, argv, w.Environ())
	if err != nil {
		return fmt.Errorf("run next runtime %s: %w", next, err)
	}
	if status != 0 && !w.stateGone(a) {
		w.Log.Debug("next runtime did not delete the container; its GPUs stay reserved", "container", id, "status", status)
		return &ExitStatusError{Path: next, Status: status}
	}
	w.release(id)
	w.Log.Debug("released", "container", id)
	if status != 0 {
		return &ExitStatusError{Path: next, Status: status}
	}
	return nil
}

// stateGone reports whether the runtime's state directory of the container
// is known not to exist. Without --root it cannot be known.
func (w *Wrapper) stateGone(a *Args) bool {
	if a.Root == "" {
		return false
	}
	_, err := os.Lstat(filepath.Join(a.Root, a.ContainerID))
	return errors.Is(err, fs.ErrNotExist)
}

// Main is the program: it returns the exit status. Errors go to stderr and,
// as runc's do, to the runtime log, from which Docker shows them.
func Main(argv []string, stderr io.Writer) int {
	if len(argv) > 1 && argv[1] == oci.PinHookArgs[0] {
		// runc has no such verb: this is the createContainer hook this
		// wrapper put into the spec.
		return pin.Main(Name, argv[1:], os.Stdin, stderr)
	}
	a := ParseArgs(argv)
	log, closeLog := openRuntimeLog(a)
	defer closeLog.Close()
	report := func(err error) {
		msg := Name + ": " + err.Error()
		fmt.Fprintln(stderr, msg)
		log.Error(msg)
	}
	fail := func(err error) int {
		var exit *ExitStatusError
		if errors.As(err, &exit) {
			return exit.Status // the next runtime has said why
		}
		report(err)
		return 1
	}
	cfg, err := config.LoadResolved("")
	passThrough := false
	if err != nil {
		if a.Verb == "create" {
			return fail(err)
		}
		// A broken config must not make existing containers unstoppable:
		// kill, delete and state go to the default next runtime untouched.
		// The host directories of containers deleted meanwhile are left to
		// the admission record's reconciliation (admission.State.Sync) at a later create.
		report(fmt.Errorf("%w (passing %q through to the default next runtime)", err, a.Verb))
		cfg, passThrough = config.Default(), true
	}
	self, err := os.Executable()
	if err != nil {
		return fail(fmt.Errorf("locate this executable: %w", err))
	}
	w := &Wrapper{Config: cfg, Log: log, Path: os.Getenv("PATH"), Self: self, PassThrough: passThrough}
	if err := w.Run(a); err != nil {
		return fail(err)
	}
	return 0
}
