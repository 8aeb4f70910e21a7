//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux has a parent-death signal. Servers are
// still killed by each test's cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
