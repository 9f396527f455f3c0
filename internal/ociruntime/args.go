package ociruntime

import "strings"

// Args is a runtime command line as containerd's runc shim builds it for
// Docker: runc's global flags, a verb, the verb's flags, then its
// positional arguments, e.g.
//
//	nri-vgpu-runtime --root /run/docker/runtime-nri-vgpu/moby \
//	    --log /run/containerd/.../log.json --log-format json --systemd-cgroup \
//	    create --bundle /run/containerd/.../<id> --pid-file /.../init.pid <id>
//
// Parsing only finds what the wrapper needs; the command line is always
// passed on to the next runtime unchanged.
type Args struct {
	// Argv is the whole command line, Argv[0] included.
	Argv []string
	// Verb is the runtime command ("create", "delete", ...); "" when the
	// command line has none (e.g. "--version").
	Verb string
	// Global flags the wrapper uses: the runtime's state root, its log file
	// and log format ("text" or "json"), and --debug.
	Root, Log, LogFormat string
	Debug                bool
	// Bundle is the bundle directory of create: --bundle or -b, in either
	// the "--bundle X" or "--bundle=X" form; "" when not given (the
	// current directory, for runc).
	Bundle string
	// ContainerID is the last positional argument after the verb: the
	// container of create, run and delete (kill and exec take more
	// arguments after the ID, so it means nothing for them).
	ContainerID string
}

// globalValueFlags are runc's global flags that take a value (runc 1.1;
// crun and nvidia-container-runtime take the same). The Go flag syntax that
// runc uses accepts one or two dashes, and "--flag=value" or "--flag value".
var globalValueFlags = map[string]bool{
	"root": true, "log": true, "log-format": true, "criu": true, "rootless": true,
}

// verbValueFlags are the flags of the verbs that take a value, so that their
// values are not mistaken for positional arguments. Flags not listed are
// taken as booleans unless written "--flag=value".
var verbValueFlags = map[string]map[string]bool{
	"create": {"bundle": true, "b": true, "console-socket": true, "pid-file": true, "preserve-fds": true},
	"run":    {"bundle": true, "b": true, "console-socket": true, "pid-file": true, "preserve-fds": true},
	"delete": {},
}

// splitFlag splits "-x", "--x" and "--x=v" into the name and the value.
func splitFlag(a string) (name, value string, hasValue bool) {
	name = strings.TrimLeft(a, "-")
	name, value, hasValue = strings.Cut(name, "=")
	return name, value, hasValue
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' }

// ParseArgs parses a runtime command line (argv[0] included). It never
// fails: a command line it does not understand is simply passed through.
func ParseArgs(argv []string) *Args {
	a := &Args{Argv: argv}
	i := 1
	for i < len(argv) {
		arg := argv[i]
		if arg == "--" {
			i++
			break
		}
		if !isFlag(arg) {
			break
		}
		name, value, hasValue := splitFlag(arg)
		i++
		if globalValueFlags[name] && !hasValue {
			if i >= len(argv) {
				break
			}
			value, hasValue = argv[i], true
			i++
		}
		switch name {
		case "root":
			a.Root = value
		case "log":
			a.Log = value
		case "log-format":
			a.LogFormat = value
		case "debug":
			a.Debug = !hasValue || value == "true"
		}
	}
	if i >= len(argv) {
		return a
	}
	a.Verb = argv[i]
	valueFlags := verbValueFlags[a.Verb]
	var positional []string
	for i++; i < len(argv); i++ {
		arg := argv[i]
		if arg == "--" {
			positional = append(positional, argv[i+1:]...)
			break
		}
		if !isFlag(arg) {
			positional = append(positional, arg)
			continue
		}
		name, value, hasValue := splitFlag(arg)
		if valueFlags[name] && !hasValue && i+1 < len(argv) {
			i++
			value, hasValue = argv[i], true
		}
		if (name == "bundle" || name == "b") && hasValue && (a.Verb == "create" || a.Verb == "run") {
			a.Bundle = value
		}
	}
	if len(positional) > 0 {
		a.ContainerID = positional[len(positional)-1]
	}
	return a
}
