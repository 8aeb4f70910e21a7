package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A batcher sends the script calls of concurrent requests bound for one
// Redis node as one pipeline: one write, one read. While a batch is on the
// wire, the calls that arrive queue; as soon as a flusher is free, the
// whole queue goes out as the next batch. There is no timer: a lone call
// is sent at once and waits for nobody. Under load, one round trip
// carries many decisions, which is what makes strict (unleased) limits
// fast: the syscalls and wake-ups of a round trip, not Redis, are most of
// a decision's cost.
//
// Each call keeps its own deadline: its caller waits for its result or its
// own context, whichever comes first (a call abandoned in flight may still
// run, as a call that times out without batching may). A batch is sent
// with the latest deadline of its calls, so no call is cut short by
// another's. Calls whose context is done before their batch is formed are
// not sent.
//
// NOSCRIPT replies (a restarted Redis, SCRIPT FLUSH) are retried at once
// with EVAL, in one more pipeline. In a cluster, a call answered MOVED or
// ASK (the slot moved since the batcher was chosen) is retried alone
// through the cluster client, which follows the redirect.
type batcher struct {
	// pipe makes a pipeline to the node; redirect, when set (cluster), runs
	// a single call that may need to follow a redirect.
	pipe     func() redis.Pipeliner
	redirect redis.Scripter

	mu       sync.Mutex
	queue    []*batchCall
	flushers int
	max      int // flushers at most: batches in flight at once
}

// maxBatchFlushers is how many batches one node may have in flight at once.
// One keeps the node's commands in one ordered stream and maximizes batch
// size; two let the next batch be written while the previous reply is
// read. Measured on loopback (BenchmarkRedisBatching), two was faster.
const maxBatchFlushers = 2

// maxBatchSize caps one pipeline; the rest waits for the next batch.
const maxBatchSize = 256

// batchCall is one script call waiting for its batch.
type batchCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any

	cmd     *redis.Cmd
	done    chan struct{}
	val     any
	err     error
	noscipt bool // the first attempt was answered NOSCRIPT
}

var batchCalls = sync.Pool{New: func() any { return &batchCall{done: make(chan struct{}, 1)} }}

func newBatcher(pipe func() redis.Pipeliner, redirect redis.Scripter) *batcher {
	return &batcher{pipe: pipe, redirect: redirect, max: maxBatchFlushers}
}

// do runs script as part of the next batch and returns its reply. noscript
// reports that Redis first answered NOSCRIPT (the call was retried with
// EVAL). abandoned reports that the caller's context ended while the call
// was in a batch: the batch may still send the arguments, so the caller
// must not reuse them.
func (b *batcher) do(ctx context.Context, script *redis.Script, keys []string, args []any) (val any, noscript, abandoned bool, err error) {
	c := batchCalls.Get().(*batchCall)
	c.ctx, c.script, c.keys, c.args = ctx, script, keys, args
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
	select {
	case <-c.done:
		val, noscript, err = c.val, c.noscipt, c.err
		*c = batchCall{done: c.done}
		batchCalls.Put(c)
		return val, noscript, false, err
	case <-ctx.Done():
		// The batch still holds c (and the caller's arguments): it is
		// dropped, not pooled, once the batch is done with it.
		return nil, false, true, ctx.Err()
	}
}

// flush sends batches while calls are queued, then ends.
func (b *batcher) flush() {
	var batch []*batchCall
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatchSize)
		if n == 0 {
			b.flushers--
			b.mu.Unlock()
			return
		}
		batch = append(batch[:0], b.queue[:n]...)
		rest := copy(b.queue, b.queue[n:])
		clear(b.queue[rest:])
		b.queue = b.queue[:rest]
		b.mu.Unlock()
		b.send(batch)
		clear(batch)
	}
}

// send runs one batch and hands every call its result.
func (b *batcher) send(batch []*batchCall) {
	live := batch[:0]
	var deadline time.Time
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			b.finish(c, nil, err)
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	b.exec(ctx, live, false)
	var retry []*batchCall
	for _, c := range live {
		if isNoScript(c.cmd.Err()) {
			c.noscipt = true
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		b.exec(ctx, retry, true)
	}
	for _, c := range live {
		val, err := c.cmd.Result()
		if b.redirect != nil && isRedirect(err) {
			val, err = c.script.EvalSha(c.ctx, b.redirect, c.keys, c.args...).Result()
			if isNoScript(err) {
				val, err = c.script.Eval(c.ctx, b.redirect, c.keys, c.args...).Result()
			}
		}
		b.finish(c, val, err)
	}
}

// exec sends calls as one pipeline: EVALSHA, or EVAL when eval is set.
func (b *batcher) exec(ctx context.Context, calls []*batchCall, eval bool) {
	p := b.pipe()
	for _, c := range calls {
		if eval {
			c.cmd = c.script.Eval(ctx, p, c.keys, c.args...)
		} else {
			c.cmd = c.script.EvalSha(ctx, p, c.keys, c.args...)
		}
	}
	// Errors are per command (a failed connection fails them all).
	_, _ = p.Exec(ctx)
}

// finish hands c its result.
func (b *batcher) finish(c *batchCall, val any, err error) {
	c.val, c.err = val, err
	c.done <- struct{}{}
}

// isRedirect reports a cluster redirect (the slot lives elsewhere now).
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK"))
}
