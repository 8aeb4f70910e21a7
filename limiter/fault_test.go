package limiter

// Fault injection against real redis-server processes (internal/redistest),
// through the composition the handler uses: a go-redis client configured
// as the handler configures it, RedisStore, BreakerStore over it, and
// Decision.DecideOrFallback with a local fallback and a Recorder. Every
// scenario checks that it leaks no goroutine once its clients are closed.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/internal/redistest"
	"go.uber.org/goleak"
)

const (
	// faultTimeout is the store's per-call deadline in these tests: the
	// handler's default.
	faultTimeout = 100 * time.Millisecond
	// maxOverrun is how much longer than faultTimeout a call may take:
	// the deadline plus scheduling noise of a loaded 2-core machine under
	// -race (measured: 0.3-6 ms).
	maxOverrun = 40 * time.Millisecond
	// faultCooldown is the breaker cooldown in these tests.
	faultCooldown = 300 * time.Millisecond
	// leakWait bounds how long checkLeaks waits for goroutines to end:
	// go-redis' dial prober sleeps 1s between attempts and notices a closed
	// client only when it wakes up.
	leakWait = 3 * time.Second
)

// checkLeaks verifies, once the test and all its cleanups are done (redis
// processes killed, clients closed), that no goroutine started during the
// test is left. The only goroutine ignored is redistest's process spawner,
// which lives as long as the test binary by design.
func checkLeaks(t *testing.T) {
	t.Helper()
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/tollgate/caddy-tollgate/internal/redistest.startCmd.func1.1"),
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(leakWait)
		for goleak.Find(opts...) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		goleak.VerifyNone(t, opts...)
	})
}

// handlerOptions completes o the way the handler configures its clients
// (redis_client.go): deadlines follow the call's context, socket and pool
// timeouts equal the store timeout.
func handlerOptions(o *redis.UniversalOptions) *redis.UniversalOptions {
	o.ClientName = "tollgate"
	o.ContextTimeoutEnabled = true
	o.DialTimeout = max(faultTimeout, 250*time.Millisecond)
	o.ReadTimeout = faultTimeout
	o.WriteTimeout = faultTimeout
	o.PoolTimeout = faultTimeout
	o.MaxRetries = -1
	return o
}

// transition is one OnStateChange call.
type transition struct {
	open bool
	at   time.Time
	err  error
}

// rig is the handler's composition on one client.
type rig struct {
	t       *testing.T
	client  redis.UniversalClient
	rs      *RedisStore
	br      *BreakerStore
	fb      Fallback
	rec     *Recorder
	calls   sync.Map // "script/result" -> *atomic.Int64
	mu      sync.Mutex
	changes []transition
	flushes []FlushStats
	flushWG sync.WaitGroup
}

// newRig builds the composition. With autoFlush, the recorder is flushed
// (through the breaker) in a new goroutine each time the breaker closes,
// as the handler does.
func newRig(t *testing.T, opts *redis.UniversalOptions, scale float64, autoFlush bool) *rig {
	t.Helper()
	r := &rig{t: t, client: redis.NewUniversalClient(handlerOptions(opts))}
	r.rs = NewRedisStore(RedisOptions{Client: r.client, Timeout: faultTimeout, Observe: func(script, result string, _ time.Duration) {
		v, _ := r.calls.LoadOrStore(script+"/"+result, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}})
	r.rec = NewRecorder(RecorderOptions{})
	r.br = NewBreakerStore(r.rs, BreakerOptions{Failures: 3, Cooldown: faultCooldown, OnStateChange: func(open bool, err error) {
		r.mu.Lock()
		r.changes = append(r.changes, transition{open, time.Now(), err})
		r.mu.Unlock()
		if !open && autoFlush {
			r.flushWG.Add(1)
			go func() {
				defer r.flushWG.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				st, err := r.rec.Flush(ctx, r.br)
				if err != nil {
					t.Logf("flush: %v", err)
				}
				r.mu.Lock()
				r.flushes = append(r.flushes, st)
				r.mu.Unlock()
			}()
		}
	}})
	mem := NewMemoryStore(MemoryOptions{})
	r.fb = Fallback{Store: mem, Scale: scale, Recorder: r.rec}
	t.Cleanup(func() {
		r.flushWG.Wait()
		_ = r.br.Close()
		_ = r.client.Close()
		_ = mem.Close()
	})
	return r
}

func (r *rig) count(script, result string) int64 {
	if v, ok := r.calls.Load(script + "/" + result); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

func (r *rig) transitions() []transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.changes)
}

// waitTransition waits for the n-th transition (0-based) and checks its
// direction.
func (r *rig) waitTransition(n int, open bool, timeout time.Duration) time.Time {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if tr := r.transitions(); len(tr) > n {
			if tr[n].open != open {
				r.t.Fatalf("transition %d: open=%v, want %v (all: %v)", n, tr[n].open, open, tr)
			}
			return tr[n].at
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no transition %d (open=%v) within %v; breaker open=%v", n, open, timeout, r.br.Open())
		}
		time.Sleep(time.Millisecond)
	}
}

