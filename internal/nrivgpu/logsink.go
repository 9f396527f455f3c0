package nrivgpu

import (
	"io"
	"log/syslog"
	"os"
)

// pluginLogSink picks where the plugin logs. containerd starts the plugins
// of its plugin directory with stdout and stderr on /dev/null, so a plugin
// started that way that wrote to stderr would log nothing at all; it logs to
// syslog instead (journald reads /dev/log), and to stderr only when syslog
// is not there either.
func pluginLogSink(stderr io.Writer, startedByRuntime bool) io.Writer {
	if !startedByRuntime || stderr != os.Stderr || !discarded(os.Stderr) {
		return stderr
	}
	w, err := syslog.New(syslog.LOG_DAEMON|syslog.LOG_INFO, name)
	if err != nil {
		return stderr
	}
	return w
}

// discarded reports whether f is /dev/null.
func discarded(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	null, err := os.Stat(os.DevNull)
	if err != nil {
		return false
	}
	return os.SameFile(fi, null)
}
