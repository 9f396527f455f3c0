package configure

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/BurntSushi/toml"
	"github.com/pelletier/go-toml/v2/unstable"
)

// The user's containerd config.toml is edited as text, not decoded and
// re-encoded: re-marshalling would drop every comment, reorder keys and
// rewrite values, turning a one-line change into a diff of the whole file.
// The positions to edit at come from go-toml's parser, the one containerd 2
// itself reads config.toml with, which gives the byte range of every key
// and value; every edit is then checked by decoding the result (see
// addImport).

const utf8BOM = "\xef\xbb\xbf"

// topKey is one key = value pair before the first table header.
type topKey struct {
	parts   []string // the key, one element per dotted part, unquoted
	lineEnd int      // offset just past the newline ending the value's line (or len(src))
	array   *arrayInfo
}

// arrayInfo describes an array value's elements.
type arrayInfo struct {
	elements   int
	nested     bool // some element is an array or inline table
	lastEnd    int  // offset just past the last element (valid when elements > 0 and !nested)
	commaAfter bool // the last element is followed by a comma
	commaEnd   int  // offset just past that comma
	open       int  // offset of the '['
}

// scanTopLevel returns the keys of src that come before its first table
// header.
func scanTopLevel(src []byte) ([]topKey, error) {
	// The parser does not skip a byte order mark; offsets into what it
	// parses are offsets into src less base.
	base := 0
	if bytes.HasPrefix(src, []byte(utf8BOM)) {
		base = len(utf8BOM)
	}
	data := src[base:]
	var p unstable.Parser
	p.Reset(data)
	var keys []topKey
	for p.NextExpression() {
		e := p.Expression()
		if e.Kind == unstable.Table || e.Kind == unstable.ArrayTable {
			return keys, nil
		}
		if e.Kind != unstable.KeyValue {
			continue
		}
		keys = append(keys, topKeyOf(src, base, e))
	}
	if err := p.Error(); err != nil {
		return nil, parseError(src, base, data, err)
	}
	return keys, nil
}

// topKeyOf describes the key = value expression e of src, whose node
// offsets are relative to src[base:].
func topKeyOf(src []byte, base int, e *unstable.Node) topKey {
	var k topKey
	keyEnd := 0
	for it := e.Key(); it.Next(); {
		n := it.Node()
		k.parts = append(k.parts, string(n.Data))
		keyEnd = base + int(n.Raw.Offset+n.Raw.Length)
	}
	// The expression's range ends with its value; only blanks and a comment
	// can follow on that line.
	valueEnd := base + int(e.Raw.Offset+e.Raw.Length)
	k.lineEnd = len(src)
	if i := bytes.IndexByte(src[valueEnd:], '\n'); i >= 0 {
		k.lineEnd = valueEnd + i + 1
	}
	v := e.Value()
	if v.Kind != unstable.Array {
		return k
	}
	// Between the key and its value there are only blanks and '='.
	info := &arrayInfo{open: keyEnd + bytes.IndexByte(src[keyEnd:valueEnd], '[')}
	for it := v.Children(); it.Next(); {
		elem := it.Node()
		info.elements++
		if elem.Kind == unstable.Array || elem.Kind == unstable.InlineTable {
			// The parser gives no end offset for these. imports holds
			// strings, and no other array is edited.
			info.nested = true
			continue
		}
		info.lastEnd = base + int(elem.Raw.Offset+elem.Raw.Length)
	}
	if info.elements > 0 && !info.nested {
		// The parser keeps no position for separators. Between the last
		// element and the closing ']' there can only be blanks, line ends,
		// comments and one comma.
		for i := info.lastEnd; i < valueEnd-1; i++ {
			switch src[i] {
			case ',':
				info.commaAfter, info.commaEnd = true, i+1
			case '#':
				n := bytes.IndexByte(src[i:valueEnd], '\n')
				if n < 0 {
					n = valueEnd - i
				}
				i += n
			}
		}
	}
	k.array = info
	return k
}