// sample is one request of the load.
type sample struct {
	worker   int
	start    time.Time
	lat      time.Duration
	err      error
	paths    [4]Path // of the first verdicts
	admitted bool
}

func (s *sample) end() time.Time { return s.start.Add(s.lat) }

// load runs workers that decide in a loop, each on the items its function
// returns for the iteration, until Stop.
type load struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	samples [][]sample
}

func (r *rig) startLoad(workers []func(iter int) []Item) *load {
	l := &load{stop: make(chan struct{}), samples: make([][]sample, len(workers))}
	// Stopped before the rig's clients close, also when the test fails.
	r.t.Cleanup(l.halt)
	for w, items := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var d Decision
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				it := items(i)
				start := time.Now()
				err := d.DecideOrFallback(context.Background(), r.br, r.fb, it)
				s := sample{worker: w, start: start, lat: time.Since(start), err: err, admitted: d.Admitted}
				for j := range min(len(d.Verdicts), len(s.paths)) {
					s.paths[j] = d.Verdicts[j].Path
				}
				l.samples[w] = append(l.samples[w], s)
				time.Sleep(500 * time.Microsecond)
			}
		}()
	}
	return l
}

func (l *load) halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// Stop ends the load and returns every sample, in order of start.
func (l *load) Stop() []sample {
	l.halt()
	var all []sample
	for _, s := range l.samples {
		all = append(all, s...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start.Before(all[j].start) })
	return all
}

// latencies summarizes the latencies of the samples that match keep.
type latencies struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(samples []sample, keep func(*sample) bool) latencies {
	var ls []time.Duration
	for i := range samples {
		if keep(&samples[i]) {
			ls = append(ls, samples[i].lat)
		}
	}
	if len(ls) == 0 {
		return latencies{}
	}
	slices.Sort(ls)
	return latencies{n: len(ls), p50: ls[len(ls)/2], p99: ls[len(ls)*99/100], max: ls[len(ls)-1]}
}

func (l latencies) String() string {
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", l.n, l.p50, l.p99, l.max)
}

// errorKinds counts the samples' errors by kind.
func errorKinds(samples []sample) (fast, store int, kinds map[string]int) {
	kinds = map[string]int{}
	for i := range samples {
		err := samples[i].err
		switch {
		case err == nil:
		case errors.Is(err, ErrBreakerOpen):
			fast++
		default:
			store++
			kinds[errorKind(err)]++
		}
	}
	return fast, store, kinds
}

