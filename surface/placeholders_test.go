package surface

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"
)

// TestPlaceholdersLastDecisionWins: a second decision in the same request
// (a second rate_limit handler) replaces the first one's values instead
// of hiding behind them; a value written into the replacer's map (a
// denial's retry_after) wins over both; other requests are not affected.
func TestPlaceholdersLastDecisionWins(t *testing.T) {
	w := httptest.NewRecorder()
	r := caddyreq.New(w, "acme")
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)

	setPlaceholders(r, repl, placeholderValues{policy: "first", tenant: "acme", limit: 10, remaining: 9, delay: 250 * time.Millisecond})
	setPlaceholders(r, repl, placeholderValues{policy: "second", tenant: "acme", limit: 5, remaining: 300, retryAfter: 2, shadow: "a,b"})
	want := map[string]string{
		"policy":        "second",
		"tenant":        "acme",
		"limit":         "5",
		"remaining":     "300",
		"retry_after":   "2",
		"shadow_denied": "a,b",
		"delay":         "0s",
	}
	for name, v := range want {
		if got, ok := repl.GetString(placeholderPrefix + name); !ok || got != v {
			t.Errorf("{http.rate_limit.%s} = %q (found %v), want %q", name, got, ok, v)
		}
	}
	if _, ok := repl.Get(placeholderPrefix + "unknown"); ok {
		t.Error("an unknown http.rate_limit placeholder was answered")
	}
	repl.Set(placeholderPrefix+"retry_after", int64(7))
	if got, _ := repl.GetString(placeholderPrefix + "retry_after"); got != "7" {
		t.Errorf("retry_after written into the replacer's map = %q, want 7", got)
	}

	other := caddyreq.New(w, "other")
	orepl := other.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if v, ok := orepl.Get(placeholderPrefix + "policy"); ok {
		t.Errorf("another request's {http.rate_limit.policy} = %v, want none", v)
	}
}

// TestPlaceholdersAllocations: reporting a decision's placeholders costs
// the holder and its provider, whatever their values.
func TestPlaceholdersAllocations(t *testing.T) {
	w := httptest.NewRecorder()
	v := placeholderValues{policy: "api", tenant: "acme", limit: 1 << 40, remaining: 1 << 39, retryAfter: 1000}
	allocs := testing.AllocsPerRun(100, func() {
		r := caddyreq.New(w, "acme")
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		setPlaceholders(r, repl, v)
	})
	base := testing.AllocsPerRun(100, func() { _ = caddyreq.New(w, "acme") })
	if got := allocs - base; got > 2 {
		t.Errorf("setPlaceholders allocates %.0f times, want at most 2 (holder and provider)", got)
	}
}
