// Command manpage writes the manual pages of nri-vgpu's commands for the
// node packages (hack/packages.sh runs it). Each page is made from what the
// command says about itself: DESCRIPTION from its package doc comment, the
// synopsis, options and subcommands from what its -h prints. What a help
// text cannot say (the page's one-line summary, files, environment) is in
// the table below.
//
//	go run ./hack/manpage -bin bin -out DIR -version VERSION -date YYYY-MM-DD
//
// The binaries in -bin must run on this machine.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nri-vgpu/nri-vgpu/internal/manpage"
	"github.com/nri-vgpu/nri-vgpu/pkg/config"
)

type page struct {
	name    string // the executable, and the page
	pkg     string // the command's package directory, for its doc comment
	summary string // the NAME line's description
	// synopsis is used when the help has no "usage:" paragraph.
	synopsis []string
	// help is the arguments that print the flags of the OPTIONS section;
	// nil when the command has no flags of its own.
	help     []string
	commands []command
	env      []entry
	files    []entry
	seeAlso  string
}

// command is a subcommand: its heading, the arguments that print its help
// (nil: none) and text the help does not give.
type command struct {
	title string
	help  []string
	text  string
}

type entry struct{ name, text string }

var configEnv = entry{config.EnvPath, "The configuration file, when no -config flag names one."}
var configFile = entry{config.DefaultPath, "The configuration file (see /usr/share/doc/nri-vgpu/config.toml.example)."}

var pages = []page{
	{
		name:    "nri-vgpu",
		pkg:     "cmd/nri-vgpu",
		summary: "NRI plugin of nri-vgpu and its operator tool",
		help:    []string{"help"},
		commands: []command{
			{title: "status", help: []string{"status", "-h"}},
			{title: "configure", help: []string{"configure", "-h"}},
			{title: "configure containerd", help: []string{"configure", "containerd", "-h"}},
			{title: "configure docker", help: []string{"configure", "docker", "-h"}},
			{title: "version", text: "Prints the version and exits."},
		},
		env: []entry{configEnv},
		files: []entry{
			configFile,
			{"/opt/nri/plugins/10-nri-vgpu", "The link through which containerd starts the plugin itself."},
			{"/run/nri-vgpu", "Each vGPU container's limits file and usage region, which the container mounts."},
			{"/var/lib/nri-vgpu", "The key that signs GPU allocations."},
		},
		seeAlso: "nri-vgpu-device-plugin(1), nri-vgpu-dra-driver(1), nri-vgpu-runtime(1), /usr/share/doc/nri-vgpu/README.md",
	},
	{
		name:     "nri-vgpu-device-plugin",
		pkg:      "cmd/device-plugin",
		summary:  "kubelet device plugin of nri-vgpu",
		synopsis: []string{"nri-vgpu-device-plugin [flags]", "nri-vgpu-device-plugin inventory [flags]"},
		help:     []string{"-h"},
		commands: []command{
			{title: "inventory", help: []string{"inventory", "-h"}},
		},
		env:     []entry{configEnv},
		files:   []entry{configFile},
		seeAlso: "nri-vgpu(1), nri-vgpu-dra-driver(1), /usr/share/doc/nri-vgpu/README.md",
	},
	{
		name:     "nri-vgpu-dra-driver",
		pkg:      "cmd/dra-driver",
		summary:  "Dynamic Resource Allocation driver of nri-vgpu",
		synopsis: []string{"nri-vgpu-dra-driver [flags]"},
		help:     []string{"-h"},
		env: []entry{
			configEnv,
			{"NODE_NAME", "The node's name, when no -node-name flag gives it."},
			{"KUBECONFIG", "The kubeconfig file, when no -kubeconfig flag names one; neither: the pod's service account."},
		},
		files: []entry{
			configFile,
			{"/run/nri-vgpu", "Each prepared claim's limits file and usage region (run_dir), which its containers mount."},
			{"/var/run/cdi", "The CDI spec of each prepared claim (dra.cdi_dir)."},
			{"/var/lib/kubelet/plugins_registry", "Where the driver registers with the kubelet."},
		},
		seeAlso: "nri-vgpu(1), nri-vgpu-device-plugin(1), /usr/share/doc/nri-vgpu/README.md",
	},
	{
		name:    "kubectl-nri_vgpu",
		pkg:     "cmd/kubectl-nri_vgpu",
		summary: "the cluster view of nri-vgpu, run as kubectl nri-vgpu",
		help:    []string{"-h"},
		env: []entry{
			{"KUBECONFIG", "The kubeconfig files, when no --kubeconfig flag names one; neither: ~/.kube/config."},
		},
		seeAlso: "kubectl(1), nri-vgpu(1), /usr/share/doc/nri-vgpu/README.md",
	},
	{
		name:     "nri-vgpu-runtime",
		pkg:      "cmd/nri-vgpu-runtime",
		summary:  "OCI runtime wrapper that gives Docker containers their vGPU",
		synopsis: []string{"nri-vgpu-runtime [runc global options] command [command options] [arguments...]"},
		env:      []entry{{config.EnvPath, "The configuration file."}},
		files:    []entry{{config.DefaultPath, "The configuration file, when " + config.EnvPath + " is not set."}},
		seeAlso:  "nri-vgpu(1), runc(8), /usr/share/doc/nri-vgpu/README.md",
	},
}

