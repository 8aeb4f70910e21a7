package limiter

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// forEachMaster runs f on the standalone server or on every master of a
// cluster.
func forEachMaster(t *testing.T, c redis.UniversalClient, f func(c *redis.Client) error) {
	t.Helper()
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(bgCtx, func(_ context.Context, m *redis.Client) error { return f(m) })
	case *redis.Client:
		err = f(c)
	default:
		t.Fatalf("client %T", c)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestRedisResetScansNothing: Reset clears a tenant's buckets, its parts
// too, with no SCAN (the keyspace may be shared with millions of other
// keys), on a standalone server and on a 3-master cluster, and leaves
// other tenants alone.
func TestRedisResetScansNothing(t *testing.T) {
	for _, topo := range []string{"standalone", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			var client redis.UniversalClient
			if topo == "cluster" {
				client = redistest.StartCluster(t, 3, 0).Client(t)
			} else {
				client = redistest.StartStandalone(t, redistest.Options{}).Client(t)
			}
			s := NewRedisStore(RedisOptions{Client: client, Prefix: "rl", Timeout: testTimeout})
			check := func(algo Algorithm, tenant, policy, part string) Check {
				return Check{Algorithm: algo, Tenant: tenant, Policy: policy, Part: part, Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1}
			}
			var acme, other []Check
			for _, tn := range []string{"acme", "", "acme:x"} {
				cs := []Check{check(TokenBucket, tn, "api", "")}
				for _, part := range []string{"GET /a", "POST /b", "{x}:y", strings.Repeat("p", 300)} {
					cs = append(cs, check(FixedWindow, tn, "ep", part))
					cs = append(cs, check(SlidingLog, tn, "log", part))
				}
				if tn == "acme" {
					acme = cs
				} else {
					other = append(other, cs...)
				}
			}
			for _, c := range append(append([]Check{}, acme...), other...) {
				for range 2 {
					if ok, _ := mustDecide(t, s, c); !ok {
						t.Fatalf("denied: %+v", c)
					}
				}
			}
			// The index outlives every bucket it lists.
			idx := "rl:parts:{acme}:ep"
			idxTTL := client.PTTL(bgCtx, idx).Val()
			for _, k := range client.SMembers(bgCtx, idx).Val() {
				if ttl := client.PTTL(bgCtx, k).Val(); ttl <= 0 || ttl > idxTTL {
					t.Errorf("bucket %s TTL %v, index TTL %v", k, ttl, idxTTL)
				}
			}
			if n := client.SCard(bgCtx, idx).Val(); n != 4 {
				t.Errorf("index %s holds %d buckets, want 4", idx, n)
			}

			forEachMaster(t, client, func(c *redis.Client) error { return c.ConfigResetStat(bgCtx).Err() })
			if err := s.Reset(bgCtx, "acme", []string{"api", "ep", "log"}); err != nil {
				t.Fatal(err)
			}
			forEachMaster(t, client, func(c *redis.Client) error {
				stats := c.Info(bgCtx, "commandstats").Val()
				for _, cmd := range []string{"cmdstat_scan:", "cmdstat_keys:"} {
					if strings.Contains(stats, cmd) {
						t.Errorf("Reset ran %s on %s", strings.TrimSuffix(cmd, ":"), c.Options().Addr)
					}
				}
				return nil
			})
			for _, c := range acme {
				if got := mustPeek(t, s, c)[0].Remaining; got != 5 {
					t.Errorf("after reset, %s %s part %.20q: remaining %d, want 5", c.Algorithm, c.Policy, c.Part, got)
				}
			}
			for _, c := range other {
				if got := mustPeek(t, s, c)[0].Remaining; got != 3 {
					t.Errorf("tenant %q %s %s part %.20q: remaining %d, want 3 (untouched)", c.Tenant, c.Algorithm, c.Policy, c.Part, got)
				}
			}
			for _, k := range allKeys(t, client) {
				if strings.Contains(k, "{acme}") {
					t.Errorf("key %s left after the reset", k)
				}
			}
		})
	}
}

