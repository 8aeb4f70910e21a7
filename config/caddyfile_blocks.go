package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// This file is the machinery the Caddyfile parser (caddyfile.go) is built
// on. A block is a table of subdirectives, each with its name, aliases,
// usage, the JSON field it sets and its parser. The parser checks syntax
// only (argument counts, numbers, durations, repeats); the rules live in
// validate.go. While parsing, every field's JSON path is recorded with the
// token and the words that name it in the Caddyfile, so an error of the
// validator names the line and the subdirective as written.

// cfParser carries the dispenser and names the place in the configuration
// that error messages refer to.
type cfParser struct {
	d     *caddyfile.Dispenser
	scope string   // e.g. "policy api", "redis"; empty at the top level
	path  []string // JSON path of the block, e.g. rate_limits.api
	dir   string   // the subdirective being parsed, as written
	usage string   // its syntax, for error messages
	rec   *cfRecord
}

// subdirective is one entry of a block: its name, syntax, JSON field and
// parser.
type subdirective[T any] struct {
	name       string
	aliases    []string
	usage      string
	repeatable bool // may appear more than once in its block
	// field is the JSON field the subdirective sets, recorded with its
	// line; "" when the parser records what it sets itself.
	field string
	parse func(p cfParser, target T) error
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
		sp := p
		sp.dir, sp.usage = name, sd.usage
		if sd.field != "" {
			sp.record(sub(p.path, sd.field), sp.label(name))
		}
		if err := sd.parse(sp, target); err != nil {
			return err
		}
	}
	return nil
}

// nested returns a parser for a block nested at JSON path, whose errors are
// prefixed scope.
func (p cfParser) nested(scope string, path []string) cfParser {
	return cfParser{d: p.d, scope: scope, path: path, rec: p.rec}
}

// label is how the Caddyfile names what follows: the scope, then name.
func (p cfParser) label(name string) string {
	if p.scope == "" {
		return name
	}
	return p.scope + ": " + name
}

// record notes that the current token sets the field at path, which the
// Caddyfile calls label.
func (p cfParser) record(path []string, label string) {
	p.rec.add(path, p.d.Token(), label)
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

// errAt reports msg at the line of tok (a token read earlier).
func errAt(tok caddyfile.Token, msg string) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.Err(msg)
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
		return nil, errAt(last, p.label(fmt.Sprintf("%s: takes no block; usage: %s", p.dir, p.usage)))
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

// parseInt parses s as an int64; want describes what is expected, for the
// error message (the validator checks the range).
func (p cfParser) parseInt(s, want string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, p.dirErr("%s is out of range (want %s)", s, want)
	case err != nil:
		return 0, p.dirErr("%q is not a valid integer (want %s)", s, want)
	}
	return n, nil
}

// int64Arg reads one integer argument.
func (p cfParser) int64Arg(want string) (int64, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	return p.parseInt(s, want)
}

// intArg reads one integer argument that fits an int.
func (p cfParser) intArg(want string) (int, error) {
	n, err := p.int64Arg(want)
	if err == nil && (n < math.MinInt32 || n > math.MaxInt32) {
		return 0, p.dirErr("%d is out of range (want %s)", n, want)
	}
	return int(n), err
}

// sizeArg reads one byte size such as 64MiB, 512MB or 1GiB.
func (p cfParser) sizeArg() (int64, error) {
	s, err := p.word()
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n > math.MaxInt64 {
		return 0, p.dirErr("%q is not a valid size (want e.g. 64MiB, 512MB, 1GiB)", s)
	}
	return int64(n), nil
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

// lease reads `lease <max_tokens> [<ttl>]`, recording both at the line.
func (p cfParser) lease() (*LeaseConfig, error) {
	path := sub(p.path, "lease")
	p.record(path, p.label(p.dir))
	p.record(sub(path, "max_tokens"), p.label(p.dir))
	p.record(sub(path, "ttl"), p.label(p.dir+": ttl"))
	args, err := p.args(1, 2)
	if err != nil {
		return nil, err
	}
	lc := new(LeaseConfig)
	if lc.MaxTokens, err = p.parseInt(args[0], countRange(0)+"; 0 disables leasing"); err != nil {
		return nil, err
	}
	if len(args) == 2 {
		if lc.TTL, err = p.parseDuration(args[1]); err != nil {
			return nil, err
		}
	}
	return lc, nil
}

// cfRecord maps JSON paths to where the Caddyfile set them.
type cfRecord struct {
	m map[string]cfField
	// policyBlocks names the policies read from `policy` blocks (the others
	// are `zone` blocks).
	policyBlocks []string
	// directive is the rate_limit token, for errors about fields the
	// Caddyfile never set.
	directive caddyfile.Token
}

// cfField is a recorded field: its token and the words naming it.
type cfField struct {
	tok   caddyfile.Token
	label string
}

func pathKey(path []string) string { return strings.Join(path, "\x00") }

func (r *cfRecord) add(path []string, tok caddyfile.Token, label string) {
	if r.m == nil {
		r.m = make(map[string]cfField)
	}
	r.m[pathKey(path)] = cfField{tok, label}
}

// cfNames maps JSON field names to the Caddyfile words for them, for
// fields the Caddyfile did not set (an error about a missing field).
var cfNames = map[string]string{
	"max_events":      "limit",
	"addresses":       "address",
	"fail_mode":       "fail",
	"sentinel_master": "sentinel",
	"rate_limits":     "policy",
	"tiers":           "tier",
	"tenant_limits":   "tenant_limit",
	"overrides":       "override",
	"tenant_tiers":    "tenant_tier",
}

func cfName(field string) string {
	if n, ok := cfNames[field]; ok {
		return n
	}
	if name, _, ok := strings.Cut(field, "["); ok && name == "addresses" {
		return "address"
	}
	return field
}

// fieldErr turns a validator error into a Caddyfile error at the line
// that set the field (or the closest enclosing one), named in Caddyfile
// words: "policy api: limit: 0 is out of range (...), at Caddyfile:5".
func (r *cfRecord) fieldErr(fe *fieldError) error {
	for n := len(fe.path); n > 0; n-- {
		f, ok := r.m[pathKey(fe.path[:n])]
		if !ok {
			continue
		}
		parts := []string{f.label}
		for _, seg := range fe.path[n:] {
			parts = append(parts, cfName(seg))
		}
		return errAt(f.tok, strings.Join(parts, ": ")+": "+fe.msg)
	}
	var parts []string
	for _, seg := range fe.path {
		parts = append(parts, cfName(seg))
	}
	return errAt(r.directive, strings.Join(parts, ": ")+": "+fe.msg)
}
