package limiter

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/lua"
)

// A batcher sends the script calls of concurrent requests bound for one
// Redis node as one pipeline: one write, one read. While a batch is on the
// wire, the calls that arrive queue; as soon as a flusher is free, the
// whole queue goes out as the next batch. Before each batch, a flusher
// yields its processor (runtime.Gosched), so that the requests already
// runnable reach their decision and join this batch rather than wait a
// round trip for the next: in bench/run.sh, 1.5 to 2 times fewer round
// trips per strict request, and in BenchmarkRedisBatching a fifth less
// client CPU per decision. There is no timer: a call waits only for the
// goroutines already runnable (when every processor is busy, Go's
// scheduler turns to yielded goroutines at least every 61 it runs), and
// that wait counts as queued time (redis_queue_seconds). Under load, one
// round trip carries many decisions, which is what makes strict
// (unleased) limits fast: the syscalls and wake-ups of a round trip, not
// Redis, are most of a decision's cost.
//
// Deadlines measure Redis, not this process. A call's deadline (the
// store's Timeout) starts when its batch is written and bounds the round
// trip: write, Redis, reply. The time a call spends queued here before
// that (both flushers busy, the scheduler of a saturated host) is not
// Redis's: while batches come back in time, queued calls wait their turn,
// up to the queue limit (RedisOptions.QueueTimeout); a call still queued
// then is shed with ErrQueueTimeout, unsent, which the breaker does not
// count. So a busy host delays its calls instead of timing them out and
// opening the breaker. When Redis leaves a batch unanswered past its
// deadline, its calls time out and so do the calls queued behind it at
// that moment (they would only wait one more timeout): a stalled Redis
// fails every waiting call within one Timeout and opens the breaker. A
// caller whose context ends stops waiting at once (a call abandoned in
// flight may still run, as a call that times out without batching may).
// A batch is sent with the latest deadline of its calls, so no call is
// cut short by another's.
//
// Calls go out as EVALSHA, or, when the store was asked for functions
// (RedisOptions.Functions), as FCALL of the function library
// (lua.Library): Redis then finds the scripts' helpers built instead of
// building them on every call. A node that does
// not know the library (first call, a restart, FUNCTION FLUSH) answers
// "Function not found": the library is loaded and the calls retried at
// once, in one more pipeline. A node without functions (Redis 6) or whose
// ACL refuses them is called with EVALSHA from then on; NOSCRIPT replies
// (a restarted Redis, SCRIPT FLUSH) are retried at once with EVAL. In a
// cluster, a call answered MOVED or ASK (the slot moved since the batcher
// was chosen) is retried alone through the cluster client, which follows
// the redirect, with EVALSHA.
type batcher struct {
	// pipe makes a pipeline to the node; redirect, when set (cluster), runs
	// a single call that may need to follow a redirect.
	pipe     func() redis.Pipeliner
	redirect redis.UniversalClient

	// noFunctions is set once the node turned FCALL or FUNCTION LOAD
	// down: scripts only, from then on.
	noFunctions atomic.Bool

	// queueLimit is how long a call may wait to be written.
	queueLimit time.Duration

	mu       sync.Mutex
	queue    []*batchCall
	flushers int
	max      int // flushers at most: batches in flight at once

	// pipes pools the pipelines flushers send batches with, so a batch
	// allocates neither its pipeline nor its command list.
	pipes sync.Pool
}

// batchPipe is a pipeline to the node and the command list it is given,
// reused from batch to batch.
type batchPipe struct {
	redis.Pipeliner
	cmds []redis.Cmder
}

// ErrQueueTimeout is the error of a call that waited longer than the
// store's queue limit in this instance for its turn to be written to
// Redis: the instance, not Redis, was too slow. The call was not sent.
var ErrQueueTimeout = errors.New("limiter: the call waited too long in this instance's queue to be sent to Redis (not sent)")

// States of a batchCall.
const (
	callQueued    uint32 = iota
	callSent             // taken into a batch
	callAbandoned        // its caller left before it was taken
)

// maxBatchFlushers is how many batches one node may have in flight at once.
// One keeps the node's commands in one ordered stream and maximizes batch
// size; two let the next batch be written while the previous reply is
// read. Measured on loopback (BenchmarkRedisBatching), two was faster.
const maxBatchFlushers = 2

// maxBatchSize caps one pipeline; the rest waits for the next batch.
const maxBatchSize = 256

