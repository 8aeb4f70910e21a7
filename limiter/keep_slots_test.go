package limiter

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestKeepSlotsAlive: a request holding a slot longer than its counter's
// idle TTL, with no other acquire in its bucket, keeps the counter (and
// so its slot) alive while it runs, through the stores that wrap Redis
// in production; once it stops, the counter idles out as before. The
// counter's TTL is cut to 300 ms to stand for the 10 minutes.
func TestKeepSlotsAlive(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	br := NewBreakerStore(rs, BreakerOptions{})
	defer br.Close()
	p := slotsPolicy("c", 1)
	items := []Item{{Policy: p, Tenant: "acme", Cost: 1}}
	key := string(AppendKey(nil, DefaultPrefix, Concurrency, "acme", "c", ""))
	expireSoon := func() {
		t.Helper()
		if !client.PExpire(bgCtx, key, 300*time.Millisecond).Val() {
			t.Fatalf("no counter %s", key)
		}
	}

	var d Decision
	if err := d.Decide(bgCtx, br, items); err != nil || !d.Admitted {
		t.Fatalf("decide: admitted %v, %v", d.Admitted, err)
	}
	stop := d.KeepSlotsAlive(100 * time.Millisecond)
	expireSoon()
	time.Sleep(700 * time.Millisecond)
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after the counter's TTL passed while the request ran, want 1", got)
	}
	if ttl := client.PTTL(bgCtx, key).Val(); ttl < RedisConcurrencyTTL-time.Minute {
		t.Fatalf("counter PTTL %v while kept, want about %v", ttl, RedisConcurrencyTTL)
	}
	// The bucket is full: another request is denied, as the limit says.
	var other Decision
	if err := other.Decide(bgCtx, br, items); err != nil || other.Admitted {
		t.Fatalf("a second request with the slot taken: admitted %v, %v", other.Admitted, err)
	}

	stop()
	expireSoon()
	time.Sleep(700 * time.Millisecond)
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d after the keeping stopped and the TTL passed, want 0 (the counter idled out)", got)
	}
	if err := d.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}

	// Nothing to keep: a denied request, and the embedded store.
	other.KeepSlotsAlive(time.Millisecond)()
	m := NewMemoryStore(MemoryOptions{})
	defer m.Close()
	var local Decision
	if err := local.Decide(bgCtx, m, items); err != nil || !local.Admitted {
		t.Fatalf("embedded: admitted %v, %v", local.Admitted, err)
	}
	if storeUnder[*RedisStore](local.decidedBy) != nil || storeUnder[*RedisStore](d.decidedBy) != rs {
		t.Fatal("storeUnder does not tell the Redis store under the breaker from the embedded store")
	}
	local.KeepSlotsAlive(time.Millisecond)()
}

// BenchmarkKeepSlotsAlive is what keeping a Redis concurrency request's
// slots adds to it: starting the keeping after the decision and stopping
// it before the release (a request shorter than the interval never
// refreshes). Beside it, the request's own calls: the acquire and the
// release, one script call each.
func BenchmarkKeepSlotsAlive(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	client := srv.Client(b)
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Functions: true})
	br := NewBreakerStore(rs, BreakerOptions{})
	defer br.Close()
	items := []Item{{Policy: slotsPolicy("c", 1<<40), Tenant: "acme", Cost: 1}}
	var d Decision
	if err := d.Decide(bgCtx, br, items); err != nil || !d.Admitted {
		b.Fatalf("decide: admitted %v, %v", d.Admitted, err)
	}
	b.Run("keep", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d.KeepSlotsAlive(KeepSlotsEvery)()
		}
	})
	if err := d.Release(bgCtx, Fallback{}); err != nil {
		b.Fatal(err)
	}
	// redis-usec/op: Redis's time in the two calls of the function
	// library (the acquire, with its slot's lease, and the release).
	b.Run("acquire_release", func(b *testing.B) {
		b.ReportAllocs()
		_, usec0 := scriptStats(b, client)
		defer func() {
			_, usec := scriptStats(b, client)
			b.ReportMetric((usec-usec0)/float64(b.N), "redis-usec/op")
		}()
		for b.Loop() {
			var d Decision
			if err := d.Decide(bgCtx, br, items); err != nil || !d.Admitted {
				b.Fatalf("decide: admitted %v, %v", d.Admitted, err)
			}
			if err := d.Release(bgCtx, Fallback{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestKeepSlotsAliveBreakerOpen: while the store's breaker is open, a
// running request sends no renewal (each would only wait out its
// timeout on a Redis that does not answer); before and after, it does.
func TestKeepSlotsAliveBreakerOpen(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	var renewals atomic.Int64
	rs := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Observe: func(script, _ string, _ time.Duration) {
		if script == "keep" {
			renewals.Add(1)
		}
	}})
	br := NewBreakerStore(rs, BreakerOptions{Cooldown: time.Hour})
	defer br.Close()
	var d Decision
	if err := d.Decide(bgCtx, br, []Item{{Policy: slotsPolicy("c", 1), Tenant: "acme", Cost: 1}}); err != nil || !d.Admitted {
		t.Fatalf("decide: admitted %v, %v", d.Admitted, err)
	}
	stop := d.KeepSlotsAlive(20 * time.Millisecond)
	defer stop()
	time.Sleep(200 * time.Millisecond)
	if renewals.Load() == 0 {
		t.Fatal("no renewal in 200 ms at one every 20 ms with the breaker closed")
	}
	br.trip(br.epoch.Load(), errors.New("test: Redis away"))
	time.Sleep(40 * time.Millisecond) // a renewal already under way ends
	before := renewals.Load()
	time.Sleep(200 * time.Millisecond)
	if n := renewals.Load() - before; n != 0 {
		t.Errorf("%d renewals sent in 200 ms with the breaker open, want 0", n)
	}
}
