// Command protectload is the load of bench/protect.sh: a fake upstream
// whose capacity is C concurrent requests (latency flat up to C, growing
// in proportion beyond it, 503 past 2C), and open-loop traffic through
// Caddy to it from one tenant at 10 times the upstream's capacity and
// three light tenants at 10% each. It prints one JSON line of what it
// measured: requests in flight at the upstream, goodput, each tenant's
// success rate and p99 latency (and the light tenants' p99 alone, before
// the flood), and how the protect limit followed when C halved. Latency
// and in flight are reported apart for the 5 s after C halved (the time
// the limit has to follow: requests in flight at the upstream when its
// capacity halves take twice as long, whatever a limiter does) and for
// the steady state after them.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type upstream struct {
	capacity atomic.Int64
	base     time.Duration
	inflight atomic.Int64
	ok       atomic.Int64
	// samples are the in-flight counts sampled, per phase (0: C, 1: the
	// 5 s after C halved, 2: C/2 after those).
	phase   atomic.Int64
	samples [3][]int64
	// refusedAt are the times of the upstream's refusals (503s), from
	// the flood's start.
	refusedAt []float64
	start     time.Time
	mu        sync.Mutex
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.inflight.Add(1)
	defer u.inflight.Add(-1)
	c := u.capacity.Load()
	if n > 2*c {
		u.mu.Lock()
		if !u.start.IsZero() {
			u.refusedAt = append(u.refusedAt, time.Since(u.start).Seconds())
		}
		u.mu.Unlock()
		w.Header().Set("X-Upstream-Refused", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	lat := u.base
	if n > c {
		lat = u.base * time.Duration(n) / time.Duration(c)
	}
	time.Sleep(lat)
	u.ok.Add(1)
	w.WriteHeader(http.StatusOK)
}

// sample records the upstream's in-flight count every 10ms.
func (u *upstream) sample(ctx context.Context) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			u.mu.Lock()
			ph := u.phase.Load()
			u.samples[ph] = append(u.samples[ph], u.inflight.Load())
			u.mu.Unlock()
		}
	}
}

type tenantStats struct {
	mu       sync.Mutex
	sent, ok int
	// latencies of the successes, by the phase they were sent in.
	latencies [3][]time.Duration
	// failures by phase and status ("error" when there was none).
	failures map[string]int
}

func (s *tenantStats) add(phase int64, status string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent++
	if status == "200" {
		s.ok++
		s.latencies[phase] = append(s.latencies[phase], d)
		return
	}
	if s.failures == nil {
		s.failures = map[string]int{}
	}
	s.failures[fmt.Sprint(phase, ":", status)]++
}

func p99(ds []time.Duration) float64 { return quantile(ds, 99) }

// quantile is the q-th percentile of ds, in milliseconds.
func quantile(ds []time.Duration, q int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)*q/100, len(s)-1)].Microseconds()) / 1000
}

// load sends rate requests a second as tenant until ctx ends.
func load(ctx context.Context, client *http.Client, url, tenant string, rate float64, phase *atomic.Int64, st *tenantStats, wg *sync.WaitGroup) {
	defer wg.Done()
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for ctx.Err() == nil {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("X-Tenant", tenant)
			ph := phase.Load()
			start := time.Now()
			res, err := client.Do(req)
			status := "error"
			if err == nil {
				status = strconv.Itoa(res.StatusCode)
				switch {
				case res.Header.Get("X-Upstream-Refused") != "":
					status += "-upstream"
				case res.Header.Get("Retry-After") != "":
					status += "-shed"
				}
				res.Body.Close()
			}
			st.add(ph, status, time.Since(start))
		}()
	}
}

// protectLimit reads caddy_rate_limit_protect_limit from Caddy's metrics.
func protectLimit(client *http.Client, metricsURL string) float64 {
	res, err := client.Get(metricsURL)
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "caddy_rate_limit_protect_limit "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// shedReasons reads caddy_rate_limit_shed_total by reason.
func shedReasons(client *http.Client, metricsURL string) map[string]float64 {
	out := map[string]float64{}
	res, err := client.Get(metricsURL)
	if err != nil {
		return out
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `caddy_rate_limit_shed_total{reason="`)
		if !ok {
			continue
		}
		reason, v, _ := strings.Cut(line, `"} `)
		f, _ := strconv.ParseFloat(v, 64)
		out[reason] = f
	}
	return out
}

