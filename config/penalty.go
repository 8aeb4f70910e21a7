package config

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// PenaltyConfig is a policy's penalty box: a bucket (a tenant, with its
// partition key) that the policy denied After times within one window
// of its limit is refused for Duration, by every instance, without a
// store call per request. Counting starts at the bucket's first denial
// and lasts one window (the limit's window, or calendar period); a box
// lifts on its own after Duration, or through the admin API.
type PenaltyConfig struct {
	// How long a boxed bucket is refused (1ms to 366d). Its 429s say
	// when it ends (Retry-After).
	Duration caddy.Duration `json:"duration"`

	// Denials within one window that box the bucket. Default 1: the first
	// denial boxes it.
	After int64 `json:"after,omitempty"`
}

// penaltyForm is the Caddyfile form of a penalty.
const penaltyForm = "penalty <duration> [after <n>]"

// penalty reads `penalty <duration> [after <n>]`.
func (p cfParser) penalty() (*PenaltyConfig, error) {
	path := sub(p.path, "penalty")
	p.record(path, p.label(p.dir))
	p.record(sub(path, "duration"), p.label(p.dir))
	p.record(sub(path, "after"), p.label(p.dir+": after"))
	args, err := p.args(1, 3)
	if err != nil {
		return nil, err
	}
	pc := new(PenaltyConfig)
	if pc.Duration, err = p.parseDuration(args[0]); err != nil {
		return nil, err
	}
	switch {
	case len(args) == 1:
	case len(args) == 3 && args[1] == "after":
		if pc.After, err = p.parseInt(args[2], countRange(1)+" denials"); err != nil {
			return nil, err
		}
		if pc.After < 1 {
			return nil, p.dirErr("after %d: want %s denials", pc.After, countRange(1))
		}
	default:
		return nil, p.dirErr("unexpected %q; usage: %s", args[1], penaltyForm)
	}
	return pc, nil
}

// checkPenalty checks the penalty at path of a policy of algorithm alg.
func checkPenalty(path []string, pc *PenaltyConfig, alg limiter.Algorithm) error {
	if pc == nil {
		return nil
	}
	if alg == limiter.Concurrency {
		return at(path, "not for concurrency, which has no window to count denials in (allowed with: token_bucket, gcra, sliding_window, fixed_window, sliding_log)")
	}
	if d := time.Duration(pc.Duration); d < time.Millisecond || d > limiter.MaxPenalty {
		return at(sub(path, "duration"), "%s: want 1ms to 366d", d)
	}
	if pc.After < 0 || pc.After > limiter.MaxCount {
		return at(sub(path, "after"), "%d: want %s denials (0: the default, 1)", pc.After, countRange(1))
	}
	return nil
}

// penalty is pc as the engine's Penalty (the zero Penalty for none).
func (pc *PenaltyConfig) penalty() limiter.Penalty {
	if pc == nil {
		return limiter.Penalty{}
	}
	return limiter.Penalty{Duration: time.Duration(pc.Duration), After: max(pc.After, 1)}
}
