package configure

import (
	"io/fs"
	"syscall"
)

// fileOwner returns the uid and gid of a file, or -1, -1 when unknown.
func fileOwner(fi fs.FileInfo) (int, int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return -1, -1
}
