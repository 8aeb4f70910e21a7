package limiter

import (
	"context"
	"errors"
	"testing"
	"time"
)

// brokenStore fails every call, as an unreachable Redis does.
type brokenStore struct{ Store }

var errUnreachable = errors.New("store unreachable")

func (brokenStore) Decide(context.Context, []Check, []Result) (bool, error) {
	return false, errUnreachable
}

func TestDecideOrFallback(t *testing.T) {
	policy := func(name string, mode FailMode, limit int64) *Policy {
		return &Policy{Name: name, Algorithm: FixedWindow, FailMode: mode,
			Limit: Limit{Rate: Rate{Limit: limit, Window: time.Hour}}}
	}
	open, closed := policy("open", FailOpen, 10), policy("closed", FailClosed, 10)
	local, local2 := policy("local", FailLocal, 10), policy("local2", FailLocal, 3)
	inflight := &Policy{Name: "inflight", Algorithm: Concurrency, Limit: Limit{Rate: Rate{Limit: 2}}}

	cases := []struct {
		name     string
		policies []*Policy
		requests int
		admitted int
	}{
		{"open admits everything", []*Policy{open}, 20, 20},
		{"closed denies everything", []*Policy{closed}, 5, 0},
		{"local grants 70% of the limit", []*Policy{local}, 20, 7},
		{"local all-or-nothing with the smallest share", []*Policy{local, local2}, 20, 2},
		{"closed beside local denies", []*Policy{local, closed}, 5, 0},
		{"open beside local follows local", []*Policy{open, local}, 20, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store, _ := newTestStore(t, MemoryOptions{})
			fb := Fallback{Store: store, Scale: 0.7}
			var d Decision
			admitted := 0
			for range c.requests {
				items := make([]Item, 0, len(c.policies))
				for _, p := range c.policies {
					items = append(items, Item{Policy: p, Tenant: "acme", Cost: 1})
				}
				err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
				if !errors.Is(err, errUnreachable) {
					t.Fatalf("error = %v, want the store's error", err)
				}
				if d.Admitted {
					admitted++
				}
				for i, v := range d.Verdicts {
					want := map[FailMode]Path{FailOpen: PathFailedOpen, FailClosed: PathFailedClosed, FailLocal: PathFallback}[c.policies[i].FailMode]
					if v.Path != want {
						t.Fatalf("policy %s: path %d, want %d", c.policies[i].Name, v.Path, want)
					}
					if v.Path == PathFailedClosed && v.Result.RetryAfter != FailedClosedRetryAfter {
						t.Errorf("closed RetryAfter %v", v.Result.RetryAfter)
					}
				}
			}
			if admitted != c.admitted {
				t.Errorf("admitted %d of %d, want %d", admitted, c.requests, c.admitted)
			}
			// A closed denial must not have charged the local bucket.
			if c.name == "closed beside local denies" {
				res := make([]Result, 1)
				chk := []Check{{Algorithm: FixedWindow, Tenant: "acme", Policy: "local", Rate: Rate{Limit: 7, Window: time.Hour}, Cost: 1}}
				if err := fb.Store.Peek(bgCtx, chk, res); err != nil || res[0].Remaining != 7 {
					t.Errorf("local bucket after closed denials: remaining %d (%v), want 7 (uncharged)", res[0].Remaining, err)
				}
			}
		})
	}

	t.Run("concurrency slots go back to the fallback store", func(t *testing.T) {
		store, _ := newTestStore(t, MemoryOptions{})
		fb := Fallback{Store: store, Scale: 1}
		items := []Item{{Policy: inflight, Tenant: "acme", Cost: 1}}
		var d1, d2, d3 Decision
		_ = d1.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
		_ = d2.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
		_ = d3.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
		if !d1.Admitted || !d2.Admitted || d3.Admitted {
			t.Fatalf("admitted %v %v %v, want true true false", d1.Admitted, d2.Admitted, d3.Admitted)
		}
		if err := d1.Release(bgCtx, fb); err != nil {
			t.Fatal(err)
		}
		var d4 Decision
		_ = d4.DecideOrFallback(bgCtx, brokenStore{}, fb, items)
		if !d4.Admitted {
			t.Error("slot released to the fallback store was not reusable")
		}
	})
}
