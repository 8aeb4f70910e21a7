package config

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// authDirectives are the handlers caddy-ratelimit runs after rate_limit
// and Tollgate runs before it (Tollgate orders itself after them, so that
// a tenant taken from an authenticated identity cannot be forged).
var authDirectives = []string{"basic_auth", "basicauth", "forward_auth"}

// OrderWarning returns the warning for a rate_limit directive whose
// meaning changed on the way from caddy-ratelimit, or "" when there is
// none: the directive at token at is written for caddy-ratelimit (zones,
// no tenant and no policy), sits in a block (a site, handle...) with
// basic_auth or forward_auth, whose handlers Caddy sorts by directive
// order, and no global order line places rate_limit (an explicit order
// means the same in both plugins).
// caddy-ratelimit ran before them (its limits counted failed logins);
// Tollgate runs after. order is the global order option as the adapter
// holds it (nil when the Caddyfile sets none).
//
// The adapter hands a directive its own tokens only (seg, the first being
// rate_limit), so the block is read again from their file; a Caddyfile
// that is not a file on disk (adapted from memory) gets no warning, nor
// does one whose file on disk does not hold these very tokens at that
// line (a file of the same name that is not the one adapted).
func OrderWarning(seg []caddyfile.Token, order any) string {
	if len(seg) == 0 {
		return ""
	}
	at := seg[0]
	blocks := parsedFile(at.File)
	if ordersRateLimit(blocks) {
		return "" // its place was chosen, in either plugin
	}
	for _, b := range blocks {
		auth, rl, found := authBeside(b.Segments, at)
		if !found {
			continue
		}
		if auth == "" || !sameTexts(rl, seg) || !caddyRatelimitStyle(rl) {
			return ""
		}
		if list, ok := order.([]string); ok {
			if i, j := slices.Index(list, "rate_limit"), slices.Index(list, auth); i >= 0 && j >= 0 && i < j {
				return "" // ordered first on purpose
			}
		}
		return fmt.Sprintf("%s:%d: rate_limit now runs after %s in this block (Tollgate orders itself after authentication; caddy-ratelimit ran before it), so requests that fail authentication are no longer counted. To keep caddy-ratelimit's order, add `order rate_limit before %s` to the global options (or put both in a route block, in the order wanted); to count only failed logins, write a policy with `count_status 401` (see the README, Limits on outcomes)",
			at.File, at.Line, auth, auth)
	}
	return ""
}

// lastParsed keeps the last file parsed by parsedFile: the adapter calls
// OrderWarning once per rate_limit directive, mostly of one file, which
// must not be parsed again for each (a config with many sites).
var lastParsed struct {
	sync.Mutex
	file   string
	size   int64
	mod    time.Time
	blocks []caddyfile.ServerBlock
}

// parsedFile returns the server blocks of a Caddyfile on disk, nil when
// it cannot be read or parsed.
func parsedFile(file string) []caddyfile.ServerBlock {
	fi, err := os.Stat(file)
	if err != nil {
		return nil
	}
	lastParsed.Lock()
	defer lastParsed.Unlock()
	if lastParsed.file == file && lastParsed.size == fi.Size() && lastParsed.mod.Equal(fi.ModTime()) {
		return lastParsed.blocks
	}
	src, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	blocks, err := caddyfile.Parse(file, src)
	if err != nil {
		return nil
	}
	lastParsed.file, lastParsed.size, lastParsed.mod, lastParsed.blocks = file, fi.Size(), fi.ModTime(), blocks
	return blocks
}

// ordersRateLimit reports whether the global options (a first block
// without keys) have an order line for rate_limit.
func ordersRateLimit(blocks []caddyfile.ServerBlock) bool {
	if len(blocks) == 0 || len(blocks[0].Keys) > 0 {
		return false
	}
	for _, s := range blocks[0].Segments {
		if len(s) > 1 && s.Directive() == "order" && s[1].Text == "rate_limit" {
			return true
		}
	}
	return false
}

// caddyRatelimitStyle reports whether a rate_limit segment is written as
// for caddy-ratelimit: zones, and neither a tenant nor a policy, which
// only Tollgate has.
func caddyRatelimitStyle(rl caddyfile.Segment) bool {
	zones := false
	for _, s := range innerSegments(rl) {
		switch s.Directive() {
		case "zone":
			zones = true
		case "tenant", "policy":
			return false
		}
	}
	return zones
}

// authBeside looks for the rate_limit directive at token at among segs
// and the blocks nested in them. found reports whether it is there, rl is
// its segment, and auth names an authentication directive in the same
// block ("" when there is none, or the block is a route: its handlers run
// as written).
func authBeside(segs []caddyfile.Segment, at caddyfile.Token) (auth string, rl caddyfile.Segment, found bool) {
	for _, seg := range segs {
		if len(seg) == 0 {
			continue
		}
		if same(seg[0], at) {
			for _, s := range segs {
				if d := s.Directive(); slices.Contains(authDirectives, d) {
					return d, seg, true
				}
			}
			return "", seg, true
		}
		if !slices.ContainsFunc(seg[1:], func(t caddyfile.Token) bool { return same(t, at) }) {
			continue
		}
		auth, rl, found = authBeside(innerSegments(seg), at)
		if seg.Directive() == "route" {
			auth = ""
		}
		return auth, rl, found
	}
	return "", nil, false
}

// innerSegments splits the block of directive seg into its directives.
func innerSegments(seg caddyfile.Segment) []caddyfile.Segment {
	d := caddyfile.NewDispenser(seg)
	d.Next()
	for d.NextArg() {
	}
	var out []caddyfile.Segment
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		out = append(out, d.NextSegment())
	}
	return out
}

// sameTexts reports whether two token lists are the same tokens: the
// same lines, the same words (placeholders aside: the adapter has
// expanded shorthands such as {client_ip} in the tokens it hands out).
func sameTexts(a, b []caddyfile.Token) bool {
	return slices.EqualFunc(a, b, func(x, y caddyfile.Token) bool {
		return x.Line == y.Line && (x.Text == y.Text || (strings.Contains(x.Text, "{") && strings.Contains(y.Text, "{")))
	})
}

// same reports whether a and b are the same token of the same file.
func same(a, b caddyfile.Token) bool {
	return a.Text == b.Text && a.Line == b.Line && a.File == b.File
}
