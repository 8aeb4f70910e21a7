package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// errStore fails every call.
type errStore struct{ limiter.Store }

func (errStore) Decide(context.Context, []limiter.Check, []limiter.Result) (bool, error) {
	return false, fmt.Errorf("down")
}

// newTestStream is a denial stream on c with a healthy breaker, counting
// drops in d.
func newTestStream(c redis.UniversalClient, prefix string, timeout time.Duration, breaker *limiter.BreakerStore, d *dropCounter) *DenialStream {
	if breaker == nil {
		breaker = limiter.NewBreakerStore(errStore{}, limiter.BreakerOptions{})
	}
	return newDenialStream(denialStreamOptions{client: c, prefix: prefix, instance: "test-instance", timeout: timeout,
		breaker: breaker, logger: zap.NewNop(), dropped: d.add})
}

// TestDenialStreamTrims: MAXLEN ~ keeps the stream near maxlen, and with a
// healthy Redis nothing is dropped.
func TestDenialStreamTrims(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	var drops dropCounter
	s := newTestStream(c, "rl", time.Second, nil, &drops)
	s.Acquire(100)
	const n = 1000
	for i := range n {
		s.Add(Denial{TS: time.Now().UnixMilli(), Tenant: "acme", Policy: "api", Limit: 1, RetryAfter: 3})
		if i%200 == 199 {
			time.Sleep(5 * time.Millisecond) // let the writer drain
		}
	}
	waitFor(t, func() bool { return int(entriesAdded(t, c, "rl:denials"))+drops.total() >= n })
	s.close()
	if d := drops.total(); d != 0 {
		t.Errorf("%d denials dropped with a healthy Redis", d)
	}
	xlen, err := c.XLen(context.Background(), "rl:denials").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("entries added %d, XLEN %d with maxlen 100", entriesAdded(t, c, "rl:denials"), xlen)
	if xlen < 100 || xlen > 300 {
		t.Errorf("XLEN %d, want about 100 (100..300) after %d denials with maxlen 100", xlen, n)
	}
}

// TestDenialStreamFullBufferNeverBlocks: with the writer stuck on a paused
// Redis and the buffer full, adding a denial returns at once and counts a
// drop; the writer recovers when Redis is back and stops within its flush
// deadline.
func TestDenialStreamFullBufferNeverBlocks(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ReadTimeout, opts.WriteTimeout = 50*time.Millisecond, 50*time.Millisecond
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	var drops dropCounter
	s := newTestStream(client, "full", 50*time.Millisecond, nil, &drops)
	s.Acquire(100)
	defer s.close()

	srv.Pause()
	const n = 20000
	var worst, total time.Duration
	e := Denial{TS: time.Now().UnixMilli(), Tenant: "acme", Policy: "api", Limit: 10, RetryAfter: 3}
	for range n {
		t0 := time.Now()
		s.Add(e)
		d := time.Since(t0)
		total += d
		worst = max(worst, d)
	}
	dropped := drops.get("buffer_full")
	t.Logf("%d adds with the writer hung: mean %v, worst %v, %v dropped as buffer_full", n, total/n, worst, dropped)
	if dropped < n-denialBufferSize-2*denialBatchSize {
		t.Errorf("only %v of %d dropped with a %d buffer and a hung writer", dropped, n, denialBufferSize)
	}
	if total/n > 20*time.Microsecond || worst > 100*time.Millisecond {
		t.Errorf("add with a full buffer: mean %v, worst %v; it must not wait", total/n, worst)
	}
	srv.Resume()
	waitFor(t, func() bool { return entriesAdded(t, srv.Client(t), "full:denials") > 0 })

	// close: the last flush is bounded even with Redis paused again.
	for range denialBufferSize {
		s.Add(e)
	}
	srv.Pause()
	t0 := time.Now()
	s.close()
	if d := time.Since(t0); d > denialFlushTimeout+time.Second {
		t.Errorf("close took %v with Redis paused", d)
	}
	srv.Resume()
	before := drops.get("shutdown")
	s.Add(e) // after close: counted, not queued
	if len(s.buf) != 0 || drops.get("shutdown") != before+1 {
		t.Errorf("%d denials left in the buffer after close; shutdown drops %d -> %d", len(s.buf), before, drops.get("shutdown"))
	}
}

