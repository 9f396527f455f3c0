// Package promtooltest runs `promtool check metrics` (the pinned promtool of
// hack/prometheus.sh) over a scrape in tests.
package promtooltest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Promtool is the path of the pinned promtool: $PROMTOOL (which `make
// test-go` sets from hack/prometheus.sh), else what hack/prometheus.sh
// provides. The test is skipped only when that script cannot provide one
// (no apt source serving it), with the script's own words; a promtool that
// is there but does not run fails the caller's check.
func Promtool(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PROMTOOL"); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory: cannot find hack/prometheus.sh")
		}
		dir = parent
	}
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(dir, "hack", "prometheus.sh"), "promtool")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("hack/prometheus.sh provides no promtool: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// CheckMetrics fails t with promtool's findings when scrape (the
// Prometheus text format) does not pass `promtool check metrics`.
func CheckMetrics(t testing.TB, scrape []byte) {
	t.Helper()
	cmd := exec.Command(Promtool(t), "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrape)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
