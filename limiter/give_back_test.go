package limiter

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestGiveBackAt: Decision.GiveBack gives a request's units back on both
// stores and for every algorithm but concurrency, at the instant they were
// charged (Result.At): in the same window they all go back; once the
// window rolled, a sliding window takes them off its previous window, a
// fixed window and a log have nothing left to give back (those units no
// longer count), and a token bucket or GCRA bucket is refilled, never
// beyond full.
func TestGiveBackAt(t *testing.T) {
	for _, target := range conformanceTargets(t) {
		for _, tc := range []struct {
			algo            Algorithm
			rolled, rolled0 int64 // remaining after the roll, with and without the give-back
		}{
			{TokenBucket, 100, 98},
			{GCRA, 100, 98},
			{SlidingWindow, 98, 93},
			{FixedWindow, 98, 98},
			{SlidingLog, 98, 98},
		} {
			t.Run(target.name+"/"+tc.algo.String(), func(t *testing.T) {
				s, clk := target.new(t)
				p := meteredPolicy("p", tc.algo)
				c := Check{Algorithm: tc.algo, Tenant: "t", Policy: "p", Rate: p.Limit.Rate}
				remaining := func() int64 { t.Helper(); return mustPeek(t, s, c)[0].Remaining }
				decide := func(cost int64) *Decision {
					t.Helper()
					d := new(Decision)
					if err := d.Decide(bgCtx, s, []Item{{Policy: p, Tenant: "t", Cost: cost}}); err != nil || !d.Admitted {
						t.Fatalf("cost %d: admitted %v, %v", cost, d.Admitted, err)
					}
					if at := d.results[0].At; at != clk.Now().UnixNano() {
						t.Fatalf("charged at %d, want the store's now %d", at, clk.Now().UnixNano())
					}
					return d
				}
				all := []bool{true}

				// Same window: every unit goes back.
				d1, d2 := decide(3), decide(4)
				if err := d1.GiveBack(bgCtx, Fallback{}, all); err != nil {
					t.Fatal(err)
				}
				if got := remaining(); got != 96 {
					t.Fatalf("after giving 3 of 7 back: remaining %d, want 96", got)
				}
				if err := d2.GiveBack(bgCtx, Fallback{}, []bool{false}); err != nil {
					t.Fatal(err)
				}
				if got := remaining(); got != 96 {
					t.Fatalf("a verdict not selected was given back: remaining %d, want 96", got)
				}

				// A minute later (the next window): 5 charged before, 2 now.
				clk.Advance(time.Hour)
				d5 := decide(5)
				clk.Advance(time.Minute)
				decide(2)
				if got := remaining(); got != tc.rolled0 {
					t.Fatalf("before the give-back: remaining %d, want %d", got, tc.rolled0)
				}
				if err := d5.GiveBack(bgCtx, Fallback{}, all); err != nil {
					t.Fatal(err)
				}
				if got := remaining(); got != tc.rolled {
					t.Fatalf("after giving back 5 units of the last window: remaining %d, want %d", got, tc.rolled)
				}
			})
		}
	}
}

// TestGiveBackLeased: a request served from a lease, and the one whose
// refill took the lease, give their units back to the shared bucket at
// the lease's instant, so a window bucket gets them back too.
func TestGiveBackLeased(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			rs := NewRedisStore(RedisOptions{Client: srv.Client(t), Prefix: "gb" + algo.String(), Timeout: testTimeout})
			clk := newManualClock(baseTime)
			rs.now = func() int64 { return clk.Now().UnixMicro() }
			ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: rs, Clock: clk, SweepInterval: -1})
			t.Cleanup(func() { ls.Close() })
			p := meteredPolicy("p", algo)
			p.Lease = Lease{Max: 10, TTL: time.Hour}
			items := []Item{{Policy: p, Tenant: "t", Cost: 1}}
			// The first request is decided (demand 1: a lease of one unit
			// would be a decision); the second takes a lease of two (a
			// refill, served from it); demand grows the next ones: keep
			// the second and two requests served from a lease.
			first := new(Decision)
			if err := first.Decide(bgCtx, ls, items); err != nil || !first.Admitted {
				t.Fatal(first.Admitted, err)
			}
			refill := new(Decision)
			if err := refill.Decide(bgCtx, ls, items); err != nil || !refill.Admitted || refill.Verdicts[0].Result.From != OriginStore {
				t.Fatal(refill.Admitted, err)
			}
			if n := ls.Stats()["p"].Acquired; n != 2 {
				t.Fatalf("the second request's refill acquired %d units, want a lease of 2", n)
			}
			ds := []*Decision{refill}
			for i := 0; len(ds) < 3; i++ {
				if i == 20 {
					t.Fatal("no request was served from a lease")
				}
				d := new(Decision)
				if err := d.Decide(bgCtx, ls, items); err != nil || !d.Admitted {
					t.Fatal(d.Admitted, err)
				}
				if d.Verdicts[0].Result.From == OriginLease {
					ds = append(ds, d)
				}
			}
			c := Check{Algorithm: algo, Tenant: "t", Policy: "p", Rate: p.Limit.Rate}
			before := mustPeek(t, rs, c)[0].Remaining
			for _, d := range ds {
				if err := d.GiveBack(bgCtx, Fallback{}, []bool{true}); err != nil {
					t.Fatal(err)
				}
			}
			if after := mustPeek(t, rs, c)[0].Remaining; after != before+3 {
				t.Fatalf("Redis holds %d after three leased requests gave their units back, want %d", after, before+3)
			}
		})
	}
}

