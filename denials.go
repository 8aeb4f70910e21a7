package tollgate

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// The denial stream (DESIGN §2 denials_stream, §5 <prefix>:denials): every
// enforced 429 of a policy is appended to a Redis stream, so operators and
// the admin API can see who was denied, by which policy, across the fleet.
//
// The deny path never waits on Redis for it. A denial is copied into a
// bounded buffer (one per Redis backend, so one per connection and key
// prefix, hence one per stream key) and a single writer goroutine per
// backend drains the buffer, sending up to denialBatchSize XADDs per
// pipelined round trip. When the buffer is full the denial is dropped and
// counted in caddy_rate_limit_denials_dropped_total{reason="buffer_full"};
// batches that meet an open breaker or fail are dropped and counted too.
// The stream is an observability aid, never a source of truth.
//
// Handlers on one backend that ask for different maxlen values share the
// writer, which trims with the largest maxlen any of them asks for: every
// XADD carries MAXLEN ~ max, so the stream keeps at least what each
// handler wants. (Separate writers with their own MAXLEN would trim each
// other's entries down to the smallest value.)

const (
	// denialBufferSize is how many denials may wait for the writer, per
	// backend. At ~80 bytes an entry (plus the strings it points to) it
	// costs a few hundred KB at most.
	denialBufferSize = 4096
	// denialBatchSize is the most XADDs sent in one pipelined round trip.
	denialBatchSize = 256
	// denialMinBatchTimeout is the least deadline of one batch; the
	// socket reads and writes inside it are still bounded by the redis
	// timeout.
	denialMinBatchTimeout = time.Second
	// denialFlushTimeout bounds the last flush when the backend goes.
	denialFlushTimeout = time.Second
)

// dropReason is the reason label of caddy_rate_limit_denials_dropped_total.
type dropReason uint8

const (
	dropBufferFull  dropReason = iota // the buffer was full: the writer is behind
	dropBreakerOpen                   // the Redis breaker was open
	dropError                         // the XADD failed or timed out
	dropShutdown                      // left over when the backend was released
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{
	dropBufferFull:  "buffer_full",
	dropBreakerOpen: "breaker_open",
	dropError:       "error",
	dropShutdown:    "shutdown",
}

// denialEntry is one denial waiting for the writer: a plain value, copied
// into the buffer on the deny path.
type denialEntry struct {
	ts         int64 // unix ms, gateway clock
	tenant     string
	policy     string
	key        string // empty unless log_key
	limit      int64
	retryAfter int64 // seconds, as sent in Retry-After
}

// denialStream is the buffer and writer of one backend's stream.
type denialStream struct {
	client   redis.UniversalClient
	key      string // <prefix>:denials
	instance string // the registry ID of this instance
	timeout  time.Duration
	breaker  *limiter.BreakerStore
	logger   *zap.Logger

	buf chan denialEntry
	// closed is set when the writer stops; later denials are dropped
	// (counted as shutdown) rather than left in a buffer nobody reads.
	closed atomic.Bool
	// maxlen is the MAXLEN of each XADD: the largest of users.
	maxlen atomic.Int64

	mu      sync.Mutex
	users   map[int]int // maxlen -> handlers asking for it
	started bool
	stop    chan struct{}
	done    chan struct{}
	// life is cancelled denialFlushTimeout after close began: every
	// write, the one in flight included, ends by then.
	life      context.Context
	endLife   context.CancelFunc
	closeOnce sync.Once
}

// denialsWriters counts running writer goroutines, for tests.
var denialsWriters atomic.Int64

func newDenialStream(client redis.UniversalClient, prefix, instance string, timeout time.Duration,
	breaker *limiter.BreakerStore, logger *zap.Logger) *denialStream {
	if prefix == "" {
		prefix = limiter.DefaultPrefix
	}
	life, endLife := context.WithCancel(context.Background())
	return &denialStream{
		life:     life,
		endLife:  endLife,
		client:   client,
		key:      prefix + ":denials",
		instance: instance,
		timeout:  timeout,
		breaker:  breaker,
		logger:   logger,
		buf:      make(chan denialEntry, denialBufferSize),
		users:    make(map[int]int),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// acquire registers a handler that wants the stream capped at maxlen and
// starts the writer on first use. Undo it with release(maxlen).
func (s *denialStream) acquire(maxlen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[maxlen]++
	s.updateMaxlen()
	if !s.started && !s.closed.Load() {
		s.started = true
		dropCounters()
		denialsWriters.Add(1)
		go s.run()
	}
}

// release undoes one acquire. The writer keeps running until the backend
// is destroyed, so buffered denials survive a reload.
func (s *denialStream) release(maxlen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users[maxlen]--; s.users[maxlen] <= 0 {
		delete(s.users, maxlen)
	}
	s.updateMaxlen()
}

func (s *denialStream) updateMaxlen() {
	m := 0
	for n := range s.users {
		m = max(m, n)
	}
	if m > 0 {
		s.maxlen.Store(int64(m))
	}
}

// add queues a denial without ever blocking: when the buffer is full the
// denial is dropped and counted.
func (s *denialStream) add(e denialEntry) {
	if s.closed.Load() {
		countDropped(dropShutdown, 1)
		return
	}
	select {
	case s.buf <- e:
	default:
		countDropped(dropBufferFull, 1)
	}
}

// close stops the writer after a last flush: it returns within about
// denialFlushTimeout, whatever state Redis is in. Denials still buffered
// then are dropped and counted. Safe to call more than once.
func (s *denialStream) close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		started := s.started
		s.closed.Store(true)
		s.mu.Unlock()
		if started {
			timer := time.AfterFunc(denialFlushTimeout, s.endLife)
			close(s.stop)
			<-s.done
			timer.Stop()
		}
		s.endLife()
		countDropped(dropShutdown, len(s.buf))
		for len(s.buf) > 0 {
			<-s.buf
		}
	})
}

