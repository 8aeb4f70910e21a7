package limiter

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

func TestDomainChecks(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string // "" = accepted
	}{
		{"count at max", CheckCount(MaxCount, 1), ""},
		{"count above max", CheckCount(MaxCount+1, 1), "9007199254740992 is out of range (allowed: 1 to 9007199254740991)"},
		{"count below least", CheckCount(0, 1), "0 is out of range (allowed: 1 to 9007199254740991)"},
		{"count zero allowed", CheckCount(0, 0), ""},
		{"window at min", CheckWindow(time.Millisecond), ""},
		{"window below min", CheckWindow(time.Millisecond - 1), "999.999µs is out of range (allowed: 1ms to 366d)"},
		{"window at max", CheckWindow(MaxWindow), ""},
		{"window above max", CheckWindow(MaxWindow + 1), "is out of range (allowed: 1ms to 366d)"},
		{"interval zero", CheckInterval(0), ""},
		{"interval 1ns", CheckInterval(1), ""},
		{"interval negative", CheckInterval(-1), "-1ns is out of range (allowed: 0 to 366d)"},
	}
	for _, tt := range tests {
		switch {
		case tt.want == "" && tt.err != nil:
			t.Errorf("%s: %v, want accepted", tt.name, tt.err)
		case tt.want != "" && (tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) || !errors.Is(tt.err, ErrOutOfRange)):
			t.Errorf("%s: %v, want an ErrOutOfRange containing %q", tt.name, tt.err, tt.want)
		}
	}
}

// TestCostBeyondDomain: a cost above MaxCount is valid input that can never
// fit, on every store and algorithm: denied with RetryAfter = window (1s
// for concurrency), nothing charged, and the same answer from Redis as
// from memory (Redis sees it as MaxCount+1, exact in a Lua number, where
// 2^53+1 would round down to 2^53 and pass). A cost of exactly the
// capacity fits a fresh bucket.
func TestCostBeyondDomain(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	rs := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	ms, _ := newTestStore(t, MemoryOptions{})
	for a := range numAlgorithms {
		r := Rate{Limit: MaxCount, Window: time.Hour}
		if a == Concurrency {
			r.Window = 0
		}
		wantRetry := time.Hour
		if a == Concurrency {
			wantRetry = time.Second
		}
		for _, store := range []struct {
			name string
			s    Store
		}{{"memory", ms}, {"redis", rs}} {
			for _, cost := range []int64{MaxCount + 1, MaxCount + 2, math.MaxInt64} {
				c := Check{Algorithm: a, Tenant: "mallory", Policy: "p", Rate: r, Cost: cost}
				ok, res := mustDecide(t, store.s, c)
				if ok || res[0].Allowed || res[0].RetryAfter != wantRetry {
					t.Errorf("%s %s cost %d: admitted=%v %+v, want denied with RetryAfter %s", store.name, a, cost, ok, res[0], wantRetry)
				}
				if rem := mustPeek(t, store.s, Check{Algorithm: a, Tenant: "mallory", Policy: "p", Rate: r})[0].Remaining; rem != MaxCount {
					t.Errorf("%s %s: remaining %d after a denied cost %d, want %d (nothing charged)", store.name, a, rem, cost, MaxCount)
				}
			}
			if a == GCRA {
				// More than one unit per microsecond: GCRA's interval rounds
				// up to 1µs on Redis (1ns in memory), so its tolerance differs.
				continue
			}
			c := Check{Algorithm: a, Tenant: "full", Policy: "p", Rate: r, Cost: MaxCount}
			if ok, res := mustDecide(t, store.s, c); !ok || res[0].Remaining != 0 {
				t.Errorf("%s %s: cost MaxCount on a fresh bucket of capacity MaxCount: admitted=%v %+v, want admitted, 0 left", store.name, a, ok, res[0])
			}
		}
	}
}

// TestFailModeNeverAdmitsWhatCannotFit: while the store fails, fail open
// admits ordinary requests but denies a request whose cost exceeds its
// bucket's capacity (any store would), and local does too.
func TestFailModeNeverAdmitsWhatCannotFit(t *testing.T) {
	mem, _ := newTestStore(t, MemoryOptions{})
	fb := Fallback{Store: mem, Scale: 0.7}
	for _, mode := range []FailMode{FailOpen, FailLocal, FailClosed} {
		p := &Policy{Name: "p", Algorithm: TokenBucket, FailMode: mode, Limit: Limit{Rate: Rate{Limit: 10, Window: time.Minute}}}
		for _, cost := range []int64{11, MaxCount, MaxCount + 1, math.MaxInt64} {
			var d Decision
			err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: cost}})
			if !errors.Is(err, errUnreachable) || d.Admitted || d.Verdicts[0].Result.RetryAfter != time.Minute {
				t.Errorf("fail %s, cost %d: err %v admitted=%v %+v, want denied with RetryAfter 1m", mode, cost, err, d.Admitted, d.Verdicts[0].Result)
			}
		}
		var d Decision
		_ = d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 1}})
		if want := mode != FailClosed; d.Admitted != want {
			t.Errorf("fail %s, cost 1: admitted=%v, want %v", mode, d.Admitted, want)
		}
	}
}

// badOverride resolves every tenant to a limit outside the domain, as a
// runtime override written by hand into Redis could.
type badOverride struct{}

func (badOverride) Lookup(*Policy, string) (Limit, bool) {
	return Limit{Rate: Rate{Limit: MaxCount + 1, Window: time.Minute}}, true
}

// TestInvalidInputIsNotAFailure: when the store refuses its input as
// invalid, DecideOrFallback returns ErrInvalidCheck and no fail mode
// decides (fail open would admit), and a breaker does not count it.
func TestInvalidInputIsNotAFailure(t *testing.T) {
	mem, _ := newTestStore(t, MemoryOptions{})
	fbStore, _ := newTestStore(t, MemoryOptions{})
	br := NewBreakerStore(mem, BreakerOptions{Failures: 1})
	p := &Policy{Name: "p", Algorithm: FixedWindow, FailMode: FailOpen, Limit: Limit{Rate: Rate{Limit: 10, Window: time.Minute}}}
	for range 3 {
		d := Decision{Overrides: badOverride{}}
		err := d.DecideOrFallback(bgCtx, br, Fallback{Store: fbStore, Scale: 1}, []Item{{Policy: p, Tenant: "t", Cost: 1}})
		if !errors.Is(err, ErrInvalidCheck) || d.Admitted || d.Verdicts[0].Path != PathStore {
			t.Fatalf("err %v admitted=%v path %v, want ErrInvalidCheck, not admitted, no fail mode", err, d.Admitted, d.Verdicts[0].Path)
		}
	}
	if br.Open() {
		t.Error("the breaker opened on invalid input")
	}
	if fbStore.Len() != 0 {
		t.Error("the fallback store was charged")
	}
}
