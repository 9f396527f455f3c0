package configure

import udiff "github.com/aymanbagabas/go-udiff"

// unifiedDiff returns the changes from oldText to newText in the unified
// format of diff -u (three lines of context), with oldName and newName in the
// --- and +++ headers, and "\ No newline at end of file" where a text lacks
// its final newline, so that patch(1) applies it. It returns "" when the
// texts are equal.
func unifiedDiff(oldName, newName, oldText, newText string) string {
	return udiff.Unified(oldName, newName, oldText, newText)
}
