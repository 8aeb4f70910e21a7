package surface

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/internal/caddyreq"
)

// TestPlaceholdersLastDecisionWins: a second decision in the same request
// (a second rate_limit handler) replaces the first one's values instead
// of hiding behind them, also after a denial wrote retry_after and
// exceeded.name (a rate_limit in handle_errors); other requests are not
// affected; and the same holds for a request without Caddy's vars map.
func TestPlaceholdersLastDecisionWins(t *testing.T) {
	w := httptest.NewRecorder()
	bare := httptest.NewRequest("GET", "/", nil)
	noVars := bare.WithContext(context.WithValue(bare.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
	for name, r := range map[string]*http.Request{"caddy": caddyreq.New(w, "acme"), "no vars": noVars} {
		t.Run(name, func(t *testing.T) {
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			setPlaceholders(r, repl, placeholderValues{policy: "first", tenant: "acme", limit: 10, remaining: 9, delay: 250 * time.Millisecond})
			setExceeded(r, repl, "first", 60)
			if got, _ := repl.GetString(placeholderPrefix + "retry_after"); got != "60" {
				t.Errorf("retry_after after the denial = %q, want 60", got)
			}
			setPlaceholders(r, repl, placeholderValues{policy: "second", tenant: "acme", limit: 5, remaining: 300, shadow: "a,b"})
			want := map[string]string{
				"policy":        "second",
				"tenant":        "acme",
				"limit":         "5",
				"remaining":     "300",
				"retry_after":   "0",
				"shadow_denied": "a,b",
				"delay":         "0s",
				"exceeded.name": "first", // as a map write left it: only a denial sets it
			}
			for name, v := range want {
				if got, ok := repl.GetString(placeholderPrefix + name); !ok || got != v {
					t.Errorf("{http.rate_limit.%s} = %q (found %v), want %q", name, got, ok, v)
				}
			}
			if _, ok := repl.Get(placeholderPrefix + "unknown"); ok {
				t.Error("an unknown http.rate_limit placeholder was answered")
			}
		})
	}

	other := caddyreq.New(w, "other")
	orepl := other.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if v, ok := orepl.Get(placeholderPrefix + "policy"); ok {
		t.Errorf("another request's {http.rate_limit.policy} = %v, want none", v)
	}
}

// TestPlaceholdersShedOnly: a request shed before any decision (no policy
// matched it) answers retry_after and exceeded.name, and nothing else.
func TestPlaceholdersShedOnly(t *testing.T) {
	r := caddyreq.New(httptest.NewRecorder(), "acme")
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	setExceeded(r, repl, "protect", 3)
	for name, v := range map[string]string{"retry_after": "3", "exceeded.name": "protect"} {
		if got, ok := repl.GetString(placeholderPrefix + name); !ok || got != v {
			t.Errorf("{http.rate_limit.%s} = %q (found %v), want %q", name, got, ok, v)
		}
	}
	for _, name := range []string{"policy", "tenant", "limit", "remaining", "shadow_denied", "delay"} {
		if v, ok := repl.Get(placeholderPrefix + name); ok {
			t.Errorf("{http.rate_limit.%s} = %v without a decision, want none", name, v)
		}
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
