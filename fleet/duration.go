package fleet

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// days matches a number of days in a duration string, e.g. the "1d" of
// "1d12h".
var days = regexp.MustCompile(`(\d+(?:\.\d+)?)d`)

// parseDuration parses a duration the way Caddy's configuration does: Go's
// time.ParseDuration plus a "d" unit of 24 hours ("1d", "1.5d", "2d12h").
func parseDuration(s string) (time.Duration, error) {
	if len(s) > 1024 {
		return 0, fmt.Errorf("duration too long (%d bytes)", len(s))
	}
	var err error
	expanded := days.ReplaceAllStringFunc(s, func(m string) string {
		n, perr := strconv.ParseFloat(m[:len(m)-1], 64)
		if perr != nil {
			err = perr
			return m
		}
		return strconv.FormatFloat(n*24, 'f', -1, 64) + "h"
	})
	if err != nil {
		return 0, err
	}
	return time.ParseDuration(expanded)
}
