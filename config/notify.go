package config

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// NotifyConfig sends webhooks: a signed POST per event to URL. At
// handler level it covers every policy; a policy's own notify replaces it
// for that policy. Each near_limit threshold, exceeded and penalty event
// is sent once per tenant, policy and period, fleet-wide with Redis.
type NotifyConfig struct {
	// The receiver: an http or https URL. A URL that resolves to a
	// private, loopback or link-local address is refused unless
	// allow_private.
	URL string `json:"url"`

	// The key of the HMAC-SHA256 signature in the Tollgate-Signature
	// header (required). Use a placeholder such as
	// {env.TOLLGATE_WEBHOOK_SECRET}, resolved when the config loads.
	Secret string `json:"secret"`

	// The events sent: near_limit, exceeded, penalty, fail_mode, override.
	// Default: all of them.
	Events []string `json:"events,omitempty"`

	// The fractions of the limit used at which near_limit fires (above 0,
	// at most 1), e.g. [0.8, 0.95]. Default: the policy's near_limit.
	NearLimit []float64 `json:"near_limit,omitempty"`

	// Permit a URL on a private network (a receiver inside the cluster).
	AllowPrivate bool `json:"allow_private,omitempty"`

	// Permit a tenant's own URL (a runtime override's notify_url) on a
	// private network too. Off by default, whatever allow_private says: a
	// tenant chooses its URL, and a private one would let it reach
	// services inside your network.
	AllowPrivateTenants bool `json:"allow_private_tenants,omitempty"`

	// How long one delivery attempt may take. Default 5s; at most 1m.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// NotifyEvents are the events a notify block can send.
var NotifyEvents = []string{"near_limit", "exceeded", "penalty", "fail_mode", "override"}

// notifyForm is the Caddyfile form of notify.
const notifyForm = "notify { url <url>; secret <value>; events <event> [<fraction>...]...; allow_private; allow_private_tenants; timeout <duration> }"

// notifyBlock lists the subdirectives of `notify { ... }`.
var notifyBlock = block[*NotifyConfig]{
	{name: "url", usage: "url <url>", field: "url", parse: func(p cfParser, c *NotifyConfig) (err error) {
		c.URL, err = p.word()
		return err
	}},
	{name: "secret", usage: "secret <value>", field: "secret", parse: func(p cfParser, c *NotifyConfig) (err error) {
		c.Secret, err = p.word()
		return err
	}},
	{name: "events", usage: "events near_limit [<fraction>...] exceeded penalty fail_mode override", field: "events", parse: func(p cfParser, c *NotifyConfig) error {
		args, err := p.args(1, -1)
		if err != nil {
			return err
		}
		for _, a := range args {
			if f, err := strconv.ParseFloat(a, 64); err == nil {
				if len(c.Events) == 0 || c.Events[len(c.Events)-1] != "near_limit" {
					return p.dirErr("%s: a fraction follows near_limit only", a)
				}
				c.NearLimit = append(c.NearLimit, f)
				continue
			}
			if !slices.Contains(NotifyEvents, a) {
				return p.dirErr("%q: unknown event (allowed: %s)", a, strings.Join(NotifyEvents, ", "))
			}
			c.Events = append(c.Events, a)
		}
		return nil
	}},
	{name: "allow_private", usage: "allow_private", field: "allow_private", parse: func(p cfParser, c *NotifyConfig) error {
		c.AllowPrivate = true
		return p.flag()
	}},
	{name: "allow_private_tenants", usage: "allow_private_tenants", field: "allow_private_tenants", parse: func(p cfParser, c *NotifyConfig) error {
		c.AllowPrivateTenants = true
		return p.flag()
	}},
	{name: "timeout", usage: "timeout <duration>", field: "timeout", parse: func(p cfParser, c *NotifyConfig) (err error) {
		c.Timeout, err = p.durationArg()
		return err
	}},
}

// notify reads a `notify { ... }` block.
func (p cfParser) notify() (*NotifyConfig, error) {
	c := new(NotifyConfig)
	if _, err := p.lineArgs(0, 0); err != nil {
		return nil, err
	}
	path := sub(p.path, "notify")
	p.record(path, p.label(p.dir))
	if err := parseBlock(p.nested(p.label("notify"), path), notifyBlock, c); err != nil {
		return nil, err
	}
	return c, nil
}

// checkNotify checks the notify block at path.
func checkNotify(path []string, c *NotifyConfig) error {
	if c == nil {
		return nil
	}
	u, err := url.Parse(c.URL)
	if c.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return at(sub(path, "url"), "%q: want an http or https URL, e.g. https://hooks.example.com/tollgate", c.URL)
	}
	if c.Secret == "" {
		return at(sub(path, "secret"), "required: the key that signs each webhook, e.g. secret {env.TOLLGATE_WEBHOOK_SECRET}")
	}
	for i, e := range c.Events {
		if !slices.Contains(NotifyEvents, e) {
			return at(sub(path, "events", strconv.Itoa(i)), "%q: unknown event (allowed: %s)", e, strings.Join(NotifyEvents, ", "))
		}
	}
	for i, f := range c.NearLimit {
		if !(f > 0 && f <= 1) {
			return at(sub(path, "near_limit", strconv.Itoa(i)), "%v: want a fraction above 0 and at most 1", f)
		}
	}
	if t := time.Duration(c.Timeout); t < 0 || t > time.Minute {
		return at(sub(path, "timeout"), "%s: want 1ms to 1m (0: 5s)", t)
	}
	return nil
}

// Sends reports whether c sends event.
func (c *NotifyConfig) Sends(event string) bool {
	return c != nil && (len(c.Events) == 0 || slices.Contains(c.Events, event))
}
