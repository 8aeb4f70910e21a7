package limiter

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// Benchmarks of the Redis store against a local redis-server:
//
//	go test -run xxx -bench Redis -benchtime 2000x ./limiter/
//
// ns/op is the round trip seen by the caller (loopback), redis-usec/call
// the time Redis spent in the script (INFO commandstats, evalsha and fcall), and
// bytes/key the Redis memory of one bucket (INFO memory, used_memory
// delta over 100 000 tenants).

// benchRedisStore starts a server and returns a store on it.
func benchRedisStore(b *testing.B) (*RedisStore, *redis.Client) {
	b.Helper()
	srv := redistest.StartStandalone(b, redistest.Options{})
	client := srv.Client(b)
	return NewRedisStore(RedisOptions{Client: client, Timeout: time.Second}), client
}

// infoField returns field of an INFO section.
func infoField(b testing.TB, client *redis.Client, section, field string) string {
	b.Helper()
	info, err := client.Info(bgCtx, section).Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// scriptUsecPerCall reads the µs per script call from INFO commandstats:
// EVALSHA and FCALL (the batcher's calls where Redis has functions)
// together.
func scriptUsecPerCall(b testing.TB, client *redis.Client) float64 {
	b.Helper()
	calls, usec := scriptStats(b, client)
	if calls == 0 {
		b.Fatal("no evalsha or fcall in INFO commandstats")
	}
	return usec / calls
}

// scriptStats reads calls (those that did not fail: a NOSCRIPT answer is
// not a decision) and usec (total µs) of EVALSHA and FCALL from INFO
// commandstats.
func scriptStats(tb testing.TB, client *redis.Client) (calls, usec float64) {
	tb.Helper()
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_fcall"} {
		for _, kv := range strings.Split(infoField(tb, client, "commandstats", cmd), ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls += f
			case "failed_calls":
				// NOSCRIPT answers, the script then loaded and called again.
				calls -= f
			case "usec":
				usec += f
			default:
				continue
			}
			if err != nil {
				tb.Fatal(err)
			}
		}
	}
	return calls, usec
}

// fillSlidingLog admits n requests of c.Cost on the sliding log of c, at
// the µs instants start, start+step, ..., start+(n-1)step: the decide
// script called directly, pipelined, so that a log of 100 000 entries
// fills in seconds. It returns the instant after the last one.
func fillSlidingLog(tb testing.TB, client *redis.Client, prefix string, c Check, n int, start, step int64) int64 {
	tb.Helper()
	if err := decideScript.Load(bgCtx, client).Err(); err != nil {
		tb.Fatal(err)
	}
	keys := []string{string(AppendKey(nil, prefix, SlidingLog, c.Tenant, c.Policy, c.Part))}
	for done := 0; done < n; {
		batch := min(n-done, 500)
		cmds, err := client.Pipelined(bgCtx, func(p redis.Pipeliner) error {
			for i := range batch {
				now := start + int64(done+i)*step
				decideScript.EvalSha(bgCtx, p, keys, "decide", now, "sliding_log", c.Rate.Limit,
					micros(c.Rate.Window), 0, micros(c.Rate.MinInterval), c.Cost, "0")
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
		for _, cmd := range cmds {
			if v, _ := cmd.(*redis.Cmd).Slice(); len(v) < 1 || v[0] != int64(1) {
				tb.Fatalf("fill: request denied: %v", v)
			}
		}
		done += batch
	}
	return start + int64(n)*step
}

// BenchmarkRedisSlidingLog: one decision on a sliding log that holds 1000,
// 30 000 or 100 000 admissions in its window, each decision admitting one
// more while the oldest leaves (1ms apart), so the log keeps its length.
// redis-usec/call is the script's time inside Redis, bytes/admission the
// key's MEMORY USAGE over the admissions it holds.
//
//	go test -run xxx -bench RedisSlidingLog -benchtime 2000x ./limiter/
func BenchmarkRedisSlidingLog(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	client := srv.Client(b)
	for _, n := range []int{1000, 30_000, 100_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			const step = 1000 // µs between admissions
			c := Check{Algorithm: SlidingLog, Tenant: fmt.Sprintf("log-%d", n), Policy: "p",
				Rate: Rate{Limit: 1 << 40, Window: time.Duration(n*step) * time.Microsecond}, Cost: 1}
			var now atomic.Int64
			now.Store(fillSlidingLog(b, client, "rl", c, n, baseTime.UnixMicro(), step))
			s := NewRedisStore(RedisOptions{Client: client, Timeout: time.Second})
			s.now = now.Load
			key := string(AppendKey(nil, "rl", SlidingLog, c.Tenant, c.Policy, ""))
			bytes, err := client.MemoryUsage(bgCtx, key, 0).Result()
			if err != nil {
				b.Fatal(err)
			}
			checks := []Check{c}
			res := make([]Result, 1)
			decide := func() {
				if ok, err := s.Decide(bgCtx, checks, res); !ok || err != nil {
					b.Fatal(ok, err)
				}
				now.Add(step)
			}
			for range 1000 { // warm up (Lua heap, client buffers)
				decide()
			}
			if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				decide()
			}
			if res[0].Remaining != 1<<40-int64(n) {
				b.Fatalf("Remaining %d: the log does not hold %d units", res[0].Remaining, n)
			}
			b.ReportMetric(scriptUsecPerCall(b, client), "redis-usec/call")
			b.ReportMetric(float64(bytes)/float64(n), "bytes/admission")
		})
	}
}

