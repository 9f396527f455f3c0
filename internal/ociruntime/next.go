package ociruntime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// FindNext returns the runtime to exec after the wrapper: the first of
// names ([runtime] next) that exists, as an absolute path. A name with a
// slash is a path; a bare name is looked up in each directory of path (the
// PATH variable) in turn. Candidates that are the wrapper itself (self, an
// absolute path; symlinks resolved on both sides) are skipped, so that a
// runtime entry naming the wrapper, or the wrapper installed under a next
// runtime's name, cannot exec itself forever.
func FindNext(names []string, path, self string) (string, error) {
	selfReal := resolve(self)
	var tried []string
	for _, name := range names {
		var candidates []string
		if strings.Contains(name, "/") {
			candidates = []string{name}
		} else {
			for _, dir := range filepath.SplitList(path) {
				// Relative PATH entries depend on the working directory,
				// which the caller chose for the container, not for us.
				if filepath.IsAbs(dir) {
					candidates = append(candidates, filepath.Join(dir, name))
				}
			}
		}
		for _, c := range candidates {
			if !isExecutable(c) {
				continue
			}
			if selfReal != "" && resolve(c) == selfReal {
				continue
			}
			abs, err := filepath.Abs(c)
			if err != nil {
				return "", fmt.Errorf("next runtime %s: %w", c, err)
			}
			return abs, nil
		}
		tried = append(tried, name)
	}
	if len(names) == 0 {
		return "", errors.New("no next runtime configured ([runtime] next is empty)")
	}
	return "", fmt.Errorf("no next runtime found: none of %s is installed (on PATH %q), other than this wrapper; set [runtime] next",
		strings.Join(tried, ", "), path)
}

// resolve returns p with symlinks resolved, or "" when it cannot.
func resolve(p string) string {
	if p == "" {
		return ""
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	abs, err := filepath.Abs(r)
	if err != nil {
		return ""
	}
	return abs
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