// TestDenialStreamBreakerOpen: while the breaker is open the writer drops
// batches without calling Redis.
func TestDenialStreamBreakerOpen(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	failing := limiter.NewBreakerStore(errStore{}, limiter.BreakerOptions{Failures: 1, Cooldown: time.Hour})
	_, _ = failing.Decide(context.Background(), []limiter.Check{{}}, make([]limiter.Result, 1))
	if !failing.Open() {
		t.Fatal("breaker did not open")
	}
	var drops dropCounter
	s := newTestStream(c, "brk", 100*time.Millisecond, failing, &drops)
	s.Acquire(100)
	for range 10 {
		s.Add(Denial{Tenant: "acme", Policy: "api"})
	}
	waitFor(t, func() bool { return drops.get("breaker_open") == 10 })
	s.close()
	if got := entriesAdded(t, c, "brk:denials"); got != 0 {
		t.Errorf("%d entries written with the breaker open", got)
	}
}

// TestDenialStreamRecent: the newest entries of a tenant first, at most n,
// reading at most maxScanned entries.
func TestDenialStreamRecent(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	var drops dropCounter
	s := newTestStream(c, "rec", time.Second, nil, &drops)
	s.Acquire(10000)
	for i := range 2500 {
		tenant := "other"
		if i%1000 == 0 || i == 2499 {
			tenant = "acme"
		}
		s.Add(Denial{TS: int64(i), Tenant: tenant, Policy: "api", Limit: 1, RetryAfter: 1})
		if i%500 == 499 {
			waitFor(t, func() bool { return entriesAdded(t, c, "rec:denials") == int64(i+1) })
		}
	}
	waitFor(t, func() bool { return entriesAdded(t, c, "rec:denials") == 2500 })
	s.close()
	got, err := s.Recent(context.Background(), "acme", "", 3, 20000)
	if err != nil {
		t.Fatal(err)
	}
	var ts []string
	for _, e := range got {
		ts = append(ts, e["ts"].(string))
	}
	if fmt.Sprint(ts) != "[2499 2000 1000]" {
		t.Errorf("recent ts %v, want [2499 2000 1000] (newest first, 3 of 4)", ts)
	}
	if got, _ := s.Recent(context.Background(), "acme", "", 10, 1000); len(got) != 2 {
		t.Errorf("scanning 1000 entries found %d, want 2 (2499 and 2000)", len(got))
	}
}

// TestDenialStreamRecentByID: two tenants whose names were cut to the
// same 128 bytes are told apart by their tenant_id, and a tenant whose
// name was not cut never matches an entry that has one. (Both long
// tenants saw each other's denials.)
func TestDenialStreamRecentByID(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	var drops dropCounter
	s := newTestStream(c, "ids", time.Second, nil, &drops)
	s.Acquire(100)
	cut := strings.Repeat("p", 128) + "...(200 bytes)"
	s.Add(Denial{TS: 1, Tenant: cut, TenantID: "#victim", Policy: "api"})
	s.Add(Denial{TS: 2, Tenant: cut, TenantID: "#other", Policy: "api"})
	s.Add(Denial{TS: 3, Tenant: "acme", Policy: "api"})
	waitFor(t, func() bool { return entriesAdded(t, c, "ids:denials") == 3 })
	s.close()
	for _, tc := range []struct {
		tenant, id, want string
	}{{cut, "#other", "[2]"}, {cut, "#victim", "[1]"}, {cut, "", "[]"}, {"acme", "", "[3]"}} {
		got, err := s.Recent(context.Background(), tc.tenant, tc.id, 10, 100)
		if err != nil {
			t.Fatal(err)
		}
		ts := []string{}
		for _, e := range got {
			ts = append(ts, e["ts"].(string))
		}
		if fmt.Sprint(ts) != tc.want {
			t.Errorf("Recent(%.12q..., %q): ts %v, want %s", tc.tenant, tc.id, ts, tc.want)
		}
	}
}

// BenchmarkDenialStreamWrite: entries per second one writer puts in a
// local Redis, in full batches.
func BenchmarkDenialStreamWrite(b *testing.B) {
	srv := redistest.StartStandalone(b, redistest.Options{})
	c := srv.Client(b)
	var drops dropCounter
	s := newTestStream(c, "bench", time.Second, nil, &drops)
	s.maxlen.Store(10000)
	batch := make([]Denial, denialBatchSize)
	for i := range batch {
		batch[i] = Denial{TS: time.Now().UnixMilli(), Tenant: "tenant-" + strconv.Itoa(i), Policy: "api", Limit: 100, RetryAfter: 7}
	}
	ctx := context.Background()
	start := time.Now()
	n := 0
	for b.Loop() {
		if err := s.write(ctx, batch); err != nil {
			b.Fatal(err)
		}
		n += len(batch)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "entries/s")
}
