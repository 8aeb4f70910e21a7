//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// Signals used by Pause and Resume.
var sigStop, sigCont os.Signal = syscall.SIGSTOP, syscall.SIGCONT
