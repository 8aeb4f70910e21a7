package limiter

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// testTimeout is the store Timeout of tests that are not about deadlines:
// generous, so a loaded machine (-race) does not fail them.
const testTimeout = 5 * time.Second

// allKeys returns every key of a standalone server.
func allKeys(t *testing.T, c redis.UniversalClient) []string {
	t.Helper()
	var keys []string
	var cursor uint64
	for {
		ks, next, err := c.Scan(bgCtx, cursor, "*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ks...)
		if next == 0 {
			return keys
		}
		cursor = next
	}
}

// keyLayout is AppendKey's: <prefix>:<algo>:{<tenant>}:<policy>[:<key>].
var keyLayout = regexp.MustCompile(`^[A-Za-z0-9_.-]+:(token_bucket|gcra|sliding_window|fixed_window|sliding_log|concurrency):\{[^{}:]*\}:[A-Za-z0-9_.-]+(:[^{}:]+)?$`)

// partIndexLayout is a partition index's: <prefix>:parts:{<tenant>}:<policy>.
var partIndexLayout = regexp.MustCompile(`^[A-Za-z0-9_.-]+:parts:\{[^{}:]*\}:[A-Za-z0-9_.-]+$`)

// TestRedisKeyTTL: after traffic on every algorithm, every key has the
// layout of AppendKey and a TTL of at most 2 x its window (the safety TTL
// for concurrency), and it ends when the bucket is fresh again.
func TestRedisKeyTTL(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	window := 10 * time.Second
	for _, algo := range benchAlgorithms {
		for _, part := range []string{"", "GET /x"} {
			c := Check{Algorithm: algo, Tenant: "t-" + algo.String(), Policy: "p", Part: part, Rate: Rate{Limit: 10, Window: window}, Cost: 1}
			for i := 0; i < 5; i++ {
				if ok, _ := mustDecide(t, s, c); !ok {
					t.Fatalf("%s: denied", algo)
				}
			}
		}
	}
	// A multi-policy request with every algorithm.
	var multi []Check
	for _, algo := range benchAlgorithms {
		multi = append(multi, Check{Algorithm: algo, Tenant: "multi", Policy: "m" + algo.String(), Rate: Rate{Limit: 10, Window: window}, Cost: 3})
	}
	if ok, _ := mustDecide(t, s, multi...); !ok {
		t.Fatal("multi denied")
	}
	// A sliding log with a min_interval longer than its window keeps its key
	// for min_interval.
	mi := Check{Algorithm: SlidingLog, Tenant: "mi", Policy: "p", Rate: Rate{Limit: 10, Window: window, MinInterval: 15 * time.Second}, Cost: 1}
	mustDecide(t, s, mi)

	keys := allKeys(t, client)
	// Buckets, and one partition index per tenant with parts.
	if want := 3*len(benchAlgorithms) + len(multi) + 1; len(keys) != want {
		t.Fatalf("%d keys, want %d: %q", len(keys), want, keys)
	}
	for _, k := range keys {
		if partIndexLayout.MatchString(k) {
			// As long as its longest-lived bucket.
			// rl:parts:{t-<algo>}:p lists rl:<algo>:{t-<algo>}:p:GET /x.
			ttl := client.PTTL(bgCtx, k).Val()
			tag, _, _ := strings.Cut(strings.TrimPrefix(k, "rl:parts:{"), "}")
			bucket := "rl:" + strings.TrimPrefix(tag, "t-") + ":{" + tag + "}:p:GET /x"
			if want := client.PTTL(bgCtx, bucket).Val(); ttl < want || ttl <= 0 {
				t.Errorf("%s: PTTL %s, shorter than its bucket %s's %s", k, ttl, bucket, want)
			}
			continue
		}
		if !keyLayout.MatchString(k) {
			t.Errorf("key %q does not follow <prefix>:<algo>:{<tenant>}:<policy>[:<key>]", k)
		}
		ttl, err := client.PTTL(bgCtx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		limit := 2 * window
		switch {
		case strings.Contains(k, ":concurrency:"):
			if ttl > RedisConcurrencyTTL || ttl < RedisConcurrencyTTL-time.Minute {
				t.Errorf("%s: PTTL %s, want about %s", k, ttl, RedisConcurrencyTTL)
			}
			continue
		case strings.HasPrefix(k, "rl:sliding_log:{mi}"):
			limit = 15 * time.Second
		}
		if ttl <= 0 || ttl > limit {
			t.Errorf("%s: PTTL %s, want in (0, %s]", k, ttl, limit)
		}
	}

	// A burst larger than 2 x limit refills over burst/limit windows: the
	// key lives exactly that long, not less (a fresh bucket early would
	// admit too much).
	tb := Check{Algorithm: TokenBucket, Tenant: "burst", Policy: "p", Rate: Rate{Limit: 1, Window: time.Second, Burst: 30}, Cost: 30}
	mustDecide(t, s, tb)
	if ttl := client.PTTL(bgCtx, "rl:token_bucket:{burst}:p").Val(); ttl <= 29*time.Second || ttl > 30*time.Second {
		t.Errorf("token bucket burst 30 at 1/s: PTTL %s, want about 30s", ttl)
	}

	// Expiry means fresh: once the TTL has passed the key is gone and the
	// bucket is full.
	for _, algo := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog} {
		c := Check{Algorithm: algo, Tenant: "short", Policy: "p", Rate: Rate{Limit: 2, Window: 100 * time.Millisecond}, Cost: 2}
		mustDecide(t, s, c)
		key := string(AppendKey(nil, "rl", algo, "short", "p", ""))
		ttl := client.PTTL(bgCtx, key).Val()
		if ttl <= 0 || ttl > 200*time.Millisecond {
			t.Fatalf("%s: PTTL %s", algo, ttl)
		}
		time.Sleep(ttl + 20*time.Millisecond)
		if n := client.Exists(bgCtx, key).Val(); n != 0 {
			t.Fatalf("%s: key still there after its TTL", algo)
		}
		if got := mustPeek(t, s, withCost(c, 0))[0]; got != wantAllow(2, 0) {
			t.Fatalf("%s after expiry: %+v", algo, got)
		}
	}

	// A concurrency bucket back at zero is deleted; releasing a missing one
	// creates nothing.
	cc := Check{Algorithm: Concurrency, Tenant: "cc", Policy: "p", Rate: Rate{Limit: 2}, Cost: 2}
	mustDecide(t, s, cc)
	if err := s.Release(bgCtx, []Check{cc}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(bgCtx, []Check{cc}); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(bgCtx, "rl:concurrency:{cc}:p").Val(); n != 0 {
		t.Fatal("released concurrency bucket still stored")
	}
}

// TestRedisNothingStoredUncharged: peeks and denied requests write nothing.
func TestRedisNothingStoredUncharged(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
	for _, algo := range benchAlgorithms {
		c := Check{Algorithm: algo, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1, Window: time.Minute}, Cost: 1}
		mustPeek(t, s, c)
		mustDecide(t, s, withCost(c, 0))
		mustDecide(t, s, withCost(c, 2)) // never fits
		deny := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "deny", Rate: Rate{Limit: 1, Window: time.Minute}, Cost: 5}
		if ok, _ := mustDecide(t, s, c, deny); ok {
			t.Fatal("admitted")
		}
	}
	if n := client.DBSize(bgCtx).Val(); n != 0 {
		t.Fatalf("%d keys written: %q", n, allKeys(t, client))
	}
}

