package ociruntime

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
)

// openRuntimeLog returns a logger that writes to the runtime log named by
// --log, in its --log-format, beside what the next runtime writes there.
//
// This file is how a runtime's errors reach `docker run`: containerd's runc
// shim reads the last "error" entry of the JSON log after a failed create
// and puts it in the error it returns ("OCI runtime create failed: …").
// Entries therefore follow runc's (logrus) shape: one JSON object per line
// with lower-case "level", "msg" and "time", or logrus' text format. The
// process's stderr is no place for messages on success: during create it
// is the container's own stderr stream.
//
// Without --log, or when the file cannot be opened, the logger discards.
func openRuntimeLog(a *Args) (*slog.Logger, io.Closer) {
	if a.Log == "" {
		return slog.New(slog.DiscardHandler), io.NopCloser(nil)
	}
	// runc opens its log the same way; O_APPEND keeps entries of the two
	// processes whole.
	f, err := os.OpenFile(a.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return slog.New(slog.DiscardHandler), io.NopCloser(nil)
	}
	level := slog.LevelInfo
	if a.Debug {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: logrusAttrs}
	var h slog.Handler
	if a.LogFormat == "json" {
		h = slog.NewJSONHandler(f, opts)
	} else {
		h = slog.NewTextHandler(f, opts)
	}
	return slog.New(prefixHandler{h}), f
}

// logrusAttrs writes levels as logrus does ("error", "warning", "info",
// "debug"): containerd matches level == "error".
func logrusAttrs(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.LevelKey {
		lvl, _ := a.Value.Any().(slog.Level)
		name := strings.ToLower(lvl.String())
		if lvl == slog.LevelWarn {
			name = "warning"
		}
		return slog.String(slog.LevelKey, name)
	}
	return a
}

// prefixHandler starts every message with the program's name, so that its
// entries stand out among the next runtime's in the shared log and in the
// error Docker shows.
type prefixHandler struct{ slog.Handler }

func (p prefixHandler) Handle(ctx context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, Name+": ") {
		r.Message = Name + ": " + r.Message
	}
	return p.Handler.Handle(ctx, r)
}

func (p prefixHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return prefixHandler{p.Handler.WithAttrs(attrs)}
}

func (p prefixHandler) WithGroup(name string) slog.Handler {
	return prefixHandler{p.Handler.WithGroup(name)}
}
