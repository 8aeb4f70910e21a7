package limiter

import (
	"bufio"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var benchAlgorithms = []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog, Concurrency}

// benchCheck is a check that always allows (huge limit), on a realistic
// key: tenant, policy and a method+path partition.
func benchCheck(algo Algorithm, tenant string) Check {
	return Check{
		Algorithm: algo, Tenant: tenant, Policy: "api", Part: "GET /v1/items",
		Rate: Rate{Limit: 1 << 40, Window: time.Hour}, Cost: 1,
	}
}

// BenchmarkDecide: one check on an existing bucket, wall clock.
func BenchmarkDecide(b *testing.B) {
	for _, algo := range benchAlgorithms {
		b.Run(algo.String(), func(b *testing.B) {
			m := NewMemoryStore(MemoryOptions{})
			defer m.Close()
			checks := []Check{benchCheck(algo, "tenant-42")}
			res := make([]Result, 1)
			m.Decide(bgCtx, checks, res)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := m.Decide(bgCtx, checks, res); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecideParallel: every goroutine on the same bucket (one shard
// lock, worst case) or spread over 1024 tenants.
func BenchmarkDecideParallel(b *testing.B) {
	for _, algo := range []Algorithm{TokenBucket, SlidingWindow} {
		for _, spread := range []int{1, 1024} {
			b.Run(algo.String()+"/tenants="+strconv.Itoa(spread), func(b *testing.B) {
				m := NewMemoryStore(MemoryOptions{})
				defer m.Close()
				checks := make([]Check, spread)
				res := make([]Result, 1)
				for i := range checks {
					checks[i] = benchCheck(algo, "tenant-"+strconv.Itoa(i))
					m.Decide(bgCtx, checks[i:i+1], res)
				}
				var seq atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seq.Add(1)) * 7919
					res := make([]Result, 1)
					for pb.Next() {
						i++
						j := i % spread
						if _, err := m.Decide(bgCtx, checks[j:j+1], res); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkDecideMultiPolicy: three policies of one tenant in one Decide.
func BenchmarkDecideMultiPolicy(b *testing.B) {
	m := NewMemoryStore(MemoryOptions{})
	defer m.Close()
	checks := []Check{
		benchCheck(TokenBucket, "tenant-42"),
		benchCheck(SlidingWindow, "tenant-42"),
		benchCheck(FixedWindow, "tenant-42"),
	}
	checks[1].Policy = "search"
	checks[2].Policy = "daily"
	checks[2].Part = ""
	res := make([]Result, len(checks))
	m.Decide(bgCtx, checks, res)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Decide(bgCtx, checks, res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecideNewKey: the first request of a tenant (insertion).
func BenchmarkDecideNewKey(b *testing.B) {
	m := NewMemoryStore(MemoryOptions{})
	defer m.Close()
	tenants := make([]string, b.N)
	for i := range tenants {
		tenants[i] = "tenant-" + strconv.Itoa(i)
	}
	res := make([]Result, 1)
	checks := []Check{benchCheck(TokenBucket, "")}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		checks[0].Tenant = tenants[i]
		m.Decide(bgCtx, checks, res)
	}
}

// BenchmarkMemoryBytesPerKey inserts 100 000 buckets (key
// "rl:<algo>:{tenant-<n>}:api") and reports the heap they retain per key.
// ns/op is the time per insertion.
func BenchmarkMemoryBytesPerKey(b *testing.B) {
	const n = 100_000
	for _, algo := range benchAlgorithms {
		b.Run(algo.String(), func(b *testing.B) {
			tenants := make([]string, n)
			for i := range tenants {
				tenants[i] = "tenant-" + strconv.Itoa(i)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			m := NewMemoryStore(MemoryOptions{SweepInterval: -1})
			res := make([]Result, 1)
			c := []Check{{Algorithm: algo, Policy: "api", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1}}
			for _, tn := range tenants {
				c[0].Tenant = tn
				if ok, _ := m.Decide(bgCtx, c, res); !ok {
					b.Fatal("denied")
				}
			}
			elapsed := time.Since(start)
			runtime.GC()
			runtime.ReadMemStats(&after)
			if m.Len() != n {
				b.Fatalf("Len %d", m.Len())
			}
			runtime.KeepAlive(m)
			runtime.KeepAlive(tenants)
			b.ReportMetric(float64(elapsed.Nanoseconds())/n, "ns/op")
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/key")
		})
	}
}

// floodTenants is how many tenants BenchmarkMemoryFlood sends.
const floodTenants = 4_000_000

// BenchmarkMemoryFlood sends 4 million random hostile tenants (129 bytes
// of braces, colons, '%', control bytes and a few letters, as a client
// controlling the tenant header could; each stored as its digest) through a MemoryStore with the
// default MaxMemory, one token-bucket request each, and reports the live
// heap after a garbage collection, the process's resident memory then
// (VmRSS) and at its peak (VmHWM), in MiB. It runs the flood once
// whatever b.N:
//
//	go test -run '^$' -bench MemoryFlood -benchtime 1x ./limiter/
func BenchmarkMemoryFlood(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	m := NewMemoryStore(MemoryOptions{SweepInterval: -1})
	defer m.Close()
	rng := rand.New(rand.NewPCG(1, 1))
	buf := make([]byte, MaxValueLen+1)
	checks := []Check{{Algorithm: TokenBucket, Policy: "api", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1}}
	res := make([]Result, 1)
	for range floodTenants {
		checks[0].Tenant = hostileTenant(rng, buf)
		if ok, err := m.Decide(bgCtx, checks, res); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	elapsed := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	const mib = 1 << 20
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/mib, "live-heap-MiB")
	b.ReportMetric(float64(procStatusKB(b, "VmRSS"))/1024, "rss-MiB")
	b.ReportMetric(float64(procStatusKB(b, "VmHWM"))/1024, "peak-rss-MiB")
	b.ReportMetric(float64(m.Len()), "buckets")
	b.ReportMetric(float64(elapsed.Nanoseconds())/floodTenants, "ns/tenant")
	runtime.KeepAlive(m)
}

// procStatusKB returns a field of /proc/self/status in kB (0 where there
// is none).
func procStatusKB(b *testing.B, field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	return 0
}
