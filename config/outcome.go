package config

import (
	"strconv"
	"strings"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// statusForm describes an allowed status for error messages.
const statusForm = "a status code (100-599, e.g. 401) or a class (1xx-5xx, e.g. 5xx)"

// Outcome says which responses keep a request's units: compiled from a
// policy's count_status or refund_status.
type Outcome struct {
	// Count is true for count_status (keep the units only when the status
	// matches), false for refund_status (give them back when it matches).
	Count bool
	// codes has bit s-100 set for each status s that matches.
	codes [8]uint64
}

// GivesBack reports whether a response of status gives the request's
// units back.
func (o *Outcome) GivesBack(status int) bool {
	return o.matches(status) != o.Count
}

func (o *Outcome) matches(status int) bool {
	i := status - 100
	return i >= 0 && i < 500 && o.codes[i/64]&(1<<(i%64)) != 0
}

// add sets the codes of one entry: a code or a class.
func (o *Outcome) add(s string) bool {
	if len(s) != 3 || s[0] < '1' || s[0] > '5' {
		return false
	}
	if rest := strings.ToLower(s[1:]); rest == "xx" {
		base := int(s[0]-'0') * 100
		for c := base; c < base+100; c++ {
			o.set(c)
		}
		return true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 100 || n > 599 {
		return false
	}
	o.set(n)
	return true
}

func (o *Outcome) set(status int) {
	i := status - 100
	o.codes[i/64] |= 1 << (i % 64)
}

// compileOutcome returns the compiled count_status or refund_status of
// the policy (nil when it has neither), checking them: path is the
// policy's JSON path, for errors.
func (pc *PolicyConfig) compileOutcome(path []string, alg limiter.Algorithm) (*Outcome, error) {
	field, list, count := "", pc.CountStatus, true
	switch {
	case len(pc.CountStatus) > 0 && len(pc.RefundStatus) > 0:
		return nil, at(sub(path, "refund_status"), "not with count_status: a policy either counts only some statuses or refunds some; use one")
	case len(pc.CountStatus) > 0:
		field = "count_status"
	case len(pc.RefundStatus) > 0:
		field, list, count = "refund_status", pc.RefundStatus, false
	default:
		return nil, nil
	}
	if alg == limiter.Concurrency {
		return nil, at(sub(path, field), "not for concurrency, whose slots go back when the response ends anyway")
	}
	o := &Outcome{Count: count}
	for i, s := range list {
		if !o.add(s) {
			return nil, at(sub(path, field, strconv.Itoa(i)), "%q is not %s", s, statusForm)
		}
	}
	return o, nil
}

// Outcome returns the compiled outcome of a validated policy (nil when it
// has no count_status or refund_status).
func (pc *PolicyConfig) Outcome(name string, alg limiter.Algorithm) (*Outcome, error) {
	return pc.compileOutcome([]string{"rate_limits", name}, alg)
}

// statuses reads the codes and classes of count_status or refund_status,
// each checked where it is written.
func (p cfParser) statuses() ([]string, error) {
	args, err := p.args(1, -1)
	if err != nil {
		return nil, err
	}
	var o Outcome
	for _, s := range args {
		if !o.add(s) {
			return nil, p.dirErr("%q is not %s", s, statusForm)
		}
	}
	return args, nil
}
