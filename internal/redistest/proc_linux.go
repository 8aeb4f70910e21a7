//go:build linux

package redistest

import "syscall"

// sysProcAttr makes redis-server receive SIGKILL when the test binary dies,
// so even a killed or timed-out test run leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
