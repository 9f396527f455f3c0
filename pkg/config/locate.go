package config

import (
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// The TOML library reports a line for syntax errors but keeps the positions
// of keys to itself (and records only the last element of an array of
// tables), so the lines in validation errors come from this small scanner.
// It runs only on documents the library has already accepted, so it needs
// to know the shape of TOML, not to check it; on any input it terminates
// without panicking (FuzzParse checks this).

// locator maps key paths to the line on which each is written. A path joins
// keys with "." (quoted as TOML quotes them when needed) and writes array
// elements as "[i]": "gpu.simulated[1].uuid", "driver.cdi_dirs[0]".
type locator struct {
	lines map[string]int
}

// line returns the line of path, else of its nearest ancestor that is
// written in the file (a key left at its default reports the line of its
// table), else 0. A nil locator knows no lines.
func (l *locator) line(path string) int {
	if l == nil {
		return 0
	}
	for path != "" {
		if n, ok := l.lines[path]; ok {
			return n
		}
		path = parentPath(path)
	}
	return 0
}

// joinPath appends key to the path of its table.
func joinPath(parent, key string) string {
	k := toml.Key{key}.String()
	if parent == "" {
		return k
	}
	return parent + "." + k
}

// indexPath names element i of the array at path.
func indexPath(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// parentPath strips the last key or index from path, skipping over quoted
// keys (which may contain "." or "[").
func parentPath(path string) string {
	cut, quoted := 0, false
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && (c == '.' || c == '['):
			cut = i
		}
	}
	return path[:cut]
}

// locate scans a TOML document and records where every key, table header
// and array element starts.
func locate(src string) *locator {
	s := &scanner{
		src:   src,
		lines: make(map[string]int),
		aot:   make(map[string]int),
	}
	for i := 0; i < len(src); i++ {
		if src[i] == '\n' {
			s.newlines = append(s.newlines, i)
		}
	}
	s.document()
	return &locator{lines: s.lines}
}

type scanner struct {
	src      string
	i        int
	newlines []int          // offsets of '\n', to turn an offset into a line
	lines    map[string]int // path -> line
	aot      map[string]int // array-of-tables path -> elements seen so far
}

func (s *scanner) eof() bool { return s.i >= len(s.src) }

func (s *scanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.i]
}

func (s *scanner) has(prefix string) bool { return strings.HasPrefix(s.src[s.i:], prefix) }

// lineAt is the 1-based line of offset off.
func (s *scanner) lineAt(off int) int {
	return sort.SearchInts(s.newlines, off) + 1
}

// record notes the line of path unless it was already seen: the first
// mention of a table is where it is defined.
func (s *scanner) record(path string, off int) {
	if _, ok := s.lines[path]; !ok {
		s.lines[path] = s.lineAt(off)
	}
}

// skipBlank skips spaces and tabs.
func (s *scanner) skipBlank() {
	for !s.eof() && (s.peek() == ' ' || s.peek() == '\t') {
		s.i++
	}
}

// skipSpace skips blanks, line ends and comments.
func (s *scanner) skipSpace() {
	for !s.eof() {
		switch s.peek() {
		case ' ', '\t', '\r', '\n':
			s.i++
		case '#':
			s.skipLine()
		default:
			return
		}
	}
}

// skipLine moves to the next '\n' (not past it).
func (s *scanner) skipLine() {
	if n := strings.IndexByte(s.src[s.i:], '\n'); n >= 0 {
		s.i += n
	} else {
		s.i = len(s.src)
	}
}

func (s *scanner) document() {
	table := "" // path of the current [table] or [[array]] element
	for {
		s.skipSpace()
		if s.eof() {
			return
		}
		start := s.i
		if s.peek() == '[' {
			array := s.has("[[")
			if array {
				s.i += 2
			} else {
				s.i++
			}
			table = s.header(s.keys(), array, start)
			s.skipLine()
			continue
		}
		keys := s.keys()
		s.skipBlank()
		if len(keys) == 0 || s.peek() != '=' {
			s.skipLine()
			if s.i == start {
				s.i++
			}
			continue
		}
		s.i++
		s.value(s.keyPath(table, keys, start))
		if s.i == start {
			s.i++
		}
	}
}

