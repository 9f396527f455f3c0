package configure

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Defaults of DockerOptions.
const (
	DefaultDaemonJSON  = "/etc/docker/daemon.json"
	DefaultRuntimeName = "nri-vgpu"
	DefaultRuntimePath = "/usr/bin/nri-vgpu-runtime"
)

// DockerOptions configure Docker. The zero value adds the runtime to the
// host's /etc/docker/daemon.json.
type DockerOptions struct {
	// Root stands for / when reading and writing files.
	Root string
	// DaemonJSON is dockerd's config file (DefaultDaemonJSON).
	DaemonJSON string
	// RuntimeName is the runtime's name in daemon.json, as given to
	// `docker run --runtime` (DefaultRuntimeName).
	RuntimeName string
	// RuntimePath is the wrapper's path (DefaultRuntimePath).
	RuntimePath string
	// DefaultRuntime also makes it dockerd's default runtime, so that
	// `docker run --gpus` works without --runtime.
	DefaultRuntime bool
}

// Docker computes the daemon.json that registers nri-vgpu-runtime:
//
//	"runtimes": {"nri-vgpu": {"path": "/usr/bin/nri-vgpu-runtime"}}
//
// and, with DefaultRuntime, "default-runtime": "nri-vgpu". Every other key
// keeps its value and its place; other fields of an existing nri-vgpu entry
// (such as runtimeArgs) are kept. The file is re-indented in the style it
// already has (two spaces when new). Nothing is written: see Result.
func Docker(opts DockerOptions) (*Result, error) {
	if opts.DaemonJSON == "" {
		opts.DaemonJSON = DefaultDaemonJSON
	}
	if opts.RuntimeName == "" {
		opts.RuntimeName = DefaultRuntimeName
	}
	if opts.RuntimePath == "" {
		opts.RuntimePath = DefaultRuntimePath
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	old, err := readOptional(opts.Root, opts.DaemonJSON)
	if err != nil {
		return nil, err
	}
	var top object
	if len(bytes.TrimSpace(old)) > 0 {
		if top, err = parseObject(old); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", opts.DaemonJSON, err)
		}
	}

	res := &Result{Root: opts.Root}
	var runtimes object
	if raw, ok := top.get("runtimes"); ok {
		if runtimes, err = parseObject(raw); err != nil {
			return nil, fmt.Errorf("%s: \"runtimes\": %w", opts.DaemonJSON, err)
		}
	}
	var entry object
	if raw, ok := runtimes.get(opts.RuntimeName); ok {
		if entry, err = parseObject(raw); err != nil {
			return nil, fmt.Errorf("%s: \"runtimes\".%q: %w", opts.DaemonJSON, opts.RuntimeName, err)
		}
		var path string
		if raw, ok := entry.get("path"); ok && json.Unmarshal(raw, &path) == nil && path != opts.RuntimePath {
			res.Notes = append(res.Notes, fmt.Sprintf("runtime %q pointed at %s; it now points at %s", opts.RuntimeName, path, opts.RuntimePath))
		}
	}
	entry = entry.set("path", mustMarshal(opts.RuntimePath))
	runtimes = runtimes.set(opts.RuntimeName, entry.marshal())
	top = top.set("runtimes", runtimes.marshal())
	if opts.DefaultRuntime {
		var prev string
		if raw, ok := top.get("default-runtime"); ok {
			_ = json.Unmarshal(raw, &prev)
		}
		if prev != "" && prev != opts.RuntimeName {
			res.Notes = append(res.Notes, fmt.Sprintf("the default runtime was %q; it is now %q", prev, opts.RuntimeName))
		}
		top = top.set("default-runtime", mustMarshal(opts.RuntimeName))
	}

	var buf bytes.Buffer
	if err := json.Indent(&buf, top.marshal(), "", detectIndent(old)); err != nil {
		return nil, fmt.Errorf("formatting %s: %w", opts.DaemonJSON, err)
	}
	buf.WriteByte('\n')
	if bytes.Equal(buf.Bytes(), old) || (old != nil && sameJSON(old, buf.Bytes())) {
		res.Notes = append(res.Notes, fmt.Sprintf("%s already registers the %s runtime: nothing to change", opts.DaemonJSON, opts.RuntimeName))
		return res, nil
	}
	res.Changes = append(res.Changes, Change{Path: opts.DaemonJSON, Old: old, New: buf.Bytes(), Mode: 0o644})
	hint := "docker run --runtime " + opts.RuntimeName
	if opts.DefaultRuntime {
		hint = "docker run"
	}
	res.Reload = "reload dockerd to load the change (systemctl reload docker, or kill -HUP the dockerd process); then " + hint + " --gpus ... uses nri-vgpu"
	return res, nil
}

// sameJSON reports whether two documents are equal as JSON values, so that
// a file already configured but formatted differently is left alone.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// detectIndent returns the indentation of the first indented line of a JSON
// document, or two spaces.
func detectIndent(doc []byte) string {
	for line := range strings.SplitSeq(string(doc), "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed != "" && len(trimmed) < len(line) {
			return line[:len(line)-len(trimmed)]
		}
	}
	return "  "
}

func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only strings are marshalled here
	}
	return b
}

// object is a JSON object that keeps its keys in order.
type object []member

type member struct {
	key   string
	value json.RawMessage
}

// parseObject decodes one JSON object, keeping key order and raw values.
func parseObject(data []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object, found %v", tok)
	}
	var obj object
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not valid JSON: %w", err)
		}
		key := tok.(string) // object keys are always strings
		if seen[key] {
			return nil, fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, err)
		}
		obj = append(obj, member{key: key, value: raw})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("text after the JSON object")
	}
	return obj, nil
}

func (o object) get(key string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.key == key {
			return m.value, true
		}
	}
	return nil, false
}

// set replaces key's value in place, or appends the key.
func (o object) set(key string, value json.RawMessage) object {
	for i := range o {
		if o[i].key == key {
			o[i].value = value
			return o
		}
	}
	return append(o, member{key: key, value: value})
}

// marshal encodes the object compactly, in order.
func (o object) marshal() json.RawMessage {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(mustMarshal(m.key))
		buf.WriteByte(':')
		buf.Write(m.value)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}
