package config

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// decoder binds a parsed document onto a Config one key at a time, using
// the TOML library for every value. Going key by key, rather than decoding
// the whole file in one call, gives three things one call cannot: every bad
// value is reported (not just the first the library meets), each with the
// line of the exact array element it is in, and keys must match in case
// (the library would otherwise bind "Split_Count" to split_count).
type decoder struct {
	md   *toml.MetaData
	loc  *locator
	file string
	errs []error
}

// table decodes the table prim onto the struct rv, leaving fields whose key
// is absent untouched (they keep their defaults).
func (d *decoder) table(prim toml.Primitive, rv reflect.Value, path string) {
	// The library decodes a non-table into a map as an empty map, without
	// an error, so the kind of value is checked first.
	if raw := d.raw(prim, path); raw == nil {
		return
	} else if _, ok := raw.(map[string]any); !ok {
		d.fail(path, fmt.Errorf("want a table, not %s", tomlTypeName(raw)))
		return
	}
	var m map[string]toml.Primitive
	if err := d.md.PrimitiveDecode(prim, &m); err != nil {
		d.fail(path, err)
		return
	}
	d.fields(m, rv, path)
}

// fields decodes each key of m onto the matching field of the struct rv,
// in the order the keys appear in the file.
func (d *decoder) fields(m map[string]toml.Primitive, rv reflect.Value, path string) {
	known := tomlFields(rv.Type())
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		li, lj := d.loc.line(joinPath(path, keys[i])), d.loc.line(joinPath(path, keys[j]))
		if li != lj {
			return li < lj
		}
		return keys[i] < keys[j]
	})
	for _, k := range keys {
		kpath := joinPath(path, k)
		idx, ok := known[k]
		if !ok {
			d.unknown(kpath, k, known)
			continue
		}
		d.value(m[k], rv.Field(idx), kpath)
	}
}

// value decodes prim onto the field fv: tables and arrays of tables
// recursively, everything else with the library.
func (d *decoder) value(prim toml.Primitive, fv reflect.Value, path string) {
	switch {
	case isTable(fv.Type()):
		d.table(prim, fv, path)
	case fv.Kind() == reflect.Slice && isTable(fv.Type().Elem()):
		switch raw := d.raw(prim, path); raw.(type) {
		case nil:
			return
		case []map[string]any, []any:
		default:
			d.fail(path, fmt.Errorf("want an array of tables ([[%s]]), not %s", path, tomlTypeName(raw)))
			return
		}
		var elems []toml.Primitive
		if err := d.md.PrimitiveDecode(prim, &elems); err != nil {
			d.fail(path, err)
			return
		}
		s := reflect.MakeSlice(fv.Type(), len(elems), len(elems))
		for i, e := range elems {
			d.table(e, s.Index(i), indexPath(path, i))
		}
		fv.Set(s)
	default:
		if fv.Kind() == reflect.Slice {
			// A list in the file replaces the default list; it is not
			// decoded over it (the library would reuse its array).
			fv.Set(reflect.Zero(fv.Type()))
		}
		if err := d.md.PrimitiveDecode(prim, fv.Addr().Interface()); err != nil {
			d.fail(path, err)
		}
	}
}

// raw returns the value of prim as the library parsed it, or nil after
// reporting why it could not.
func (d *decoder) raw(prim toml.Primitive, path string) any {
	var v any
	if err := d.md.PrimitiveDecode(prim, &v); err != nil {
		d.fail(path, err)
		return nil
	}
	return v
}

var (
	unmarshalerType     = reflect.TypeFor[toml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// isTable reports whether values of t are decoded key by key: structs,
// except those that decode themselves.
func isTable(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Kind() == reflect.Struct && !p.Implements(unmarshalerType) && !p.Implements(textUnmarshalerType)
}

// libraryPrefix is how the library starts the messages of its decode
// errors; the location it gives is replaced with the scanner's, which also
// knows the array element.
var libraryPrefix = regexp.MustCompile(`^toml: (line \d+ )?(\(last key "(\\.|[^"\\])*"\): )?`)

func (d *decoder) fail(path string, err error) {
	msg := err.Error()
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg = pe.Message
	} else {
		msg = libraryPrefix.ReplaceAllString(msg, "")
	}
	d.errs = append(d.errs, &Error{
		File: d.file,
		Line: d.loc.line(path),
		Key:  path,
		Err:  &causeError{msg: msg, cause: err},
	})
}

func (d *decoder) unknown(path, key string, known map[string]int) {
	msg := fmt.Sprintf("%s %q", ErrUnknownKey, path)
	if s := suggest(key, known); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	d.errs = append(d.errs, &Error{
		File: d.file,
		Line: d.loc.line(path),
		Err:  &causeError{msg: msg, cause: ErrUnknownKey},
	})
}

// suggest returns the known key that key probably meant: the closest one
// once case, "_" and "-" are ignored, within one or two typos.
func suggest(key string, known map[string]int) string {
	norm := func(s string) string {
		return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s))
	}
	want := norm(key)
	limit := 2
	if len(want) <= 4 {
		limit = 1
	}
	best, bestDist := "", limit+1
	for k := range known {
		if d := editDistance(norm(k), want); d < bestDist || d == bestDist && k < best {
			best, bestDist = k, d
		}
	}
	if bestDist > limit {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// tomlFields maps the TOML key of each settable field of the struct type t
// to its field index, as the library names them: the toml tag, else the Go
// field name; "-" and unexported fields are not keys.
func tomlFields(t reflect.Type) map[string]int {
	fields := make(map[string]int, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields[name] = i
	}
	return fields
}