// batchCall is one script call waiting for its batch.
type batchCall struct {
	ctx     context.Context
	timeout time.Duration // the round trip's deadline, from the write
	script  *luaScript
	keys    []string
	args    []any
	state   atomic.Uint32

	cmd     *redis.IntSliceCmd
	done    chan struct{}
	val     []int64
	err     error
	noscipt bool // the first attempt was answered NOSCRIPT
	// queued is when the call was queued; sent and took, when its batch
	// was written and how long its round trip took.
	queued, sent time.Time
	took         time.Duration

	// Kept when the call is pooled, so a call allocates neither its queue
	// limit's timer nor its command's arguments: timer ends the wait in
	// the queue, cmdArgs holds the FCALL or EVALSHA command.
	timer   *time.Timer
	cmdArgs []any
}

var batchCalls = sync.Pool{New: func() any { return &batchCall{done: make(chan struct{}, 1)} }}

func newBatcher(pipe func() redis.Pipeliner, redirect redis.UniversalClient, functions bool, queueLimit time.Duration) *batcher {
	b := &batcher{pipe: pipe, redirect: redirect, max: maxBatchFlushers, queueLimit: queueLimit}
	b.noFunctions.Store(!functions)
	return b
}

// callTiming is how a batched call spent its time.
type callTiming struct {
	// Queued is the time from do to the write of the call's batch (or to
	// the end of the wait, for a call never written).
	Queued time.Duration
	// Redis is the round trip of the call's batch: write, Redis, reply.
	// Zero for a call never written.
	Redis time.Duration
}

