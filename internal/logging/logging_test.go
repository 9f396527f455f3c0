package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	tests := []struct {
		level, format string
		wantErr       string
	}{
		{"info", "text", ""},
		{"debug", "json", ""},
		{"WARN", "JSON", ""},
		{"loud", "text", `--log-level "loud"`},
		{"info", "xml", `--log-format "xml"`},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		l, err := New(&buf, tt.level, tt.format)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New(%q, %q) error = %v, want %q", tt.level, tt.format, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("New(%q, %q): %v", tt.level, tt.format, err)
		}
		l.Debug("d")
		l.Warn("w")
		out := buf.String()
		if got := strings.Contains(out, `"d"`) || strings.Contains(out, "msg=d"); got != (strings.ToLower(tt.level) == "debug") {
			t.Errorf("level %q: debug line logged = %v", tt.level, got)
		}
		if strings.EqualFold(tt.format, "json") {
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if !json.Valid([]byte(line)) {
					t.Errorf("format json: line %q is not JSON", line)
				}
			}
		}
	}
}

func TestContext(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil)).With("container", "c1")
	ctx := NewContext(t.Context(), l)
	if got := FromContext(ctx); got != l {
		t.Errorf("FromContext returned %p, want the logger put in, %p", got, l)
	}
	FromContext(ctx).Info("created")
	if !strings.Contains(buf.String(), "msg=created container=c1") {
		t.Errorf("log %q, want the request's attributes", buf.String())
	}
	if got := FromContext(t.Context()); got != slog.Default() {
		t.Errorf("FromContext of a context without a logger = %p, want slog.Default()", got)
	}
}
