package config

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLocate(t *testing.T) {
	doc := `# comment with key = "value" and [table]
top = 1

[a]
b = """
not.a = key
[nor]
a table"""
c = '''
x = 1'''
d = "quoted # not a comment" # comment
"quoted.key" = 2
e.f.g = 3
arr = [
  1, # one
  [2, 3],
  { h = 4, i = { j = 5 } },
]
inline = { k = 6,
  l = 7 }

[[aot]]
m = 8
[aot.sub]
n = 9
[[aot.nested]]
o = 10

[[aot]]
m = 11
[[aot.nested]]
o = 12
[[aot.nested]]
o = 13

[ spaced . 'literal key' ]
p = "esc\"aped"
q = 14
`
	want := map[string]int{
		"top":                      2,
		"a":                        4,
		"a.b":                      5,
		"a.c":                      9,
		"a.d":                      11,
		`a."quoted.key"`:           12,
		"a.e":                      13,
		"a.e.f.g":                  13,
		"a.arr":                    14,
		"a.arr[0]":                 15,
		"a.arr[1]":                 16,
		"a.arr[1][1]":              16,
		"a.arr[2]":                 17,
		"a.arr[2].h":               17,
		"a.arr[2].i.j":             17,
		"a.inline.k":               19,
		"a.inline.l":               20,
		"aot":                      22,
		"aot[0]":                   22,
		"aot[0].m":                 23,
		"aot[0].sub.n":             25,
		"aot[0].nested[0].o":       27,
		"aot[1]":                   29,
		"aot[1].m":                 30,
		"aot[1].nested[0]":         31,
		"aot[1].nested[1].o":       34,
		`spaced."literal key"`:     36,
		`spaced."literal key".p`:   37,
		`spaced."literal key".q`:   38,
		"a.missing":                4, // falls back to its table
		"aot[1].nested[1].missing": 33,
		"nothing.here":             0,
	}
	loc := locate(doc)
	for path, line := range want {
		if got := loc.line(path); got != line {
			t.Errorf("line(%s) = %d, want %d", path, got, line)
		}
	}
	for path := range loc.lines {
		for _, bogus := range []string{"not", "nor", "x"} {
			if strings.HasSuffix(path, "."+bogus) || path == bogus {
				t.Errorf("text inside a string was taken for key %s", path)
			}
		}
	}
}

// TestLocateInsideInlineTables: an inline table stays on one line, but an
// array inside it may span lines; its elements are located on their own.
func TestLocateInsideInlineTables(t *testing.T) {
	doc := "t = { a = { b = [\n  1,\n  2 ] }, d = [\n  3 ] }\n"
	var v map[string]any
	if _, err := toml.Decode(doc, &v); err != nil {
		t.Fatalf("the document is not TOML the decoder accepts: %v", err)
	}
	loc := locate(doc)
	want := map[string]int{
		"t.a.b":    1,
		"t.a.b[0]": 2,
		"t.a.b[1]": 3,
		"t.d":      3,
		"t.d[0]":   4,
	}
	for path, line := range want {
		if got := loc.line(path); got != line {
			t.Errorf("line(%s) = %d, want %d", path, got, line)
		}
	}
}

// TestLocateByteOrderMark: a file saved with a byte order mark still has
// its lines (the decoding library accepts the mark).
func TestLocateByteOrderMark(t *testing.T) {
	loc := locate("\ufeff[device_plugin]\r\nsplit_count = 4\r\n\r\n[gpu]\r\nbackend = \"nvml\"\r\n")
	want := map[string]int{
		"device_plugin":             1,
		"device_plugin.split_count": 2,
		"gpu":                       4,
		"gpu.backend":               5,
	}
	for path, line := range want {
		if got := loc.line(path); got != line {
			t.Errorf("line(%s) = %d, want %d", path, got, line)
		}
	}
}

func TestParentPath(t *testing.T) {
	tests := map[string]string{
		"a.b.c":               "a.b",
		"a[1]":                "a",
		"a[1].b":              "a[1]",
		`a."b.c"`:             "a",
		`a."b[1]"`:            "a",
		`a."b\"c.d"`:          "a",
		"a":                   "",
		"gpu.simulated[0][1]": "gpu.simulated[0]",
	}
	for in, want := range tests {
		if got := parentPath(in); got != want {
			t.Errorf("parentPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(simulatedDoc))
	f.Add([]byte("[device_plugin]\nsplit_count = 4\n[[device_plugin.model]]\nname = \"x\"\nsplit_count = 2\n"))
	f.Add([]byte("a = \"\"\"\nb\"\"\"\"\"\nc = [1, {d = 2}]\n"))
	f.Add([]byte("[gpu]\nsimulated = [{uuid=\"GPU-1\", name=\"n\", memory=\"1GiB\"}]\n"))
	f.Add([]byte("x = '''\n"))
	f.Add([]byte("[[a]]\n[[a.b]]\n[a.b.c]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The scanner runs on any input, not only on valid TOML.
		locate(string(data))
		cfg, err := Parse("fuzz.toml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.toml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate rejects: %v", err)
		}
	})
}