// TestGiveBackRedisPaused: a give-back whose Redis is paused (SIGSTOP)
// times out, is kept with its id by the Recorder, and lands once when
// Redis is back: every unit of the window buckets comes back, and a second
// flush of the same call (a retry whose reply was lost) gives back
// nothing more.
func TestGiveBackRedisPaused(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true // as the module's clients: the store's timeout bounds a call
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: 300 * time.Millisecond})
	rec := NewRecorder(RecorderOptions{})
	fbStore, _ := newTestStore(t, MemoryOptions{})
	fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
	for _, algo := range []Algorithm{SlidingWindow, FixedWindow, SlidingLog} {
		t.Run(algo.String(), func(t *testing.T) {
			p := meteredPolicy("paused"+algo.String(), algo)
			c := Check{Algorithm: algo, Tenant: "t", Policy: p.Name, Rate: p.Limit.Rate}
			// Redis's clock decides here: the subtest (about half a second)
			// must not cross the minute window's edge, or the charges and
			// the give-back land in different windows.
			awayFromWindowEdge(t, p.Limit.Rate.Window, 5*time.Second)
			var ds []*Decision
			for _, cost := range []int64{3, 4} {
				d := new(Decision)
				if err := d.Decide(bgCtx, rs, []Item{{Policy: p, Tenant: "t", Cost: cost}}); err != nil || !d.Admitted {
					t.Fatal(d.Admitted, err)
				}
				ds = append(ds, d)
			}
			srv.Pause()
			err := ds[0].GiveBack(bgCtx, fb, []bool{true})
			srv.Resume()
			if err == nil {
				t.Fatal("a give-back to a paused Redis succeeded")
			}
			if rec.Pending() != 1 {
				t.Fatalf("Recorder keeps %d calls, want the give-back", rec.Pending())
			}
			// What the paused call may have done reaches Redis once it runs.
			time.Sleep(100 * time.Millisecond)
			var calls int
			once := chargeFunc(func(id string, checks []Check, charged []int64) error {
				calls++
				// The retry, then the same call again (as if its reply
				// were lost): applied once.
				if err := rs.Charge(bgCtx, id, checks, charged); err != nil {
					return err
				}
				return rs.Charge(bgCtx, id, checks, charged)
			})
			if _, err := rec.Flush(bgCtx, once); err != nil {
				t.Fatal(err)
			}
			if calls != 1 || rec.Pending() != 0 {
				t.Fatalf("flush made %d calls, %d left", calls, rec.Pending())
			}
			if got := mustPeek(t, rs, c)[0].Remaining; got != 96 {
				t.Fatalf("Redis holds %d units after the give-back of 3 of 7, want 96 (given back once)", got)
			}
		})
	}
}

// awayFromWindowEdge waits, when less than margin is left of the current
// window of length w (aligned to the Unix epoch, as fixed windows are), for
// the next one, so that a test on the wall clock stays in one window.
func awayFromWindowEdge(t *testing.T, w, margin time.Duration) {
	t.Helper()
	if left := w - time.Duration(time.Now().UnixNano()%int64(w)); left < margin {
		time.Sleep(left + 50*time.Millisecond)
	}
}

// TestGiveBackFallbackAfterFlush: a request the fallback decided gives
// its units back (refund_status) after they were sent to Redis: the
// give-back goes to Redis, under an id. (It was taken off the recorded
// units only, which were gone: Redis kept the unit.)
func TestGiveBackFallbackAfterFlush(t *testing.T) {
	fbStore, _ := newTestStore(t, MemoryOptions{})
	rec := NewRecorder(RecorderOptions{})
	fb := Fallback{Store: fbStore, Scale: 1, Recorder: rec}
	p := &Policy{Name: "api", Algorithm: FixedWindow, FailMode: FailLocal, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Hour}}}
	var d Decision
	if err := d.DecideOrFallback(bgCtx, brokenStore{}, fb, []Item{{Policy: p, Tenant: "t", Cost: 1}}); !errors.Is(err, errUnreachable) || !d.Admitted {
		t.Fatal(d.Admitted, err)
	}
	moved := flushTotal(t, rec)
	if err := d.GiveBack(bgCtx, fb, []bool{true}); err != nil {
		t.Fatal(err)
	}
	if moved += flushTotal(t, rec); moved != 0 {
		t.Fatalf("Redis was moved %d units in all, want 0 (the request was refunded)", moved)
	}
}
