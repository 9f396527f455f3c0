package deviceplugin

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// dirEvent is a file created in, or removed from, the watched directory.
type dirEvent struct {
	name    string
	created bool
}

// dirWatcher reports changes of one directory's entries. Its channel closes
// when the directory itself goes away, when the watch fails, or on Close;
// the plugin then relies on its once-a-second check alone.
type dirWatcher struct {
	fw     *fsnotify.Watcher // nil when a test feeds events itself
	events chan dirEvent
	done   chan struct{}
}

// watchDir watches dir with fsnotify: inotify on Linux, and the native
// mechanism where fsnotify has one; elsewhere it fails and the plugin polls.
func watchDir(dir string) (*dirWatcher, error) {
	dir = filepath.Clean(dir)
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	if err := fw.Add(dir); err != nil {
		_ = fw.Close()
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	w := &dirWatcher{
		fw:     fw,
		events: make(chan dirEvent, 16),
		done:   make(chan struct{}),
	}
	go w.forward(dir)
	return w, nil
}

func (w *dirWatcher) Events() <-chan dirEvent { return w.events }

func (w *dirWatcher) Close() {
	close(w.done)
	if w.fw != nil {
		_ = w.fw.Close()
	}
}

// forward turns fsnotify's events for the entries of dir into dirEvents
// and ends the watch when dir itself is removed or renamed: fsnotify drops
// a watch whose directory has gone, so no further event would come.
func (w *dirWatcher) forward(dir string) {
	defer close(w.events)
	for {
		select {
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if ev.Name == dir {
				if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
					return
				}
				continue
			}
			// A socket appears with Create (or a rename into place) and
			// goes with Remove (or a rename away); writes and mode changes
			// say nothing about which kubelet is there.
			if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
				continue
			}
			de := dirEvent{name: filepath.Base(ev.Name), created: ev.Has(fsnotify.Create)}
			select {
			case w.events <- de:
			case <-w.done:
				return
			}
		case err, ok := <-w.fw.Errors:
			// Lost events (a full kernel queue) cost at most the second
			// until the periodic check, so the watch goes on. Any other
			// error leaves the watch in an unknown state: end it, which
			// the plugin logs and answers by polling.
			if !ok || !errors.Is(err, fsnotify.ErrEventOverflow) {
				return
			}
		case <-w.done:
			return
		}
	}
}