// benchDecide runs Decide of checks in a loop and reports the script's
// time inside Redis.
func benchDecide(b *testing.B, s *RedisStore, client *redis.Client, checks []Check) {
	res := make([]Result, len(checks))
	if _, err := s.Decide(bgCtx, checks, res); err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Decide(bgCtx, checks, res); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(scriptUsecPerCall(b, client), "redis-usec/call")
}

// BenchmarkRedisDecide: one check on an existing bucket, per algorithm,
// and a request of three policies of one tenant.
func BenchmarkRedisDecide(b *testing.B) {
	s, client := benchRedisStore(b)
	for _, algo := range benchAlgorithms {
		b.Run(algo.String(), func(b *testing.B) {
			c := benchCheck(algo, "tenant-42")
			if algo == SlidingLog {
				// A log of 1<<40 entries is not a realistic bucket: 100 per
				// minute is, and it fills up during the benchmark.
				c.Rate = Rate{Limit: 100, Window: time.Minute}
			}
			benchDecide(b, s, client, []Check{c})
		})
	}
	b.Run("3-policies", func(b *testing.B) {
		benchDecide(b, s, client, benchThreePolicies("tenant-42"))
	})
	// The same decisions as functions of the library (redis `functions`):
	// built once, where each script builds its helpers on every call.
	functions := NewRedisStore(RedisOptions{Client: client, Timeout: time.Second, Functions: true})
	for _, algo := range benchAlgorithms {
		b.Run("fcall-"+algo.String(), func(b *testing.B) {
			c := benchCheck(algo, "tenant-42")
			if algo == SlidingLog {
				c.Rate = Rate{Limit: 100, Window: time.Minute}
			}
			benchDecide(b, functions, client, []Check{c})
		})
	}
	// The script floor: the least a decision must do in Redis (read the
	// clock, read the bucket, write it with a TTL), so redis-usec/call of
	// each algorithm can be read as a ratio to it on a noisy machine.
	b.Run("floor-script", func(b *testing.B) {
		floor := redis.NewScript(`local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '0123456789abcdef', 'PX', 60000)
return {1, t[1]}`)
		keys := []string{"rl:token_bucket:{tenant-42}:floor"}
		if err := floor.Run(bgCtx, client, keys).Err(); err != nil {
			b.Fatal(err)
		}
		if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := floor.EvalSha(bgCtx, client, keys).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(scriptUsecPerCall(b, client), "redis-usec/call")
	})
	// The round-trip floor: a plain GET on the same client.
	b.Run("baseline-GET", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := client.Get(bgCtx, "nothing").Err(); err != redis.Nil {
				b.Fatal(err)
			}
		}
	})
}

// benchThreePolicies is a typical request: a per-second burst limit, a
// per-minute limit and a daily quota of one tenant.
func benchThreePolicies(tenant string) []Check {
	return []Check{
		{Algorithm: TokenBucket, Tenant: tenant, Policy: "burst", Rate: Rate{Limit: 1 << 40, Window: time.Second}, Cost: 1},
		{Algorithm: SlidingWindow, Tenant: tenant, Policy: "minute", Part: "GET /v1/items", Rate: Rate{Limit: 1 << 40, Window: time.Minute}, Cost: 1},
		{Algorithm: FixedWindow, Tenant: tenant, Policy: "daily", Rate: Rate{Limit: 1 << 40, Window: 24 * time.Hour}, Cost: 1},
	}
}

