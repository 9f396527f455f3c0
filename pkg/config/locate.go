package config

import (
	"bytes"
	"sort"
	"strconv"

	"github.com/BurntSushi/toml"
	"github.com/pelletier/go-toml/v2/unstable"
)

// The TOML library that decodes the file reports a line for syntax errors
// but keeps the positions of keys to itself (and records only the last
// element of an array of tables), so the lines in validation errors come
// from go-toml's parser, which gives the byte range of every key and value.
// It runs on documents the decoding library has already accepted; should
// the two parsers disagree on a corner of TOML, keys after the point where
// go-toml stopped have no line, and their errors none either.

// locator maps key paths to the line on which each is written. A path joins
// keys with "." (quoted as TOML quotes them when needed) and writes array
// elements as "[i]": "gpu.simulated[1].uuid", "driver.cdi_dirs[0]".
type locator struct {
	lines map[string]int

	// Only while locate runs:
	newlines []int          // offsets of '\n', to turn an offset into a line
	aot      map[string]int // array-of-tables path -> elements seen so far
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

// locate records where every key, table header and array element of src
// starts.
func locate(src string) *locator {
	// A byte order mark holds no line break, so parsing after it changes
	// no line number.
	data := []byte(src)
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	l := &locator{
		lines: make(map[string]int),
		aot:   make(map[string]int),
	}
	for i, c := range data {
		if c == '\n' {
			l.newlines = append(l.newlines, i)
		}
	}
	var p unstable.Parser
	p.Reset(data)
	table := "" // path of the current [table] or [[array]] element
	for p.NextExpression() {
		switch e := p.Expression(); e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = l.header(e)
		case unstable.KeyValue:
			l.value(e.Value(), l.keyPath(table, e))
		}
	}
	l.newlines, l.aot = nil, nil
	return l
}

// lineAt is the 1-based line of offset off.
func (l *locator) lineAt(off int) int {
	return sort.SearchInts(l.newlines, off) + 1
}

// record notes the line of path unless it was already seen: the first
// mention of a table is where it is defined.
func (l *locator) record(path string, off int) {
	if _, ok := l.lines[path]; !ok {
		l.lines[path] = l.lineAt(off)
	}
}

// keys returns the parts of the key of a table header or key/value node and
// the offset of its first part.
func keys(n *unstable.Node) ([]string, int) {
	var parts []string
	off := -1
	for it := n.Key(); it.Next(); {
		k := it.Node()
		if off < 0 {
			off = int(k.Raw.Offset)
		}
		parts = append(parts, string(k.Data))
	}
	return parts, off
}

// header resolves a table header to its path: each array of tables on the
// way stands for its latest element, and a [[header]] starts a new element.
func (l *locator) header(e *unstable.Node) string {
	parts, off := keys(e)
	path := ""
	for j, k := range parts {
		path = joinPath(path, k)
		n, isArray := l.aot[path]
		switch {
		case j == len(parts)-1 && e.Kind == unstable.ArrayTable:
			l.aot[path] = n + 1
			l.record(path, off)
			path = indexPath(path, n)
		case isArray && n > 0:
			path = indexPath(path, n-1)
		}
	}
	l.record(path, off)
	return path
}

// keyPath records the (possibly dotted) key of the key/value node e and
// each table it implies, and returns its path.
func (l *locator) keyPath(table string, e *unstable.Node) string {
	parts, off := keys(e)
	path := table
	for _, k := range parts {
		path = joinPath(path, k)
		l.record(path, off)
	}
	return path
}

// value records the keys of inline tables and the elements of arrays in the
// value node v under path.
func (l *locator) value(v *unstable.Node, path string) {
	switch v.Kind {
	case unstable.Array:
		i := 0
		for it := v.Children(); it.Next(); i++ {
			elem := indexPath(path, i)
			if off, ok := start(it.Node()); ok {
				l.record(elem, off)
			}
			l.value(it.Node(), elem)
		}
	case unstable.InlineTable:
		for it := v.Children(); it.Next(); {
			kv := it.Node()
			l.value(kv.Value(), l.keyPath(path, kv))
		}
	}
}

// start is the offset where the value node v begins. The parser records no
// range for an array, so a nested array is placed at its first element; an
// empty one has no place of its own and reports the line of its parent.
func start(v *unstable.Node) (int, bool) {
	if v.Kind != unstable.Array {
		return int(v.Raw.Offset), true
	}
	for it := v.Children(); it.Next(); {
		if off, ok := start(it.Node()); ok {
			return off, true
		}
	}
	return 0, false
}
