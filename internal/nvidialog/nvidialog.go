// Package nvidialog adapts log/slog to the logger interface of NVIDIA's
// container toolkit packages (pkg/nvcdi and the nvidia-cdi-hook commands).
package nvidialog

import (
	"context"
	"fmt"
	"log/slog"
)

// Logger has the methods the toolkit's logger interface asks for.
type Logger struct {
	log *slog.Logger
	// warn is the level of the toolkit's warnings: the CDI library warns
	// about every optional file it does not find (Vulkan, X11, firmware of
	// other driver versions), which is no news for a compute node.
	warn slog.Level
}

// New returns a Logger writing to log; the toolkit's warnings get level warn.
func New(log *slog.Logger, warn slog.Level) *Logger {
	return &Logger{log: log, warn: warn}
}

func (l *Logger) emit(level slog.Level, format string, args []any) {
	if l.log.Enabled(context.Background(), level) {
		l.log.Log(context.Background(), level, fmt.Sprintf(format, args...))
	}
}

// Tracef logs below debug.
func (l *Logger) Tracef(format string, args ...any) { l.emit(slog.LevelDebug-4, format, args) }

// Debugf logs at debug.
func (l *Logger) Debugf(format string, args ...any) { l.emit(slog.LevelDebug, format, args) }

// Infof logs at debug too: the library reports each file it selects.
func (l *Logger) Infof(format string, args ...any) { l.emit(slog.LevelDebug, format, args) }

// Warningf logs at the level New was given.
func (l *Logger) Warningf(format string, args ...any) { l.emit(l.warn, format, args) }

// Errorf logs at error.
func (l *Logger) Errorf(format string, args ...any) { l.emit(slog.LevelError, format, args) }
