package deviceplugin

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startWatch watches dir, skipping the test where the platform has no
// directory events (the plugin polls there).
func startWatch(t *testing.T, dir string) *dirWatcher {
	t.Helper()
	w, err := watchDir(dir)
	if err != nil {
		t.Skipf("no directory events here: %v", err)
	}
	t.Cleanup(w.Close)
	return w
}

// nextEvent returns the watcher's next event, failing the test when none
// comes or the watch has ended.
func nextEvent(t *testing.T, w *dirWatcher) dirEvent {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(waitTimeout):
		t.Fatal("no event")
	}
	return dirEvent{}
}

func expectEvents(t *testing.T, w *dirWatcher, want ...dirEvent) {
	t.Helper()
	for _, ev := range want {
		if got := nextEvent(t, w); got != ev {
			t.Errorf("event %+v, want %+v", got, ev)
		}
	}
}

// expectEnded waits for the watcher's channel to close.
func expectEnded(t *testing.T, w *dirWatcher) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return
			}
			t.Logf("event %+v before the end", ev)
		case <-timeout:
			t.Fatal("the watch did not end")
		}
	}
}

// TestWatchDirKubeletSocket: kubelet restarting removes its socket and
// listens on a new one; each step is an event for kubelet.sock.
func TestWatchDirKubeletSocket(t *testing.T) {
	dir := shortDir(t)
	w := startWatch(t, dir)
	path := filepath.Join(dir, KubeletSocketName)
	for range 2 {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		expectEvents(t, w, dirEvent{KubeletSocketName, true})
		l.Close() // unlinks the socket
		expectEvents(t, w, dirEvent{KubeletSocketName, false})
	}
}

// TestWatchDirRenamesAndOtherChanges: a socket renamed into place is a
// creation and one renamed away a removal; a mode change or a write is
// not reported at all.
func TestWatchDirRenamesAndOtherChanges(t *testing.T) {
	dir, elsewhere := shortDir(t), shortDir(t)
	w := startWatch(t, dir)

	outside := filepath.Join(elsewhere, "staged")
	inside := filepath.Join(dir, KubeletSocketName)
	if err := os.WriteFile(outside, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(outside, inside); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, w, dirEvent{KubeletSocketName, true})

	if err := os.Chmod(inside, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inside, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The marker's creation comes right after the socket's: nothing was
	// reported in between.
	if err := os.WriteFile(filepath.Join(dir, "marker"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, w, dirEvent{"marker", true})

	if err := os.Rename(inside, outside); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, w, dirEvent{KubeletSocketName, false})
}

// TestWatchDirMovedAway: a watched directory that is renamed is no longer
// socket_dir; the watch ends so that the plugin polls the path instead.
func TestWatchDirMovedAway(t *testing.T) {
	dir := shortDir(t)
	w := startWatch(t, dir)
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir + ".old") })
	expectEnded(t, w)
}

// TestWatchDirSurvivesLostEvents: when more changes happen than the kernel
// queues, some events are lost (the periodic check covers them) but the
// watch goes on reporting later ones.
func TestWatchDirSurvivesLostEvents(t *testing.T) {
	limit, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skipf("no inotify queue limit to exceed: %v", err)
	}
	var n int
	if _, err := fmt.Sscan(string(limit), &n); err != nil || n > 1<<16 {
		t.Skipf("inotify queue limit %q is too large to exceed here", limit)
	}
	dir := shortDir(t)
	w := startWatch(t, dir)
	// Nothing takes the events while the files are made, so once the
	// watcher's own buffers are full (fsnotify reads up to 64 KiB of events,
	// about 2000 short names, then waits on its channel) the kernel's queue
	// overflows. Making only a few more files than the queue holds left it
	// to the scheduler whether the buffers took up the excess.
	extra := 5000
	for i := range n + extra {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever came after the overflow was dropped too, so keep making
	// files until one is reported: that needs the watch to go on once the
	// queued events are read.
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("after-", i)), nil, 0o600); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); <-writerDone }()
	seen := 0
	for {
		ev := nextEvent(t, w)
		if strings.HasPrefix(ev.name, "after-") {
			break
		}
		seen++
	}
	if seen >= n+extra {
		t.Fatalf("all %d events arrived; the queue never overflowed, so this tests nothing", seen)
	}
}
