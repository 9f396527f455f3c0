// Package manpage writes manual pages in the man(7) roff format from what a
// command already says about itself: its Go doc comment and the flag listing
// that its -h prints (the flag package's PrintDefaults format).
package manpage

import (
	"fmt"
	"regexp"
	"strings"
)

// Flag is one entry of a flag listing.
type Flag struct {
	Name  string // without the leading "-"
	Arg   string // the argument's placeholder ("file"), empty for a boolean
	Usage string // the description, its lines joined by spaces
}

// Help is a command's -h output split into the text before the flag listing
// and the listing itself.
type Help struct {
	// Text is every line before the first flag, less the flag package's
	// "Usage of NAME:" line and blank lines at either end.
	Text  []string
	Flags []Flag
}

// pflagLine is a flag of spf13/pflag's listing: shorthand, name, argument
// type, description.
var pflagLine = regexp.MustCompile(`^  (?:-([A-Za-z0-9]), |    )--([A-Za-z0-9][A-Za-z0-9-]*)(?: ([a-zA-Z]+))?  +(\S.*)$`)

// flagIndent starts the lines that continue a flag's description.
const flagIndent = "    \t"

// ParseHelp splits the output of a command's -h. It refuses text after the
// flag listing and a flag listed twice: either means the output is not the
// single PrintDefaults listing a page can be made from.
func ParseHelp(out string) (Help, error) {
	var h Help
	seen := map[string]bool{}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i, line := range lines {
		if m := pflagLine.FindStringSubmatch(line); m != nil {
			// spf13/pflag's listing (kubectl's flags): "  -o, --output
			// string   description" on one line; the name keeps its second
			// dash and its shorthand, as the command spells them.
			name := "-" + m[2]
			if m[1] != "" {
				name = m[1] + ", -" + name
			}
			if seen[name] {
				return Help{}, fmt.Errorf("help line %d: flag -%s is listed twice", i+1, name)
			}
			seen[name] = true
			h.Flags = append(h.Flags, Flag{Name: name, Arg: m[3], Usage: strings.TrimSpace(m[4])})
			continue
		}
		switch {
		case strings.HasPrefix(line, "  -"):
			// "  -name arg" with the description on the next lines, or
			// "  -x\tdescription" for a one-letter flag without argument.
			spec, usage, _ := strings.Cut(line[len("  -"):], "\t")
			name, arg, _ := strings.Cut(strings.TrimRight(spec, " "), " ")
			if name == "" {
				return Help{}, fmt.Errorf("help line %d %q: a flag without a name", i+1, line)
			}
			if seen[name] {
				return Help{}, fmt.Errorf("help line %d: flag -%s is listed twice", i+1, name)
			}
			seen[name] = true
			h.Flags = append(h.Flags, Flag{Name: name, Arg: strings.TrimSpace(arg), Usage: strings.TrimSpace(usage)})
		case strings.HasPrefix(line, flagIndent) && len(h.Flags) > 0:
			f := &h.Flags[len(h.Flags)-1]
			f.Usage = strings.TrimSpace(f.Usage + " " + strings.TrimSpace(line))
		case len(h.Flags) > 0:
			return Help{}, fmt.Errorf("help line %d %q: text after the flag listing", i+1, line)
		case strings.HasPrefix(line, "Usage of ") && strings.HasSuffix(line, ":"):
			// The flag package's heading: the page has its own.
		default:
			h.Text = append(h.Text, line)
		}
	}
	h.Text = trimBlank(h.Text)
	return h, nil
}

// Usage returns the lines of a "usage: ..." paragraph that opens the text,
// without the "usage: " prefix and with the continuation lines moved left by
// as much; nil when the text does not open with one.
func (h Help) Usage() []string {
	const prefix = "usage: "
	if len(h.Text) == 0 || !strings.HasPrefix(strings.ToLower(h.Text[0]), prefix) {
		return nil
	}
	out := []string{h.Text[0][len(prefix):]}
	for _, l := range h.Text[1:] {
		if strings.TrimSpace(l) == "" {
			break
		}
		out = append(out, strings.TrimPrefix(l, strings.Repeat(" ", len(prefix))))
	}
	return out
}

func trimBlank(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}