// TestRedisScriptFlush: SCRIPT FLUSH and FUNCTION FLUSH in the middle of
// traffic lose no decision: FCALL answers "Function not found" (EVALSHA
// NOSCRIPT) and the store sends the library (the script) again.
func TestRedisScriptFlush(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	var noscript, calls atomic.Int64
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Observe: func(script, result string, d time.Duration) {
		calls.Add(1)
		if result == "noscript" {
			noscript.Add(1)
		}
	}})
	const workers, perWorker = 4, 400
	checks := []Check{
		{Algorithm: FixedWindow, Tenant: "t", Policy: "fw", Rate: Rate{Limit: 1 << 40, Window: MaxWindow}, Cost: 1},
		{Algorithm: SlidingLog, Tenant: "t", Policy: "log", Rate: Rate{Limit: workers * perWorker, Window: MaxWindow}, Cost: 1},
	}
	stop := make(chan struct{})
	flushed := make(chan int)
	go func() {
		n := 0
		defer func() { flushed <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				// The batcher calls the library's functions: flush
				// them too, alternately.
				err := client.ScriptFlush(bgCtx).Err()
				if n%2 == 1 {
					err = client.FunctionFlush(bgCtx).Err()
				}
				if err != nil {
					t.Error(err)
					return
				}
				n++
			}
		}
	}()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make([]Result, len(checks))
			for i := 0; i < perWorker; i++ {
				ok, err := s.Decide(bgCtx, checks, res)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	nflush := <-flushed
	if got := admitted.Load(); got != workers*perWorker {
		t.Fatalf("admitted %d of %d", got, workers*perWorker)
	}
	res := mustPeek(t, s, withCost(checks[0], 0), withCost(checks[1], 0))
	if res[0].Remaining != 1<<40-workers*perWorker || res[1].Remaining != 0 {
		t.Fatalf("after traffic: %+v", res)
	}
	if nflush < 5 || noscript.Load() == 0 {
		t.Fatalf("%d flushes, %d NOSCRIPT answers: the fallback was not exercised", nflush, noscript.Load())
	}
	t.Logf("%d SCRIPT FLUSH, %d NOSCRIPT fallbacks in %d calls", nflush, noscript.Load(), calls.Load())
}