// header resolves a table header to its path: each array of tables on the
// way stands for its latest element, and a [[header]] starts a new element.
func (s *scanner) header(keys []string, array bool, off int) string {
	path := ""
	for j, k := range keys {
		path = joinPath(path, k)
		n, isArray := s.aot[path]
		switch {
		case j == len(keys)-1 && array:
			s.aot[path] = n + 1
			s.record(path, off)
			path = indexPath(path, n)
		case isArray && n > 0:
			path = indexPath(path, n-1)
		}
	}
	s.record(path, off)
	return path
}

// keyPath records a dotted key and each table it implies, and returns its
// path.
func (s *scanner) keyPath(table string, keys []string, off int) string {
	path := table
	for _, k := range keys {
		path = joinPath(path, k)
		s.record(path, off)
	}
	return path
}

// keys reads a possibly dotted key: bare, "basic" or 'literal' parts.
func (s *scanner) keys() []string {
	var keys []string
	for {
		s.skipBlank()
		var k string
		switch c := s.peek(); {
		case c == '"':
			k = s.basicString()
		case c == '\'':
			k = s.literalString()
		default:
			start := s.i
			for !s.eof() && isBareKeyChar(s.peek()) {
				s.i++
			}
			if s.i == start {
				return keys
			}
			k = s.src[start:s.i]
		}
		keys = append(keys, k)
		s.skipBlank()
		if s.peek() != '.' {
			return keys
		}
		s.i++
	}
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// basicString reads a one-line "string" and returns its value.
func (s *scanner) basicString() string {
	start := s.i
	s.i++
	for !s.eof() && s.peek() != '"' && s.peek() != '\n' {
		if s.peek() == '\\' && s.i+1 < len(s.src) {
			s.i++ // the escaped character, which may be a quote
		}
		s.i++
	}
	if s.eof() || s.peek() == '\n' {
		return s.src[start+1 : s.i]
	}
	s.i++
	raw := s.src[start:s.i]
	if v, err := strconv.Unquote(raw); err == nil {
		return v
	}
	return raw[1 : len(raw)-1]
}

// literalString reads a one-line 'string' and returns its value.
func (s *scanner) literalString() string {
	start := s.i + 1
	s.i = start
	for !s.eof() && s.peek() != '\'' && s.peek() != '\n' {
		s.i++
	}
	v := s.src[start:s.i]
	if s.peek() == '\'' {
		s.i++
	}
	return v
}

// multiline skips a multi-line string (delim is three quote characters),
// which may end in up to two more quotes that belong to its value.
func (s *scanner) multiline(delim string, escapes bool) {
	s.i += len(delim)
	for !s.eof() {
		switch {
		case escapes && s.peek() == '\\':
			s.i += 2
		case s.has(delim):
			s.i += len(delim)
			for n := 0; n < 2 && s.peek() == delim[0]; n++ {
				s.i++
			}
			return
		default:
			s.i++
		}
	}
	if s.i > len(s.src) {
		s.i = len(s.src)
	}
}

// value skips one value, recording the keys of inline tables and the
// elements of arrays under path.
func (s *scanner) value(path string) {
	s.skipBlank()
	switch {
	case s.has(`"""`):
		s.multiline(`"""`, true)
	case s.has(`'''`):
		s.multiline(`'''`, false)
	case s.peek() == '"':
		s.basicString()
	case s.peek() == '\'':
		s.literalString()
	case s.peek() == '[':
		s.i++
		for n := 0; ; {
			s.skipSpace()
			switch s.peek() {
			case 0:
				return
			case ']':
				s.i++
				return
			case ',':
				s.i++
				continue
			}
			start := s.i
			elem := indexPath(path, n)
			s.record(elem, start)
			s.value(elem)
			n++
			if s.i == start {
				s.i++
			}
		}
	case s.peek() == '{':
		s.i++
		for {
			s.skipSpace()
			switch s.peek() {
			case 0:
				return
			case '}':
				s.i++
				return
			case ',':
				s.i++
				continue
			}
			start := s.i
			keys := s.keys()
			s.skipBlank()
			if len(keys) == 0 || s.peek() != '=' {
				if s.i == start {
					s.i++
				}
				continue
			}
			s.i++
			s.value(s.keyPath(path, keys, start))
		}
	default:
		// Numbers, booleans, dates: up to whatever may follow a value.
		for !s.eof() && !strings.ContainsRune(",]}\n#", rune(s.peek())) {
			s.i++
		}
	}
}
