package manpage

import (
	"fmt"
	"go/doc/comment"
	"strings"
)

// Writer builds a page in the man(7) macros. Text handed to it is plain: it
// escapes what roff would take for requests or escapes.
type Writer struct {
	b strings.Builder
}

// Header writes the .TH line: the page's name (upper-cased, as man pages
// are titled), its section, date, source (package and version) and manual.
// Text is left-aligned and never hyphenated: a path or flag split at a
// hyphen could not be copied from the page.
func (w *Writer) Header(name, section, date, source, manual string) {
	fmt.Fprintf(&w.b, ".TH %s %s %s %s %s\n.nh\n.ad l\n", quote(strings.ToUpper(name)), quote(section),
		quote(date), quote(source), quote(manual))
}

// Name writes the NAME section in the form whatis and apropos read:
// "name \- summary".
func (w *Writer) Name(name, summary string) {
	w.Section("NAME")
	fmt.Fprintf(&w.b, "%s \\- %s\n", escape(name), escape(summary))
}

// Synopsis writes the SYNOPSIS section, one command line a line, as given.
func (w *Writer) Synopsis(lines []string) {
	w.Section("SYNOPSIS")
	w.Preformatted(lines)
}

// Section starts a section (.SH).
func (w *Writer) Section(title string) {
	fmt.Fprintf(&w.b, ".SH %s\n", quote(strings.ToUpper(title)))
}

// Subsection starts a subsection (.SS).
func (w *Writer) Subsection(title string) {
	fmt.Fprintf(&w.b, ".SS %s\n", quote(title))
}

// Paragraph writes filled text; the line breaks in it do not matter.
func (w *Writer) Paragraph(text string) {
	w.paragraph(escape(text))
}

func (w *Writer) paragraph(escaped string) {
	if strings.TrimSpace(escaped) == "" {
		return
	}
	w.b.WriteString(".PP\n")
	w.b.WriteString(fill(escaped))
	w.b.WriteString("\n")
}

// Preformatted writes lines as they are, indented: usage lines, examples.
func (w *Writer) Preformatted(lines []string) {
	if len(lines) == 0 {
		return
	}
	w.b.WriteString(".PP\n.RS 4\n.nf\n")
	for _, l := range lines {
		w.b.WriteString(guard(escape(l)))
		w.b.WriteString("\n")
	}
	w.b.WriteString(".fi\n.RE\n")
}

// Text writes the free text of a command's help: paragraphs split at blank
// lines, each filled unless it is laid out by hand (a "usage:" paragraph, or
// one with indented lines), which is kept as it is.
func (w *Writer) Text(lines []string) {
	var para []string
	flush := func() {
		if len(para) == 0 {
			return
		}
		if laidOut(para) {
			w.Preformatted(para)
		} else {
			w.Paragraph(strings.Join(para, "\n"))
		}
		para = nil
	}
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		para = append(para, l)
	}
	flush()
}

func laidOut(para []string) bool {
	if strings.HasPrefix(strings.ToLower(para[0]), "usage:") {
		return true
	}
	for _, l := range para {
		if l != strings.TrimLeft(l, " \t") {
			return true
		}
	}
	return false
}

// Flags writes a flag listing, one tagged paragraph per flag:
// "-name arg" in bold and italics, then its description.
func (w *Writer) Flags(flags []Flag) {
	for _, f := range flags {
		w.b.WriteString(".TP\n")
		fmt.Fprintf(&w.b, "\\fB\\-%s\\fR", escape(f.Name))
		if f.Arg != "" {
			fmt.Fprintf(&w.b, " \\fI%s\\fR", escape(f.Arg))
		}
		w.b.WriteString("\n")
		w.b.WriteString(fill(escape(f.Usage)))
		w.b.WriteString("\n")
	}
}

// Tagged writes a tagged paragraph: the tag (a path, a variable) in bold,
// then the text, as FILES and ENVIRONMENT entries are laid out.
func (w *Writer) Tagged(tag, text string) {
	fmt.Fprintf(&w.b, ".TP\n\\fB%s\\fR\n%s\n", escape(tag), fill(escape(text)))
}

// Doc writes a Go doc comment's text (as go/ast.CommentGroup.Text returns
// it): paragraphs, code blocks, lists and headings.
func (w *Writer) Doc(text string) {
	var p comment.Parser
	w.blocks(p.Parse(text).Content)
}

func (w *Writer) blocks(blocks []comment.Block) {
	for _, b := range blocks {
		switch b := b.(type) {
		case *comment.Paragraph:
			w.paragraph(inline(b.Text))
		case *comment.Heading:
			w.Subsection(plainText(b.Text))
		case *comment.Code:
			w.Preformatted(strings.Split(strings.TrimRight(b.Text, "\n"), "\n"))
		case *comment.List:
			for i, item := range b.Items {
				mark := `\(bu`
				if item.Number != "" {
					mark = item.Number + "."
				}
				var text []string
				for _, c := range item.Content {
					if p, ok := c.(*comment.Paragraph); ok {
						text = append(text, inline(p.Text))
					}
				}
				if i == 0 || b.BlankBetween() {
					w.b.WriteString(".PP\n")
				}
				fmt.Fprintf(&w.b, ".IP %s 4\n%s\n", mark, fill(strings.Join(text, "\n")))
			}
		}
	}
}

// inline renders a paragraph's text, escaped, with italics kept and each
// link followed by its address.
func inline(texts []comment.Text) string {
	var b strings.Builder
	for _, t := range texts {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(escape(string(t)))
		case comment.Italic:
			b.WriteString(`\fI` + escape(string(t)) + `\fR`)
		case *comment.Link:
			label := inline(t.Text)
			b.WriteString(label)
			if t.URL != plainText(t.Text) && !t.Auto {
				b.WriteString(" <" + escape(t.URL) + ">")
			}
		case *comment.DocLink:
			b.WriteString(inline(t.Text))
		}
	}
	return b.String()
}

func plainText(texts []comment.Text) string {
	var b strings.Builder
	for _, t := range texts {
		switch t := t.(type) {
		case comment.Plain:
			b.WriteString(string(t))
		case comment.Italic:
			b.WriteString(string(t))
		case *comment.Link:
			b.WriteString(plainText(t.Text))
		case *comment.DocLink:
			b.WriteString(plainText(t.Text))
		}
	}
	return b.String()
}

// Bytes returns the page.
func (w *Writer) Bytes() []byte {
	return []byte(w.b.String())
}

// escapeText makes text safe as roff input: backslashes print as
// themselves and "-" is a minus sign, so that flags and paths copied from
// the page work.
var escapeText = strings.NewReplacer(`\`, `\e`, "-", `\-`)

func escape(s string) string {
	return escapeText.Replace(s)
}

// fill prepares escaped text for filling: lines are trimmed (a leading space
// would break the line) and guarded.
func fill(escaped string) string {
	lines := strings.Split(escaped, "\n")
	out := lines[:0]
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		out = append(out, guard(l))
	}
	return strings.Join(out, "\n")
}

// guard keeps a line that starts with a control character ("." or "'")
// from being read as a request.
func guard(line string) string {
	if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
		return `\&` + line
	}
	return line
}

// quote makes one macro argument of s.
func quote(s string) string {
	return `"` + strings.ReplaceAll(escape(s), `"`, `\(dq`) + `"`
}
