package manpage

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

func TestWriterPage(t *testing.T) {
	var w Writer
	w.Header("my-tool", "1", "2026-01-02", "pkg 1.0", "User Commands")
	w.Name("my-tool", "does a thing")
	w.Synopsis([]string{"my-tool [-f file]", ".starts with a dot"})
	w.Section("Description")
	w.Paragraph("  First line\n  second line with a \\ and 'quote'\n.dot at the start\n'quote at the start")
	w.Paragraph("   ")
	w.Flags([]Flag{{Name: "config", Arg: "file", Usage: "the file"}, {Name: "n", Usage: "dry run"}})
	w.Tagged("/etc/x.toml", "The \"config\".")
	want := `.TH "MY\-TOOL" "1" "2026\-01\-02" "pkg 1.0" "User Commands"
.nh
.ad l
.SH "NAME"
my\-tool \- does a thing
.SH "SYNOPSIS"
.PP
.RS 4
.nf
my\-tool [\-f file]
\&.starts with a dot
.fi
.RE
.SH "DESCRIPTION"
.PP
First line
second line with a \e and 'quote'
\&.dot at the start
\&'quote at the start
.TP
\fB\-config\fR \fIfile\fR
the file
.TP
\fB\-n\fR
dry run
.TP
\fB/etc/x.toml\fR
The "config".
`
	if got := string(w.Bytes()); got != want {
		t.Errorf("page:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriterQuotesMacroArguments(t *testing.T) {
	var w Writer
	w.Subsection(`say "hi"`)
	if got, want := string(w.Bytes()), ".SS \"say \\(dqhi\\(dq\"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Help text keeps hand-made layout (usage lines, indented lines) and fills
// prose.
func TestWriterText(t *testing.T) {
	var w Writer
	w.Text([]string{
		"usage: tool a [flags]",
		"       tool b [flags]",
		"",
		"a: does a, in words that",
		"wrap over lines.",
		"",
		"",
		"Examples:",
		"  tool a -x",
	})
	want := `.PP
.RS 4
.nf
usage: tool a [flags]
       tool b [flags]
.fi
.RE
.PP
a: does a, in words that
wrap over lines.
.PP
.RS 4
.nf
Examples:
  tool a \-x
.fi
.RE
`
	if got := string(w.Bytes()); got != want {
		t.Errorf("text:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriterDoc(t *testing.T) {
	doc := `tool is a tool. It reads files and more: see
[the site].

# Signals

	tool run
	tool -h

Lists:
  - one item
  - two items

and
 1. first
 2. second

[the site]: https://example.com/tool
`
	var w Writer
	w.Doc(doc)
	want := `.PP
tool is a tool. It reads files and more: see
the site <https://example.com/tool>.
.SS "Signals"
.PP
.RS 4
.nf
tool run
tool \-h
.fi
.RE
.PP
Lists:
.PP
.IP \(bu 4
one item
.IP \(bu 4
two items
.PP
and
.PP
.IP 1. 4
first
.IP 2. 4
second
`
	if got := string(w.Bytes()); got != want {
		t.Errorf("doc:\n%s\nwant:\n%s", got, want)
	}
}

// The pages must be ones man(1) shows without complaint: groff, warning
// about everything, reads a page with every construct the writer makes.
func TestWriterOutputIsCleanRoff(t *testing.T) {
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Skip("groff is not installed (Debian: groff-base)")
	}
	var w Writer
	w.Header("tool", "1", "2026-01-02", "pkg 1.0", "User Commands")
	w.Name("tool", "does a thing")
	w.Synopsis([]string{"tool [flags]", ".x"})
	w.Section("DESCRIPTION")
	w.Doc("tool \\ does _it_.\n\n\tcode -x\n\n  - item\n\n# Heading\n\n'quoted\n")
	w.Section("OPTIONS")
	w.Flags([]Flag{{Name: "config", Arg: "file", Usage: `a "file"`}})
	w.Section("COMMANDS")
	w.Subsection("run it")
	w.Text([]string{"usage: tool run", "", "Runs."})
	w.Tagged("/etc/tool", "Its file.")
	cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
	cmd.Stdin = bytes.NewReader(w.Bytes())
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("groff -man -ww: %v\n%s\nof the page:\n%s", err, out, w.Bytes())
	}
}