func errorKind(err error) string {
	msg := err.Error()
	for _, k := range []string{"deadline exceeded", "i/o timeout", "connection refused", "connection reset", "EOF", "CLUSTERDOWN", "MOVED", "TRYAGAIN", "LOADING", "READONLY", "broken pipe", "pool timeout"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	if len(msg) > 60 {
		msg = msg[:60]
	}
	return msg
}

func policyOf(name string, algo Algorithm, mode FailMode, limit int64, window time.Duration) *Policy {
	return &Policy{Name: name, Algorithm: algo, FailMode: mode, Limit: Limit{Rate: Rate{Limit: limit, Window: window}}}
}

// fixed returns a worker that decides the same items every time.
func fixed(items ...Item) func(int) []Item {
	return func(int) []Item { return items }
}

// TestFaultPause: SIGSTOP under load, then SIGCONT. Every call returns
// within the deadline, the breaker opens once and fails fast while open,
// decisions follow the fail modes, and the breaker closes within one
// cooldown after SIGCONT.
func TestFaultPause(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	r := newRig(t, &redis.UniversalOptions{Addrs: []string{srv.Addr}}, 0.7, true)

	big := int64(1_000_000)
	open := policyOf("open", FixedWindow, FailOpen, big, time.Minute)
	closed := policyOf("closed", FixedWindow, FailClosed, big, time.Minute)
	// Local: a token bucket of 100/min; the fallback's is 70 units,
	// refilling at 70/min.
	local := policyOf("local", TokenBucket, FailLocal, 100, time.Minute)
	l := r.startLoad([]func(int) []Item{
		fixed(Item{Policy: open, Tenant: "t-open", Cost: 1}),
		fixed(Item{Policy: open, Tenant: "t-open", Cost: 1}),
		fixed(Item{Policy: closed, Tenant: "t-closed", Cost: 1}),
		fixed(Item{Policy: closed, Tenant: "t-closed", Cost: 1}),
		fixed(Item{Policy: local, Tenant: "t-local", Cost: 1}),
		fixed(Item{Policy: local, Tenant: "t-local", Cost: 1}),
	})
	time.Sleep(300 * time.Millisecond)
	paused := time.Now()
	srv.Pause()
	opened := r.waitTransition(0, true, 2*time.Second)
	time.Sleep(time.Until(paused.Add(1050 * time.Millisecond)))
	resumed := time.Now()
	srv.Resume()
	closedAt := r.waitTransition(1, false, faultCooldown+faultTimeout+2*time.Second)
	time.Sleep(300 * time.Millisecond)
	samples := l.Stop()

	all := summarize(samples, func(*sample) bool { return true })
	fast := summarize(samples, func(s *sample) bool { return errors.Is(s.err, ErrBreakerOpen) })
	slow := summarize(samples, func(s *sample) bool { return s.err != nil && !errors.Is(s.err, ErrBreakerOpen) })
	normal := summarize(samples, func(s *sample) bool { return s.err == nil })
	t.Logf("SIGSTOP with timeout %v: max latency %v over %d calls", faultTimeout, all.max, all.n)
	t.Logf("  store answered:        %v", normal)
	t.Logf("  store failed (timeout): %v", slow)
	t.Logf("  breaker open (fast):   %v", fast)
	t.Logf("  breaker opened %v after SIGSTOP; closed %v after SIGCONT (cooldown %v)",
		opened.Sub(paused).Round(time.Millisecond), closedAt.Sub(resumed).Round(time.Millisecond), faultCooldown)

	if all.max > faultTimeout+maxOverrun {
		t.Errorf("a call took %v, more than the timeout %v + %v", all.max, faultTimeout, maxOverrun)
	}
	// Bounds loose enough for a loaded CI machine under -race, still far
	// below the timeout: a refused call never waits on Redis.
	if fast.n == 0 || fast.p99 >= 5*time.Millisecond {
		t.Errorf("calls while open: %v; want them to fail fast (p99 < 5ms)", fast)
	}
	if fast.max >= faultTimeout/4 {
		t.Errorf("a call refused by the open breaker took %v", fast.max)
	}
	if d := opened.Sub(paused); d > faultTimeout+100*time.Millisecond {
		t.Errorf("breaker opened %v after SIGSTOP, want about one timeout (%v)", d, faultTimeout)
	}
	if d := closedAt.Sub(resumed); d > faultCooldown+faultTimeout+50*time.Millisecond {
		t.Errorf("breaker closed %v after SIGCONT, want within one cooldown (+ a probe)", d)
	}
	if tr := r.transitions(); len(tr) != 2 {
		t.Errorf("transitions %v, want exactly one open and one close", tr)
	}

	// Fail modes, on the calls the store did not answer.
	var openN, closedN, localN, localAdmitted int
	for i := range samples {
		s := &samples[i]
		if s.err == nil {
			if s.paths[0] != PathStore {
				t.Fatalf("store answered but path %d", s.paths[0])
			}
			continue
		}
		switch s.worker / 2 {
		case 0:
			openN++
			if !s.admitted || s.paths[0] != PathFailedOpen {
				t.Fatalf("fail open: admitted=%v path=%d", s.admitted, s.paths[0])
			}
		case 1:
			closedN++
			if s.admitted || s.paths[0] != PathFailedClosed {
				t.Fatalf("fail closed: admitted=%v path=%d", s.admitted, s.paths[0])
			}
		case 2:
			localN++
			if s.paths[0] != PathFallback {
				t.Fatalf("fail local: path %d", s.paths[0])
			}
			if s.admitted {
				localAdmitted++
			}
		}
	}
	t.Logf("  during the outage: open admitted %d/%d, closed admitted 0/%d, local admitted %d/%d (fallback bucket 70 of limit 100)",
		openN, openN, closedN, localAdmitted, localN)
	if localAdmitted < 70 || localAdmitted > 75 {
		t.Errorf("fail local admitted %d during the outage, want 70 (+ refill)", localAdmitted)
	}
	// After the close every call is answered by Redis again.
	for i := range samples {
		if s := &samples[i]; s.start.After(closedAt) && s.err != nil {
			t.Fatalf("error %v %v after the breaker closed", s.err, s.start.Sub(closedAt))
		}
	}
	r.flushWG.Wait()
	r.mu.Lock()
	t.Logf("  recovery flush: %+v", r.flushes)
	r.mu.Unlock()
}

// TestFaultKillRestart: SIGKILL, then a restart on the same port with an
// empty dataset. Service continues on the fallback, recovers, and NOSCRIPT
// after the restart is transparent.
func TestFaultKillRestart(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	r := newRig(t, &redis.UniversalOptions{Addrs: []string{srv.Addr}}, 0.7, true)
	p := policyOf("api", SlidingWindow, FailLocal, 1_000_000, time.Minute)
	var workers []func(int) []Item
	for w := range 3 {
		workers = append(workers, fixed(Item{Policy: p, Tenant: fmt.Sprint("k", w), Cost: 1}))
	}
	l := r.startLoad(workers)
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	srv.Kill()
	opened := r.waitTransition(0, true, 2*time.Second)
	time.Sleep(600 * time.Millisecond)
	restart := time.Now()
	srv.Restart(t)
	restarted := time.Now()
	closedAt := r.waitTransition(1, false, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	samples := l.Stop()

	all := summarize(samples, func(*sample) bool { return true })
	fast, store, kinds := errorKinds(samples)
	t.Logf("SIGKILL: breaker opened %v after the kill; restart took %v; closed %v after redis-server was back",
		opened.Sub(killed).Round(time.Millisecond), restarted.Sub(restart).Round(time.Millisecond), closedAt.Sub(restarted).Round(time.Millisecond))
	t.Logf("  max latency %v (%v); store errors %d %v, fast fails %d; noscript replies %d",
		all.max, all, store, kinds, fast, r.count("decide", "noscript"))
	if all.max > faultTimeout+maxOverrun {
		t.Errorf("a call took %v, more than the timeout %v + %v", all.max, faultTimeout, maxOverrun)
	}
	for i := range samples {
		s := &samples[i]
		if !s.admitted {
			t.Fatalf("request denied (%v): the fallback should admit", s.err)
		}
		if s.start.After(closedAt) && s.err != nil {
			t.Fatalf("error after the breaker closed: %v", s.err)
		}
	}
	if r.count("decide", "noscript") == 0 {
		t.Error("no NOSCRIPT seen after the restart: the test did not exercise it")
	}
	if tr := r.transitions(); len(tr) != 2 {
		t.Errorf("transitions %v, want one open and one close", tr)
	}
	r.flushWG.Wait()
	// The restarted Redis holds the fallback's units again.
	r.mu.Lock()
	flushes := slices.Clone(r.flushes)
	r.mu.Unlock()
	if len(flushes) != 1 || flushes[0].Charged == 0 {
		t.Errorf("recovery flush %+v, want the fallback's units charged", flushes)
	}
	t.Logf("  recovery flush: %+v", flushes)
}

// TestFaultClusterFailover: a 3-master, 3-replica cluster loses a master;
// its replica is promoted and decisions continue.
func TestFaultClusterFailover(t *testing.T) {
	checkLeaks(t)
	c := redistest.StartCluster(t, 3, 1)
	r := newRig(t, &redis.UniversalOptions{Addrs: c.Addrs, IsClusterMode: true}, 0.7, true)
	p := policyOf("api", SlidingWindow, FailLocal, 1_000_000, time.Minute)
	// 30 tenants over the three masters' slots.
	var workers []func(int) []Item
	for w := range 4 {
		workers = append(workers, func(i int) []Item {
			return []Item{{Policy: p, Tenant: fmt.Sprint("tenant-", (i*4+w)%30), Cost: 1}}
		})
	}
	reg := NewRegistry(RegistryOptions{Client: r.client, Interval: 200 * time.Millisecond})
	defer reg.Close()
	l := r.startLoad(workers)
	time.Sleep(500 * time.Millisecond)
	if reg.Count() != 1 {
		t.Errorf("registry Count %d before the failover", reg.Count())
	}
	killed := time.Now()
	c.Masters[0].Kill()
	// The replica of the killed master takes over (cluster-node-timeout 2s).
	c.WaitOK(t)
	promoted := time.Now()
	// Decisions on the store again for every tenant: wait for a stretch
	// of 100 consecutive answered decisions.
	deadline := time.Now().Add(10 * time.Second)
	var recovered time.Time
	for recovered.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("decisions did not return to the store after the failover")
		}
		time.Sleep(50 * time.Millisecond)
		res := make([]Result, 1)
		ok := true
		for i := range 30 {
			chk := []Check{{Algorithm: SlidingWindow, Tenant: fmt.Sprint("tenant-", i), Policy: "api", Rate: p.Limit.Rate}}
			if err := r.rs.Peek(context.Background(), chk, res); err != nil {
				ok = false
				break
			}
		}
		if ok && !r.br.Open() {
			recovered = time.Now()
		}
	}
	time.Sleep(300 * time.Millisecond)
	samples := l.Stop()

	fast, store, kinds := errorKinds(samples)
	all := summarize(samples, func(*sample) bool { return true })
	t.Logf("cluster failover: replica promoted (cluster ok) %v after the master was killed; decisions back on Redis %v after the kill",
		promoted.Sub(killed).Round(time.Millisecond), recovered.Sub(killed).Round(time.Millisecond))
	t.Logf("  %d decisions: %d store errors %v, %d breaker fast-fails (all decided by the fallback); breaker transitions %d; max latency %v",
		len(samples), store, kinds, fast, len(r.transitions()), all.max)
	for i := range samples {
		s := &samples[i]
		if !s.admitted {
			t.Fatalf("request denied (%v): the fallback should admit", s.err)
		}
		if s.start.After(recovered) && s.err != nil {
			t.Fatalf("error after recovery: %v", s.err)
		}
	}
	if all.max > faultTimeout+maxOverrun {
		t.Errorf("a call took %v, more than the timeout %v + %v", all.max, faultTimeout, maxOverrun)
	}
	// The registry's heartbeats follow the failover too.
	time.Sleep(500 * time.Millisecond)
	if reg.Count() != 1 || time.Since(reg.LastHeartbeat()) > time.Second {
		t.Errorf("registry after failover: Count %d, last heartbeat %v ago", reg.Count(), time.Since(reg.LastHeartbeat()))
	}
}

