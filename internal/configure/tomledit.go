package configure

import (
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// The user's containerd config.toml is edited as text, not decoded and
// re-encoded: re-marshalling would drop every comment, reorder keys and
// rewrite values, turning a one-line change into a diff of the whole file.
// The scanner below understands just enough TOML to find the top-level keys
// (those before the first table header) and the elements of an array value;
// every edit is then checked by decoding the result (see addImport).

const utf8BOM = "\xef\xbb\xbf"

// topKey is one key = value pair before the first table header.
type topKey struct {
	name       string // unquoted key
	valueStart int    // offset of the value's first byte
	valueEnd   int    // offset just past the value
	lineEnd    int    // offset just past the newline ending the value's line (or len(src))
	array      *arrayInfo
}

// arrayInfo describes an array value's elements.
type arrayInfo struct {
	elements   int
	lastEnd    int  // offset just past the last element (valid when elements > 0)
	commaAfter bool // the last element is followed by a comma
	commaEnd   int  // offset just past that comma
	open       int  // offset of the '['
}

type scanner struct {
	src []byte
	p   int
}

func (s *scanner) errorf(format string, args ...any) error {
	line := 1 + bytes.Count(s.src[:min(s.p, len(s.src))], []byte("\n"))
	return fmt.Errorf("line %d: %s", line, fmt.Sprintf(format, args...))
}

func (s *scanner) peek(prefix string) bool { return bytes.HasPrefix(s.src[s.p:], []byte(prefix)) }

func (s *scanner) skipSpaces() {
	for s.p < len(s.src) && (s.src[s.p] == ' ' || s.src[s.p] == '\t') {
		s.p++
	}
}

// skipToEOL moves past the next newline (or to the end).
func (s *scanner) skipToEOL() {
	if i := bytes.IndexByte(s.src[s.p:], '\n'); i >= 0 {
		s.p += i + 1
	} else {
		s.p = len(s.src)
	}
}

// skipBlank skips whitespace, newlines and comments (inside arrays).
func (s *scanner) skipBlank() {
	for s.p < len(s.src) {
		switch s.src[s.p] {
		case ' ', '\t', '\r', '\n':
			s.p++
		case '#':
			s.skipToEOL()
		default:
			return
		}
	}
}

// scanTopLevel returns the keys of src that come before its first table
// header.
func scanTopLevel(src []byte) ([]topKey, error) {
	s := &scanner{src: src}
	if bytes.HasPrefix(src, []byte(utf8BOM)) {
		s.p = len(utf8BOM)
	}
	var keys []topKey
	for s.p < len(src) {
		s.skipSpaces()
		if s.p >= len(src) {
			break
		}
		switch c := src[s.p]; {
		case c == '\n' || c == '\r' || c == '#':
			s.skipToEOL()
			continue
		case c == '[':
			return keys, nil
		}
		k, err := s.keyValue()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// keyValue scans `key = value [# comment]` and the rest of its line.
func (s *scanner) keyValue() (topKey, error) {
	var name strings.Builder
	for s.p < len(s.src) && s.src[s.p] != '=' {
		switch c := s.src[s.p]; c {
		case '"', '\'':
			start := s.p
			if err := s.basicOrLiteral(c); err != nil {
				return topKey{}, err
			}
			q := string(s.src[start:s.p])
			if c == '"' {
				uq, err := strconv.Unquote(q)
				if err != nil {
					return topKey{}, s.errorf("bad quoted key %s", q)
				}
				name.WriteString(uq)
			} else {
				name.WriteString(q[1 : len(q)-1])
			}
		case '\n':
			return topKey{}, s.errorf("key without a value")
		case ' ', '\t':
			s.p++
		default:
			name.WriteByte(c)
			s.p++
		}
	}
	if s.p >= len(s.src) {
		return topKey{}, s.errorf("key without a value")
	}
	s.p++ // '='
	s.skipSpaces()
	k := topKey{name: name.String(), valueStart: s.p}
	arr, err := s.value()
	if err != nil {
		return topKey{}, err
	}
	k.array = arr
	k.valueEnd = s.p
	s.skipSpaces()
	if s.p < len(s.src) && s.src[s.p] != '#' && s.src[s.p] != '\n' && s.src[s.p] != '\r' {
		return topKey{}, s.errorf("unexpected %q after the value of %s", s.src[s.p], k.name)
	}
	s.skipToEOL()
	k.lineEnd = s.p
	return k, nil
}

// value scans one value; for an array it also describes the elements.
func (s *scanner) value() (*arrayInfo, error) {
	if s.p >= len(s.src) {
		return nil, s.errorf("missing value")
	}
	switch c := s.src[s.p]; {
	case s.peek(`"""`):
		return nil, s.multiline(`"""`, true)
	case s.peek(`'''`):
		return nil, s.multiline(`'''`, false)
	case c == '"' || c == '\'':
		return nil, s.basicOrLiteral(c)
	case c == '[':
		return s.arrayValue()
	case c == '{':
		return nil, s.inlineTable()
	default:
		start := s.p
		for s.p < len(s.src) && !bytes.ContainsRune([]byte(" \t\r\n,]}#"), rune(s.src[s.p])) {
			s.p++
		}
		if s.p == start {
			return nil, s.errorf("missing value")
		}
		return nil, nil
	}
}

// basicOrLiteral scans a one-line string quoted by q.
func (s *scanner) basicOrLiteral(q byte) error {
	s.p++
	for s.p < len(s.src) {
		switch c := s.src[s.p]; {
		case c == '\\' && q == '"':
			s.p += 2
		case c == q:
			s.p++
			return nil
		case c == '\n':
			return s.errorf("unterminated string")
		default:
			s.p++
		}
	}
	return s.errorf("unterminated string")
}

func (s *scanner) multiline(delim string, escapes bool) error {
	s.p += len(delim)
	for s.p < len(s.src) {
		if escapes && s.src[s.p] == '\\' {
			s.p += 2
			continue
		}
		if s.peek(delim) {
			s.p += len(delim)
			// Up to two quotes may directly precede the closing delimiter.
			for i := 0; i < 2 && s.p < len(s.src) && s.src[s.p] == delim[0]; i++ {
				s.p++
			}
			return nil
		}
		s.p++
	}
	return s.errorf("unterminated multi-line string")
}

func (s *scanner) arrayValue() (*arrayInfo, error) {
	info := &arrayInfo{open: s.p}
	s.p++ // '['
	for {
		s.skipBlank()
		if s.p >= len(s.src) {
			return nil, s.errorf("unterminated array")
		}
		if s.src[s.p] == ']' {
			s.p++
			return info, nil
		}
		if _, err := s.value(); err != nil {
			return nil, err
		}
		info.elements++
		info.lastEnd = s.p
		info.commaAfter = false
		s.skipBlank()
		if s.p < len(s.src) && s.src[s.p] == ',' {
			info.commaAfter = true
			s.p++
			info.commaEnd = s.p
		}
	}
}

func (s *scanner) inlineTable() error {
	s.p++ // '{'
	for s.p < len(s.src) {
		switch c := s.src[s.p]; c {
		case '}':
			s.p++
			return nil
		case '"', '\'':
			if err := s.basicOrLiteral(c); err != nil {
				return err
			}
		case '[':
			if _, err := s.arrayValue(); err != nil {
				return err
			}
		case '{':
			if err := s.inlineTable(); err != nil {
				return err
			}
		default:
			s.p++
		}
	}
	return s.errorf("unterminated inline table")
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
		switch keys[i].name {
		case "imports":
			imports = &keys[i]
		case "version":
			version = &keys[i]
		}
	}
	switch {
	case imports != nil && imports.array == nil:
		return nil, fmt.Errorf("imports is not an array")
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
