package surface

import (
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The decision's placeholders ({http.rate_limit.policy}, .tenant, .limit,
// .remaining, .retry_after, .shadow_denied, .delay, and .exceeded.name on
// a denial or a shed) are answered by a replacer provider over the
// request's values, instead of being written into the replacer's map one
// by one: seven map writes under the replacer's lock cost more than the
// rest of reporting a decision, on every request, while most
// configurations read none of them. The values live in a small
// per-request holder (never the pooled request state: an access log reads
// them after the handler has returned), kept in the request's variables
// (Caddy's vars map, which already holds the client IP, so adding it
// allocates nothing) under holderKey; without a vars map (a handler
// called outside Caddy's server), in the replacer's map. Every writer of
// these placeholders (a decision, a denial, the missing-tenant answer,
// protect's shed) writes the holder, so the last write wins, as it did
// with map writes: a second rate_limit handler in the same request (in
// handle_errors, say) reports its own decision.

// placeholderPrefix starts every placeholder of a decision.
const placeholderPrefix = "http.rate_limit."

// holderKey is where a request's placeholder values are kept in its
// variables. It starts with a NUL byte, which no Caddyfile placeholder or
// vars matcher can name.
const holderKey = "\x00tollgate.placeholders"

// placeholderValues are the placeholders of one decision.
type placeholderValues struct {
	policy     string
	tenant     string
	limit      int64
	remaining  int64
	retryAfter int64
	shadow     string
	delay      time.Duration
}

// placeholderHolder answers a request's placeholders from its values.
type placeholderHolder struct {
	values placeholderValues
	// decided: values holds a decision (or the missing-tenant answer);
	// before that only what a shed wrote is answered. retrySet:
	// retryAfter was written by a shed without a decision.
	decided, retrySet bool
	// exceeded is {http.rate_limit.exceeded.name}, answered once a
	// denial, the missing-tenant answer or a shed wrote it.
	exceeded    string
	hasExceeded bool
}

// replace is the holder's replacer provider. Numbers are boxed here, when
// a placeholder is read, not on every request.
func (h *placeholderHolder) replace(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	v, d := &h.values, h.decided
	switch name {
	case "exceeded.name":
		return h.exceeded, h.hasExceeded
	case "retry_after":
		return v.retryAfter, d || h.retrySet
	case "policy":
		return v.policy, d
	case "tenant":
		return v.tenant, d
	case "limit":
		return v.limit, d
	case "remaining":
		return v.remaining, d
	case "shadow_denied":
		return v.shadow, d
	case "delay":
		return v.delay, d
	}
	return nil, false
}

// setPlaceholders makes v the values of r's decision.
func setPlaceholders(r *http.Request, repl *caddy.Replacer, v placeholderValues) {
	h := placeholdersOf(r, repl)
	h.values, h.decided = v, true
}

// setExceeded sets {http.rate_limit.exceeded.name} and .retry_after, as
// a denial or a shed does.
func setExceeded(r *http.Request, repl *caddy.Replacer, name string, retryAfter int64) {
	h := placeholdersOf(r, repl)
	h.exceeded, h.hasExceeded = name, true
	h.values.retryAfter, h.retrySet = retryAfter, true
}

// placeholdersOf returns r's placeholder holder, made and registered with
// repl on first use.
func placeholdersOf(r *http.Request, repl *caddy.Replacer) *placeholderHolder {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	var found any
	if vars != nil {
		found = vars[holderKey]
	} else {
		found, _ = repl.Get(holderKey)
	}
	if h, ok := found.(*placeholderHolder); ok {
		return h
	}
	h := &placeholderHolder{}
	if vars != nil {
		vars[holderKey] = h
	} else {
		repl.Set(holderKey, h)
	}
	repl.Map(h.replace)
	return h
}