// TestFaultSentinelFailover: the master dies; the sentinel promotes the
// replica and a failover-client RedisStore follows it.
func TestFaultSentinelFailover(t *testing.T) {
	checkLeaks(t)
	s := redistest.StartSentinel(t)
	r := newRig(t, &redis.UniversalOptions{Addrs: s.SentinelAddrs, MasterName: s.MasterName}, 0.7, true)
	p := policyOf("api", FixedWindow, FailLocal, 1_000_000, time.Hour)
	l := r.startLoad([]func(int) []Item{
		fixed(Item{Policy: p, Tenant: "s0", Cost: 1}),
		fixed(Item{Policy: p, Tenant: "s1", Cost: 1}),
	})
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	s.Master.Kill()
	s.WaitMasterAddr(t, s.Replica.Addr)
	promoted := time.Now()
	chk := []Check{{Algorithm: FixedWindow, Tenant: "s0", Policy: "api", Rate: p.Limit.Rate, Cost: 1}}
	res := make([]Result, 1)
	deadline := time.Now().Add(10 * time.Second)
	var followed time.Time
	for followed.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("the store did not follow the new master")
		}
		if _, err := r.rs.Decide(context.Background(), chk, res); err == nil {
			followed = time.Now()
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Let the breaker close (cooldown) and run on the new master.
	r.waitTransition(1, false, 3*time.Second)
	time.Sleep(300 * time.Millisecond)
	samples := l.Stop()

	fast, store, kinds := errorKinds(samples)
	all := summarize(samples, func(*sample) bool { return true })
	t.Logf("sentinel failover: new master reported %v after the kill; store writes to it %v after the kill",
		promoted.Sub(killed).Round(time.Millisecond), followed.Sub(killed).Round(time.Millisecond))
	t.Logf("  %d decisions: %d store errors %v, %d breaker fast-fails; max latency %v",
		len(samples), store, kinds, fast, all.max)
	// The writes land on the new master.
	nc := s.Replica.Client(t)
	role, err := nc.Do(context.Background(), "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Fatalf("new master ROLE %v %v", role, err)
	}
	key := string(AppendKey(nil, DefaultPrefix, FixedWindow, "s0", "api", ""))
	if n := nc.Exists(context.Background(), key).Val(); n != 1 {
		t.Errorf("bucket %s not on the new master", key)
	}
	for i := range samples {
		if !samples[i].admitted {
			t.Fatalf("request denied (%v): the fallback should admit", samples[i].err)
		}
	}
	if all.max > faultTimeout+maxOverrun {
		t.Errorf("a call took %v, more than the timeout %v + %v", all.max, faultTimeout, maxOverrun)
	}
}

