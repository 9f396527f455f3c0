package nrivgpu

import (
	"bytes"
	"os"
	"testing"
)

func TestDiscarded(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if !discarded(null) {
		t.Errorf("discarded(%s) = false, want true", os.DevNull)
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if discarded(f) {
		t.Errorf("discarded(regular file) = true, want false")
	}
}

func TestPluginLogSinkKeepsAUsefulStderr(t *testing.T) {
	var buf bytes.Buffer
	for _, byRuntime := range []bool{false, true} {
		if got := pluginLogSink(&buf, byRuntime); got != &buf {
			t.Errorf("pluginLogSink(buffer, %v) replaced the writer", byRuntime)
		}
	}
	if got := pluginLogSink(os.Stderr, false); got != os.Stderr {
		t.Errorf("pluginLogSink(os.Stderr, false) replaced stderr")
	}
}
