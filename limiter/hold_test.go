package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// slotsPolicy is a concurrency policy of limit in-flight requests.
func slotsPolicy(name string, limit int64) *Policy {
	return &Policy{Name: name, Algorithm: Concurrency, FailMode: FailOpen, Limit: Limit{Rate: Rate{Limit: limit}}}
}

// inFlight returns the count Redis holds for tenant in policy (0 when its
// key does not exist).
func inFlight(t *testing.T, client redis.UniversalClient, tenant, policy string) int64 {
	t.Helper()
	key := string(AppendKey(nil, DefaultPrefix, Concurrency, tenant, policy, ""))
	n, err := client.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// holdState returns what the hold key of check c records: "held", "gone"
// or "" (none).
func holdState(t *testing.T, client redis.UniversalClient, c *Check) string {
	t.Helper()
	key := string(appendOnceKey(nil, DefaultPrefix, c.Tenant, c.Hold))
	v, err := client.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestHoldReleasedOnce: a slot taken under a hold is given back once,
// however often its release is sent, so a retried release never frees
// another request's slot (by count alone, the second release of d1 freed
// d2's).
func TestHoldReleasedOnce(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	p := slotsPolicy("c", 5)
	items := []Item{{Policy: p, Tenant: "acme", Cost: 1}}
	var d1, d2 Decision
	for _, d := range []*Decision{&d1, &d2} {
		if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
			t.Fatalf("decide: admitted %v, %v", d.Admitted, err)
		}
	}
	if d1.checks[0].Hold == "" || d1.checks[0].Hold == d2.checks[0].Hold {
		t.Fatalf("holds %q and %q, want two ids", d1.checks[0].Hold, d2.checks[0].Hold)
	}
	if got := inFlight(t, client, "acme", "c"); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
	if got := holdState(t, client, &d1.checks[0]); got != "held" {
		t.Fatalf("hold of d1 %q, want held", got)
	}
	retry := append([]Check(nil), d1.checks...)
	if err := d1.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	// The same release again, as the Recorder retries one whose reply
	// was lost.
	if err := s.releaseLost(bgCtx, retry); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after d1's release sent twice, want 1 (d2's)", got)
	}
	if got := holdState(t, client, &retry[0]); got != "gone" {
		t.Fatalf("hold of d1 %q after its retried release, want gone", got)
	}
	if err := d2.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d, want 0", got)
	}
	if got := holdState(t, client, &d2.checks[0]); got != "" {
		t.Fatalf("hold of d2 %q after its release, want none", got)
	}
	// "gone" lasts IdempotencyTTL; a released hold nothing.
	key := string(appendOnceKey(nil, DefaultPrefix, "acme", retry[0].Hold))
	if ttl := client.PTTL(bgCtx, key).Val(); ttl <= IdempotencyTTL-5*time.Second || ttl > IdempotencyTTL {
		t.Fatalf("TTL of a gone hold %v, want about %v (release.lua's GONE_TTL_MS)", ttl, IdempotencyTTL)
	}
}

// TestHoldReleaseBeforeAcquire: a release that runs before its acquire (the
// caller gave up on the acquire's reply while the call waited in Redis)
// keeps the acquire from taking the slot. By count alone the release found
// nothing to give back and the acquire then took a slot no one releases.
func TestHoldReleaseBeforeAcquire(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	c := Check{Algorithm: Concurrency, Tenant: "acme", Policy: "c", Rate: Rate{Limit: 5}, Cost: 1, Hold: NewChargeID()}
	if err := s.releaseLost(bgCtx, []Check{c}); err != nil {
		t.Fatal(err)
	}
	res := make([]Result, 1)
	admitted, err := s.Decide(bgCtx, []Check{c}, res)
	if err != nil {
		t.Fatal(err)
	}
	if admitted || res[0].Allowed {
		t.Fatalf("acquire after its release: admitted %v, allowed %v; want neither", admitted, res[0].Allowed)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d, want 0", got)
	}
	// Another request is not affected.
	c.Hold = NewChargeID()
	if admitted, err := s.Decide(bgCtx, []Check{c}, res); err != nil || !admitted {
		t.Fatalf("another acquire: admitted %v, %v", admitted, err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
}

// TestHoldCluster: a request with concurrency checks in several cluster
// slots (two tenants) and a token bucket holds each slot under its own
// id, in its own slot, and gives each back once.
func TestHoldCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	client := cl.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	p, tb := slotsPolicy("c", 5), &Policy{Name: "tb", Algorithm: TokenBucket, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Minute}}}
	items := []Item{{Policy: p, Tenant: "acme", Cost: 1}, {Policy: tb, Tenant: "acme", Cost: 1}, {Policy: p, Tenant: "globex", Cost: 2}}
	var d Decision
	if err := d.Decide(bgCtx, s, items); err != nil || !d.Admitted {
		t.Fatalf("decide: admitted %v, %v", d.Admitted, err)
	}
	if a, g := inFlight(t, client, "acme", "c"), inFlight(t, client, "globex", "c"); a != 1 || g != 2 {
		t.Fatalf("in flight acme %d globex %d, want 1 and 2", a, g)
	}
	retry := append([]Check(nil), d.checks[0], d.checks[2])
	for i := range retry {
		if got := holdState(t, client, &retry[i]); got != "held" {
			t.Fatalf("hold %d: %q, want held", i, got)
		}
	}
	if err := d.Release(bgCtx, Fallback{}); err != nil {
		t.Fatal(err)
	}
	if err := s.releaseLost(bgCtx, retry); err != nil {
		t.Fatal(err)
	}
	if a, g := inFlight(t, client, "acme", "c"), inFlight(t, client, "globex", "c"); a != 0 || g != 0 {
		t.Fatalf("in flight acme %d globex %d after the release sent twice, want 0 and 0", a, g)
	}

	// A request its second slot denies: the first slot's charge is given
	// back with its record (a release, which deletes it).
	var full, denied Decision
	if err := full.Decide(bgCtx, s, []Item{{Policy: p, Tenant: "globex", Cost: 5}}); err != nil || !full.Admitted {
		t.Fatalf("filling globex: admitted %v, %v", full.Admitted, err)
	}
	if err := denied.Decide(bgCtx, s, []Item{{Policy: p, Tenant: "acme", Cost: 1}, {Policy: p, Tenant: "globex", Cost: 1}}); err != nil || denied.Admitted {
		t.Fatalf("cross-slot denial: admitted %v, %v", denied.Admitted, err)
	}
	if a, g := inFlight(t, client, "acme", "c"), inFlight(t, client, "globex", "c"); a != 0 || g != 5 {
		t.Fatalf("in flight acme %d globex %d after a cross-slot denial, want 0 and 5", a, g)
	}
	if got := holdState(t, client, &denied.checks[0]); got != "" {
		t.Fatalf("record of the slot given back after a cross-slot denial: %q, want none", got)
	}
}