// hammer runs 8 goroutines x 300 Decides of checks and returns how many
// were admitted.
func hammer(t *testing.T, s Store, checks []Check) int64 {
	t.Helper()
	return hammerStores(t, []Store{s}, 8, 300, checks)
}

// hammerStores runs, on each store, workers goroutines of n Decides of
// checks and returns how many were admitted in all.
func hammerStores(t *testing.T, stores []Store, workers, n int, checks []Check) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range workers {
			wg.Go(func() {
				res := make([]Result, len(checks))
				for range n {
					ok, err := s.Decide(bgCtx, checks, res)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted.Load()
}

// exactUnderConcurrency: 2400 requests on a bucket of 1000 admit exactly
// 1000, for every algorithm. Windows are as long as allowed so that
// nothing refills or rolls during the test.
func exactUnderConcurrency(t *testing.T, s Store, tenant string) {
	for _, algo := range benchAlgorithms {
		t.Run(algo.String(), func(t *testing.T) {
			c := Check{Algorithm: algo, Tenant: tenant, Policy: "p", Rate: Rate{Limit: 1000, Window: MaxWindow}, Cost: 1}
			if algo == Concurrency {
				c.Rate.Window = 0
			}
			if got := hammer(t, s, []Check{c}); got != 1000 {
				t.Fatalf("admitted %d, want exactly 1000", got)
			}
		})
	}
}

func TestRedisExactUnderConcurrency(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := NewRedisStore(RedisOptions{Client: srv.Client(t), Timeout: testTimeout})
	exactUnderConcurrency(t, s, "t")
}

// TestRedisDeadline: a server that stops answering (SIGSTOP) makes calls
// fail at the store's Timeout, not later; the store works again once the
// server resumes.
func TestRedisDeadline(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	var timeouts atomic.Int64
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 50 * time.Millisecond, Observe: func(script, result string, d time.Duration) {
		if result == "timeout" {
			timeouts.Add(1)
		}
	}})
	c := tbCheck("t", "p", 100, time.Minute)
	mustDecide(t, s, c)

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	for _, op := range []string{"decide", "peek", "release", "reset"} {
		start := time.Now()
		var err error
		switch op {
		case "decide":
			_, err = s.Decide(bgCtx, []Check{c}, make([]Result, 1))
		case "peek":
			err = s.Peek(bgCtx, []Check{c}, make([]Result, 1))
		case "release":
			err = s.Release(bgCtx, []Check{{Algorithm: Concurrency, Tenant: "t", Policy: "c", Rate: Rate{Limit: 1}, Cost: 1}})
		case "reset":
			err = s.Reset(bgCtx, "t", []string{"p"})
		}
		elapsed := time.Since(start)
		if err == nil {
			t.Fatalf("%s on a stopped server: no error", op)
		}
		if elapsed > 150*time.Millisecond {
			t.Fatalf("%s: error after %s with a 50ms timeout: %v", op, elapsed, err)
		}
		t.Logf("%s: %v after %s", op, err, elapsed)
	}
	if timeouts.Load() == 0 {
		t.Error("Observe saw no timeout")
	}
	// The caller's own deadline applies when it is shorter.
	ctx, cancel := context.WithTimeout(bgCtx, 10*time.Millisecond)
	start := time.Now()
	_, err := s.Decide(ctx, []Check{c}, make([]Result, 1))
	cancel()
	if err == nil || time.Since(start) > 40*time.Millisecond {
		t.Fatalf("caller deadline 10ms: %v after %s", err, time.Since(start))
	}

	srv.Resume()
	resumed = true
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store still failing after resume: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisRealTime: without the test hook, time comes from Redis TIME.
func TestRedisRealTime(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Prefix: "real", Timeout: testTimeout})
	c := Check{Algorithm: SlidingLog, Tenant: "t", Policy: "p", Rate: Rate{Limit: 3, Window: time.Hour}, Cost: 1}
	for i := 0; i < 3; i++ {
		if ok, res := mustDecide(t, s, c); !ok || res[0].Remaining != int64(2-i) {
			t.Fatalf("request %d: %v %+v", i, ok, res)
		}
	}
	ok, res := mustDecide(t, s, c)
	if ok || res[0].RetryAfter <= 59*time.Minute || res[0].RetryAfter > time.Hour {
		t.Fatalf("4th: %v %+v", ok, res)
	}
	// The log holds three units, the newest taken from Redis TIME: a
	// list [base, ts1, cum1, ...] of one entry per admission.
	raw, err := client.LRange(bgCtx, "real:sliding_log:{t}:p", 0, -1).Result()
	if err != nil || len(raw) < 3 || len(raw)%2 != 1 || raw[0] != "0" || raw[len(raw)-1] != "3" {
		t.Fatalf("log %q %v", raw, err)
	}
	tm, err := client.Time(bgCtx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := strconv.ParseInt(raw[len(raw)-2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if d := tm.Sub(time.UnixMicro(ts)); d < 0 || d > 5*time.Second {
		t.Fatalf("logged %s, Redis TIME %s", time.UnixMicro(ts), tm)
	}
}

// TestRedisInvalidChecks: the store refuses what it cannot compute.
func TestRedisInvalidChecks(t *testing.T) {
	s := NewRedisStore(RedisOptions{Client: redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})})
	for _, c := range []Check{
		{Algorithm: TokenBucket, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1 << 54, Window: time.Second}, Cost: 1},
		{Algorithm: TokenBucket, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1, Window: time.Second}, Cost: -1},
		{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1}, Cost: 1},
	} {
		if _, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1)); !errors.Is(err, ErrInvalidCheck) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	a := tbCheck("t", "a", 1, time.Second)
	if _, err := s.Decide(bgCtx, []Check{a, a}, make([]Result, 1)); err != errShortResults {
		t.Errorf("short results: %v", err)
	}
	if ok, err := s.Decide(bgCtx, nil, nil); !ok || err != nil {
		t.Errorf("no checks: %v %v", ok, err)
	}
}