// do runs script as part of the next batch and returns its reply. The
// call waits at most the queue limit to be written (then it fails with
// ErrQueueTimeout, unsent), then at most timeout for its reply, and no
// longer than ctx. noscript reports that Redis first answered NOSCRIPT or
// "Function not found" (the call was retried after loading the script or
// the library). abandoned reports that the call ended while a batch may
// still hold it: the batch may still send the arguments, so the caller
// must not reuse them.
func (b *batcher) do(ctx context.Context, timeout time.Duration, script *luaScript, keys []string, args []any) (val []int64, timing callTiming, noscript, abandoned bool, err error) {
	c := batchCalls.Get().(*batchCall)
	c.ctx, c.timeout, c.script, c.keys, c.args = ctx, timeout, script, keys, args
	c.state.Store(callQueued)
	c.queued = time.Now()
	if c.timer == nil {
		c.timer = time.NewTimer(b.queueLimit)
	} else {
		c.timer.Reset(b.queueLimit)
	}
	queueLimit := c.timer.C
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.flushers < b.max
	if start {
		b.flushers++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	for {
		select {
		case <-c.done:
			val, noscript, err = c.val, c.noscipt, c.err
			timing = callTiming{Queued: c.sent.Sub(c.queued), Redis: c.took}
			c.timer.Stop()
			clear(c.cmdArgs)
			*c = batchCall{done: c.done, timer: c.timer, cmdArgs: c.cmdArgs[:0]}
			batchCalls.Put(c)
			return val, timing, noscript, false, err
		case <-ctx.Done():
			// The batch may still hold c (and the caller's arguments): it
			// is dropped, not pooled, once the batch is done with it.
			c.timer.Stop()
			if c.state.CompareAndSwap(callQueued, callAbandoned) {
				timing.Queued = time.Since(c.queued)
			}
			return nil, timing, false, true, ctx.Err()
		case <-queueLimit:
			if c.state.CompareAndSwap(callQueued, callAbandoned) {
				// Never written: the flusher skips it without reading
				// its arguments, so the caller may reuse them (c itself
				// stays with the queue, not pooled).
				return nil, callTiming{Queued: time.Since(c.queued)}, false, false, ErrQueueTimeout
			}
			// Written meanwhile: its batch's deadline bounds the wait.
			queueLimit = nil
		}
	}
}

// flush sends batches while calls are queued, then ends.
func (b *batcher) flush() {
	var batch []*batchCall
	p, _ := b.pipes.Get().(*batchPipe)
	if p == nil {
		p = &batchPipe{Pipeliner: b.pipe()}
	}
	yield := true
	b.mu.Lock()
	for {
		n := min(len(b.queue), maxBatchSize)
		if n == 0 {
			b.flushers--
			b.mu.Unlock()
			b.pipes.Put(p)
			return
		}
		if yield && n < maxBatchSize {
			// Let the goroutines already runnable run first: those about
			// to decide queue their calls and ride this batch instead of
			// the next. With nothing else runnable this returns at once.
			b.mu.Unlock()
			runtime.Gosched()
			b.mu.Lock()
			yield = false
			continue // the other flusher may have taken the queue
		}
		yield = true
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		if b.send(p, batch) {
			b.failQueued()
		}
		clear(batch)
		b.mu.Lock()
	}
}

// errBehindStalled is the error of calls that were waiting to be written
// while Redis did not answer the batch ahead of them within its timeout:
// a timeout of Redis's, which the breaker counts.
var errBehindStalled = fmt.Errorf("redis did not answer the batch ahead of this call within the timeout: %w", context.DeadlineExceeded)

// failQueued fails every call still queued with errBehindStalled: a batch
// just timed out, so Redis is not answering, and sending them would only
// make each wait one more timeout. (When this instance is merely busy,
// batches come back in time and queued calls wait their turn.)
func (b *batcher) failQueued() {
	b.mu.Lock()
	stalled := b.queue
	b.queue = nil
	b.mu.Unlock()
	now := time.Now()
	for _, c := range stalled {
		if c.state.CompareAndSwap(callQueued, callSent) {
			c.sent = now
			b.finish(c, nil, errBehindStalled)
		}
	}
}

// send runs one batch and hands every call its result. It reports
// whether Redis left the batch unanswered past its deadline.
func (b *batcher) send(p *batchPipe, batch []*batchCall) (timedOut bool) {
	live := batch[:0]
	var timeout time.Duration
	for _, c := range batch {
		if !c.state.CompareAndSwap(callQueued, callSent) {
			continue // its caller left; nobody reads its result
		}
		if err := c.ctx.Err(); err != nil {
			c.sent = time.Now()
			b.finish(c, nil, err)
			continue
		}
		timeout = max(timeout, c.timeout)
		live = append(live, c)
	}
	if len(live) == 0 {
		return false
	}
	// The deadline starts now, at the write: time queued is not Redis's.
	sent := time.Now()
	deadline := sent.Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	fcall := !b.noFunctions.Load()
	mode := execEvalSha
	if fcall {
		mode = execFCall
	}
	b.exec(ctx, p, live, mode)
	var retry []*batchCall
	for _, c := range live {
		switch err := c.cmd.Err(); {
		case fcall && isFunctionMissing(err):
			c.noscipt = true
			retry = append(retry, c)
		case fcall && isFunctionRefused(err):
			b.noFunctions.Store(true)
			retry = append(retry, c)
		case isNoScript(err):
			c.noscipt = true
			retry = append(retry, c)
		}
	}
	switch {
	case len(retry) == 0:
	case fcall && !b.noFunctions.Load():
		// Load the library and call again, in one pipeline; a node that
		// refuses the library is called with scripts.
		if !b.exec(ctx, p, retry, execLoadFCall) || isFunctionMissing(retry[0].cmd.Err()) {
			// Refused, or loaded where the calls do not go (a client
			// that routes by key, seen as one node): scripts only.
			b.noFunctions.Store(true)
			b.load(ctx, p, notRun(retry))
		}
	default:
		b.load(ctx, p, retry)
	}
	took := time.Since(sent)
	answered := sent.Add(took) // when the pipeline's replies were in
	for _, c := range live {
		val, err := c.cmd.Result()
		// Judged on the pipeline's own reply, before any redirect runs.
		timedOut = timedOut || stalled(err, answered, deadline)
		if b.redirect != nil && isRedirect(err) {
			rctx, rcancel := context.WithTimeout(c.ctx, c.timeout)
			cmd := c.command(rctx, argEvalSha, c.script.shaArg)
			_ = b.redirect.Process(rctx, noRetry{cmd})
			if isNoScript(cmd.Err()) {
				cmd = c.command(rctx, argEval, c.script.srcArg)
				_ = b.redirect.Process(rctx, noRetry{cmd})
			}
			val, err = cmd.Result()
			rcancel()
		}
		c.sent, c.took = sent, took
		b.finish(c, val, err)
	}
	return timedOut
}

// stalled reports whether a call's error, read at answered, says Redis
// left it unanswered past deadline: a timeout, or a broken connection
// found past the deadline (retries cut short). The socket's deadline is
// the batch context's, and the reader can wake before the context's timer
// has fired, so the error and the clock decide, not ctx.Err(). A reply of
// Redis's (an error reply, MOVED, NOSCRIPT), however late it was read, is
// no stall.
func stalled(err error, answered, deadline time.Time) bool {
	var reply redis.Error
	if err == nil || errors.As(err, &reply) || isRedirect(err) {
		return false
	}
	return IsTimeout(err) || !answered.Before(deadline)
}

// load sends calls answered NOSCRIPT again after loading their scripts;
// those still not run (SCRIPT LOAD refused by an ACL, or the cache
// flushed again in between) are sent with their source (EVAL).
func (b *batcher) load(ctx context.Context, p *batchPipe, calls []*batchCall) {
	b.exec(ctx, p, calls, execEval)
	if rest := notRun(calls); len(rest) > 0 {
		b.exec(ctx, p, rest, execEvalSource)
	}
}

// notRun keeps the calls that Redis did not run (NOSCRIPT, no such
// function, functions refused): sent again. A call that ran (its script
// or library loaded meanwhile by another batch) must not be. It filters
// calls in place.
func notRun(calls []*batchCall) []*batchCall {
	n := 0
	for _, c := range calls {
		if err := c.cmd.Err(); isNoScript(err) || isFunctionMissing(err) || isFunctionRefused(err) {
			calls[n] = c
			n++
		}
	}
	return calls[:n]
}

// How exec sends its calls.
const (
	execFCall     = iota // FCALL of the library function
	execLoadFCall        // FUNCTION LOAD REPLACE of the library, then FCALL
	execEvalSha
	execEval       // SCRIPT LOAD of the calls' scripts, then EVALSHA
	execEvalSource // EVAL, the source with every call
)

// exec sends calls as one pipeline, as mode says. It reports false when
// the library or a script was to be loaded and the node refused it (the
// calls then hold that pipeline's replies, not to be used).
func (b *batcher) exec(ctx context.Context, p *batchPipe, calls []*batchCall, mode int) bool {
	var loads []*redis.StringCmd
	switch mode {
	case execLoadFCall:
		loads = append(loads, p.FunctionLoadReplace(ctx, lua.Library))
	case execEval:
		// Each script once, then the calls by digest: a batch of
		// hundreds of calls must not send the source hundreds of times.
		var loaded []*luaScript
		for _, c := range calls {
			if !slices.Contains(loaded, c.script) {
				loaded = append(loaded, c.script)
				loads = append(loads, p.ScriptLoad(ctx, c.script.src))
			}
		}
	}
	for _, c := range calls {
		switch mode {
		case execFCall, execLoadFCall:
			c.cmd = c.command(ctx, argFCall, c.script.fnArg)
		case execEvalSource:
			c.cmd = c.command(ctx, argEval, c.script.srcArg)
		default:
			c.cmd = c.command(ctx, argEvalSha, c.script.shaArg)
		}
		p.cmds = append(p.cmds, c.cmd)
	}
	// One append of the whole list: the pipeline's own list is made at
	// its size, once.
	_ = p.BatchProcess(ctx, p.cmds...)
	clear(p.cmds)
	p.cmds = p.cmds[:0]
	// Errors are per command (a failed connection fails them all).
	_, _ = p.Exec(ctx)
	for _, load := range loads {
		if err := load.Err(); err != nil && !isConnError(err) {
			return false
		}
	}
	return true
}

// The command names, boxed once.
var (
	argFCall   any = "fcall"
	argEvalSha any = "evalsha"
	argEval    any = "eval"
)

// command returns c as the command name (FCALL, EVALSHA or EVAL) of fn
// (the function, the script's digest or its source), with arguments built
// in c.cmdArgs rather than by go-redis's helpers, which box every key and
// the name on each call: keys go as pointers into the caller's key slice,
// which outlives the call (see do). Every script answers a list of
// integers, read as such: no reply is boxed.
func (c *batchCall) command(ctx context.Context, name, fn any) *redis.IntSliceCmd {
	a := append(c.cmdArgs[:0], name, fn, len(c.keys))
	for i := range c.keys {
		a = append(a, &c.keys[i])
	}
	a = append(a, c.args...)
	c.cmdArgs = a
	return redis.NewIntSliceCmd(ctx, a...)
}

// isFunctionMissing reports a node that does not hold the library.
func isFunctionMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// isFunctionRefused reports a node that cannot or may not run functions:
// a Redis before 7, or an ACL without FCALL.
func isFunctionRefused(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(err.Error(), "unknown command"))
}

// isConnError reports an error of the connection rather than a reply.
func isConnError(err error) bool {
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// finish hands c its result.
func (b *batcher) finish(c *batchCall, val []int64, err error) {
	c.val, c.err = val, err
	c.done <- struct{}{}
}

// isRedirect reports a cluster redirect (the slot lives elsewhere now).
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}
