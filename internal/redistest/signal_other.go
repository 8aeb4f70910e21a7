//go:build !unix

package redistest

import "os"

// Pause and Resume do nothing where there is no SIGSTOP/SIGCONT.
var sigStop, sigCont os.Signal
