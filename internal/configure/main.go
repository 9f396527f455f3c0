package configure

import (
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"

	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

const usage = `usage: nri-vgpu configure containerd [flags]
       nri-vgpu configure docker [flags]

containerd: enable NRI in containerd (1.7 or later) and register the nri-vgpu
plugin. The main config keeps every setting and comment: NRI is enabled by a
drop-in file that the main config imports.

docker: add the nri-vgpu runtime (nri-vgpu-runtime) to dockerd's daemon.json.

Neither restarts a daemon; each says what to restart. --dry-run prints the
change as a unified diff and writes nothing.

Run "nri-vgpu configure containerd -h" for the flags.
`

// Main runs the configure subcommand. args are the arguments after
// "configure" (such as ["containerd", "--dry-run"]). It returns the process
// exit status: 0 on success (changed or not), 1 when configuring failed, 2
// for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "containerd":
		return mainContainerd(args[1:], stdout, stderr)
	case "docker":
		return mainDocker(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "nri-vgpu configure: unknown runtime %q (want containerd or docker)\n\n%s", args[0], usage)
		return 2
	}
}

func mainContainerd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-vgpu configure containerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts ContainerdOptions
	fs.StringVar(&opts.ConfigPath, "containerd-config", DefaultContainerdConfig, "containerd's main config `file`")
	fs.StringVar(&opts.DropInDir, "drop-in-dir", DefaultDropInDir, "`directory` for the drop-in "+DropInName)
	fs.StringVar(&opts.Binary, "containerd", "containerd", "containerd `executable`, run with --version to learn its version")
	fs.StringVar(&opts.Version, "containerd-version", "", "containerd's `version` (such as 1.7.29); skips running containerd --version")
	fs.StringVar(&opts.PluginBinary, "plugin-binary", DefaultPluginBinary, "the nri-vgpu `executable` to register as an NRI plugin")
	fs.StringVar(&opts.PluginIndex, "plugin-index", "", "the plugin's two-digit NRI `index` (default: nri.plugin_index of nri-vgpu's config, else "+DefaultPluginIndex+")")
	fs.BoolVar(&opts.NoRegister, "no-register", false, "enable NRI only; leave NRI's plugin directory alone (where the plugin runs as a DaemonSet or as the nri-vgpu service)")
	fs.BoolVar(&opts.NoRequire, "no-require", false, "on containerd 2.2 and later, do not make NRI's validator refuse containers while nri-vgpu is not connected")
	fs.StringVar(&opts.Root, "root", "/", "`directory` that stands for / when reading and writing files")
	dryRun := fs.Bool("dry-run", false, "print the change as a unified diff; write nothing")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	if opts.PluginIndex == "" {
		index, err := configuredPluginIndex(opts.Root)
		if err != nil {
			fmt.Fprintf(stderr, "nri-vgpu configure containerd: %v; using plugin index %s\n", err, DefaultPluginIndex)
			index = DefaultPluginIndex
		}
		opts.PluginIndex = index
	}
	res, err := Containerd(opts)
	return finish("containerd", res, err, *dryRun, stdout, stderr)
}

func mainDocker(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nri-vgpu configure docker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts DockerOptions
	fs.StringVar(&opts.DaemonJSON, "daemon-json", DefaultDaemonJSON, "dockerd's config `file`")
	fs.StringVar(&opts.RuntimeName, "runtime-name", DefaultRuntimeName, "the runtime's `name`, as given to docker run --runtime")
	fs.StringVar(&opts.RuntimePath, "runtime-path", DefaultRuntimePath, "the nri-vgpu-runtime `executable`")
	fs.BoolVar(&opts.DefaultRuntime, "default-runtime", false, "also make it dockerd's default runtime")
	fs.StringVar(&opts.Root, "root", "/", "`directory` that stands for / when reading and writing files")
	dryRun := fs.Bool("dry-run", false, "print the change as a unified diff; write nothing")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	res, err := Docker(opts)
	return finish("docker", res, err, *dryRun, stdout, stderr)
}

// configuredPluginIndex returns nri.plugin_index from nri-vgpu's config: the
// file named by $NRI_VGPU_CONFIG, else the default path under root. Without a
// config file it is the default index.
func configuredPluginIndex(root string) (string, error) {
	path := os.Getenv(config.EnvPath)
	if path == "" {
		path = filepath.Join(root, config.DefaultPath)
		if _, err := os.Stat(path); errors.Is(err, iofs.ErrNotExist) {
			return DefaultPluginIndex, nil
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return "", fmt.Errorf("reading the plugin index from nri-vgpu's config: %w", err)
	}
	return cfg.NRI.PluginIndex, nil
}

// parseFlags parses args; done is true when the command should stop with
// code (after -h, or on a usage error).
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	// The flag package prints the usage on -h as well as on an error; -h
	// gets it once, on stdout, below.
	usage := fs.Usage
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0, true
	case err != nil:
		usage() // after the problem, which the flag package has printed
		return 2, true
	case fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, true
	}
	return 0, false
}

func finish(what string, res *Result, err error, dryRun bool, stdout, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintf(stderr, "nri-vgpu configure %s: %v\n", what, err)
		return 1
	}
	fmt.Fprint(stdout, res.Diff())
	if dryRun {
		if res.Changed() {
			fmt.Fprintln(stdout, "dry run: nothing written")
		}
	} else if err := res.Apply(); err != nil {
		fmt.Fprintf(stderr, "nri-vgpu configure %s: %v\n", what, err)
		return 1
	} else {
		for _, c := range res.Changes {
			fmt.Fprintf(stdout, "wrote %s\n", c.Path)
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintln(stdout, n)
	}
	if !dryRun && res.Reload != "" {
		fmt.Fprintln(stdout, res.Reload)
	}
	return 0
}
