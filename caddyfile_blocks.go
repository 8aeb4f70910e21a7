package tollgate

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// This file is the machinery the Caddyfile parser (caddyfile.go) is built
// on: a block is a table of subdirectives, each with its name, aliases,
// usage and parser, and cfParser reads arguments and reports errors that
// name the scope, the subdirective, its line and the allowed values.

// cfParser carries the dispenser and names the place in the configuration
// that error messages refer to.
type cfParser struct {
	d     *caddyfile.Dispenser
	scope string // e.g. "policy api", "redis"; empty at the top level
	dir   string // the subdirective being parsed, as written
	usage string // its syntax, for error messages
}

// subdirective is one entry of a block: its name, syntax and parser.
type subdirective[T any] struct {
	name       string
	aliases    []string
	usage      string
	repeatable bool // may appear more than once in its block
	parse      func(p cfParser, target T) error
}

// block is the list of subdirectives a block accepts.
type block[T any] []subdirective[T]

func (b block[T]) lookup(name string) *subdirective[T] {
	for i := range b {
		if b[i].name == name {
			return &b[i]
		}
		for _, a := range b[i].aliases {
			if a == name {
				return &b[i]
			}
		}
	}
	return nil
}

// allowed lists the subdirective names for an "unknown subdirective" error.
func (b block[T]) allowed() string {
	names := make([]string, 0, len(b))
	for _, s := range b {
		n := s.name
		if len(s.aliases) > 0 {
			n += " (alias " + strings.Join(s.aliases, ", ") + ")"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// tokenRecorder is implemented by block targets that need to point at a
// subdirective's line after the whole block has been read.
type tokenRecorder interface {
	record(name string, tok caddyfile.Token)
}

// parseBlock reads the block that opens at the end of the current line and
// hands each subdirective to its parser. It refuses unknown subdirectives
// and repeats of single-valued ones.
func parseBlock[T any](p cfParser, b block[T], target T) error {
	type first struct {
		as   string // the spelling used, which may be an alias
		line int
	}
	seen := make(map[string]first) // canonical name -> its first use
	for nesting := p.d.Nesting(); p.d.NextBlock(nesting); {
		name := p.d.Val()
		sd := b.lookup(name)
		if sd == nil {
			return p.errf("unknown subdirective %q (allowed: %s)", name, b.allowed())
		}
		if !sd.repeatable {
			if f, dup := seen[sd.name]; dup {
				if f.as != name {
					return p.errf("%s: already specified as %s at line %d (%s and %s are the same setting)", name, f.as, f.line, f.as, name)
				}
				return p.errf("%s already specified at line %d", name, f.line)
			}
			seen[sd.name] = first{name, p.d.Line()}
		}
		if r, ok := any(target).(tokenRecorder); ok {
			r.record(sd.name, p.d.Token())
		}
		sp := p
		sp.dir, sp.usage = name, sd.usage
		if err := sd.parse(sp, target); err != nil {
			return err
		}
	}
	return nil
}

// sub returns a parser for a nested block whose errors are prefixed scope.
func (p cfParser) sub(scope string) cfParser {
	return cfParser{d: p.d, scope: scope}
}

// errf reports an error at the current token, prefixed with the scope.
func (p cfParser) errf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if p.scope != "" {
		msg = p.scope + ": " + msg
	}
	return p.d.Err(msg)
}

// dirErr reports an error about the current subdirective.
func (p cfParser) dirErr(format string, args ...any) error {
	return p.errf("%s: %s", p.dir, fmt.Sprintf(format, args...))
}

// errAt reports an error at the line of tok (a subdirective read earlier).
func (p cfParser) errAt(tok caddyfile.Token, format string, args ...any) error {
	at := cfParser{d: caddyfile.NewDispenser([]caddyfile.Token{tok}), scope: p.scope}
	at.d.Next()
	return at.errf(format, args...)
}

// lineArgs returns the arguments on the rest of the line, which must number
// between min and max (max < 0: no upper bound). A block may follow.
func (p cfParser) lineArgs(min, max int) ([]string, error) {
	args := p.d.RemainingArgs()
	if len(args) < min || (max >= 0 && len(args) > max) {
		return nil, p.dirErr("wrong number of arguments (%d); usage: %s", len(args), p.usage)
	}
	return args, nil
}

// args is lineArgs for a subdirective that takes no block.
func (p cfParser) args(min, max int) ([]string, error) {
	args, err := p.lineArgs(min, max)
	if err != nil {
		return nil, err
	}
	if last := p.d.Token(); p.d.NextBlock(p.d.Nesting()) {
		return nil, p.errAt(last, "%s: takes no block; usage: %s", p.dir, p.usage)
	}
	return args, nil
}

// flag checks that a flag subdirective has no arguments.
func (p cfParser) flag() error {
	_, err := p.args(0, 0)
	return err
}

// word returns the single argument of the subdirective.
func (p cfParser) word() (string, error) {
	args, err := p.args(1, 1)
	if err != nil {
		return "", err
	}
	return args[0], nil
}

// enum returns the single argument, which must be one of allowed.
func (p cfParser) enum(allowed []string) (string, error) {
	s, err := p.word()
	if err != nil {
		return "", err
	}
	if err := checkEnum(s, allowed); err != nil {
		return "", p.dirErr("%v", err)
	}
	return s, nil
}

// parseInt parses s as an integer of at least min; want describes the
// accepted values for the error message.
func (p cfParser) parseInt(s string, min, max int64, want string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, p.dirErr("%q is not a valid integer (want %s)", s, want)
	}
	if n < min || n > max {
		return 0, p.dirErr("%d is out of range (want %s)", n, want)
	}
	return n, nil
}

// countArg reads one count (a limit, a burst) from least to
// limiter.MaxCount.
func (p cfParser) countArg(least int64) (int64, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	return p.parseInt(s, least, limiter.MaxCount, countRange(least))
}

// intArg reads one int argument of at least min.
func (p cfParser) intArg(min int64, want string) (int, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	n, err := p.parseInt(s, min, math.MaxInt32, want)
	return int(n), err
}

// intRange reads one int argument between min and max inclusive.
func (p cfParser) intRange(min, max int64) (int, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	n, err := p.parseInt(s, min, max, fmt.Sprintf("an integer from %d to %d", min, max))
	return int(n), err
}

// parseDuration parses a positive duration such as 500ms, 1m or 1d.
func (p cfParser) parseDuration(s string) (caddy.Duration, error) {
	v, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, p.dirErr("%q is not a valid duration (want e.g. 100ms, 10s, 1m, 1h, 1d)", s)
	}
	if v <= 0 {
		return 0, p.dirErr("%q must be a positive duration", s)
	}
	return caddy.Duration(v), nil
}