func main() {
	bin := flag.String("bin", "bin", "directory of the built `commands`")
	out := flag.String("out", "", "`directory` to write the pages to (required)")
	version := flag.String("version", "", "the package `version` the pages belong to (required)")
	date := flag.String("date", "", "the pages' `date`, YYYY-MM-DD (required)")
	flag.Parse()
	if err := run(*bin, *out, *version, *date); err != nil {
		fmt.Fprintln(os.Stderr, "manpage:", err)
		os.Exit(1)
	}
}

func run(bin, out, version, date string) error {
	if out == "" || version == "" || date == "" {
		return errors.New("-out, -version and -date are required")
	}
	if _, err := time.Parse(time.DateOnly, date); err != nil {
		return fmt.Errorf("-date %q: want YYYY-MM-DD: %w", date, err)
	}
	for _, p := range pages {
		b, err := render(p, bin, version, date)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		if err := os.WriteFile(filepath.Join(out, p.name+".1"), b, 0o644); err != nil {
			return fmt.Errorf("write the page: %w", err)
		}
	}
	return nil
}

func render(p page, bin, version, date string) ([]byte, error) {
	doc, err := docComment(p.pkg)
	if err != nil {
		return nil, err
	}
	var w manpage.Writer
	w.Header(p.name, "1", date, "nri-vgpu "+version, "User Commands")
	w.Name(p.name, p.summary)

	var opts manpage.Help
	if p.help != nil {
		if opts, err = help(bin, p.name, p.help); err != nil {
			return nil, err
		}
	}
	synopsis := opts.Usage()
	if synopsis == nil {
		synopsis = p.synopsis
	}
	w.Synopsis(synopsis)
	w.Section("DESCRIPTION")
	w.Doc(doc)
	if len(opts.Flags) > 0 {
		w.Section("OPTIONS")
		w.Flags(opts.Flags)
	}
	if len(p.commands) > 0 {
		w.Section("COMMANDS")
		for _, c := range p.commands {
			w.Subsection(c.title)
			w.Paragraph(c.text)
			if c.help == nil {
				continue
			}
			h, err := help(bin, p.name, c.help)
			if err != nil {
				return nil, err
			}
			w.Text(h.Text)
			w.Flags(h.Flags)
		}
	}
	for _, s := range []struct {
		title   string
		entries []entry
	}{{"ENVIRONMENT", p.env}, {"FILES", p.files}} {
		if len(s.entries) == 0 {
			continue
		}
		w.Section(s.title)
		for _, e := range s.entries {
			w.Tagged(e.name, e.text)
		}
	}
	w.Section("SEE ALSO")
	w.Paragraph(p.seeAlso)
	return w.Bytes(), nil
}

// docComment returns the doc comment of the command's package, without the
// "Command " that Go's convention opens it with.
func docComment(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", fmt.Errorf("list %s: %w", dir, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", fmt.Errorf("read the doc comment: %w", err)
		}
		if ast.Doc != nil {
			return strings.TrimPrefix(ast.Doc.Text(), "Command "), nil
		}
	}
	return "", fmt.Errorf("package %s has no doc comment", dir)
}

// help runs the command for its help: what it prints on standard output,
// or on standard error when that is all it prints. Exit status 2 is
// accepted as well as 0: it is how the flag package's default ends -h.
func help(bin, name string, args []string) (manpage.Help, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	// Flags whose default is an environment variable would print the
	// builder's value as the default.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "NODE_NAME" || k == "KUBECONFIG" || k == config.EnvPath
	})
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	what := strings.Join(append([]string{name}, args...), " ")
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			return manpage.Help{}, fmt.Errorf("run %s: %w: %s", what, err, stderr.Bytes())
		}
	}
	text := stdout.String()
	if strings.TrimSpace(text) == "" {
		text = stderr.String()
	}
	h, err := manpage.ParseHelp(text)
	if err != nil {
		return manpage.Help{}, fmt.Errorf("the help of %s: %w", what, err)
	}
	return h, nil
}
