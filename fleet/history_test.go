package fleet

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/manualclock"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// newTestHistory is a History on a private in-process map ("memory") or
// on a real Redis ("redis"), closed when the test ends.
func newTestHistory(t *testing.T, kind string) *History {
	t.Helper()
	var h *History
	if kind == "memory" {
		h = newHistory(&memoryHistorySink{hashes: map[string]*memoryHash{}, now: time.Now}, "t", HistoryOptions{})
	} else {
		srv := redistest.StartStandalone(t, redistest.Options{})
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		h = NewRedisHistory(c, "t", HistoryOptions{})
	}
	t.Cleanup(h.Close)
	return h
}

// TestHistorySeries: points noted land in their minute and hour, are
// read before and after a flush (the instance's own pending points
// included), per tenant and policy only; ranges beyond the retention are
// refused.
func TestHistorySeries(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			h := newTestHistory(t, kind)
			clk := manualclock.New(time.Date(2026, 11, 26, 10, 58, 30, 0, time.UTC))
			h.now = clk.Now
			h.Note("api", "acme", 5, 0, 0)
			h.Note("api", "acme", 2, 1, 0)
			h.Note("api", "other", 100, 0, 0)
			h.Note("batch", "acme", 1000, 0, 0)
			ctx := context.Background()
			read := func(r Resolution, from, to time.Time) []Point {
				t.Helper()
				ps, err := h.Series(ctx, "api", "acme", r, from, to)
				if err != nil {
					t.Fatal(err)
				}
				return ps
			}
			start := time.Date(2026, 11, 26, 10, 57, 0, 0, time.UTC)
			check := func(when string) {
				t.Helper()
				ps := read(Minute, start, start.Add(4*time.Minute))
				want := []Point{{At: start}, {At: start.Add(time.Minute), Admitted: 7, Denied: 1}, {At: start.Add(2 * time.Minute), Shadow: 3},
					{At: start.Add(3 * time.Minute), Admitted: 4}, {At: start.Add(4 * time.Minute)}}
				if fmt.Sprint(ps) != fmt.Sprint(want) {
					t.Errorf("%s: minutes\n got %v\nwant %v", when, ps, want)
				}
				hs := read(Hour, start, start.Add(time.Hour))
				if len(hs) != 2 || hs[0].Admitted != 7 || hs[0].Denied != 1 || hs[0].Shadow != 3 || hs[1].Admitted != 4 {
					t.Errorf("%s: hours %v", when, hs)
				}
			}
			clk.Advance(time.Minute) // 10:59:30
			h.Note("api", "acme", 0, 0, 3)
			clk.Advance(time.Minute) // 11:00:30: the next hour, and its hash
			h.Note("api", "acme", 4, 0, 0)
			check("pending")
			h.Flush(ctx)
			check("flushed")
			h.Note("api", "acme", 0, 0, 0) // nothing
			if _, err := h.Series(ctx, "api", "acme", Minute, start, start.Add(49*time.Hour)); err == nil {
				t.Error("49 hours of minutes: no error")
			}
			if _, err := h.Series(ctx, "api", "acme", Hour, start, start.Add(24*time.Hour)); err != nil {
				t.Errorf("a day of hours: %v", err)
			}
		})
	}
}

// TestHistoryRedisTTL: every hash written expires with its retention
// after its hour or day ends.
func TestHistoryRedisTTL(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	h := NewRedisHistory(c, "ttl", HistoryOptions{MinuteRetention: 2 * time.Hour, HourRetention: 3 * 24 * time.Hour})
	defer h.Close()
	now := time.Now()
	h.Note("api", "acme", 1, 0, 0)
	h.Flush(context.Background())
	hour, day := now.Unix()/3600, now.Unix()/86400
	for key, end := range map[string]time.Time{
		"ttl:hist:{acme}:api:m:" + strconv.FormatInt(hour, 10): time.Unix((hour+1)*3600, 0).Add(2 * time.Hour),
		"ttl:hist:{acme}:api:h:" + strconv.FormatInt(day, 10):  time.Unix((day+1)*86400, 0).Add(3 * 24 * time.Hour),
	} {
		exp, err := c.ExpireTime(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Unix(int64(exp/time.Second), 0); !got.Equal(end) {
			t.Errorf("%s expires at %v, want %v", key, got, end)
		}
	}
}

// TestHistoryMemory measures the Redis memory of a full retention for one
// tenant and policy: a point every minute for 48 hours and every hour for
// 90 days (the defaults), with denials in one minute of ten.
func TestHistoryMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 90 days of points to a real Redis")
	}
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	h := NewRedisHistory(c, "mem", HistoryOptions{})
	defer h.Close()
	ctx := context.Background()
	end := time.Now().Truncate(time.Hour)
	var incs []historyIncr
	for m := end.Add(-DefaultHourRetention).Unix() / 60; m < end.Unix()/60; m++ {
		c := [3]int64{1234, 0, 0}
		if m%10 == 0 {
			c[1] = 7
		}
		k := historyKey{"api", "tenant-0001", m}
		if m < end.Add(-DefaultMinuteRetention).Unix()/60 {
			// Older than the minute retention: only its hour is kept.
			hour := m / 60
			incs = append(incs, historyIncr{key: hourKey(k.policy, k.tenant, hour/24), field: strconv.FormatInt(hour%24, 10), n: c[0],
				expireAt: end.Add(DefaultHourRetention).Unix()})
			continue
		}
		incs = h.appendIncrs(incs, k, c)
	}
	if err := h.sink.add(ctx, incs); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "mem:hist:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	t.Logf("one tenant and policy, full retention: %d keys, %d bytes (%.1f KiB)", len(keys), total, float64(total)/1024)
	if total > 64<<10 {
		t.Errorf("%d bytes per tenant and policy, want at most 64 KiB", total)
	}
}

