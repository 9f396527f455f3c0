// Package logging builds the slog loggers of the nri-vgpu daemons from their
// --log-level and --log-format flags, and carries a request's logger in its
// context, as klog.NewContext and klog.FromContext do for Kubernetes
// components: a handler puts the logger with the request's attributes (the
// container, the claim) into the context, and what it calls takes it from
// there.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a logger writing to w at level (debug, info, warn or error)
// in format (text or json). The errors name the flag that was wrong.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

type contextKey struct{}

// NewContext returns a copy of ctx that carries l.
func NewContext(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, contextKey{}, l)
}

// FromContext returns the logger ctx carries, else slog's default.
func FromContext(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(contextKey{}).(*slog.Logger); ok && l != nil {
		return l
	}
	return slog.Default()
}
