package configure

import (
	"fmt"
	"strings"
)

// contextLines is how many unchanged lines surround each hunk, as in diff -u.
const contextLines = 3

// unifiedDiff returns the changes from oldText to newText in the unified
// format of diff -u, with oldName and newName in the --- and +++ headers. It
// returns "" when the texts are equal. Configuration files are small (a few
// hundred lines), so a quadratic longest-common-subsequence is fast enough and
// gives the minimal diff.
func unifiedDiff(oldName, newName, oldText, newText string) string {
	if oldText == newText {
		return ""
	}
	a, b := splitLines(oldText), splitLines(newText)
	ops := diffOps(a, b)

	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", oldName, newName)

	// Group the edit script into hunks: runs of changes with at most
	// 2*contextLines equal lines between them.
	for i := 0; i < len(ops); {
		if ops[i].kind == opEqual {
			i++
			continue
		}
		start := max(i-contextLines, 0)
		end := i
		for end < len(ops) {
			if ops[end].kind != opEqual {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == opEqual {
				run++
			}
			if run == len(ops) || run-end > 2*contextLines {
				end = min(end+contextLines, len(ops))
				break
			}
			end = run
		}
		writeHunk(&out, ops[start:end])
		i = end
	}
	return out.String()
}

type opKind byte

const (
	opEqual  opKind = ' '
	opDelete opKind = '-'
	opInsert opKind = '+'
)

type diffOp struct {
	kind opKind
	line string // with its trailing newline, if it had one
	aIdx int    // 0-based line number in a (for equal and delete)
	bIdx int    // 0-based line number in b (for equal and insert)
}

func writeHunk(out *strings.Builder, ops []diffOp) {
	aStart, bStart, aLen, bLen := -1, -1, 0, 0
	for _, op := range ops {
		if op.kind != opInsert {
			if aStart < 0 {
				aStart = op.aIdx
			}
			aLen++
		}
		if op.kind != opDelete {
			if bStart < 0 {
				bStart = op.bIdx
			}
			bLen++
		}
	}
	// diff -u numbers lines from 1; an empty range names the line before it.
	fmt.Fprintf(out, "@@ -%s +%s @@\n", hunkRange(aStart, aLen, ops, true), hunkRange(bStart, bLen, ops, false))
	for _, op := range ops {
		out.WriteByte(byte(op.kind))
		out.WriteString(op.line)
		if !strings.HasSuffix(op.line, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

func hunkRange(start, n int, ops []diffOp, old bool) string {
	if n == 0 {
		// The range is empty: name the line after which the change goes,
		// found from the first op's position on that side.
		first := ops[0]
		pos := first.bIdx
		if old {
			pos = first.aIdx
		}
		return fmt.Sprintf("%d,0", pos)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

// splitLines splits s after each newline; a last line without one is kept.
func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// diffOps computes a minimal edit script from a to b. Every op records its
// position on both sides so that hunks can be numbered, including the
// position an insertion or deletion has on the other side.
func diffOps(a, b []string) []diffOp {
	n, m := len(a), len(b)
	// lcs[i][j] = length of the longest common subsequence of a[i:] and b[j:].
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	ops := make([]diffOp, 0, n+m)
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			ops = append(ops, diffOp{kind: opEqual, line: a[i], aIdx: i, bIdx: j})
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, diffOp{kind: opDelete, line: a[i], aIdx: i, bIdx: j})
			i++
		default:
			ops = append(ops, diffOp{kind: opInsert, line: b[j], aIdx: i, bIdx: j})
			j++
		}
	}
	return ops
}