// memoryTenants is how many buckets BenchmarkRedisMemory creates.
const memoryTenants = 100_000

// BenchmarkRedisMemory: the Redis memory of one bucket per algorithm,
// measured over 100 000 tenants with one request each (key, value, TTL and
// Redis' per-key overhead; keys like "rl:gcra:{tenant-000042}:api"). The
// sliding log is measured with 1 and with 100 units logged. The loop then
// decides on random existing buckets of that keyspace.
func BenchmarkRedisMemory(b *testing.B) {
	s, client := benchRedisStore(b)
	type variant struct {
		name string
		algo Algorithm
		cost int64
	}
	var variants []variant
	for _, algo := range benchAlgorithms {
		variants = append(variants, variant{algo.String(), algo, 1})
	}
	variants = append(variants, variant{"sliding_log/100-units", SlidingLog, 100})
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			if err := client.FlushAll(bgCtx).Err(); err != nil {
				b.Fatal(err)
			}
			check := func(i int) Check {
				return Check{Algorithm: v.algo, Tenant: fmt.Sprintf("tenant-%06d", i), Policy: "api",
					Rate: Rate{Limit: 100, Window: time.Hour}, Cost: v.cost}
			}
			// Warm up (script cache, client buffers) before the baseline.
			mustDecide(b, s, Check{Algorithm: v.algo, Tenant: "warm", Policy: "warm", Rate: Rate{Limit: 1000, Window: time.Hour}, Cost: 1})
			client.Del(bgCtx, string(AppendKey(nil, "rl", v.algo, "warm", "warm", "")))
			before := usedMemory(b, client)
			var next atomic.Int64
			var wg sync.WaitGroup
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					checks := make([]Check, 1)
					res := make([]Result, 1)
					for {
						i := int(next.Add(1)) - 1
						if i >= memoryTenants {
							return
						}
						checks[0] = check(i)
						if _, err := s.Decide(bgCtx, checks, res); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if n := client.DBSize(bgCtx).Val(); n != memoryTenants {
				b.Fatalf("%d keys, want %d", n, memoryTenants)
			}
			perKey := float64(usedMemory(b, client)-before) / memoryTenants

			checks := make([]Check, 1)
			res := make([]Result, 1)
			i := 0
			for b.Loop() {
				i = (i + 7919) % memoryTenants
				checks[0] = check(i)
				checks[0].Cost = 0
				if _, err := s.Decide(bgCtx, checks, res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(perKey, "bytes/key")
		})
	}
}

