package configure

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Defaults of ContainerdOptions.
const (
	DefaultContainerdConfig = "/etc/containerd/config.toml"
	DefaultDropInDir        = "/etc/containerd/conf.d"
	DefaultPluginBinary     = "/usr/bin/nri-vgpu"
	DefaultPluginIndex      = "10"

	// DropInName is the file nri-vgpu owns in the drop-in directory.
	DropInName = "nri-vgpu.toml"
	// PluginName is the name the plugin is registered under in NRI's
	// plugin directory, after its index: 10-nri-vgpu.
	PluginName = "nri-vgpu"

	// nriPluginID is the NRI section's key under [plugins], the same in
	// config versions 2 and 3.
	nriPluginID = "io.containerd.nri.v1.nri"
	// defaultNRIPluginPath is where containerd looks for pre-registered NRI
	// plugins unless plugin_path says otherwise.
	defaultNRIPluginPath = "/opt/nri/plugins"

	// TolerateAnnotation is the pod annotation that NRI's default validator
	// is told to honour: a pod with it set to "true" starts while nri-vgpu
	// is not connected (nri-vgpu's own pods, static pods).
	TolerateAnnotation = "nri-vgpu.io/tolerate-missing-plugin"
	// validatorKey is the table of NRI's built-in default validator inside
	// the NRI section (containerd 2.2 and later, NRI v0.10).
	validatorKey = "default_validator"
)

// ErrContainerdTooOld is returned for a containerd without NRI (before 1.7).
var ErrContainerdTooOld = errors.New("containerd is too old for NRI")

// ContainerdOptions configure Containerd. The zero value means: the host's
// containerd, found on PATH, and its default paths.
type ContainerdOptions struct {
	// Root stands for / when reading and writing files (for image builds
	// and tests); paths written into configs stay host paths.
	Root string
	// ConfigPath is containerd's main config (DefaultContainerdConfig).
	ConfigPath string
	// DropInDir receives DropInName (DefaultDropInDir).
	DropInDir string
	// Version is containerd's version ("1.7.29", "v2.1.0"); when empty it is
	// read from `<Binary> --version`.
	Version string
	// Binary is the containerd executable used to detect the version
	// ("containerd", looked up on PATH).
	Binary string
	// PluginBinary is what the plugin registration links to
	// (DefaultPluginBinary).
	PluginBinary string
	// PluginIndex is the plugin's two-digit NRI index (DefaultPluginIndex).
	PluginIndex string
	// NoRegister leaves NRI's plugin directory alone, for nodes where the
	// plugin runs another way (the Helm chart's DaemonSet, or the
	// nri-vgpu service): two instances of the plugin must not run.
	NoRegister bool
	// Distribution is "auto" (or empty) to detect a containerd run by k3s
	// or RKE2, "none" to treat ConfigPath as a plain containerd's config, or
	// "k3s"/"rke2" to name the distribution. A distribution writes its
	// containerd's config again at every start: the settings go into a
	// drop-in it imports, else into a template it renders (see
	// distribution).
	Distribution string
	// NoRequire leaves NRI's default validator alone. By default, on
	// containerd 2.2 and later, the validator is set to refuse every
	// container while nri-vgpu is not connected (required_plugins), so that
	// no container starts without its edits.
	NoRequire bool
}

func (o *ContainerdOptions) setDefaults() {
	if o.ConfigPath == "" {
		o.ConfigPath = DefaultContainerdConfig
	}
	if o.DropInDir == "" {
		o.DropInDir = DefaultDropInDir
	}
	if o.PluginBinary == "" {
		o.PluginBinary = DefaultPluginBinary
	}
	if o.PluginIndex == "" {
		o.PluginIndex = DefaultPluginIndex
	}
	if o.Root == "" {
		o.Root = "/"
	}
}

// containerdVersion is a containerd release's major and minor version.
type containerdVersion struct {
	major, minor int
	text         string
}

func (v containerdVersion) less(major, minor int) bool {
	return v.major < major || (v.major == major && v.minor < minor)
}

var versionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)`)

// parseContainerdVersion takes a version ("1.7.29", "v2.1.0") or the whole
// output of `containerd --version`, whose form varies by who built it:
//
//	containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376
//	containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da
//	containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1
func parseContainerdVersion(s string) (containerdVersion, error) {
	fields := strings.Fields(s)
	if len(fields) > 1 && fields[0] == "containerd" {
		fields = fields[1:]
	}
	for _, f := range fields {
		if m := versionRE.FindStringSubmatch(f); m != nil {
			major, _ := strconv.Atoi(m[1])
			minor, _ := strconv.Atoi(m[2])
			return containerdVersion{major: major, minor: minor, text: strings.TrimPrefix(f, "v")}, nil
		}
	}
	return containerdVersion{}, fmt.Errorf("no version number in %q", strings.TrimSpace(s))
}

func detectContainerdVersion(binary string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("detecting the containerd version (%s --version): %w; pass the version with --containerd-version", binary, err)
	}
	return string(out), nil
}

// configFile is one containerd config file in load order.
type configFile struct {
	path string
	doc  map[string]any
}

// Containerd computes what enables NRI in the node's containerd and registers
// nri-vgpu as a pre-registered NRI plugin:
//
//   - containerd before 1.7 has no NRI: ErrContainerdTooOld.
//   - When NRI is disabled (containerd 1.7's default, or disable = true in the
//     user's config), a drop-in file DropInDir/DropInName enables it, and the
//     main config's top-level imports list gets that file, edited in place so
//     that the rest of the file, comments included, stays as it was.
//     containerd 1.7 replaces a whole plugin section with the one from an
//     imported file, so there the drop-in repeats the user's other NRI
//     settings; containerd 2 merges sections key by key.
//   - When NRI is already enabled, the config is left alone.
//   - The plugin is registered by linking <plugin_path>/<index>-nri-vgpu to
//     PluginBinary when nothing is there yet (the packages ship that link for
//     the default plugin_path), unless NoRegister is set.
//
// Nothing is written: see Result.
func Containerd(opts ContainerdOptions) (*Result, error) {
	opts.setDefaults()
	if !validIndex(opts.PluginIndex) {
		return nil, fmt.Errorf("plugin index %q: want two digits, such as 10", opts.PluginIndex)
	}
	distro, err := findDistribution(&opts)
	if err != nil {
		return nil, err
	}
	if opts.Binary == "" {
		opts.Binary = "containerd"
		if distro != nil {
			opts.Binary = distro.containerdBinary(opts.Root)
		}
	}
	versionText := opts.Version
	if versionText == "" {
		out, err := detectContainerdVersion(opts.Binary)
		if err != nil {
			return nil, err
		}
		versionText = out
	}
	version, err := parseContainerdVersion(versionText)
	if err != nil {
		return nil, fmt.Errorf("containerd version: %w", err)
	}
	if version.less(1, 7) {
		return nil, fmt.Errorf("%w: containerd %s has no NRI support (NRI arrived in containerd 1.7); upgrade containerd to 1.7 or later, or use Docker with nri-vgpu-runtime", ErrContainerdTooOld, version.text)
	}
	// containerd 1.7 reads config version 2; 2.0 to 2.3 write 3 and 2.4
	// writes 4. Each migrates older versions file by file as it loads them,
	// warning at every start, so the drop-in has the running one's version.
	mergeSections := !version.less(2, 0)
	dropInVersion := int64(2)
	switch {
	case !version.less(2, 4):
		dropInVersion = 4
	case mergeSections:
		dropInVersion = 3
	}

	res := &Result{Root: opts.Root}
	mainSrc, err := readOptional(opts.Root, opts.ConfigPath)
	if err != nil {
		return nil, err
	}
	var mainDoc map[string]any
	if err := toml.Unmarshal(mainSrc, &mainDoc); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", opts.ConfigPath, err)
	}
	mainVersion, _ := mainDoc["version"].(int64)
	switch {
	case mainSrc == nil:
		// No config: containerd runs on its defaults, which a file holding
		// just version and imports keeps.
	case mainVersion < 2 && len(mainDoc) > 0:
		return nil, fmt.Errorf("%s is a version 1 containerd config (it has no version line of 2 or more), which names plugin sections differently; convert it to version 2 or later first (containerd config migrate where your containerd has it, or start from containerd config default), then run this again", opts.ConfigPath)
	case mainVersion > 2 && !mergeSections:
		return nil, fmt.Errorf("%s has config version %d, which needs containerd 2.0 or later, but containerd is %s", opts.ConfigPath, mainVersion, version.text)
	}

	if distro != nil {
		if mainSrc == nil {
			return nil, fmt.Errorf("%s does not exist: start %s once, so that it writes its containerd config, then run this again", opts.ConfigPath, distro.name)
		}
		opts.DropInDir = filepath.Join(distro.dir, dropInDirName(mainVersion))
	}
	dropInPath := filepath.Join(opts.DropInDir, DropInName)
	files, err := loadConfigChain(fsView{root: opts.Root}, opts.ConfigPath, dropInPath)
	if err != nil {
		return nil, err
	}
	before := effectiveNRI(files, mergeSections)
	disabled := !mergeSections // containerd 1.7 ships NRI disabled; 2.x enabled
	if d, ok := before["disable"].(bool); ok {
		disabled = d
	}
	oldDropIn, err := readOptional(opts.Root, dropInPath)
	if err != nil {
		return nil, err
	}

	// containerd 2.2 (NRI v0.10) has the default validator.
	validate := !version.less(2, 2) && !opts.NoRequire
	var validator map[string]any
	if validate {
		validator = requireValidator(before[validatorKey])
		if tol, _ := validator["tolerate_missing_plugins_annotation"].(string); tol != TolerateAnnotation {
			res.Notes = append(res.Notes, fmt.Sprintf("NRI's validator already honours the annotation %s, kept: nri-vgpu's own pods carry %s; give them yours too", tol, TolerateAnnotation))
		}
	}

	imported := importsPath(opts.ConfigPath, stringList(mainDoc["imports"]), dropInPath)
	needDropIn := disabled || (oldDropIn != nil && imported) || (validate && !validatorRequires(before[validatorKey]))
	overlay := map[string][]byte{}
	switch {
	case needDropIn && distro != nil && !imported:
		// The distribution's config does not import a drop-in directory
		// (releases before 2026): the settings go into its template.
		if err := distroTemplate(res, distro, mainSrc, mainVersion, nriSettings(before, mergeSections, validator), overlay); err != nil {
			return nil, err
		}
	case needDropIn:
		newDropIn, err := dropInContent(before, mergeSections, dropInVersion, validator)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(oldDropIn, newDropIn) {
			res.Changes = append(res.Changes, Change{Path: dropInPath, Old: oldDropIn, New: newDropIn, Mode: 0o644})
		}
		if distro != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%s writes %s again at every start, importing %s: nri-vgpu's settings are in %s", distro.name, opts.ConfigPath, filepath.Join(opts.DropInDir, "*.toml"), dropInPath))
		}
		if !imported {
			var newMain []byte
			if mainSrc == nil {
				newMain = fmt.Appendf(nil, "version = %d\nimports = [%s]\n", dropInVersion, strconv.Quote(dropInPath))
			} else if newMain, err = addImport(mainSrc, dropInPath); err != nil {
				return nil, fmt.Errorf("adding %s to the imports of %s: %w", dropInPath, opts.ConfigPath, err)
			}
			res.Changes = append(res.Changes, Change{Path: opts.ConfigPath, Old: mainSrc, New: newMain, Mode: 0o644})
		}
		for _, c := range res.Changes {
			overlay[c.Path] = c.New
		}
	}
	if needDropIn {
		// Check the outcome the way containerd will load it: another
		// imported file may still override the drop-in.
		files, err := loadConfigChain(fsView{root: opts.Root, overlay: overlay}, opts.ConfigPath, "")
		if err != nil {
			return nil, fmt.Errorf("checking the new config: %w", err)
		}
		after := effectiveNRI(files, mergeSections)
		if d, ok := after["disable"].(bool); ok && d {
			return nil, fmt.Errorf("NRI would still be disabled: a file imported after %s sets disable = true in [plugins.%q]; remove that setting", dropInPath, nriPluginID)
		}
		if validate && !validatorRequires(after[validatorKey]) {
			return nil, fmt.Errorf("NRI's validator would not require nri-vgpu: a file imported after %s sets [plugins.%q.%s]; remove it, or pass --no-require", dropInPath, nriPluginID, validatorKey)
		}
		before = after
	}

	pluginPath := defaultNRIPluginPath
	if p, ok := before["plugin_path"].(string); ok && p != "" {
		pluginPath = p
	}
	link := filepath.Join(pluginPath, opts.PluginIndex+"-"+PluginName)
	// Two instances of the plugin must not run: both would edit every
	// container. A registration under another index (an earlier install,
	// before nri.plugin_index changed), or any registration where the
	// plugin runs another way, would start a second one.
	registered, err := filepath.Glob(filepath.Join(opts.Root, pluginPath, "[0-9][0-9]-"+PluginName))
	if err != nil {
		return nil, fmt.Errorf("checking the plugin registrations in %s: %w", pluginPath, err)
	}
	for _, r := range registered {
		other := filepath.Join(pluginPath, filepath.Base(r))
		switch {
		case opts.NoRegister:
			return nil, fmt.Errorf("--no-register, but the plugin is registered as %s: containerd starts that one too, so the plugin would run twice; remove %s", other, other)
		case other != link:
			return nil, fmt.Errorf("the plugin is already registered as %s, under another index than %s: remove it, or pass --plugin-index %s", other, opts.PluginIndex, strings.TrimSuffix(filepath.Base(r), "-"+PluginName))
		}
	}
	if !opts.NoRegister {
		switch st, err := os.Lstat(filepath.Join(opts.Root, link)); {
		case errors.Is(err, fs.ErrNotExist):
			res.Changes = append(res.Changes, Change{Path: link, LinkTarget: opts.PluginBinary})
		case err != nil:
			return nil, fmt.Errorf("checking the plugin registration %s: %w", link, err)
		case st.Mode()&fs.ModeSymlink != 0:
			if target, err := os.Readlink(filepath.Join(opts.Root, link)); err == nil && target != opts.PluginBinary {
				res.Notes = append(res.Notes, fmt.Sprintf("%s links to %s, not %s: containerd starts that one", link, target, opts.PluginBinary))
			}
		}
	}
	if pluginPath != defaultNRIPluginPath && !opts.NoRegister {
		res.Notes = append(res.Notes, fmt.Sprintf("containerd's NRI plugin_path is %s, not %s: the plugin is registered there", pluginPath, defaultNRIPluginPath))
	}

	if validate {
		res.Notes = append(res.Notes, fmt.Sprintf("containerd %s refuses every container while nri-vgpu is not connected (NRI default_validator, required_plugins); pods that must start without it — static pods, nri-vgpu's own — need the annotation %s: \"true\"", version.text, TolerateAnnotation))
	} else if version.less(2, 2) {
		res.Notes = append(res.Notes, fmt.Sprintf("containerd %s has no NRI validator: while nri-vgpu is down, GPU containers are still refused (the device plugin's gate), containers without a GPU are not", version.text))
	}
	switch {
	case res.Changed() && distro != nil:
		res.Reload = distro.restartHint(opts.Root)
	case res.Changed():
		res.Reload = "restart containerd to load the change (systemctl restart containerd); running containers keep running"
	case opts.NoRegister:
		res.Notes = append(res.Notes, fmt.Sprintf("containerd %s already has NRI enabled: nothing to change", version.text))
	default:
		res.Notes = append(res.Notes, fmt.Sprintf("containerd %s already has NRI enabled and nri-vgpu registered (%s): nothing to change", version.text, link))
	}
	return res, nil
}

func validIndex(s string) bool {
	return len(s) == 2 && s[0] >= '0' && s[0] <= '9' && s[1] >= '0' && s[1] <= '9'
}

// importsPath reports whether imports (as listed in the config at
// configPath) already load path, by name or by glob.
func importsPath(configPath string, imports []string, path string) bool {
	for _, imp := range imports {
		imp = filepath.Clean(imp)
		if !filepath.IsAbs(imp) {
			imp = filepath.Join(filepath.Dir(configPath), imp)
		}
		if imp == path {
			return true
		}
		if strings.Contains(imp, "*") {
			if ok, _ := filepath.Match(imp, path); ok {
				return true
			}
		}
	}
	return false
}

// fsView reads files under root, with overlay (host path -> content) taking
// the place of what is on disk: the changes of a Result not yet applied.
type fsView struct {
	root    string
	overlay map[string][]byte
}

func (v fsView) read(path string) ([]byte, error) {
	if data, ok := v.overlay[path]; ok {
		return data, nil
	}
	return readOptional(v.root, path)
}

// glob expands pattern as containerd does (filepath.Glob: sorted), over the
// files on disk and those in the overlay.
func (v fsView) glob(pattern string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(v.root, pattern))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range matches {
		rel, err := filepath.Rel(v.root, m)
		if err != nil {
			return nil, err
		}
		out = append(out, "/"+rel)
	}
	for p := range v.overlay {
		if ok, _ := filepath.Match(pattern, p); ok && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// loadConfigChain returns the config files containerd loads, in its order:
// the main file, then breadth-first through imports (relative to the
// importing file, globs expanded and sorted), each file once, leaving out
// skip.
func loadConfigChain(v fsView, mainPath string, skip string) ([]configFile, error) {
	mainSrc, err := v.read(mainPath)
	if err != nil {
		return nil, err
	}
	var mainDoc map[string]any
	if err := toml.Unmarshal(mainSrc, &mainDoc); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", mainPath, err)
	}
	files := []configFile{{path: mainPath, doc: mainDoc}}
	loaded := map[string]bool{mainPath: true}
	for i := 0; i < len(files); i++ {
		for _, imp := range stringList(files[i].doc["imports"]) {
			imp = filepath.Clean(imp)
			if !filepath.IsAbs(imp) {
				imp = filepath.Join(filepath.Dir(files[i].path), imp)
			}
			paths := []string{imp}
			if strings.Contains(imp, "*") {
				if paths, err = v.glob(imp); err != nil {
					return nil, fmt.Errorf("import %q in %s: %w", imp, files[i].path, err)
				}
			}
			for _, p := range paths {
				if loaded[p] || p == skip {
					continue
				}
				loaded[p] = true
				src, err := v.read(p)
				if err != nil {
					return nil, err
				}
				if src == nil {
					// containerd fails on a missing import; say so now
					// rather than after a restart.
					return nil, fmt.Errorf("%s imports %s, which does not exist; containerd would not start", files[i].path, p)
				}
				var doc map[string]any
				if err := toml.Unmarshal(src, &doc); err != nil {
					return nil, fmt.Errorf("parsing %s (imported by %s): %w", p, files[i].path, err)
				}
				files = append(files, configFile{path: p, doc: doc})
			}
		}
	}
	return files, nil
}

// nriSection returns a config's [plugins."io.containerd.nri.v1.nri"] table.
func nriSection(doc map[string]any) (map[string]any, bool) {
	plugins, _ := doc["plugins"].(map[string]any)
	sec, ok := plugins[nriPluginID].(map[string]any)
	return sec, ok
}

// effectiveNRI returns the NRI settings that result from loading files in
// order: containerd 1.7 replaces the whole section with each file's,
// containerd 2 merges key by key.
func effectiveNRI(files []configFile, merge bool) map[string]any {
	eff := map[string]any{}
	for _, f := range files {
		sec, ok := nriSection(f.doc)
		if !ok {
			continue
		}
		if !merge {
			eff = map[string]any{}
		}
		maps.Copy(eff, sec)
	}
	return eff
}

// validatorRequires reports whether a default_validator table is on and
// requires nri-vgpu, with an annotation to tolerate its absence.
func validatorRequires(v any) bool {
	t, _ := v.(map[string]any)
	enabled, _ := t["enable"].(bool)
	tol, _ := t["tolerate_missing_plugins_annotation"].(string)
	return enabled && tol != "" && slices.Contains(stringList(t["required_plugins"]), PluginName)
}

// requireValidator returns the default_validator table that requires
// nri-vgpu: the current one's settings, turned on, with nri-vgpu added to
// the required plugins and, where none is set, TolerateAnnotation.
func requireValidator(current any) map[string]any {
	t := map[string]any{}
	if cur, ok := current.(map[string]any); ok {
		maps.Copy(t, cur)
	}
	t["enable"] = true
	required := stringList(t["required_plugins"])
	if !slices.Contains(required, PluginName) {
		required = append(required, PluginName)
	}
	t["required_plugins"] = required
	if tol, _ := t["tolerate_missing_plugins_annotation"].(string); tol == "" {
		t["tolerate_missing_plugins_annotation"] = TolerateAnnotation
	}
	return t
}

// nriSettings is the NRI section that enables NRI and, when validator is
// not nil, sets NRI's default validator to it. Where sections replace each
// other (containerd 1.7) it repeats the other settings in effect.
func nriSettings(current map[string]any, merge bool, validator map[string]any) map[string]any {
	sec := map[string]any{"disable": false}
	if validator != nil {
		sec[validatorKey] = validator
	}
	if !merge {
		for k, v := range current {
			if k != "disable" {
				sec[k] = v
			}
		}
	}
	return sec
}

// dropInContent renders the drop-in that enables NRI and, when validator is
// not nil, sets NRI's default validator to it. For containerd 1.7, which
// replaces a whole plugin section with the last imported one, it repeats
// the other settings in effect (such as a custom plugin_path).
func dropInContent(current map[string]any, merge bool, version int64, validator map[string]any) ([]byte, error) {
	sec := nriSettings(current, merge, validator)
	body, err := toml.Marshal(map[string]any{
		"version": version,
		"plugins": map[string]any{nriPluginID: sec},
	})
	if err != nil {
		return nil, fmt.Errorf("rendering the drop-in: %w", err)
	}
	header := "# Written by `nri-vgpu configure containerd`, which rewrites it when run again.\n" +
		"# Enables containerd's NRI, which starts the plugins found in its plugin_path\n" +
		"# (such as /opt/nri/plugins/10-nri-vgpu).\n"
	if validator != nil {
		header += "# NRI's default validator refuses every container while nri-vgpu is not\n" +
			"# connected; a pod annotated " + TolerateAnnotation + ": \"true\" starts anyway.\n"
	}
	if !merge {
		header += "# containerd 1.7 replaces a whole plugin section with the last imported one,\n" +
			"# so the NRI settings of the files loaded before this one are repeated here.\n"
	}
	return append([]byte(header+"\n"), body...), nil
}