// TestFaultOverAdmission measures how much a tenant hammering one instance
// gets through around an outage with fail local (scale 0.7, 1 instance),
// with and without recovery accounting. The policy is a sliding log, which
// is exact (never more than limit in any trailing window), so every excess
// is the outage's doing:
//   - at the start of the outage, the units Redis admitted in the trailing
//     window plus a fresh fallback bucket of 0.7 x limit: at most 1.7 x;
//   - during the outage, 0.7 x limit per window;
//   - at recovery, without accounting, the fallback's units in the trailing
//     window plus a fresh Redis budget (up to 1.7 x); with accounting the
//     fallback's units are charged to Redis (1.0 x).
func TestFaultOverAdmission(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	const (
		limit  = 100
		window = time.Second
		outage = 2 * time.Second
		// slack absorbs that admissions are timed on the client, up to a
		// round trip away from Redis' own instant.
		slack = 5
	)
	peaks := map[bool]int{}
	for _, flush := range []bool{true, false} {
		name := "with recovery accounting"
		if !flush {
			name = "without recovery accounting"
		}
		t.Run(name, func(t *testing.T) {
			r := newRig(t, &redis.UniversalOptions{Addrs: []string{srv.Addr}}, 0.7, flush)
			p := policyOf("api", SlidingLog, FailLocal, limit, window)
			item := Item{Policy: p, Tenant: fmt.Sprint("hammer-", flush), Cost: 1}
			l := r.startLoad([]func(int) []Item{fixed(item), fixed(item), fixed(item), fixed(item)})
			time.Sleep(1500 * time.Millisecond)
			paused := time.Now()
			srv.Pause()
			time.Sleep(outage)
			srv.Resume()
			closedAt := r.waitTransition(1, false, 3*time.Second)
			time.Sleep(1500 * time.Millisecond)
			samples := l.Stop()

			var admitted []time.Time
			var before, during, after int
			for i := range samples {
				s := &samples[i]
				if !s.admitted {
					continue
				}
				at := s.end()
				admitted = append(admitted, at)
				switch {
				case !at.After(paused):
					if at.After(paused.Add(-window)) {
						before++
					}
				case !at.After(closedAt):
					during++
				case !at.After(closedAt.Add(window)):
					after++
				}
			}
			slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
			// Peaks: most admissions in a trailing window ending during
			// the outage, and ending after recovery.
			peakOutage, peakRecovery := 0, 0
			for lo, hi := 0, 0; hi < len(admitted); hi++ {
				for admitted[hi].Sub(admitted[lo]) >= window {
					lo++
				}
				n := hi - lo + 1
				switch {
				case admitted[hi].After(closedAt):
					peakRecovery = max(peakRecovery, n)
				case admitted[hi].After(paused):
					peakOutage = max(peakOutage, n)
				}
			}
			outageLen := closedAt.Sub(paused)
			allowed := float64(limit) * outageLen.Seconds() / window.Seconds()
			r.flushWG.Wait()
			r.mu.Lock()
			flushes := slices.Clone(r.flushes)
			r.mu.Unlock()
			t.Logf("sliding_log %d/%v, fail local x0.7, 1 instance, %s; outage %v:",
				limit, window, name, outageLen.Round(time.Millisecond))
			t.Logf("  admitted: last %v before %d; during the outage %d = %.2f x what the limit allows in %v (%.0f); first %v after %d",
				window, before, during, float64(during)/allowed, outageLen.Round(time.Millisecond), allowed, window, after)
			t.Logf("  peak in any %v: %d (%.2f x limit) at the outage start, %d (%.2f x limit) at recovery; flush %+v",
				window, peakOutage, float64(peakOutage)/limit, peakRecovery, float64(peakRecovery)/limit, flushes)
			peaks[flush] = peakRecovery

			if bound := int(1.7*limit) + slack; peakOutage > bound {
				t.Errorf("peak %d during the outage, above limit x (1 + 0.7) = %d", peakOutage, bound)
			}
			if bound := 0.7*allowed + 0.7*limit + slack; float64(during) > bound {
				t.Errorf("admitted %d during the outage, above 0.7 x %.0f + one fallback bucket", during, allowed)
			}
			if flush {
				if peakRecovery > limit+slack {
					t.Errorf("with recovery accounting, %d admitted in a window at recovery, want at most the limit %d", peakRecovery, limit)
				}
				if len(flushes) != 1 || flushes[0].Charged < 60 {
					t.Errorf("flush %+v, want the fallback's ~70 units charged", flushes)
				}
			}
		})
	}
	if peaks[false] <= peaks[true] {
		t.Errorf("recovery peak without accounting %d, with %d: accounting made no difference", peaks[false], peaks[true])
	}
}

