package limiter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// pipelineCounter is a go-redis hook that counts the round trips that
// carried script calls (pipelines and single commands) and the calls.
type pipelineCounter struct {
	trips, cmds atomic.Int64
}

func scriptCalls(cmds ...redis.Cmder) int64 {
	n := int64(0)
	for _, c := range cmds {
		if name := c.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
			n++
		}
	}
	return n
}

func (h *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := scriptCalls(cmd); n > 0 {
			h.trips.Add(1)
			h.cmds.Add(n)
		}
		return next(ctx, cmd)
	}
}

func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := scriptCalls(cmds...); n > 0 {
			h.trips.Add(1)
			h.cmds.Add(n)
		}
		return next(ctx, cmds)
	}
}

// TestBatchingSharesRoundTrips: decisions that arrive while a batch is on
// the wire go out together. With Redis paused, 100 concurrent decisions
// queue behind the first batches; once it resumes they take a handful of
// round trips, and every one of them is decided exactly (one tenant,
// limit 60: exactly 60 admitted).
func TestBatchingSharesRoundTrips(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	var hook pipelineCounter
	client.AddHook(&hook)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 5 * time.Second})
	c := Check{Algorithm: FixedWindow, Tenant: "batched", Policy: "p", Rate: Rate{Limit: 60, Window: time.Hour}, Cost: 1}
	mustDecide(t, s, Check{Algorithm: FixedWindow, Tenant: "warm", Policy: "p", Rate: c.Rate, Cost: 1}) // loads the script

	trips0, cmds0 := hook.trips.Load(), hook.cmds.Load()
	srv.Pause()
	const n = 100
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			res := make([]Result, 1)
			ok, err := s.Decide(bgCtx, []Check{c}, res)
			if err != nil {
				t.Error(err)
			}
			if ok {
				admitted.Add(1)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // every goroutine has queued
	srv.Resume()
	wg.Wait()
	trips, cmds := hook.trips.Load()-trips0, hook.cmds.Load()-cmds0
	t.Logf("%d decisions in %d round trips (%d commands)", n, trips, cmds)
	if admitted.Load() != 60 {
		t.Errorf("%d admitted, want exactly 60", admitted.Load())
	}
	if cmds != n {
		t.Errorf("%d commands sent for %d decisions", cmds, n)
	}
	if trips > 2*maxBatchFlushers+2 {
		t.Errorf("%d round trips for %d queued decisions, want a few batches", trips, n)
	}
}