func main() {
	listen := flag.String("upstream", "127.0.0.1:0", "address of the fake upstream")
	capacity := flag.Int("capacity", 20, "C: requests in flight the upstream serves at its base latency")
	base := flag.Duration("base", 50*time.Millisecond, "the upstream's latency up to C")
	target := flag.String("target", "", "Caddy's URL (empty: print the upstream's address and wait for it on stdin)")
	metrics := flag.String("metrics", "", "Caddy's metrics URL, to follow the protect limit")
	warm := flag.Duration("light-alone", 5*time.Second, "how long the light tenants run alone first (their unloaded p99)")
	duration := flag.Duration("duration", 20*time.Second, "how long the flood runs; C halves in the middle")
	flag.Parse()

	u := &upstream{base: *base}
	u.capacity.Store(int64(*capacity))
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go http.Serve(l, u)
	if *target == "" {
		fmt.Println(l.Addr().String())
		bufio.NewReader(os.Stdin).ReadString('\n')
		return
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}}
	capRate := float64(*capacity) / base.Seconds() // requests/s the upstream can serve
	light := []string{"light-1", "light-2", "light-3"}
	var wg sync.WaitGroup

	// The light tenants alone: their unloaded p99.
	alone := map[string]*tenantStats{}
	ctx, cancel := context.WithTimeout(context.Background(), *warm)
	for _, t := range light {
		alone[t] = &tenantStats{}
		wg.Add(1)
		go load(ctx, client, *target, t, capRate*0.1, new(atomic.Int64), alone[t], &wg)
	}
	wg.Wait()
	cancel()

	// Then the flood at 10x the capacity with them; C halves half way.
	stats := map[string]*tenantStats{"flood": {}}
	for _, t := range light {
		stats[t] = &tenantStats{}
	}
	ctx, cancel = context.WithTimeout(context.Background(), *duration)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	go u.sample(sctx)
	okBefore := u.ok.Load()
	start := time.Now()
	u.mu.Lock()
	u.start = start
	u.mu.Unlock()
	wg.Add(1)
	go load(ctx, client, *target, "flood", capRate*10, &u.phase, stats["flood"], &wg)
	for _, t := range light {
		wg.Add(1)
		go load(ctx, client, *target, t, capRate*0.1, &u.phase, stats[t], &wg)
	}
	// Follow the limit; halve C in the middle.
	var followed float64 = -1
	var limits []float64
	half := *duration / 2
	// settle is the time the limit has to follow C/2 (the target's 5 s):
	// what happens in it is reported apart from the steady state.
	const settle = 5 * time.Second
	halved := false
	var halvedAt time.Time
	tick := time.NewTicker(100 * time.Millisecond)
	var firstHalf int64
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if !halved && time.Since(start) >= half {
				firstHalf = u.ok.Load() - okBefore
				u.capacity.Store(int64(*capacity / 2))
				u.phase.Store(1)
				halved, halvedAt = true, time.Now()
			}
			if halved && u.phase.Load() == 1 && time.Since(halvedAt) >= settle {
				u.phase.Store(2)
			}
			if *metrics != "" {
				lim := protectLimit(client, *metrics)
				limits = append(limits, lim)
				// 0: no protect block (the gauge exists, its limit is at least 1).
				if halved && followed < 0 && lim > 0 && lim <= 1.2*float64(*capacity/2) {
					followed = time.Since(halvedAt).Seconds()
				}
			}
		}
	}
	tick.Stop()
	scancel()
	total := u.ok.Load() - okBefore
	wg.Wait()

	u.mu.Lock()
	first, transition, second := slices.Clone(u.samples[0]), slices.Clone(u.samples[1]), slices.Clone(u.samples[2])
	refused := slices.Clone(u.refusedAt)
	u.mu.Unlock()
	slices.Sort(first)
	slices.Sort(transition)
	slices.Sort(second)
	pct := func(s []int64, q int) int64 {
		if len(s) == 0 {
			return -1
		}
		return s[min(len(s)*q/100, len(s)-1)]
	}
	out := map[string]any{
		"capacity":                 *capacity,
		"capacity_rps":             capRate,
		"inflight_p99_first_half":  pct(first, 99),
		"inflight_max_first_half":  pct(first, 100),
		"inflight_p99_second_half": pct(second, 99),
		"inflight_max_transition":  pct(transition, 100),
		"inflight_p50_first_half":  pct(first, 50),
		"inflight_p90_first_half":  pct(first, 90),
		"limits":                   limits,
		"upstream_refusals":        len(refused),
		"upstream_refused_at":      refused[:min(len(refused), 20)],
		"goodput_first_half":       float64(firstHalf) / half.Seconds() / capRate,
		"goodput_second_half":      float64(total-firstHalf) / (duration.Seconds() - half.Seconds()) / (capRate / 2),
		"limit_followed_seconds":   followed,
	}
	for t, s := range stats {
		s.mu.Lock()
		out[t+"_success"] = float64(s.ok) / float64(max(s.sent, 1))
		out[t+"_p99_ms"] = p99(s.latencies[0])
		out[t+"_p50_ms"] = quantile(s.latencies[0], 50)
		out[t+"_p99_transition_ms"] = p99(s.latencies[1])
		out[t+"_p99_second_half_ms"] = p99(s.latencies[2])
		out[t+"_sent"] = s.sent
		if t != "flood" {
			out[t+"_failures"] = s.failures
		}
		s.mu.Unlock()
	}
	for t, s := range alone {
		out[t+"_alone_p99_ms"] = p99(s.latencies[0])
	}
	if len(limits) > 0 {
		out["limit_last"] = limits[len(limits)-1]
	}
	if *metrics != "" {
		out["shed"] = shedReasons(client, *metrics)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
