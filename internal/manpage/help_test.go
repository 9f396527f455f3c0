package manpage

import (
	"bytes"
	"flag"
	"reflect"
	"testing"
)

// The listing comes from the flag package itself, so the parser is held to
// the format Go really prints: a one-letter flag with its description on
// the same line, argument names taken from back-quoted words, multi-line
// descriptions, defaults.
func TestParseHelpFlagPackageListing(t *testing.T) {
	fs := flag.NewFlagSet("tool", flag.ContinueOnError)
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	fs.String("config", "", "configuration `file`")
	fs.Bool("dry-run", false, "print the change; write nothing")
	fs.Bool("v", false, "verbose")
	fs.Int("n", 3, "how many\nretries")
	fs.String("o", "table", "output `format`")
	if err := fs.Parse([]string{"-h"}); err != flag.ErrHelp {
		t.Fatalf("Parse(-h) = %v, want flag.ErrHelp", err)
	}

	got, err := ParseHelp(buf.String())
	if err != nil {
		t.Fatalf("ParseHelp: %v\n%s", err, buf.String())
	}
	want := Help{Flags: []Flag{
		{Name: "config", Arg: "file", Usage: "configuration file"},
		{Name: "dry-run", Usage: "print the change; write nothing"},
		{Name: "n", Arg: "int", Usage: "how many retries (default 3)"},
		{Name: "o", Arg: "format", Usage: `output format (default "table")`},
		{Name: "v", Usage: "verbose"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseHelp:\n got %+v\nwant %+v\nof:\n%s", got, want, buf.String())
	}
}

func TestParseHelpTextAndUsage(t *testing.T) {
	out := "usage: tool [global flags]        run it\n" +
		"       tool status [-o table]\n" +
		"                                  print it\n" +
		"\n" +
		"global flags:\n" +
		"  -a\tall of it\n"
	h, err := ParseHelp(out)
	if err != nil {
		t.Fatal(err)
	}
	wantText := []string{
		"usage: tool [global flags]        run it",
		"       tool status [-o table]",
		"                                  print it",
		"",
		"global flags:",
	}
	if !reflect.DeepEqual(h.Text, wantText) {
		t.Errorf("Text = %q, want %q", h.Text, wantText)
	}
	wantUsage := []string{
		"tool [global flags]        run it",
		"tool status [-o table]",
		"                           print it",
	}
	if got := h.Usage(); !reflect.DeepEqual(got, wantUsage) {
		t.Errorf("Usage() = %q, want %q", got, wantUsage)
	}
	if want := []Flag{{Name: "a", Usage: "all of it"}}; !reflect.DeepEqual(h.Flags, want) {
		t.Errorf("Flags = %+v, want %+v", h.Flags, want)
	}

	// Text that is not a usage paragraph gives no synopsis.
	h, err = ParseHelp("Usage of tool:\n\nSome words first.\n  -a\tall\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Usage(); got != nil {
		t.Errorf("Usage() = %q, want nil", got)
	}
	if want := []string{"Some words first."}; !reflect.DeepEqual(h.Text, want) {
		t.Errorf("Text = %q, want %q (without the flag package's heading and blank lines)", h.Text, want)
	}
}

func TestParseHelpRefusesWhatIsNotOneListing(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
	}{
		{
			name: "text after the flags",
			out:  "  -a\tall\nRun tool -h for more.\n",
			want: `help line 2 "Run tool -h for more.": text after the flag listing`,
		},
		{
			// A listing printed twice, as a command that prints its
			// usage both itself and through the flag package would.
			name: "flag listed twice",
			out:  "  -a\tall\n  -b\tboth\n  -a\tall\n",
			want: "help line 3: flag -a is listed twice",
		},
		{
			name: "flag without a name",
			out:  "  - file\n",
			want: `help line 1 "  - file": a flag without a name`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHelp(tc.out)
			if err == nil || err.Error() != tc.want {
				t.Errorf("ParseHelp error = %v, want %q", err, tc.want)
			}
		})
	}
}

// Blank lines inside the text stay: they separate its paragraphs.
func TestParseHelpKeepsInnerBlankLines(t *testing.T) {
	h, err := ParseHelp("\n\nfirst\n\nsecond\n\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"first", "", "second"}; !reflect.DeepEqual(h.Text, want) {
		t.Errorf("Text = %q, want %q", h.Text, want)
	}
}

// spf13/pflag's listing (kubectl-nri_vgpu's): shorthands, double dashes,
// the argument's type, one line each; the usage paragraph before it.
func TestParseHelpPflagListing(t *testing.T) {
	out := `usage: kubectl nri-vgpu [flags]

The cluster's vGPUs.

flags:
  -o, --output string                  output format: wide, json or yaml; empty: a table
  -A, --all-namespaces                 list the pods and claims of every namespace
      --node strings                   list only these nodes (repeat or separate by commas)
      --scrape-timeout duration        how long to wait for one node's metrics (default 10s)
      --as-group stringArray           Group to impersonate for the operation.
`
	h, err := ParseHelp(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Flag{
		{"o, --output", "string", "output format: wide, json or yaml; empty: a table"},
		{"A, --all-namespaces", "", "list the pods and claims of every namespace"},
		{"-node", "strings", "list only these nodes (repeat or separate by commas)"},
		{"-scrape-timeout", "duration", "how long to wait for one node's metrics (default 10s)"},
		{"-as-group", "stringArray", "Group to impersonate for the operation."},
	}
	if !reflect.DeepEqual(h.Flags, want) {
		t.Errorf("flags\n%q\nwant\n%q", h.Flags, want)
	}
	if u := h.Usage(); len(u) != 1 || u[0] != "kubectl nri-vgpu [flags]" {
		t.Errorf("usage %q, want kubectl nri-vgpu [flags]", u)
	}
	var w Writer
	w.Flags(h.Flags[:1])
	if got, want := string(w.Bytes()), ".TP\n\\fB\\-o, \\-\\-output\\fR \\fIstring\\fR\noutput format: wide, json or yaml; empty: a table\n"; got != want {
		t.Errorf("roff\n%q\nwant\n%q", got, want)
	}
}