// TestBatchingPerCallDeadline: a call keeps its own deadline in a batch. With
// Redis paused, a call with a 50ms deadline sharing batches with calls that
// have 2s returns a timeout at about 50ms, and the others are still
// answered once Redis resumes.
func TestBatchingPerCallDeadline(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 2 * time.Second})
	rate := Rate{Limit: 1000, Window: time.Hour}
	mustDecide(t, s, Check{Algorithm: TokenBucket, Tenant: "warm", Policy: "p", Rate: rate, Cost: 1})
	srv.Pause()
	var wg sync.WaitGroup
	var slowOK atomic.Int64
	for i := range 10 {
		wg.Go(func() {
			c := Check{Algorithm: TokenBucket, Tenant: "slow-" + strconv.Itoa(i), Policy: "p", Rate: rate, Cost: 1}
			if ok, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1)); ok && err == nil {
				slowOK.Add(1)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(bgCtx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Decide(ctx, []Check{{Algorithm: TokenBucket, Tenant: "fast", Policy: "p", Rate: rate, Cost: 1}}, make([]Result, 1))
	took := time.Since(start)
	if !IsTimeout(err) || took > 500*time.Millisecond {
		t.Errorf("short-deadline call: %v after %v, want a timeout at about 50ms", err, took)
	}
	time.Sleep(200 * time.Millisecond)
	srv.Resume()
	wg.Wait()
	if slowOK.Load() != 10 {
		t.Errorf("%d of 10 long-deadline calls admitted after Redis resumed", slowOK.Load())
	}
}

// TestBatchingStoreTimeout: with Redis paused, every call ends within the
// store's timeout: a call written to Redis one timeout after its write
// (its round trip measured as such), a call queued behind a batch Redis
// left unanswered when that batch timed out, never later; calls that reuse
// a pooled queue timer after a stopped one are not cut short by it, even
// after idle gaps longer than the timeout.
func TestBatchingStoreTimeout(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	const timeout = 200 * time.Millisecond
	var mu sync.Mutex
	var trips []time.Duration // round trips of timed-out calls that were written
	s := NewRedisStore(RedisOptions{Client: client, Timeout: timeout, Observe: func(_, result string, d time.Duration) {
		if result == "timeout" && d > 0 {
			mu.Lock()
			trips = append(trips, d)
			mu.Unlock()
		}
	}})
	rate := Rate{Limit: 1 << 40, Window: time.Hour}
	check := func(i int) []Check {
		return []Check{{Algorithm: TokenBucket, Tenant: "t-" + strconv.Itoa(i), Policy: "p", Rate: rate, Cost: 1}}
	}
	mustDecide(t, s, check(0)...)

	paused := func(round int) {
		srv.Pause()
		defer srv.Resume()
		mu.Lock()
		trips = trips[:0]
		mu.Unlock()
		var wg sync.WaitGroup
		// More calls than the flushers can hold in flight: some wait in the
		// queue behind stuck batches.
		for i := range 12 {
			wg.Go(func() {
				start := time.Now()
				_, err := s.Decide(bgCtx, check(i), make([]Result, 1))
				if took := time.Since(start); !IsTimeout(err) || took > timeout+60*time.Millisecond {
					t.Errorf("round %d, call %d with Redis paused: %v after %v, want a timeout within about %v", round, i, err, took, timeout)
				}
			})
			time.Sleep(25 * time.Millisecond)
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(trips) < 2 {
			t.Errorf("round %d: %d written calls timed out, want at least the first two batches'", round, len(trips))
		}
		for _, d := range trips {
			if d < timeout-10*time.Millisecond || d > timeout+60*time.Millisecond {
				t.Errorf("round %d: a written call's round trip timed out after %v, want about %v", round, d, timeout)
			}
		}
	}
	answered := func(round int) {
		for i := range 50 {
			if _, err := s.Decide(bgCtx, check(i), make([]Result, 1)); err != nil {
				t.Fatalf("round %d, call %d: %v", round, i, err)
			}
			if i%10 == 9 {
				// Idle for longer than the timeout: a timer not stopped would
				// have fired by now.
				time.Sleep(timeout + timeout/2)
			}
		}
	}
	for round := range 2 {
		paused(round)
		// The abandoned calls' batches end at their deadline; give Redis
		// the stale replies' time, then every call must be answered.
		time.Sleep(timeout)
		answered(round)
	}
}

// stallHook is a go-redis hook that, while armed, holds each pipeline of
// script calls until released and then fails it with a socket timeout
// without sending it: what a reader sees when the socket's deadline fires
// a moment before the call's context reports its own.
type stallHook struct {
	armed   atomic.Bool
	held    chan struct{} // one value per pipeline held
	release chan struct{} // closed to let held pipelines fail
	sent    atomic.Int64  // script calls that reached Redis
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if scriptCalls(cmds...) == 0 || !h.armed.Load() {
			h.sent.Add(scriptCalls(cmds...))
			return next(ctx, cmds)
		}
		h.held <- struct{}{}
		<-h.release
		err := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		for _, c := range cmds {
			c.SetErr(err)
		}
		return err
	}
}

// TestBatchingStallSeenBeforeContext: calls queued behind batches that
// timed out fail at once (errBehindStalled, unsent), even when the batch's
// reader sees the socket's timeout before the context's timer has fired.
// Before, the batcher asked only the context, and a call queued behind a
// stalled Redis was sent in the next batch and waited a second timeout
// (TestFaultPause: a call of 201-203 ms against a 100 ms timeout, 3 runs
// in 8 with go-redis's retries off).
func TestBatchingStallSeenBeforeContext(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	defer client.Close()
	h := &stallHook{held: make(chan struct{}, maxBatchFlushers), release: make(chan struct{})}
	client.AddHook(h)
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 5 * time.Second})
	rate := Rate{Limit: 1000, Window: time.Hour}
	check := func(i int) []Check {
		return []Check{{Algorithm: TokenBucket, Tenant: "t-" + strconv.Itoa(i), Policy: "p", Rate: rate, Cost: 1}}
	}
	mustDecide(t, s, check(0)...) // the library is loaded
	h.armed.Store(true)
	b := s.batcherFor(bgCtx, nil)
	if b == nil {
		t.Fatal("the store does not batch")
	}

	const queued = 6
	errs := make([]error, maxBatchFlushers+queued)
	var wg sync.WaitGroup
	for i := range maxBatchFlushers {
		wg.Go(func() { _, errs[i] = s.Decide(bgCtx, check(i), make([]Result, 1)) })
		<-h.held // each flusher holds one batch
	}
	h.armed.Store(false) // a batch sent from now on reaches Redis (and counts)
	for i := range queued {
		wg.Go(func() { _, errs[maxBatchFlushers+i] = s.Decide(bgCtx, check(maxBatchFlushers+i), make([]Result, 1)) })
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.mu.Lock()
		n := len(b.queue)
		b.mu.Unlock()
		if n == queued {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", n, queued)
		}
		time.Sleep(time.Millisecond)
	}
	before := h.sent.Load()
	start := time.Now()
	close(h.release)
	wg.Wait()
	if took := time.Since(start); took > time.Second {
		t.Errorf("the calls ended %v after the stalled batches did", took)
	}
	for i, err := range errs {
		switch {
		case i < maxBatchFlushers && !IsTimeout(err):
			t.Errorf("call %d, in a stalled batch: %v, want a timeout", i, err)
		case i >= maxBatchFlushers && !errors.Is(err, errBehindStalled):
			t.Errorf("call %d, queued behind the stalled batches: %v, want %v", i, err, errBehindStalled)
		}
	}
	if n := h.sent.Load() - before; n != 0 {
		t.Errorf("%d queued calls were sent to Redis after the stall, want 0", n)
	}
}

