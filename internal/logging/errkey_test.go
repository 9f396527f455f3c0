package logging

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// ErrKey is the key every log record of the tree gives an error: the key
// klog's ErrorS writes, and with it the Kubernetes components and NVIDIA's
// device plugin and DRA driver that the daemons run beside, so that one
// query finds the errors of a node.
const ErrKey = "err"

// logCalls are the slog functions and methods whose arguments hold
// key-value pairs.
var logCalls = map[string]bool{
	"Debug": true, "Info": true, "Warn": true, "Error": true, "Log": true,
	"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true,
	"With": true, "Any": true, "String": true, "Group": true,
}

// TestOneErrorKey fails on a log call anywhere in the module that gives an
// error the key "error" instead of ErrKey.
func TestOneErrorKey(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name[0] == '.' || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" {
			return nil
		}
		files++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !logCalls[sel.Sel.Name] {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && (id.Name == "t" || id.Name == "b") {
				return true // testing.T and B: t.Error is no log record
			}
			for _, arg := range call.Args {
				lit, ok := arg.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				if s, _ := strconv.Unquote(lit.Value); s == "error" {
					t.Errorf("%s: log key %q; the tree's key for an error is %q", fset.Position(lit.Pos()), s, ErrKey)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files under %s; the module has hundreds", files, root)
	}
}
