package surface

import (
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The decision's placeholders ({http.rate_limit.policy}, .tenant, .limit,
// .remaining, .retry_after, .shadow_denied, .delay) are answered by a
// replacer provider over the values of the request's last decision,
// instead of being written into the replacer's map one by one: seven map
// writes under the replacer's lock cost more than the rest of reporting a
// decision, on every request, while most configurations read none of
// them. The values are copied into a small per-request holder (never the
// pooled request state: an access log reads them after the handler has
// returned). The holder is kept in the request's variables (Caddy's vars
// map, which already holds the client IP, so adding it allocates nothing)
// under holderKey, so a second rate_limit handler in the same request
// overwrites the values (the last decision is reported, as with map
// writes) instead of adding a provider. Values written into the map (a denial's retry_after, the
// missing-tenant answer, protect's shed) still win: the replacer asks its
// map before any provider added later.

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
}

// replace is the holder's replacer provider. Numbers are boxed here, when
// a placeholder is read, not on every request.
func (h *placeholderHolder) replace(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	v := &h.values
	switch name {
	case "policy":
		return v.policy, true
	case "tenant":
		return v.tenant, true
	case "limit":
		return v.limit, true
	case "remaining":
		return v.remaining, true
	case "retry_after":
		return v.retryAfter, true
	case "shadow_denied":
		return v.shadow, true
	case "delay":
		return v.delay, true
	}
	return nil, false
}

// setPlaceholders makes v the placeholder values of r's decision.
func setPlaceholders(r *http.Request, repl *caddy.Replacer, v placeholderValues) {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if h, ok := vars[holderKey].(*placeholderHolder); ok {
		h.values = v
		return
	}
	h := &placeholderHolder{values: v}
	if vars != nil {
		vars[holderKey] = h
	}
	repl.Map(h.replace)
}
