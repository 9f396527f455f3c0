package config

import (
	"errors"
	"strconv"
	"strings"
)

// ErrUnknownKey is wrapped by the Error for a key that nri-vgpu does not
// know. A misspelt key is an error rather than a warning, because silently
// running with the default of what the operator meant to set is worse.
var ErrUnknownKey = errors.New("unknown key")

// Error is one problem in a configuration, located as precisely as the file
// allows. Parse and Validate return every problem they find, joined with
// errors.Join; use errors.As to reach them one by one.
type Error struct {
	File string // the file name given to Parse; "" for a Config built in code
	Line int    // 1-based; 0 when not known
	Col  int    // 1-based; set for syntax errors only
	Key  string // dotted key such as "gpu.simulated[1].uuid"; "" when Err names it
	Err  error
}

// Error formats the problem as "file:line: key: what is wrong", the form
// compilers use, so that editors can jump to it.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
	} else {
		b.WriteString("config")
	}
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
		if e.Col > 0 {
			b.WriteString(":" + strconv.Itoa(e.Col))
		}
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the underlying problem.
func (e *Error) Unwrap() error { return e.Err }

// causeError shows a cleaned-up message while keeping the library's error in
// the chain for errors.As.
type causeError struct {
	msg   string
	cause error
}

func (e *causeError) Error() string { return e.msg }
func (e *causeError) Unwrap() error { return e.cause }