// run is the writer: it takes whatever is buffered (up to a batch) as soon
// as there is something, and writes it in one round trip.
func (s *denialStream) run() {
	defer func() {
		denialsWriters.Add(-1)
		close(s.done)
	}()
	batch := make([]denialEntry, 0, denialBatchSize)
	failing := false
	for {
		select {
		case <-s.stop:
			s.flush(batch)
			return
		case e := <-s.buf:
			batch = s.fill(append(batch[:0], e))
			ctx, cancel := context.WithTimeout(s.life, max(s.timeout, denialMinBatchTimeout))
			err := s.write(ctx, batch)
			cancel()
			switch {
			case err != nil && !failing:
				failing = true
				s.logger.Warn("denial stream: writing to Redis failed; dropping denials until it works again",
					zap.String("stream", s.key), causeField(err), zap.Error(err))
			case err == nil && failing:
				failing = false
				s.logger.Info("denial stream: writing to Redis again", zap.String("stream", s.key))
			}
		}
	}
}

// fill adds buffered denials to batch, without waiting, up to a batch.
func (s *denialStream) fill(batch []denialEntry) []denialEntry {
	for len(batch) < denialBatchSize {
		select {
		case e := <-s.buf:
			batch = append(batch, e)
		default:
			return batch
		}
	}
	return batch
}

// flush writes what is buffered when the writer stops, until life ends
// (denialFlushTimeout after close began); the rest is dropped.
func (s *denialStream) flush(batch []denialEntry) {
	for {
		batch = s.fill(batch[:0])
		if len(batch) == 0 {
			return
		}
		if s.life.Err() != nil {
			countDropped(dropShutdown, len(batch))
			continue
		}
		ctx, cancel := context.WithTimeout(s.life, max(s.timeout, denialMinBatchTimeout))
		_ = s.write(ctx, batch)
		cancel()
	}
}

// write sends batch as one pipeline of XADDs. Denials that were not
// written are counted as dropped. The breaker is read, not fed: the
// decisions' own calls tell it whether Redis is healthy.
func (s *denialStream) write(ctx context.Context, batch []denialEntry) error {
	if s.breaker.Open() {
		countDropped(dropBreakerOpen, len(batch))
		return nil
	}
	maxlen := s.maxlen.Load()
	pipe := s.client.Pipeline()
	for i := range batch {
		e := &batch[i]
		values := make([]any, 0, 14)
		values = append(values,
			"ts", strconv.FormatInt(e.ts, 10),
			"tenant", e.tenant,
			"policy", e.policy)
		if e.key != "" {
			values = append(values, "key", e.key)
		}
		values = append(values,
			"limit", strconv.FormatInt(e.limit, 10),
			"retry_after", strconv.FormatInt(e.retryAfter, 10),
			"instance", s.instance)
		pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: s.key,
			MaxLen: maxlen,
			Approx: true,
			ID:     "*",
			Values: values,
		})
	}
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	failed := 0
	for _, c := range cmds {
		if c.Err() != nil {
			failed++
		}
	}
	if len(cmds) == 0 {
		failed = len(batch)
	}
	countDropped(dropError, failed)
	return err
}

// recordDenial queues the stream entry of an enforced denial. Called on
// the 429 path: a struct copy into a channel, no I/O.
func (h *Handler) recordDenial(it *limiter.Item, v *limiter.Verdict, retryAfter int64) {
	e := denialEntry{
		ts:         time.Now().UnixMilli(),
		tenant:     loggable(it.Tenant),
		policy:     it.Policy.Name,
		limit:      v.Limit.Limit,
		retryAfter: retryAfter,
	}
	if h.LogKey {
		e.key = loggable(it.Part)
	}
	h.denials.add(e)
}

// dropCounters are the children of caddy_rate_limit_denials_dropped_total,
// resolved when the first writer starts, so the series exist (at 0) only
// where the stream is used.
var dropCounters = sync.OnceValue(func() (c [numDropReasons]prometheus.Counter) {
	for i, r := range dropReasonNames {
		c[i] = collectors.denialsDropped.WithLabelValues(r)
	}
	return c
})

// countDropped counts n denials that did not reach the stream.
func countDropped(reason dropReason, n int) {
	if n > 0 {
		dropCounters()[reason].Add(float64(n))
	}
}

// recentDenials returns up to n entries of tenant (as stored, i.e. cut
// like in logs) from the backend's denial stream, newest first, scanning
// at most maxDenialsScanned entries.
func (b *redisBackend) recentDenials(ctx context.Context, tenant string, n int) ([]map[string]any, error) {
	key, client := b.denials.key, b.denials.client
	var out []map[string]any
	end := "+"
	for scanned := 0; scanned < maxDenialsScanned && len(out) < n; {
		page, err := client.XRevRangeN(ctx, key, end, "-", 1000).Result()
		if err != nil {
			return nil, err
		}
		for _, m := range page {
			if m.Values["tenant"] == tenant {
				e := map[string]any{"id": m.ID}
				for k, v := range m.Values {
					e[k] = v
				}
				out = append(out, e)
				if len(out) == n {
					break
				}
			}
		}
		scanned += len(page)
		if len(page) < 1000 {
			break
		}
		// Continue below the oldest entry of this page.
		end = "(" + page[len(page)-1].ID
	}
	return out, nil
}
