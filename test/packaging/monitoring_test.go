package packaging

import (
	"os/exec"
	"strings"
	"sync"
	"testing"
)

const rulesPath = "../../packaging/helm/nri-vgpu/rules/nri-vgpu.rules.yaml"

var promtoolOnce struct {
	sync.Once
	path string
	err  error
}

// promtool returns the path of the pinned promtool (hack/prometheus.sh
// unpacks Debian's on first use). The tests that need it skip only where
// that script fails, which it says why.
func promtool(t *testing.T) string {
	t.Helper()
	promtoolOnce.Do(func() {
		out, err := exec.Command("../../hack/prometheus.sh", "promtool").Output()
		if ee, ok := err.(*exec.ExitError); ok {
			err = &scriptError{err: ee, stderr: string(ee.Stderr)}
		}
		promtoolOnce.path, promtoolOnce.err = strings.TrimSpace(string(out)), err
	})
	if promtoolOnce.err != nil {
		t.Skipf("no promtool: hack/prometheus.sh promtool: %v", promtoolOnce.err)
	}
	return promtoolOnce.path
}

type scriptError struct {
	err    error
	stderr string
}

func (e *scriptError) Error() string { return e.err.Error() + ": " + strings.TrimSpace(e.stderr) }

// runPromtool runs promtool with args in dir and fails the test, with its
// output, when it fails.
func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// The chart's alerting rules are valid, and each alert fires on the series
// in rules_test.yaml that should make it fire, and on no other.
func TestAlertRules(t *testing.T) {
	runPromtool(t, ".", "check", "rules", rulesPath)
	runPromtool(t, ".", "test", "rules", "rules_test.yaml")
}
