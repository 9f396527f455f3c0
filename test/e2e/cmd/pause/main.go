// Command pause is the sandbox ("infra") container of the end-to-end tests'
// pods: it holds the pod's namespaces open and does nothing else. It sleeps
// until SIGTERM or SIGINT and, as a PID 1 must, reaps children that are
// re-parented to it. Build it statically (CGO_ENABLED=0): the pause image
// holds this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