// TestFaultConcurrencyLostReplies: with Redis paused (SIGSTOP), a release
// times out, an acquire times out (fail open admits its request), and a
// client goes away while its acquire waits. When Redis resumes it runs
// what it had received, and the recorder then sends the release again and
// a release for each lost acquire: what Redis holds is exactly the slot
// still taken. By count alone (before holds) the lost acquires kept their
// slots (the failed release was not retried either, so a release Redis
// had not received would have kept its slot too).
func TestFaultConcurrencyLostReplies(t *testing.T) {
	checkLeaks(t)
	srv := redistest.StartStandalone(t, redistest.Options{})
	r := newRig(t, &redis.UniversalOptions{Addrs: []string{srv.Addr}}, 1, false)
	p := policyOf("c", Concurrency, FailOpen, 10, 0)
	items := []Item{{Policy: p, Tenant: "acme", Cost: 1}}
	var d0, d1, d2, d3 Decision
	for _, d := range []*Decision{&d0, &d1} {
		if err := d.DecideOrFallback(bgCtx, r.br, r.fb, items); err != nil || !d.Admitted {
			t.Fatalf("decide: admitted %v, %v", d.Admitted, err)
		}
	}
	if got := inFlight(t, r.client, "acme", "c"); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	if err := d1.Release(bgCtx, r.fb); err == nil {
		t.Fatal("release with Redis paused: no error")
	}
	if err := d2.DecideOrFallback(bgCtx, r.br, r.fb, items); err == nil || !d2.Admitted || d2.Verdicts[0].Path != PathFailedOpen {
		t.Fatalf("acquire with Redis paused: %v, admitted %v, path %v; want an error, admitted open", err, d2.Admitted, d2.Verdicts[0].Path)
	}
	ctx, cancel := context.WithCancel(bgCtx)
	time.AfterFunc(faultTimeout/2, cancel)
	// Its call may also fail first, unsent, behind the stalled one.
	if err := d3.DecideOrFallback(ctx, r.br, r.fb, items); !CallerLeft(ctx, err) && !NotSent(err) {
		t.Fatalf("acquire of a client gone: %v, want the caller's cancellation", err)
	}
	// The release, and each acquire that may have run: one that waited
	// in this instance's queue behind the stalled call never ran, and is
	// not kept (NotSent).
	if got := r.rec.Pending(); got < 1 || got > 3 {
		t.Fatalf("recorder holds %d calls, want 1 to 3 (the release and the lost acquires)", got)
	} else {
		t.Logf("recorder holds %d calls", got)
	}
	srv.Resume()
	resumed = true

	// Redis runs what it had received; the recorder's releases follow.
	deadline := time.Now().Add(5 * time.Second)
	for r.rec.Pending() > 0 && time.Now().Before(deadline) {
		fctx, fcancel := context.WithTimeout(bgCtx, time.Second)
		st, err := r.rec.Flush(fctx, r.br)
		fcancel()
		t.Logf("flush: %+v, %v", st, err)
		if err != nil {
			time.Sleep(faultCooldown)
		}
	}
	if got := r.rec.Pending(); got != 0 {
		t.Fatalf("recorder still holds %d calls", got)
	}
	if err := d2.Release(bgCtx, r.fb); err != nil {
		t.Fatal(err)
	}
	t.Logf("decide calls: %d ok, %d timeout; release calls: %d ok, %d timeout",
		r.count("decide", "ok"), r.count("decide", "timeout"), r.count("release", "ok"), r.count("release", "timeout"))
	if got := inFlight(t, r.client, "acme", "c"); got != 1 {
		t.Fatalf("in flight %d after recovery, want 1 (d0's)", got)
	}
	if err := d0.Release(bgCtx, r.fb); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, r.client, "acme", "c"); got != 0 {
		t.Fatalf("in flight %d after every release, want 0", got)
	}
	// No record of a slot is left held.
	keys, err := r.client.Keys(bgCtx, DefaultPrefix+":once:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if v := r.client.Get(bgCtx, k).Val(); v != "gone" {
			t.Errorf("%s = %q, want gone", k, v)
		}
	}
}