// TestHoldAcquireSentAgain: an acquire that runs twice (a client library
// that sends a call again after its connection broke) charges once and
// answers admitted both times. Treating its own record as a release that
// came first denied the live request and left the first run's slot taken.
func TestHoldAcquireSentAgain(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	tb := Check{Algorithm: TokenBucket, Tenant: "acme", Policy: "tb", Rate: Rate{Limit: 100, Window: time.Minute}, Cost: 1}
	c := Check{Algorithm: Concurrency, Tenant: "acme", Policy: "c", Rate: Rate{Limit: 5}, Cost: 1, Hold: NewChargeID()}
	checks := []Check{tb, c}
	res := make([]Result, 2)
	for run := range 2 {
		admitted, err := s.Decide(bgCtx, checks, res)
		if err != nil || !admitted || !res[0].Allowed || !res[1].Allowed {
			t.Fatalf("run %d: admitted %v (%+v), %v; want admitted", run, admitted, res, err)
		}
		if res[1].Remaining != 4 || res[0].Remaining != 99 {
			t.Fatalf("run %d: remaining %d and %d, want 99 and 4 (charged once)", run, res[0].Remaining, res[1].Remaining)
		}
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	if err := s.Release(bgCtx, []Check{c}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d after the release, want 0", got)
	}
}

// TestHoldRecordGone: a request whose record is gone when it releases (it
// held its slot longer than the record lives, or Redis evicted the record)
// still gives its slot back: its release knows the acquire ran. A retry,
// which cannot know, gives nothing back.
func TestHoldRecordGone(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	// A concurrency check of cost 0 first: it takes nothing, and must not
	// take the next check's hold key.
	peek := Check{Algorithm: Concurrency, Tenant: "acme", Policy: "c", Rate: Rate{Limit: 5}}
	c := Check{Algorithm: Concurrency, Tenant: "acme", Policy: "c", Rate: Rate{Limit: 5}, Cost: 1, Hold: NewChargeID()}
	other := c
	other.Hold = NewChargeID()
	res := make([]Result, 2)
	for _, cc := range []Check{c, other} {
		if admitted, err := s.Decide(bgCtx, []Check{peek, cc}, res); err != nil || !admitted {
			t.Fatalf("acquire: admitted %v, %v", admitted, err)
		}
	}
	if got := inFlight(t, client, "acme", "c"); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
	if err := client.Del(bgCtx, string(appendOnceKey(nil, DefaultPrefix, "acme", c.Hold))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bgCtx, []Check{peek, c}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after a release without its record, want 1", got)
	}
	if err := s.releaseLost(bgCtx, []Check{peek, c}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after a retried release, want 1 (the other request's)", got)
	}
	if got := holdState(t, client, &other); got != "held" {
		t.Fatalf("the other request's record: %q, want held", got)
	}
}

// TestHoldLateRelease: a request's own release that arrives after the
// Recorder's retry of it (sent on another connection, delayed) finds the
// slot released, and gives nothing back a second time.
func TestHoldLateRelease(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	c := Check{Algorithm: Concurrency, Tenant: "acme", Policy: "c", Rate: Rate{Limit: 5}, Cost: 1, Hold: NewChargeID()}
	other := c
	other.Hold = NewChargeID()
	res := make([]Result, 1)
	for _, cc := range []Check{c, other} {
		if admitted, err := s.Decide(bgCtx, []Check{cc}, res); err != nil || !admitted {
			t.Fatalf("acquire: admitted %v, %v", admitted, err)
		}
	}
	if err := s.releaseLost(bgCtx, []Check{c}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bgCtx, []Check{c}); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after a retry and a late release of one request, want 1 (the other's)", got)
	}
}