// TestRedisPartIndexPrunes: the partition index does not keep every part
// a tenant ever used: members whose buckets expired are dropped as new
// ones arrive, and a live member never is.
func TestRedisPartIndexPrunes(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Prefix: "rl", Timeout: testTimeout})
	decide := func(part string, window time.Duration) {
		c := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Part: part, Rate: Rate{Limit: 5, Window: window}, Cost: 1}
		if ok, _ := mustDecide(t, s, c); !ok {
			t.Fatalf("denied: %+v", c)
		}
	}
	const n = 100
	for i := range n {
		decide(fmt.Sprintf("old%d", i), 20*time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	for i := range n {
		decide(fmt.Sprintf("new%d", i), time.Hour)
	}
	idx := "rl:parts:{t}:p"
	if got := client.SCard(bgCtx, idx).Val(); got >= 2*n-20 {
		t.Errorf("index holds %d members after %d expired and %d live parts: expired ones are not pruned", got, n, n)
	}
	for i := range n {
		k := fmt.Sprintf("rl:fixed_window:{t}:p:new%d", i)
		if !client.SIsMember(bgCtx, idx, k).Val() {
			t.Fatalf("live bucket %s dropped from the index", k)
		}
	}
}

// TestRedisPartIndexAdoptsBuckets: a live bucket that is not in its
// index (written before indexes existed, or its index evicted) is added
// by its next write, whether the index is gone or outlives the bucket,
// and a reset then clears it.
func TestRedisPartIndexAdoptsBuckets(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Prefix: "rl", Timeout: testTimeout})
	c := Check{Algorithm: TokenBucket, Tenant: "t", Policy: "p", Part: "x", Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1}
	mustDecide(t, s, c)
	const idx, bucket = "rl:parts:{t}:p", "rl:token_bucket:{t}:p:x"
	client.Del(bgCtx, idx)
	mustDecide(t, s, c)
	if !client.SIsMember(bgCtx, idx, bucket).Val() {
		t.Fatalf("%s not adopted by %s", bucket, idx)
	}
	// The same while the index lives on, kept by a part with a longer TTL.
	long := c
	long.Part, long.Cost = "drained", 5
	mustDecide(t, s, long)
	client.SRem(bgCtx, idx, bucket)
	mustDecide(t, s, c)
	if !client.SIsMember(bgCtx, idx, bucket).Val() {
		t.Fatalf("%s not adopted by %s, which outlives it", bucket, idx)
	}
	if err := s.Reset(bgCtx, "t", []string{"p"}); err != nil {
		t.Fatal(err)
	}
	if got := mustPeek(t, s, c)[0].Remaining; got != 5 {
		t.Fatalf("after reset: remaining %d, want 5", got)
	}
}

// TestRedisResetInChunks: a tenant with more parts than one reset call
// deletes is reset over several calls, each bounded, and entirely.
func TestRedisResetInChunks(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Prefix: "rl", Timeout: testTimeout})
	const parts = 2*resetChunk + 500
	for i := range parts {
		c := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Part: fmt.Sprint(i), Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1}
		if ok, _ := mustDecide(t, s, c); !ok {
			t.Fatal("denied")
		}
	}
	if n := client.SCard(bgCtx, "rl:parts:{t}:p").Val(); n != parts {
		t.Fatalf("index holds %d parts, want %d", n, parts)
	}
	client.ConfigResetStat(bgCtx)
	if err := s.Reset(bgCtx, "t", []string{"p"}); err != nil {
		t.Fatal(err)
	}
	stats := client.Info(bgCtx, "commandstats").Val()
	if m := regexp.MustCompile(`cmdstat_spop:calls=(\d+),`).FindStringSubmatch(stats); m == nil || m[1] != "3" {
		t.Errorf("want 3 reset calls of %d parts at most: %q", resetChunk, stats)
	}
	if n := client.DBSize(bgCtx).Val(); n != 0 {
		t.Errorf("%d keys left after the reset", n)
	}
}
