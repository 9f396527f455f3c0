//go:build linux

package deviceplugin

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dirEvent is a file created in, or removed from, the watched directory.
type dirEvent struct {
	name    string
	created bool
}

// dirWatcher reports changes of one directory's entries through inotify.
// Its channel closes when the directory itself goes away or on Close.
type dirWatcher struct {
	f      *os.File
	events chan dirEvent
	done   chan struct{}
}

func watchDir(dir string) (*dirWatcher, error) {
	// Non-blocking, so that os.File puts it in the runtime poller and Close
	// wakes a pending Read.
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	const mask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM |
		unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("inotify_add_watch %s: %w", dir, err)
	}
	w := &dirWatcher{
		f:      os.NewFile(uintptr(fd), "inotify:"+dir),
		events: make(chan dirEvent, 16),
		done:   make(chan struct{}),
	}
	go w.read()
	return w, nil
}

func (w *dirWatcher) Events() <-chan dirEvent { return w.events }

func (w *dirWatcher) Close() {
	close(w.done)
	_ = w.f.Close()
}

func (w *dirWatcher) read() {
	defer close(w.events)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, then len bytes
			// of NUL-padded name.
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			off = start + nameLen
			if off > n {
				return
			}
			if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
				return // the directory is gone; the caller falls back to polling
			}
			ev := dirEvent{
				name:    string(bytes.TrimRight(buf[start:off], "\x00")),
				created: mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0,
			}
			select {
			case w.events <- ev:
			case <-w.done:
				return
			}
		}
	}
}