// replyError is an error reply of Redis's, as go-redis reports one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestStalled: what counts as Redis leaving a batch unanswered.
func TestStalled(t *testing.T) {
	deadline := time.Unix(100, 0)
	before, after := deadline.Add(-time.Millisecond), deadline.Add(time.Millisecond)
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		name     string
		err      error
		answered time.Time
		want     bool
	}{
		{"answered", nil, after, false},
		{"socket timeout, before the context's", timeout, before, true},
		{"context deadline", context.DeadlineExceeded, after, true},
		{"broken connection past the deadline", io.EOF, after, true},
		{"broken connection in time", io.EOF, before, false},
		{"error reply read late", replyError("BUSY Redis is busy running a script"), after, false},
		{"MOVED read late", replyError("MOVED 1234 127.0.0.1:7001"), after, false},
		{"NOSCRIPT read late", replyError("NOSCRIPT No matching script"), after, false},
	} {
		if got := stalled(c.err, c.answered, deadline); got != c.want {
			t.Errorf("%s: stalled %v, want %v", c.name, got, c.want)
		}
	}
}

// movedHook answers every pipeline of script calls MOVED to addr, without
// sending it; slowHook makes every single command take d.
type movedHook struct{ addr string }

func (h movedHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h movedHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h movedHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if scriptCalls(cmds...) == 0 {
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(replyError("MOVED 1234 " + h.addr))
		}
		return nil
	}
}

type slowHook struct{ d time.Duration }

func (h slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(h.d)
		return next(ctx, cmd)
	}
}
func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestBatchingRedirectsAreNoStall: a batch answered MOVED at once, whose
// calls are then redirected one by one past the batch's deadline, all
// answered, is no stall: the calls queued behind it must not fail. (Once
// the stall was judged by the clock, it was judged after the redirects.)
func TestBatchingRedirectsAreNoStall(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	opts := srv.ClientOptions()
	opts.ContextTimeoutEnabled = true
	pipeClient := redis.NewClient(opts)
	defer pipeClient.Close()
	pipeClient.AddHook(movedHook{srv.Addr})
	redirect := redis.NewClient(srv.ClientOptions())
	defer redirect.Close()
	if err := redirect.ScriptLoad(bgCtx, decideScript.src).Err(); err != nil {
		t.Fatal(err)
	}
	redirect.AddHook(slowHook{30 * time.Millisecond})
	b := newBatcher(func() redis.Pipeliner { return pipeClient.Pipeline() }, redirect, false, time.Second)
	call := func(key string) *batchCall {
		return &batchCall{ctx: bgCtx, timeout: 50 * time.Millisecond, script: decideScript, done: make(chan struct{}, 1),
			keys: []string{key}, args: []any{"peek", "0", "token_bucket", 10, 1000000, 0, 0, 1, "0"}}
	}
	calls := []*batchCall{call("a"), call("b"), call("c")}
	if b.send(&batchPipe{Pipeliner: b.pipe()}, calls) {
		t.Errorf("a batch whose calls were all answered (redirected) counts as stalled: queued calls would fail with %v", errBehindStalled)
	}
	for i, c := range calls {
		if c.err != nil {
			t.Errorf("call %d: %v", i, c.err)
		}
	}
}

