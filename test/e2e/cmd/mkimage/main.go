// Command mkimage writes a single-layer container image built from host files
// as a docker-archive tarball, for `ctr images import` or `docker load` on a
// machine without a registry.
//
//	mkimage -o busybox.tar -ref nri-vgpu.test/busybox:e2e \
//	  -busybox /bin/busybox -file ./prog:/usr/local/bin/prog:libs \
//	  -env PATH=/usr/local/bin:/bin -cmd sleep,infinity
//
// -file SRC:DST[:libs] copies SRC to DST (with the shared libraries ldd finds
// when ":libs" is given); -link DST=TARGET adds a symlink; -dir DST an empty
// directory; -busybox PATH installs a static busybox at /bin/busybox with a
// link for each applet.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nri-vgpu/nri-vgpu/test/e2e/image"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		slog.Error("mkimage failed", "err", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var (
		out     = fs.String("o", "", "output tarball (required)")
		ref     = fs.String("ref", "", "image reference, e.g. nri-vgpu.test/busybox:e2e (required)")
		busybox = fs.String("busybox", "", "a static busybox to install at /bin/busybox with its applet links")
		arch    = fs.String("arch", "", "image architecture (default: this machine's)")
		cmd     = fs.String("cmd", "", "comma-separated image command")
		entry   = fs.String("entrypoint", "", "comma-separated image entrypoint")
		files   list
		links   list
		dirs    list
		env     list
	)
	fs.Var(&files, "file", "SRC:DST[:libs] (repeatable)")
	fs.Var(&links, "link", "DST=TARGET symlink (repeatable)")
	fs.Var(&dirs, "dir", "empty directory (repeatable)")
	fs.Var(&env, "env", "KEY=value of the image config (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" {
		return errors.New("-o and -ref are required")
	}
	spec := image.Spec{Ref: *ref, Arch: *arch, Env: env, Dirs: dirs, Symlinks: map[string]string{}}
	if *cmd != "" {
		spec.Cmd = strings.Split(*cmd, ",")
	}
	if *entry != "" {
		spec.Entrypoint = strings.Split(*entry, ",")
	}
	if *busybox != "" {
		applets, err := image.BusyboxApplets(*busybox)
		if err != nil {
			return err
		}
		for k, v := range applets {
			spec.Symlinks[k] = v
		}
		spec.Files = append(spec.Files, image.File{Src: *busybox, Dst: "/bin/busybox", Mode: 0o755})
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "libs") {
			return fmt.Errorf("-file %q: want SRC:DST or SRC:DST:libs", f)
		}
		spec.Files = append(spec.Files, image.File{Src: parts[0], Dst: parts[1], WithLibs: len(parts) == 3})
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok || dst == "" || target == "" {
			return fmt.Errorf("-link %q: want DST=TARGET", l)
		}
		spec.Symlinks[dst] = target
	}
	if err := image.Write(*out, spec); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s)\n", *out, *ref)
	return nil
}