// parseError adds to the parser's error the line and column where it
// stopped. data is src[base:], what the parser read.
func parseError(src []byte, base int, data []byte, err error) error {
	var perr *unstable.ParserError
	if !errors.As(err, &perr) {
		return fmt.Errorf("not valid TOML: %w", err)
	}
	// The highlight is a slice of data: the capacities tell where.
	off := cap(data) - cap(perr.Highlight)
	if perr.Highlight == nil || off < 0 || off > len(data) {
		return fmt.Errorf("not valid TOML: %w", err)
	}
	off += base
	line := 1 + bytes.Count(src[:off], []byte("\n"))
	col := off - (bytes.LastIndexByte(src[:off], '\n') + 1) + 1
	return fmt.Errorf("line %d, column %d: not valid TOML: %w", line, col, err)
}

// addImport returns src with path appended to its top-level imports array,
// or an imports key added when there is none (after the version key if there
// is one, else at the top). Only those bytes change. The result is decoded
// and compared with the original to prove that nothing but imports changed.
func addImport(src []byte, path string) ([]byte, error) {
	keys, err := scanTopLevel(src)
	if err != nil {
		return nil, err
	}
	quoted := strconv.Quote(path)
	nl := "\n"
	if bytes.Contains(src, []byte("\r\n")) {
		nl = "\r\n"
	}

	var out []byte
	splice := func(at int, text string) {
		out = append(append(append([]byte{}, src[:at]...), text...), src[at:]...)
	}
	var imports, version *topKey
	for i := range keys {
		switch k := &keys[i]; {
		case k.parts[0] == "imports":
			imports = k
		case len(k.parts) == 1 && k.parts[0] == "version":
			version = k
		}
	}
	switch {
	case imports != nil && (len(imports.parts) > 1 || imports.array == nil):
		return nil, fmt.Errorf("imports is not an array")
	case imports != nil && imports.array.nested:
		return nil, fmt.Errorf("imports holds an array or table; containerd wants a list of file names")
	case imports != nil && imports.array.elements == 0:
		splice(imports.array.open+1, quoted)
	case imports != nil && imports.array.commaAfter:
		// `"/a", # comment` becomes `"/a", "/b", # comment`: trailing
		// commas are valid TOML, and a comment stays where it was.
		splice(imports.array.commaEnd, " "+quoted+",")
	case imports != nil:
		splice(imports.array.lastEnd, ", "+quoted)
	case version != nil && version.lineEnd == len(src) && !bytes.HasSuffix(src, []byte("\n")):
		splice(version.lineEnd, nl+"imports = ["+quoted+"]"+nl)
	case version != nil:
		splice(version.lineEnd, "imports = ["+quoted+"]"+nl)
	default:
		at := 0
		if bytes.HasPrefix(src, []byte(utf8BOM)) {
			at = len(utf8BOM)
		}
		splice(at, "imports = ["+quoted+"]"+nl)
	}
	if err := checkOnlyImportsChanged(src, out, path); err != nil {
		return nil, err
	}
	return out, nil
}

// checkOnlyImportsChanged decodes both documents and requires that they are
// equal except for path having been appended to imports.
func checkOnlyImportsChanged(before, after []byte, path string) error {
	var a, b map[string]any
	if err := toml.Unmarshal(before, &a); err != nil {
		return fmt.Errorf("decoding the original: %w", err)
	}
	if err := toml.Unmarshal(after, &b); err != nil {
		return fmt.Errorf("the edited file does not decode (%w); leaving it unchanged", err)
	}
	want := append(stringList(a["imports"]), path)
	if got := stringList(b["imports"]); !reflect.DeepEqual(got, want) {
		return fmt.Errorf("editing imports gave %q, want %q; leaving the file unchanged", got, want)
	}
	delete(a, "imports")
	delete(b, "imports")
	if !reflect.DeepEqual(a, b) {
		return fmt.Errorf("editing imports changed other settings; leaving the file unchanged")
	}
	return nil
}

func stringList(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, e := range list {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
