package config

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// ProtectConfig protects the upstream behind the handler with an adaptive
// concurrency limit, per instance: the requests in flight follow the
// upstream's latency and errors, and when the limit is reached the rest
// wait in per-tenant queues served fairly (weighted by tier), shed when
// waits keep growing. Rate-limit policies decide first: a request they
// deny never takes a slot.
type ProtectConfig struct {
	// The floor of the limit: it never shrinks below this many requests
	// in flight. Default 1.
	Min int `json:"min,omitempty"`

	// The ceiling of the limit: it never grows beyond this many requests
	// in flight. Default 1000.
	Max int `json:"max,omitempty"`

	// The limit's starting value, before the upstream's latency has been
	// measured. Default 20.
	Initial int `json:"initial,omitempty"`

	// How much slower than its recent best the upstream may answer before
	// the limit shrinks: 1.1 (10%) by default; 1 to 3.
	Tolerance float64 `json:"tolerance,omitempty"`

	// How much of the gradient's decrease each update takes when the
	// upstream answers slower than the tolerance: above 0, at most 1;
	// default 0.2 (an update every 100ms).
	Smoothing float64 `json:"smoothing,omitempty"`

	// The queue wait above which, once waits have stayed above it for an
	// interval, requests are shed (CoDel's target). Default 20ms.
	TargetWait caddy.Duration `json:"target_wait,omitempty"`

	// CoDel's interval. Default 100ms.
	Interval caddy.Duration `json:"interval,omitempty"`

	// The longest any request waits. Default 10 × target_wait + interval.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// The most requests one tenant may have waiting. Default 4 × max.
	QueueLimit int `json:"queue_limit,omitempty"`

	// A tier's share of the slots when tenants wait (the tier comes from
	// the handler's tier template or tenant_tiers); tiers not listed
	// weigh 1. E.g. {"enterprise": 4, "free": 1}.
	Weights map[string]int `json:"weights,omitempty"`

	// A placeholder whose value is the request's criticality: "critical"
	// requests go first and are shed last, "sheddable" ones the reverse;
	// anything else is normal.
	Priority string `json:"priority,omitempty"`

	// The status of a shed request: 503 (default) or 429.
	Status int `json:"status,omitempty"`

	// The Retry-After of a shed request. Default 1s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`
}

// protectForm is the Caddyfile form of protect.
const protectForm = "protect { min <n>; max <n>; initial <n>; tolerance <f>; smoothing <f>; target_wait <d>; interval <d>; max_wait <d>; queue_limit <n>; weight <tier> <n>; priority <placeholder>; status 503|429; retry_after <d> }"

// protectBlock lists the subdirectives of `protect { ... }`.
var protectBlock = block[*ProtectConfig]{
	{name: "min", usage: "min <n>", field: "min", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Min, err = p.intArg("an integer from 1 to 1000000")
		return err
	}},
	{name: "max", usage: "max <n>", field: "max", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Max, err = p.intArg("an integer from 1 to 1000000")
		return err
	}},
	{name: "initial", usage: "initial <n>", field: "initial", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Initial, err = p.intArg("an integer from 1 to 1000000")
		return err
	}},
	{name: "tolerance", usage: "tolerance <factor>", field: "tolerance", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Tolerance, err = p.floatArg()
		return err
	}},
	{name: "smoothing", usage: "smoothing <fraction>", field: "smoothing", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Smoothing, err = p.floatArg()
		return err
	}},
	{name: "target_wait", usage: "target_wait <duration>", field: "target_wait", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.TargetWait, err = p.durationArg()
		return err
	}},
	{name: "interval", usage: "interval <duration>", field: "interval", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Interval, err = p.durationArg()
		return err
	}},
	{name: "max_wait", usage: "max_wait <duration>", field: "max_wait", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.MaxWait, err = p.durationArg()
		return err
	}},
	{name: "queue_limit", usage: "queue_limit <n>", field: "queue_limit", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.QueueLimit, err = p.intArg("an integer from 1 to 100000000")
		return err
	}},
	{name: "weight", usage: "weight <tier> <n>", repeatable: true, parse: func(p cfParser, c *ProtectConfig) error {
		args, err := p.args(2, 2)
		if err != nil {
			return err
		}
		n, err := p.parseInt(args[1], "an integer from 1 to 1000")
		if err != nil {
			return err
		}
		if c.Weights == nil {
			c.Weights = map[string]int{}
		}
		if _, dup := c.Weights[args[0]]; dup {
			return p.dirErr("tier %q has a weight already", args[0])
		}
		c.Weights[args[0]] = int(n)
		p.record(sub(p.path, "weights", args[0]), p.label(p.dir))
		return nil
	}},
	{name: "priority", usage: "priority <placeholder>", field: "priority", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Priority, err = p.word()
		return err
	}},
	{name: "status", usage: "status 503|429", field: "status", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.Status, err = p.intArg("503 or 429")
		return err
	}},
	{name: "retry_after", usage: "retry_after <duration>", field: "retry_after", parse: func(p cfParser, c *ProtectConfig) (err error) {
		c.RetryAfter, err = p.durationArg()
		return err
	}},
}