// TestRedisCluster runs on a 3-master Redis Cluster.
func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	client := cl.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})

	t.Run("KeySlot", func(t *testing.T) {
		// keySlot is Redis' own hash slot, hash tags included.
		for _, k := range []string{"", "a", "rl:gcra:{t}:p", "{}", "a{}b", "{{a}}", "a{b}c{d}", "{a", "a}", "}{a}", "rl:x:{%7B}:p", "x\x00{\n}"} {
			want, err := client.ClusterKeySlot(bgCtx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := keySlot([]byte(k)); int64(got) != want {
				t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT %d", k, got, want)
			}
		}
	})

	t.Run("Lease", func(t *testing.T) {
		// A tenant's policies share a slot and lease together; checks of
		// several tenants (several slots) cannot lease and are decided
		// slot by slot instead. Both stay exact.
		calls := &scriptCounter{}
		rs := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Observe: calls.observe})
		ls := NewLeaseStore(LeaseOptions{Store: rs, Taker: rs})
		defer ls.Close()
		lease := Lease{Max: 20, TTL: time.Minute}
		one := []Check{
			{Algorithm: TokenBucket, Tenant: "lease-a", Policy: "p1", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1, Lease: lease},
			{Algorithm: FixedWindow, Tenant: "lease-a", Policy: "p2", Rate: Rate{Limit: 60, Window: time.Hour}, Cost: 1, Lease: lease},
		}
		multi := []Check{
			{Algorithm: TokenBucket, Tenant: "lease-b", Policy: "p1", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1, Lease: lease},
			{Algorithm: FixedWindow, Tenant: "lease-c", Policy: "p2", Rate: Rate{Limit: 60, Window: time.Hour}, Cost: 1, Lease: lease},
		}
		if keySlot([]byte("{lease-b}")) == keySlot([]byte("{lease-c}")) {
			t.Fatal("pick tenants in different slots")
		}
		for name, checks := range map[string][]Check{"one slot": one, "two slots": multi} {
			if got := hammer(t, ls, checks); got != 60 {
				t.Errorf("%s: admitted %d, want exactly 60", name, got)
			}
		}
		if calls.get("lease") == 0 || calls.get("lease") > 200 {
			t.Errorf("one slot: %d lease calls for 2400 requests", calls.get("lease"))
		}
		if calls.get("decide") < 2400 {
			t.Errorf("two slots: %d decide calls, want one per slot and request", calls.get("decide"))
		}
	})

	t.Run("OneSlotPerTenant", func(t *testing.T) {
		// Every key of a tenant, across algorithms, policies and parts,
		// lands in the slot of its hash tag; a tenant made of braces cannot
		// borrow another tenant's slot.
		slotOf := func(k string) int64 {
			n, err := client.ClusterKeySlot(bgCtx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		victim := slotOf(string(AppendKey(nil, "rl", GCRA, "victim", "p", "")))
		for _, tenant := range []string{"acme", "{victim}", "x}{victim", "victim}", "{victim", "}victim{", "a:b", "\n\x00", strings.Repeat("v", 300)} {
			var slot int64 = -1
			for _, algo := range benchAlgorithms {
				for _, policy := range []string{"p", "q"} {
					for _, part := range []string{"", "{victim}", "GET /x"} {
						k := string(AppendKey(nil, "rl", algo, tenant, policy, part))
						got := slotOf(k)
						if slot == -1 {
							slot = got
						} else if got != slot {
							t.Fatalf("tenant %q: key %q in slot %d, others in %d", tenant, k, got, slot)
						}
					}
				}
			}
			if want := slotOf("{" + string(AppendEscaped(nil, tenant)) + "}"); slot != want {
				t.Fatalf("tenant %q: slot %d, want the slot of its escaped tag %d", tenant, slot, want)
			}
			if tenant != "victim" && slot == victim {
				t.Fatalf("tenant %q shares the slot of tenant victim", tenant)
			}
			// And the store runs a multi-policy, multi-algorithm request
			// of this tenant in one script.
			var checks []Check
			for _, algo := range benchAlgorithms {
				checks = append(checks, Check{Algorithm: algo, Tenant: tenant, Policy: "p", Part: "{victim}", Rate: Rate{Limit: 5, Window: time.Minute}, Cost: 1})
			}
			if ok, _ := mustDecide(t, s, checks...); !ok {
				t.Fatalf("tenant %q denied", tenant)
			}
		}
	})

	t.Run("Exact", func(t *testing.T) {
		exactUnderConcurrency(t, s, "exact")
	})

	t.Run("CrossSlot", func(t *testing.T) {
		// Checks of two tenants in two slots: all or nothing, with the
		// charge of the first slot given back when the second denies.
		for _, algo := range benchAlgorithms {
			t.Run(algo.String(), func(t *testing.T) {
				a := Check{Algorithm: algo, Tenant: "xa-" + algo.String(), Policy: "p", Rate: Rate{Limit: 10, Window: time.Hour}, Cost: 3}
				b := Check{Algorithm: FixedWindow, Tenant: "xb-" + algo.String(), Policy: "p", Rate: Rate{Limit: 1, Window: time.Hour}, Cost: 1}
				if keySlot(AppendKey(nil, "rl", a.Algorithm, a.Tenant, a.Policy, "")) == keySlot(AppendKey(nil, "rl", b.Algorithm, b.Tenant, b.Policy, "")) {
					t.Skip("same slot")
				}
				ok, res := mustDecide(t, s, a, b)
				if !ok || res[0].Remaining != 7 || res[1].Remaining != 0 {
					t.Fatalf("first: %v %+v", ok, res)
				}
				// b denies: a is charged first, then given back.
				ok, res = mustDecide(t, s, a, b)
				if ok || !res[0].Allowed || res[0].Remaining != 7 || res[1].Allowed {
					t.Fatalf("second: %v %+v", ok, res)
				}
				if got := mustPeek(t, s, withCost(a, 0))[0]; got.Remaining != 7 {
					t.Fatalf("a after the give-back: %+v", got)
				}
				// b first: a is only evaluated.
				ok, res = mustDecide(t, s, b, a)
				if ok || res[0].Allowed || !res[1].Allowed || res[1].Remaining != 7 {
					t.Fatalf("third: %v %+v", ok, res)
				}
				if got := mustPeek(t, s, withCost(a, 0))[0]; got.Remaining != 7 {
					t.Fatalf("a after a dry run: %+v", got)
				}
				if algo == Concurrency {
					if err := s.Release(bgCtx, []Check{a, b}); err != nil {
						t.Fatal(err)
					}
					if got := mustPeek(t, s, withCost(a, 0))[0]; got.Remaining != 10 {
						t.Fatalf("a after release: %+v", got)
					}
				}
			})
		}
	})

	t.Run("CrossSlotSlidingLog", func(t *testing.T) {
		// A refund takes the units back from the entry they were logged
		// in (shared with an earlier admission at the same instant), or
		// removes the entry they made.
		s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout})
		clk := newManualClock(baseTime)
		s.now = func() int64 { return clk.Now().UnixMicro() }
		a := Check{Algorithm: SlidingLog, Tenant: "xl-a", Policy: "p", Rate: Rate{Limit: 10, Window: time.Hour}, Cost: 1}
		b := Check{Algorithm: FixedWindow, Tenant: "xl-b", Policy: "p", Rate: Rate{Limit: 1, Window: time.Hour}, Cost: 1}
		keyA := string(AppendKey(nil, "rl", a.Algorithm, a.Tenant, a.Policy, ""))
		if keySlot([]byte(keyA)) == keySlot(AppendKey(nil, "rl", b.Algorithm, b.Tenant, b.Policy, "")) {
			t.Fatal("pick tenants in different slots")
		}
		t0, sec := baseTime.UnixMicro(), int64(time.Second/time.Microsecond)
		list := func(want ...int64) {
			t.Helper()
			raw := client.LRange(bgCtx, keyA, 0, -1).Val()
			ok := len(raw) == len(want)
			for i := 0; ok && i < len(raw); i++ {
				ok = raw[i] == strconv.FormatInt(want[i], 10)
			}
			if !ok {
				t.Fatalf("list %v, want %v", raw, want)
			}
		}
		mustDecide(t, s, withCost(a, 2))
		clk.Set(baseTime.Add(time.Second))
		mustDecide(t, s, withCost(a, 3))
		if ok, _ := mustDecide(t, s, a, b); !ok {
			t.Fatal("denied")
		}
		list(0, t0, 2, t0+sec, 6)
		ok, res := mustDecide(t, s, withCost(a, 2), b)
		if ok || !res[0].Allowed || res[0].Remaining != 4 || res[1].Allowed {
			t.Fatalf("refunded at the same instant: %v %+v", ok, res)
		}
		list(0, t0, 2, t0+sec, 6)
		clk.Set(baseTime.Add(2 * time.Second))
		if ok, _ := mustDecide(t, s, withCost(a, 4), b); ok {
			t.Fatal("admitted")
		}
		list(0, t0, 2, t0+sec, 6)
		if got := mustPeek(t, s, withCost(a, 0))[0]; got != wantAllow(4, time.Hour-2*time.Second) {
			t.Fatalf("after the refunds: %+v", got)
		}
	})

	t.Run("CrossSlotExact", func(t *testing.T) {
		// 2400 requests over two slots, the limited tenant last: exactly
		// 1000 admitted, and the other tenant is charged exactly 1000
		// after the refunds of the 1400 denied requests.
		free := Check{Algorithm: FixedWindow, Tenant: "free", Policy: "p", Rate: Rate{Limit: 1 << 40, Window: MaxWindow}, Cost: 1}
		limited := Check{Algorithm: SlidingLog, Tenant: "limited", Policy: "p", Rate: Rate{Limit: 1000, Window: MaxWindow}, Cost: 1}
		if got := hammer(t, s, []Check{free, limited}); got != 1000 {
			t.Fatalf("admitted %d, want 1000", got)
		}
		if got := mustPeek(t, s, withCost(free, 0))[0].Remaining; got != 1<<40-1000 {
			t.Fatalf("free charged %d, want 1000", 1<<40-got)
		}
	})

	t.Run("ReleaseAcrossSlots", func(t *testing.T) {
		var checks []Check
		for _, tn := range []string{"rel-a", "rel-b", "rel-c", ""} {
			for _, p := range []string{"p", "q"} {
				checks = append(checks, Check{Algorithm: Concurrency, Tenant: tn, Policy: p, Rate: Rate{Limit: 1}, Cost: 1})
			}
		}
		if ok, _ := mustDecide(t, s, checks...); !ok {
			t.Fatal("denied")
		}
		if ok, _ := mustDecide(t, s, checks...); ok {
			t.Fatal("admitted with every slot taken")
		}
		if err := s.Release(bgCtx, checks); err != nil {
			t.Fatal(err)
		}
		for _, r := range mustPeek(t, s, checks...) {
			if r != wantAllow(1, 0) {
				t.Fatalf("after release: %+v", r)
			}
		}
	})

	t.Run("EmptyTenant", func(t *testing.T) {
		// "{}" is no hash tag: the empty tenant's keys of two policies live
		// in two slots, and still decide together.
		a := Check{Algorithm: TokenBucket, Tenant: "", Policy: "p1", Rate: Rate{Limit: 2, Window: time.Hour}, Cost: 1}
		b := Check{Algorithm: TokenBucket, Tenant: "", Policy: "p2", Rate: Rate{Limit: 1, Window: time.Hour}, Cost: 1}
		if ok, _ := mustDecide(t, s, a, b); !ok {
			t.Fatal("denied")
		}
		if ok, _ := mustDecide(t, s, a, b); ok {
			t.Fatal("admitted past b's limit")
		}
		if got := mustPeek(t, s, a, b); got[0].Remaining != 1 || got[1].Remaining != 0 {
			t.Fatalf("peek: %+v", got)
		}
		if err := s.Reset(bgCtx, "", []string{"p1", "p2"}); err != nil {
			t.Fatal(err)
		}
		if got := mustPeek(t, s, a, b); got[0].Remaining != 2 || got[1].Remaining != 1 {
			t.Fatalf("after reset: %+v", got)
		}
	})

	t.Run("Reset", func(t *testing.T) {
		tenants := []string{"r", "r:b", "r*", "{r}", "rr"}
		for _, tn := range tenants {
			for _, p := range []string{"p", "q"} {
				mustDecide(t, s, Check{Algorithm: FixedWindow, Tenant: tn, Policy: p, Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1})
			}
		}
		if err := s.Reset(bgCtx, "r", []string{"p", "q"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Reset(bgCtx, "r*", []string{"q"}); err != nil {
			t.Fatal(err)
		}
		for _, tn := range tenants {
			for _, p := range []string{"p", "q"} {
				want := int64(4)
				if tn == "r" || (tn == "r*" && p == "q") {
					want = 5
				}
				c := Check{Algorithm: FixedWindow, Tenant: tn, Policy: p, Rate: Rate{Limit: 5, Window: time.Hour}}
				if got := mustPeek(t, s, c)[0].Remaining; got != want {
					t.Errorf("tenant %q policy %s: Remaining %d, want %d", tn, p, got, want)
				}
			}
		}
	})
}

// TestRedisKeyPrefix: the prefix starts every key and separates stores.
func TestRedisKeyPrefix(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	a := NewRedisStore(RedisOptions{Client: client, Prefix: "one", Timeout: testTimeout})
	b := NewRedisStore(RedisOptions{Client: client, Prefix: "two", Timeout: testTimeout})
	c := fwCheck("t", "p", 1, time.Hour)
	if ok, _ := mustDecide(t, a, c); !ok {
		t.Fatal("a denied")
	}
	if ok, _ := mustDecide(t, b, c); !ok {
		t.Fatal("b shares a's bucket")
	}
	if err := a.Reset(bgCtx, "t", []string{"p"}); err != nil {
		t.Fatal(err)
	}
	if got := mustPeek(t, b, c)[0].Remaining; got != 0 {
		t.Fatal("a's Reset touched b")
	}
	for _, k := range allKeys(t, client) {
		if !strings.HasPrefix(k, "two:") {
			t.Errorf("key %q", k)
		}
	}
	if err := a.Close(); err != nil || client.Ping(bgCtx).Err() != nil {
		t.Fatal("Close closed the client")
	}
}

// TestRedisClusterUnansweredBounded: a cluster whose nodes accept
// connections and never answer: a decision and a probe each end within
// about the store's timeout (loading the slot map is bounded by it too),
// however go-redis retries.
func TestRedisClusterUnansweredBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	const timeout = 50 * time.Millisecond
	o := &redis.UniversalOptions{Addrs: []string{l.Addr().String()}, IsClusterMode: true, ContextTimeoutEnabled: true,
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, PoolTimeout: time.Second}
	client := redis.NewUniversalClient(o)
	defer client.Close()
	s := NewRedisStore(RedisOptions{Client: client, Timeout: timeout})
	c := Check{Algorithm: FixedWindow, Tenant: "t", Policy: "p", Rate: Rate{Limit: 1, Window: time.Second}, Cost: 1}
	for name, call := range map[string]func() error{
		"decide": func() error { _, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1)); return err },
		"ping":   func() error { return s.Ping(bgCtx) },
	} {
		start := time.Now()
		err := call()
		if took := time.Since(start); err == nil || took > 4*timeout+maxOverrun {
			t.Errorf("%s on a cluster that never answers: %v after %v, want an error within about %v", name, err, took, timeout)
		}
	}
}

