package configure

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

func TestAddImport(t *testing.T) {
	const p = "/etc/containerd/conf.d/nri-vgpu.toml"
	tests := []struct {
		name, in, want string
	}{{
		name: "empty array",
		in:   "version = 2\nimports = []\n\n[plugins]\n",
		want: "version = 2\nimports = [\"" + p + "\"]\n\n[plugins]\n",
	}, {
		name: "one element",
		in:   "imports = [\"/a.toml\"] # mine\nversion = 2\n",
		want: "imports = [\"/a.toml\", \"" + p + "\"] # mine\nversion = 2\n",
	}, {
		name: "literal strings, as containerd 2 writes them",
		in:   "version = 4\nimports = ['/etc/containerd/other/*.toml']\n",
		want: "version = 4\nimports = ['/etc/containerd/other/*.toml', \"" + p + "\"]\n",
	}, {
		name: "multi-line with trailing comma and comments",
		in:   "imports = [\n  \"/a.toml\", # first\n  \"/b.toml\", # second\n]\nversion = 2\n",
		want: "imports = [\n  \"/a.toml\", # first\n  \"/b.toml\", \"" + p + "\", # second\n]\nversion = 2\n",
	}, {
		name: "multi-line without trailing comma",
		in:   "imports = [\n  \"/a.toml\" # only\n]\n",
		want: "imports = [\n  \"/a.toml\", \"" + p + "\" # only\n]\n",
	}, {
		name: "no imports: after version",
		in:   "# my containerd\nroot = \"/data\"\nversion = 2\n\n[plugins]\n",
		want: "# my containerd\nroot = \"/data\"\nversion = 2\nimports = [\"" + p + "\"]\n\n[plugins]\n",
	}, {
		name: "no imports, version on the last line without a newline",
		in:   "version = 2",
		want: "version = 2\nimports = [\"" + p + "\"]\n",
	}, {
		name: "no imports and no version: at the top",
		in:   "root = \"/data\"\n",
		want: "imports = [\"" + p + "\"]\nroot = \"/data\"\n",
	}, {
		name: "CRLF line ends",
		in:   "version = 2\r\nroot = \"/data\"\r\n",
		want: "version = 2\r\nimports = [\"" + p + "\"]\r\nroot = \"/data\"\r\n",
	}, {
		name: "strings that look like syntax before imports",
		in:   "root = \"/var/lib/c#d[x]\"\nstate = 'a]b'\nnote = \"\"\"\n[not.a.table]\nimports = [\"x\"]\n\"\"\"\nimports = [ ] # none yet\n",
		want: "root = \"/var/lib/c#d[x]\"\nstate = 'a]b'\nnote = \"\"\"\n[not.a.table]\nimports = [\"x\"]\n\"\"\"\nimports = [\"" + p + "\" ] # none yet\n",
	}, {
		name: "inline table and nested arrays before imports",
		in:   "t = { a = [1, [2]], b = \"}\" }\nimports = [\"/a.toml\"]\n",
		want: "t = { a = [1, [2]], b = \"}\" }\nimports = [\"/a.toml\", \"" + p + "\"]\n",
	}, {
		name: "byte order mark before imports",
		in:   "\ufeffimports = ['/a.toml'] # x\n",
		want: "\ufeffimports = ['/a.toml', \"" + p + "\"] # x\n",
	}, {
		name: "byte order mark, no imports and no version",
		in:   "\ufeffroot = \"/data\"\n",
		want: "\ufeffimports = [\"" + p + "\"]\nroot = \"/data\"\n",
	}, {
		name: "a comma in a comment after the last element",
		in:   "imports = [\n  \"/a.toml\" # x, y\n]\n",
		want: "imports = [\n  \"/a.toml\", \"" + p + "\" # x, y\n]\n",
	}, {
		name: "the trailing comma on the line after a comment",
		in:   "imports = [\n  \"/a.toml\" # x\n  , # y\n]\n",
		want: "imports = [\n  \"/a.toml\" # x\n  , \"" + p + "\", # y\n]\n",
	}, {
		name: "imports inside a table is not the top-level key",
		in:   "version = 2\n[x]\nimports = [\"/a.toml\"]\n",
		want: "version = 2\nimports = [\"" + p + "\"]\n[x]\nimports = [\"/a.toml\"]\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := addImport([]byte(tt.in), p)
			if err != nil {
				t.Fatalf("addImport: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("addImport:\n got: %q\nwant: %q", got, tt.want)
			}
		})
	}
}

func TestAddImportErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"imports not an array", "imports = \"/a.toml\"\n", "imports is not an array"},
		{"imports a table", "version = 2\nimports.a = [\"/a.toml\"]\n", "imports is not an array"},
		{"imports holds an array", "imports = [\"/a.toml\", [\"/b.toml\"]]\n", "imports holds an array or table"},
		// Line and column are 1-based; the column counts bytes. At the end
		// of the input the parser points at its last byte.
		{"unterminated array", "imports = [\"/a.toml\"\n", "line 1, column 21: not valid TOML: array is incomplete"},
		{"unterminated string", "root = \"/data\nimports = []\n", "line 1, column 14: not valid TOML: basic strings cannot have new lines"},
		{"not TOML", "version = 2\nimports = [] junk\n", "line 2, column 14: not valid TOML: expected newline but got U+006A 'j'"},
		{"after a byte order mark", "\ufeffversion = 2\nimports = [\"a\" junk]\n", "line 2, column 16: not valid TOML: expected ',' or ']' after array value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := addImport([]byte(tt.in), "/x.toml")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("addImport(%q) error = %v, want one containing %q", tt.in, err, tt.want)
			}
		})
	}
}

func FuzzAddImport(f *testing.F) {
	f.Add("version = 2\nimports = []\n[plugins]\n")
	f.Add("imports = [\n 'a', # c\n]\n")
	f.Add("a = \"\"\"\n[x]\n\"\"\"\n")
	f.Add("t = {a=[1,{b=2}]}\n")
	f.Add("\"imports\" = [] #c\nversion=2")
	f.Add("'k=v' = 'x'\r\nimports=['a',]")
	f.Add("\ufeffa = '''\n[x]'''\nb.c = 1\n[[t]]\n")
	f.Fuzz(func(t *testing.T, in string) {
		const p = "/etc/containerd/conf.d/nri-vgpu.toml"
		if !utf8.ValidString(in) {
			return // containerd reads UTF-8 only
		}
		var doc map[string]any
		if toml.Unmarshal([]byte(in), &doc) != nil {
			return
		}
		if imp, ok := doc["imports"]; ok {
			list, isList := imp.([]any)
			if !isList || len(stringList(imp)) != len(list) {
				return // not a list of strings: containerd would reject it
			}
		}
		// Any valid TOML document must be edited, and the edit must change
		// nothing but imports.
		out, err := addImport([]byte(in), p)
		if err != nil {
			t.Fatalf("addImport(%q): %v", in, err)
		}
		if err := checkOnlyImportsChanged([]byte(in), out, p); err != nil {
			t.Fatalf("addImport(%q) = %q: %v", in, out, err)
		}
	})
}