// TestBatchingNoScript: a batch answered NOSCRIPT (a flushed script cache)
// is retried with EVAL, and with functions one answered "Function not
// found" (a flushed library) is retried after loading the library; every
// call gets its answer.
func TestBatchingNoScript(t *testing.T) {
	for _, functions := range []bool{false, true} {
		t.Run(fmt.Sprint("functions=", functions), func(t *testing.T) { testBatchingNoScript(t, functions) })
	}
}

func testBatchingNoScript(t *testing.T, functions bool) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	client := srv.Client(t)
	var noscript atomic.Int64
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 2 * time.Second, Functions: functions, Observe: func(_, result string, _ time.Duration) {
		if result == "noscript" {
			noscript.Add(1)
		}
	}})
	rate := Rate{Limit: 5, Window: time.Hour}
	mustDecide(t, s, Check{Algorithm: SlidingWindow, Tenant: "warm", Policy: "p", Rate: rate, Cost: 1})
	if err := client.ScriptFlush(bgCtx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.FunctionFlush(bgCtx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 20 {
		wg.Go(func() {
			c := Check{Algorithm: SlidingWindow, Tenant: "flushed", Policy: "p", Rate: rate, Cost: 1}
			ok, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1))
			if err != nil {
				t.Error(err)
			}
			if ok {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 5 || noscript.Load() == 0 {
		t.Errorf("%d admitted (want 5), %d NOSCRIPT answers seen (want some)", admitted.Load(), noscript.Load())
	}
}

// TestBatchingWithoutFunctions: a Redis user whose ACL refuses FCALL and
// FUNCTION (as a Redis 6 refuses the commands) is served with EVALSHA,
// NOSCRIPT retried with EVAL, every decision exact.
func TestBatchingWithoutFunctions(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	admin := srv.Client(t)
	if err := admin.Do(bgCtx, "ACL", "SETUSER", "nofunc", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-fcall_ro", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	opts := srv.ClientOptions()
	opts.Username, opts.Password = "nofunc", "pw"
	client := redis.NewClient(opts)
	defer client.Close()
	var hook pipelineCounter
	client.AddHook(&hook)
	var noscript atomic.Int64
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 2 * time.Second, Functions: true, Observe: func(_, result string, _ time.Duration) {
		if result == "noscript" {
			noscript.Add(1)
		}
	}})
	c := Check{Algorithm: TokenBucket, Tenant: "nofunc", Policy: "p", Rate: Rate{Limit: 5, Window: time.Hour}, Cost: 1}
	admitted := 0
	for i := range 8 {
		if i == 4 {
			if err := admin.ScriptFlush(bgCtx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		ok, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1))
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != 5 || noscript.Load() == 0 {
		t.Errorf("%d admitted (want 5), %d NOSCRIPT answers (want some after SCRIPT FLUSH)", admitted, noscript.Load())
	}
	if n, _ := admin.FunctionList(bgCtx, redis.FunctionListQuery{}).Result(); len(n) != 0 {
		t.Errorf("libraries %v: the refused user loaded one", n)
	}
}

// TestBatchingNoScriptWithoutScriptLoad: an ACL user that may run scripts
// (EVALSHA, EVAL) but not SCRIPT LOAD still gets its decisions after the
// script cache is flushed: the batch falls back to EVAL.
func TestBatchingNoScriptWithoutScriptLoad(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{ACLUsers: []string{"user limited on >pw ~* +@all -script"}})
	opts := srv.ClientOptions()
	opts.Username, opts.Password = "limited", "pw"
	client := redis.NewClient(opts)
	defer client.Close()
	s := NewRedisStore(RedisOptions{Client: client, Timeout: 2 * time.Second})
	c := Check{Algorithm: FixedWindow, Tenant: "acl", Policy: "p", Rate: Rate{Limit: 100, Window: time.Hour}, Cost: 1}
	for range 2 {
		if err := srv.Client(t).ScriptFlush(bgCtx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if _, err := s.Decide(bgCtx, []Check{c}, make([]Result, 1)); err != nil {
					t.Errorf("decide after SCRIPT FLUSH, SCRIPT LOAD refused: %v", err)
				}
			})
		}
		wg.Wait()
	}
	if got := mustPeek(t, s, withCost(c, 0))[0].Remaining; got != 84 {
		t.Fatalf("remaining %d after 16 decisions, want 84", got)
	}
}