// parseProtect reads `protect { ... }`.
func parseProtect(p cfParser, h *Handler) error {
	if _, err := p.lineArgs(0, 0); err != nil {
		return err
	}
	c := new(ProtectConfig)
	p.record([]string{"protect"}, p.label(p.dir))
	if err := parseBlock(p.nested("protect", []string{"protect"}), protectBlock, c); err != nil {
		return err
	}
	h.Protect = c
	return nil
}

// floatArg reads one number argument.
func (p cfParser) floatArg() (float64, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, p.dirErr("%q is not a number", s)
	}
	return f, nil
}

// checkProtect checks the protect block.
func checkProtect(c *ProtectConfig) error {
	if c == nil {
		return nil
	}
	path := []string{"protect"}
	for _, f := range []struct {
		field string
		v     int
	}{{"min", c.Min}, {"max", c.Max}, {"initial", c.Initial}} {
		if f.v < 0 || f.v > 1000000 {
			return at(sub(path, f.field), "%d: want 1 to 1000000 (0: the default)", f.v)
		}
	}
	if c.Min > 0 && c.Max > 0 && c.Min > c.Max {
		return at(sub(path, "min"), "%d is above max %d", c.Min, c.Max)
	}
	if c.Tolerance != 0 && (c.Tolerance < 1 || c.Tolerance > 3) {
		return at(sub(path, "tolerance"), "%v: want 1 to 3 (0: 1.1)", c.Tolerance)
	}
	if c.Smoothing < 0 || c.Smoothing > 1 {
		return at(sub(path, "smoothing"), "%v: want above 0, at most 1 (0: 0.2)", c.Smoothing)
	}
	for _, f := range []struct {
		field string
		v     caddy.Duration
	}{{"target_wait", c.TargetWait}, {"interval", c.Interval}, {"max_wait", c.MaxWait}, {"retry_after", c.RetryAfter}} {
		if d := time.Duration(f.v); d < 0 || d > time.Hour {
			return at(sub(path, f.field), "%s: want 1ms to 1h (0: the default)", d)
		}
	}
	if c.QueueLimit < 0 || c.QueueLimit > 100000000 {
		return at(sub(path, "queue_limit"), "%d: want 1 to 100000000 (0: 4 × max)", c.QueueLimit)
	}
	for _, tier := range sortedKeys(c.Weights) {
		if w := c.Weights[tier]; w < 1 || w > 1000 {
			return at(sub(path, "weights", tier), "%d: want 1 to 1000", w)
		}
	}
	if c.Status != 0 && c.Status != 503 && c.Status != 429 {
		return at(sub(path, "status"), "%d: want 503 or 429", c.Status)
	}
	return nil
}
