package gate

import "strconv"

// maxLoggedValue bounds tenant and key values in log lines and event
// data, so a hostile header cannot blow up the logs.
const maxLoggedValue = 128

// Loggable bounds a client-controlled value for logs: at most
// maxLoggedValue bytes, with the original length noted when cut. The JSON
// and console encoders escape control bytes themselves.
func Loggable(s string) string {
	if len(s) <= maxLoggedValue {
		return s
	}
	return s[:maxLoggedValue] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}
