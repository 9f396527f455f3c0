//go:build !linux

package deviceplugin

import "errors"

type dirEvent struct {
	name    string
	created bool
}

type dirWatcher struct{}

// watchDir is only implemented with inotify; elsewhere the plugin polls.
func watchDir(string) (*dirWatcher, error) {
	return nil, errors.New("directory events need inotify (Linux)")
}

func (*dirWatcher) Events() <-chan dirEvent { return nil }
func (*dirWatcher) Close()                  {}