// afterAnswer is a go-redis hook for the node clients of a cluster: once
// armed, the first script call answered by the node at address after runs
// then (a SIGSTOP of another node, a client that goes away), so that what
// the caller sends next meets it. Only the timing is the hook's.
type afterAnswer struct {
	after string
	then  func() // set before armed
	armed atomic.Bool
}

// on returns the hook for the node client at addr.
func (h *afterAnswer) on(addr string) redis.Hook { return afterAnswerHook{h, addr} }

type afterAnswerHook struct {
	*afterAnswer
	addr string
}

func (h afterAnswerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterAnswerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.answered(cmd)
		return err
	}
}

func (h afterAnswerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.answered(cmds...)
		return err
	}
}

func (h afterAnswerHook) answered(cmds ...redis.Cmder) {
	if h.addr == h.after && scriptCalls(cmds...) > 0 && h.armed.CompareAndSwap(true, false) {
		h.then()
	}
}

// TestFaultCrossSlotCompensationLost: a request whose checks span two
// cluster nodes is charged on the first (a concurrency slot and a token
// bucket unit) and denied on the second; the first node stalls (SIGSTOP)
// before the compensation reaches it. The release and the give-back fail,
// the error says something ran, the fail mode hands both to the recorder,
// and once the node resumes, what Redis holds is what the tenant used:
// nothing, the request was denied. (The give-back was a refund without an
// id that the stall found unwritten: the unit stayed charged, 99 of 100.)
// Then a client goes away at the same moment: its request's charges are
// given back all the same, at once (before, the compensation failed with
// the client's context and waited for the recorder).
func TestFaultCrossSlotCompensationLost(t *testing.T) {
	checkLeaks(t)
	c := redistest.StartCluster(t, 3, 0)
	opts := handlerOptions(&redis.UniversalOptions{Addrs: c.Addrs, IsClusterMode: true})
	client := redis.NewClusterClient(opts.Cluster())
	defer client.Close()

	// Two tenants whose keys live on different masters, as the cluster
	// itself says.
	admin := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	shards, err := admin.ClusterShards(bgCtx).Result()
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	master := func(tenant string) *redistest.Server {
		slot := int64(keySlot([]byte("{" + tenant + "}")))
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if slot < r.Start || slot > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					for _, m := range c.Masters {
						if n.Role == "master" && m.Port == int(n.Port) {
							return m
						}
					}
				}
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return nil
	}
	acme, other := "acme", ""
	for i := 0; other == ""; i++ {
		if name := "t-" + strconv.Itoa(i); master(name) != master(acme) {
			other = name
		}
	}
	hook := &afterAnswer{after: master(other).Addr, then: master(acme).Pause}
	client.OnNewNode(func(n *redis.Client) { n.AddHook(hook.on(n.Options().Addr)) })
	resumed := true
	defer func() {
		if !resumed {
			master(acme).Resume()
		}
	}()

	s := NewRedisStore(RedisOptions{Client: client, Timeout: faultTimeout})
	defer s.Close()
	rec := NewRecorder(RecorderOptions{})
	fb := Fallback{Recorder: rec}
	// Fail open: a request Redis denied stays denied when only its
	// compensation fails (the fail mode decides only what Redis did not).
	slots := &Policy{Name: "c", Algorithm: Concurrency, FailMode: FailOpen, Limit: Limit{Rate: Rate{Limit: 5}}}
	tb := &Policy{Name: "tb", Algorithm: TokenBucket, FailMode: FailOpen, Limit: Limit{Rate: Rate{Limit: 100, Window: time.Hour}}}
	var full Decision
	if err := full.DecideOrFallback(bgCtx, s, fb, []Item{{Policy: slots, Tenant: other, Cost: 5}}); err != nil || !full.Admitted {
		t.Fatalf("filling %s: admitted %v, %v", other, full.Admitted, err)
	}

	var d Decision
	hook.armed.Store(true)
	resumed = false
	start := time.Now()
	err = d.DecideOrFallback(bgCtx, s, fb, []Item{{Policy: slots, Tenant: acme, Cost: 1}, {Policy: tb, Tenant: acme, Cost: 1}, {Policy: slots, Tenant: other, Cost: 1}})
	if hook.armed.Load() {
		t.Fatal("the denying node's answer was not seen")
	}
	if err == nil || NotSent(err) || d.Admitted {
		t.Fatalf("compensation against a stalled node: admitted %v, %v; want a failure that may have run, denied by Redis", d.Admitted, err)
	}
	for i, v := range d.Verdicts {
		if v.Path != PathStore {
			t.Errorf("verdict %d decided by path %d, want the store's", i, v.Path)
		}
	}
	if v := d.Verdicts[2]; v.Result.Allowed {
		t.Errorf("%s's slot, which Redis denied: %+v", other, v.Result)
	}
	if took := time.Since(start); took > faultTimeout+maxOverrun {
		t.Errorf("the decision took %v with a stalled node, want one timeout (%v)", took, faultTimeout)
	}
	t.Logf("decide: %v", err)
	if got := rec.Pending(); got != 2 {
		t.Fatalf("recorder holds %d calls, want 2 (the release and the give-back)", got)
	}
	master(acme).Resume()
	resumed = true

	// Redis runs the release it had received; the recorder's release,
	// sent again, finds the slot given back, and its give-back lands.
	deadline := time.Now().Add(5 * time.Second)
	for rec.Pending() > 0 && time.Now().Before(deadline) {
		fctx, fcancel := context.WithTimeout(bgCtx, time.Second)
		st, ferr := rec.Flush(fctx, s)
		fcancel()
		t.Logf("flush: %+v, %v", st, ferr)
		if ferr != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := rec.Pending(); got != 0 {
		t.Fatalf("recorder still holds %d calls", got)
	}
	if a, o := inFlight(t, client, acme, "c"), inFlight(t, client, other, "c"); a != 0 || o != 5 {
		t.Errorf("in flight %s %d, %s %d after recovery; want 0 and 5", acme, a, other, o)
	}
	// The token bucket's unit, given back under an id: once, whether the
	// first attempt ran when the node resumed or only the recorder's did.
	tbCheck := Check{Algorithm: TokenBucket, Tenant: acme, Policy: "tb", Rate: tb.Limit.Rate, Cost: 1}
	peek := make([]Result, 1)
	if err := s.Peek(bgCtx, []Check{tbCheck}, peek); err != nil {
		t.Fatal(err)
	}
	if got := peek[0].Remaining; got != 100 {
		t.Errorf("token bucket of %s: %d remaining after recovery, want 100 (the denied request's unit given back)", acme, got)
	}
	// No record of acme's slot is left held.
	node := redis.NewClient(&redis.Options{Addr: master(acme).Addr})
	defer node.Close()
	keys, err := node.Keys(bgCtx, DefaultPrefix+":once:{"+acme+"}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	gone := 0
	for _, k := range keys {
		// The slot's record, and the give-back's answer under its id.
		switch v := node.Get(bgCtx, k).Val(); {
		case v == "gone":
			gone++
		case v == "held":
			t.Errorf("%s = %q after recovery, want the slot released", k, v)
		}
	}
	if gone != 1 || len(keys) != 2 {
		t.Errorf("%d records of %s (%d gone) after recovery, want the slot's, gone, and the give-back's", len(keys), acme, gone)
	}

	// The client goes away just as the second node denies.
	ctx, cancel := context.WithCancel(bgCtx)
	defer cancel()
	hook.then = cancel
	hook.armed.Store(true)
	var gone2 Decision
	err = gone2.DecideOrFallback(ctx, s, fb, []Item{{Policy: slots, Tenant: acme, Cost: 1}, {Policy: tb, Tenant: acme, Cost: 1}, {Policy: slots, Tenant: other, Cost: 1}})
	if hook.armed.Load() || ctx.Err() == nil {
		t.Fatal("the client did not leave")
	}
	// The denial's own reply may be lost to the caller that left (then
	// the slots' releases are kept, as for any call that may have run).
	if (err != nil && !CallerLeft(ctx, err)) || gone2.Admitted {
		t.Fatalf("a client gone during the compensation: admitted %v, %v; want denied, or the caller's cancellation", gone2.Admitted, err)
	}
	if err := s.Peek(bgCtx, []Check{tbCheck}, peek); err != nil {
		t.Fatal(err)
	}
	if a, got := inFlight(t, client, acme, "c"), peek[0].Remaining; a != 0 || got != 100 {
		t.Errorf("after a client gone during the compensation: in flight %d, token bucket %d; want 0 and 100 at once", a, got)
	}
	if _, err := rec.Flush(bgCtx, s); err != nil {
		t.Fatal(err)
	}
	if a, got := inFlight(t, client, acme, "c"), inFlight(t, client, other, "c"); a != 0 || got != 5 {
		t.Errorf("after the recorder's releases: in flight %s %d, %s %d; want 0 and 5", acme, a, other, got)
	}
}