// durationArg reads one positive duration argument.
func (p cfParser) durationArg() (caddy.Duration, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	return p.parseDuration(s)
}

// durationText reads one positive duration argument and returns it as written.
func (p cfParser) durationText() (string, error) {
	s, err := p.word()
	if err != nil {
		return "", err
	}
	_, err = p.parseDuration(s)
	return s, err
}

// parseWindow parses a policy or tier window, from limiter.MinWindow to
// limiter.MaxWindow.
func (p cfParser) parseWindow(s string) (caddy.Duration, error) {
	w, err := p.parseDuration(s)
	if err != nil {
		return 0, err
	}
	if err := limiter.CheckWindow(time.Duration(w)); err != nil {
		return 0, p.dirErr("%v", err)
	}
	return w, nil
}

// intervalArg reads a min_interval: a positive duration up to
// limiter.MaxWindow.
func (p cfParser) intervalArg() (caddy.Duration, error) {
	d, err := p.durationArg()
	if err != nil {
		return 0, err
	}
	if err := limiter.CheckInterval(time.Duration(d)); err != nil {
		return 0, p.dirErr("%v", err)
	}
	return d, nil
}

// windowArg reads one window argument.
func (p cfParser) windowArg() (caddy.Duration, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	return p.parseWindow(s)
}

// lease reads `lease <max_tokens> [<ttl>]`.
func (p cfParser) lease() (*LeaseConfig, error) {
	args, err := p.args(1, 2)
	if err != nil {
		return nil, err
	}
	lc := new(LeaseConfig)
	if lc.MaxTokens, err = p.parseInt(args[0], 0, limiter.MaxCount, countRange(0)+"; 0 disables leasing"); err != nil {
		return nil, err
	}
	if len(args) == 2 {
		if lc.TTL, err = p.parseWindow(args[1]); err != nil {
			return nil, err
		}
	}
	return lc, nil
}