// TestHistoryTop: the tenants admitted the most units over the hours of
// a range, flushed and pending alike, per policy.
func TestHistoryTop(t *testing.T) {
	for _, kind := range []string{"memory", "redis"} {
		t.Run(kind, func(t *testing.T) {
			h := newTestHistory(t, kind)
			clk := manualclock.New(time.Now().Truncate(time.Hour).Add(-90 * time.Minute))
			h.now = clk.Now
			h.Note("api", "a", 10, 0, 0)
			h.Note("api", "b", 30, 0, 0)
			h.Note("api", "c", 0, 5, 0) // denials only: not a consumer
			h.Note("other", "z", 1000, 0, 0)
			h.Flush(context.Background())
			clk.Advance(time.Hour)
			h.Note("api", "a", 25, 0, 0) // pending
			top, err := h.Top(context.Background(), "api", clk.Now().Add(-2*time.Hour), clk.Now(), 10)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(top) != "[{a 35} {b 30}]" {
				t.Fatalf("top %v", top)
			}
			if top, _ := h.Top(context.Background(), "api", clk.Now().Add(-2*time.Hour), clk.Now(), 1); len(top) != 1 || top[0].Tenant != "a" {
				t.Fatalf("top 1: %v", top)
			}
		})
	}
}

// TestHistoryMemoryBound: a full embedded history makes room for a tenth
// of its bound at once, dropping the hashes that expire first, so new
// hashes are not each a scan of the map; each hour's top set keeps its
// busiest tenants, trimmed in one go.
func TestHistoryMemoryBound(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := &memoryHistorySink{hashes: map[string]*memoryHash{}, now: func() time.Time { return now }}
	incs := make([]historyIncr, historyMemoryKeys)
	for i := range incs {
		incs[i] = historyIncr{key: "h" + strconv.Itoa(i), field: "a", n: 1, expireAt: now.Unix() + 1000 + int64(i)}
	}
	if err := s.add(context.Background(), incs); err != nil {
		t.Fatal(err)
	}
	if err := s.add(context.Background(), []historyIncr{{key: "new", field: "a", n: 1, expireAt: now.Unix() + 10}}); err != nil {
		t.Fatal(err)
	}
	if want := historyMemoryKeys*9/10 + 1; len(s.hashes) != want {
		t.Fatalf("%d hashes after making room, want %d", len(s.hashes), want)
	}
	dropped := historyMemoryKeys - historyMemoryKeys*9/10
	if s.hashes["h"+strconv.Itoa(dropped-1)] != nil || s.hashes["h"+strconv.Itoa(dropped)] == nil || s.hashes["new"] == nil {
		t.Error("the hashes dropped are not those that expire first")
	}

	fields := map[string]int64{}
	for i := range historyTopKeep + 500 {
		fields[fmt.Sprintf("t%05d", i)] = int64((i + 1) / 2) // pairs tie
	}
	trimTop(fields)
	if len(fields) != historyTopKeep {
		t.Fatalf("%d tenants kept, want %d", len(fields), historyTopKeep)
	}
	// Dropped: the 500 smallest counts, ties by name: t00499 and t00500
	// both count 250, at the line; the smaller name goes.
	if _, ok := fields["t00499"]; ok {
		t.Error("t00499 kept")
	}
	if _, ok := fields["t00500"]; !ok {
		t.Error("t00500 dropped")
	}
}