// TestRedisFunctionRatesBounded: the function library keeps the rate
// tables it builds between calls, but at most RATES_MAX of them, so a
// fleet with a rate per tenant (overrides) cannot grow Redis's Lua memory
// without bound: 20 000 distinct rates leave it within a few MB of where
// it started (about 2 MB; kept without a bound, 20 MB).
func TestRedisFunctionRatesBounded(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: testTimeout, Functions: true})
	luaMemory := func() int64 {
		t.Helper()
		info := client.Info(bgCtx, "memory").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory_vm_functions:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatal("no used_memory_vm_functions in INFO memory")
		return 0
	}
	res := make([]Result, 1)
	decide := func(limit int64) {
		t.Helper()
		c := []Check{{Algorithm: TokenBucket, Tenant: "t", Policy: "p", Rate: Rate{Limit: limit, Window: time.Hour}, Cost: 1}}
		if _, err := s.Decide(bgCtx, c, res); err != nil {
			t.Fatal(err)
		}
	}
	decide(1) // the library is loaded
	before := luaMemory()
	for i := range int64(20000) {
		decide(1000 + i)
	}
	grew := luaMemory() - before
	t.Logf("Lua memory grew %d bytes over 20 000 rates", grew)
	if grew > 8<<20 {
		t.Fatalf("Lua memory grew %d bytes over 20 000 rates, want at most 8 MB", grew)
	}
}