func usedMemory(b *testing.B, client *redis.Client) int64 {
	b.Helper()
	n, err := strconv.ParseInt(infoField(b, client, "memory", "used_memory"), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkLeaseHotTenant: one tenant's requests from 32 goroutines on a
// lease of 50 (as `lease 50` on a busy tenant), with the lease topped up
// before it runs out (prefetch) and refilled only once empty, same run.
// A refill makes every concurrent request of the tenant wait one round
// trip; a prefetch lets them go on.
func BenchmarkLeaseHotTenant(b *testing.B) {
	s, _ := benchRedisStore(b)
	c := Check{Algorithm: TokenBucket, Tenant: "hot", Policy: "p", Rate: Rate{Limit: 1 << 50, Window: time.Hour}, Cost: 1,
		Lease: Lease{Max: 50, TTL: time.Second}}
	for _, on := range []bool{true, false} {
		name := "refill_only"
		if on {
			name = "prefetch"
		}
		b.Run(name, func(b *testing.B) {
			prefetchOn = on
			defer func() { prefetchOn = true }()
			ls := NewLeaseStore(LeaseOptions{Store: s, Taker: s})
			defer ls.Close()
			b.SetParallelism(16) // 32 goroutines on 2 cores
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				checks := []Check{c}
				res := make([]Result, 1)
				for pb.Next() {
					if ok, err := ls.Decide(bgCtx, checks, res); !ok || err != nil {
						b.Error(ok, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkLeaseDecide is a decision served from a lease: the
// same checks as BenchmarkRedisDecide's token_bucket and sliding_window,
// with a lease large enough that Redis is asked about once per 1000
// requests. The "no lease" case, every request one script call, is the
// baseline of the same run.
func BenchmarkLeaseDecide(b *testing.B) {
	s, client := benchRedisStore(b)
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		c := Check{Algorithm: algo, Tenant: "bench-lease", Policy: "p", Rate: Rate{Limit: 1 << 50, Window: time.Hour}, Cost: 1}
		b.Run(algo.String()+"/no_lease", func(b *testing.B) {
			benchDecide(b, s, client, []Check{c})
		})
		b.Run(algo.String()+"/lease", func(b *testing.B) {
			ls := NewLeaseStore(LeaseOptions{Store: s, Taker: s})
			defer ls.Close()
			c := c
			c.Lease = Lease{Max: 1000, TTL: time.Minute}
			checks := []Check{c}
			res := make([]Result, 1)
			for range 5000 { // ramp the demand up to full leases
				ls.Decide(bgCtx, checks, res)
			}
			if err := client.ConfigResetStat(bgCtx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := ls.Decide(bgCtx, checks, res); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
			n, _ := scriptStats(b, client)
			b.ReportMetric(n/float64(b.N), "redis-calls/op")
		})
	}
}

// BenchmarkRedisBatching compares ways of sending concurrent decisions to
// one local Redis: each call on its own round trip (direct), the store's
// batcher (batched), and go-redis's experimental automatic pipelining
// (autopipeline, its blocking face with default options). 32 goroutines on
// the test's cores decide for 100 tenants; ns/op is the wall time per
// decision, so lower means more decisions per second.
//
//	go test -run xxx -bench RedisBatching -benchtime 3s -count 3 ./limiter/
func BenchmarkRedisBatching(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	opts.PoolSize = 64
	check := func(i int) []Check {
		return []Check{{Algorithm: TokenBucket, Tenant: "tenant-" + strconv.Itoa(i%100), Policy: "api",
			Rate: Rate{Limit: 1 << 40, Window: time.Second}, Cost: 1}}
	}
	admin := srv.Client(b)
	redisCPU := func() float64 {
		var sum float64
		for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, _ := strconv.ParseFloat(infoField(b, admin, "cpu", f), 64)
			sum += v
		}
		return sum
	}
	// redisTrips counts Redis's write events to its clients: about one
	// per round trip while a batch arrives in one read (it does here: at
	// most 32 calls in flight, on loopback), however many calls it carries.
	redisTrips := func() float64 {
		v, err := strconv.ParseFloat(infoField(b, admin, "stats", "total_writes_processed"), 64)
		if err != nil {
			b.Fatalf("INFO stats total_writes_processed (Redis 6+): %v", err)
		}
		return v
	}
	run := func(b *testing.B, decide func(checks []Check, res []Result) error) {
		var n atomic.Int64
		b.SetParallelism(16)
		b.ReportAllocs()
		cpu0, rcpu0, trips0 := processCPU(), redisCPU(), redisTrips()
		defer func() {
			b.StopTimer()
			ops := float64(b.N)
			b.ReportMetric((processCPU()-cpu0).Seconds()*1e6/ops, "client-cpu-us/op")
			b.ReportMetric((redisCPU()-rcpu0)*1e6/ops, "redis-cpu-us/op")
			b.ReportMetric((redisTrips()-trips0)/ops, "round-trips/op")
		}()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			checks := check(int(n.Add(1)))
			res := make([]Result, 1)
			for pb.Next() {
				if err := decide(checks, res); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for _, mode := range []string{"direct", "batched"} {
		b.Run(mode, func(b *testing.B) {
			client := redis.NewClient(opts)
			defer client.Close()
			s := NewRedisStore(RedisOptions{Client: client, Timeout: time.Second, NoBatch: mode == "direct"})
			run(b, func(checks []Check, res []Result) error {
				_, err := s.Decide(bgCtx, checks, res)
				return err
			})
		})
	}
	b.Run("autopipeline", func(b *testing.B) {
		client := redis.NewClient(opts)
		defer client.Close()
		ap, err := client.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		defer ap.Close()
		s := NewRedisStore(RedisOptions{Client: client, Timeout: time.Second, NoBatch: true})
		run(b, func(checks []Check, res []Result) error {
			sc := s.getScratch()
			defer s.putScratch(sc)
			s.prepare(sc, checks)
			sc.args = append(sc.args[:0], argDecideMode, argZero)
			keys := sc.appendCheckArgs(checks, sc.all)
			reply, err := decideScript.EvalSha(bgCtx, ap, keys, sc.args...).Int64Slice()
			if isNoScript(err) {
				reply, err = decideScript.Eval(bgCtx, ap, keys, sc.args...).Int64Slice()
			}
			if err != nil {
				return err
			}
			_, _, err = parseReply(reply, sc.all, res, nil)
			return err
		})
	})
}

var argDecideMode any = "decide"

// processCPU is the CPU time (user + system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
