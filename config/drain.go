package config

import (
	"time"

	"github.com/caddyserver/caddy/v2"
)

// DrainConfig bounds how a metered response is read on after its client
// went away (so that the usage at its end is charged): the upstream
// request is not cancelled when the client goes, only when a bound is
// reached. Zero fields take their defaults.
type DrainConfig struct {
	// How long a response is read after its client went away. Default
	// 5m.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// How many bytes of it are read after its client went away. Default
	// 16 MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`

	// How many responses this handler drains at once, per instance; the
	// upstream request of a client that leaves while all are taken is
	// cancelled at once. Default 100.
	MaxConcurrent int `json:"max_concurrent,omitempty"`

	// Cancel the upstream request as soon as the client goes (Caddy's
	// behaviour without Tollgate): the response is charged what it showed.
	Off bool `json:"off,omitempty"`
}

// Drain defaults.
const (
	DefaultDrainTimeout       = 5 * time.Minute
	DefaultDrainMaxBytes      = 16 << 20
	DefaultDrainMaxConcurrent = 100
	maxDrainConcurrent        = 1 << 20
)

// DrainBounds returns the drain settings of h with the defaults filled
// in; off reports that responses are not drained.
func (h *Handler) DrainBounds() (timeout time.Duration, maxBytes int64, maxConcurrent int, off bool) {
	timeout, maxBytes, maxConcurrent = DefaultDrainTimeout, DefaultDrainMaxBytes, DefaultDrainMaxConcurrent
	d := h.Drain
	if d == nil {
		return
	}
	if d.Timeout > 0 {
		timeout = time.Duration(d.Timeout)
	}
	if d.MaxBytes > 0 {
		maxBytes = d.MaxBytes
	}
	if d.MaxConcurrent > 0 {
		maxConcurrent = d.MaxConcurrent
	}
	return timeout, maxBytes, maxConcurrent, d.Off
}

// checkDrain checks the drain block.
func checkDrain(d *DrainConfig) error {
	switch {
	case d == nil:
		return nil
	case d.Timeout < 0:
		return at([]string{"drain", "timeout"}, "%s: must not be negative (0 means %s)", time.Duration(d.Timeout), DefaultDrainTimeout)
	case d.MaxBytes < 0:
		return at([]string{"drain", "max_bytes"}, "%d: must not be negative (0 means 16 MiB)", d.MaxBytes)
	case d.MaxConcurrent < 0 || d.MaxConcurrent > maxDrainConcurrent:
		return at([]string{"drain", "max_concurrent"}, "%d: out of range (allowed: 0 to %d; 0 means %d)", d.MaxConcurrent, maxDrainConcurrent, DefaultDrainMaxConcurrent)
	}
	return nil
}

// drainBlock lists the subdirectives of `drain { ... }`.
var drainBlock = block[*DrainConfig]{
	{name: "timeout", usage: "timeout <duration>", field: "timeout", parse: func(p cfParser, c *DrainConfig) (err error) {
		c.Timeout, err = p.durationArg()
		return err
	}},
	{name: "max_bytes", usage: "max_bytes <size>", field: "max_bytes", parse: func(p cfParser, c *DrainConfig) (err error) {
		c.MaxBytes, err = p.sizeArg()
		return err
	}},
	{name: "max_concurrent", usage: "max_concurrent <n>", field: "max_concurrent", parse: func(p cfParser, c *DrainConfig) (err error) {
		c.MaxConcurrent, err = p.intArg("an integer from 0 to 1048576")
		return err
	}},
}

// parseDrain reads `drain off` or `drain { ... }`.
func parseDrain(p cfParser, h *Handler) error {
	args, err := p.lineArgs(0, 1)
	if err != nil {
		return err
	}
	if len(args) == 1 {
		if args[0] != "off" {
			return p.dirErr("%q: unknown argument (allowed: off, or a block); usage: %s", args[0], p.usage)
		}
		h.Drain = &DrainConfig{Off: true}
		return nil
	}
	c := new(DrainConfig)
	if err := parseBlock(p.nested("drain", []string{"drain"}), drainBlock, c); err != nil {
		return err
	}
	h.Drain = c
	return nil
}
