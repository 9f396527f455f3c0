package hoststate

import "syscall"

// setUmask sets the process umask and returns the previous one, so that a
// test can check that modes do not depend on it.
func setUmask(mask int) int { return syscall.Umask(mask) }
