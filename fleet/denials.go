package fleet

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// The denial stream (denials_stream; the key <prefix>:denials): every
// enforced 429 of a policy is appended to a Redis stream, so operators and
// the admin API can see who was denied, by which policy, across the fleet.
//
// The deny path never waits on Redis for it. A denial is copied into a
// bounded buffer (one per Redis backend, so one per connection and key
// prefix, hence one per stream key) and a single writer goroutine per
// backend drains the buffer, sending up to denialBatchSize XADDs per
// pipelined round trip. When the buffer is full the denial is dropped and
// counted (Observer.DenialsDropped, reason "buffer_full"); batches that
// meet an open breaker or fail are dropped and counted too.
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

// DropReasons are the reasons a denial can miss the stream, as reported to
// Observer.DenialsDropped.
var DropReasons = dropReasonNames[:]

var dropReasonNames = [numDropReasons]string{
	dropBufferFull:  "buffer_full",
	dropBreakerOpen: "breaker_open",
	dropError:       "error",
	dropShutdown:    "shutdown",
}

// Denial is one enforced 429, as written to the stream: a plain value,
// copied into the buffer on the deny path.
type Denial struct {
	// TS is the time of the denial in Unix milliseconds (the gateway's
	// clock).
	TS int64
	// Tenant and Policy say who was denied by what; Key is the partition
	// (empty unless the operator asked for keys in logs). TenantID is the
	// tenant's digest when Tenant was cut to 128 bytes (written as
	// tenant_id; see Recent).
	Tenant, TenantID, Policy, Key string
	// Limit is the limit in force; RetryAfter the Retry-After sent, in
	// seconds.
	Limit, RetryAfter int64
	// Penalty is set when the bucket was refused by its policy's penalty
	// box (written as reason=penalty).
	Penalty bool
}

// DenialStream is the buffer and writer of one backend's stream.
type DenialStream struct {
	client   redis.UniversalClient
	key      string // <prefix>:denials
	instance string // the registry ID of this instance
	timeout  time.Duration
	breaker  *limiter.BreakerStore
	logger   *zap.Logger
	dropped  func(reason string, n int)

	buf chan Denial
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

// denialStreamOptions configures newDenialStream.
type denialStreamOptions struct {
	client   redis.UniversalClient
	prefix   string
	instance string // the registry ID of this instance
	timeout  time.Duration
	breaker  *limiter.BreakerStore
	logger   *zap.Logger
	// dropped counts denials that did not reach the stream, by reason.
	dropped func(reason string, n int)
}

func newDenialStream(o denialStreamOptions) *DenialStream {
	life, endLife := context.WithCancel(context.Background())
	return &DenialStream{
		life:     life,
		endLife:  endLife,
		client:   o.client,
		key:      o.prefix + ":denials",
		instance: o.instance,
		timeout:  o.timeout,
		breaker:  o.breaker,
		logger:   o.logger,
		dropped:  o.dropped,
		buf:      make(chan Denial, denialBufferSize),
		users:    make(map[int]int),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// Acquire registers a user that wants the stream capped at maxlen and
// starts the writer on first use. Undo it with Release(maxlen).
func (s *DenialStream) Acquire(maxlen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users[maxlen]++
	s.updateMaxlen()
	if !s.started && !s.closed.Load() {
		s.started = true
		go s.run()
	}
}

// Release undoes one Acquire. The writer keeps running until the backend
// is released, so buffered denials survive a reload.
func (s *DenialStream) Release(maxlen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users[maxlen]--; s.users[maxlen] <= 0 {
		delete(s.users, maxlen)
	}
	s.updateMaxlen()
}

func (s *DenialStream) updateMaxlen() {
	m := 0
	for n := range s.users {
		m = max(m, n)
	}
	if m > 0 {
		s.maxlen.Store(int64(m))
	}
}

// Add queues a denial without ever blocking: when the buffer is full the
// denial is dropped and counted. It costs a struct copy into a channel.
func (s *DenialStream) Add(e Denial) {
	if s.closed.Load() {
		s.countDropped(dropShutdown, 1)
		return
	}
	select {
	case s.buf <- e:
	default:
		s.countDropped(dropBufferFull, 1)
	}
}

// close stops the writer after a last flush: it returns within about
// denialFlushTimeout, whatever state Redis is in. Denials still buffered
// then are dropped and counted. Safe to call more than once.
func (s *DenialStream) close() {
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
		s.countDropped(dropShutdown, len(s.buf))
		for len(s.buf) > 0 {
			<-s.buf
		}
	})
}

// run is the writer: it takes whatever is buffered (up to a batch) as soon
// as there is something, and writes it in one round trip.
func (s *DenialStream) run() {
	defer func() {
		close(s.done)
	}()
	batch := make([]Denial, 0, denialBatchSize)
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
func (s *DenialStream) fill(batch []Denial) []Denial {
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
func (s *DenialStream) flush(batch []Denial) {
	for {
		batch = s.fill(batch[:0])
		if len(batch) == 0 {
			return
		}
		if s.life.Err() != nil {
			s.countDropped(dropShutdown, len(batch))
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
func (s *DenialStream) write(ctx context.Context, batch []Denial) error {
	if s.breaker.Open() {
		s.countDropped(dropBreakerOpen, len(batch))
		return nil
	}
	maxlen := s.maxlen.Load()
	pipe := s.client.Pipeline()
	for i := range batch {
		e := &batch[i]
		values := make([]any, 0, 14)
		values = append(values,
			"ts", strconv.FormatInt(e.TS, 10),
			"tenant", e.Tenant,
			"policy", e.Policy)
		if e.TenantID != "" {
			values = append(values, "tenant_id", e.TenantID)
		}
		if e.Key != "" {
			values = append(values, "key", e.Key)
		}
		values = append(values,
			"limit", strconv.FormatInt(e.Limit, 10),
			"retry_after", strconv.FormatInt(e.RetryAfter, 10),
			"instance", s.instance)
		if e.Penalty {
			values = append(values, "reason", "penalty")
		}
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
	s.countDropped(dropError, failed)
	return err
}

// countDropped reports n denials that did not reach the stream.
func (s *DenialStream) countDropped(reason dropReason, n int) {
	if n > 0 && s.dropped != nil {
		s.dropped(dropReasonNames[reason], n)
	}
}

// MaxLen is the MAXLEN the writer trims with: the largest any user asked
// for.
func (s *DenialStream) MaxLen() int64 { return s.maxlen.Load() }

// Key is the stream's key, <prefix>:denials.
func (s *DenialStream) Key() string { return s.key }

// recentPage is how many entries Recent reads per round trip.
const recentPage = 1000

// Recent returns up to n entries of a tenant from the stream, newest
// first, each with its stream id as "id", reading at most maxScanned
// entries. The tenant is given as the stream records it (tenant, id: see
// Denial): an entry matches by its tenant_id when id is set, else by its
// tenant field when it has no tenant_id (two tenants cut to the same 128
// bytes are told apart by their ids).
func (s *DenialStream) Recent(ctx context.Context, tenant, id string, n, maxScanned int) ([]map[string]any, error) {
	var out []map[string]any
	end := "+"
	for scanned := 0; scanned < maxScanned && len(out) < n; {
		page, err := s.client.XRevRangeN(ctx, s.key, end, "-", recentPage).Result()
		if err != nil {
			return nil, err
		}
		for _, m := range page {
			got, cut := m.Values["tenant_id"]
			if (id != "" && got == id) || (id == "" && !cut && m.Values["tenant"] == tenant) {
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
		if len(page) < recentPage {
			break
		}
		// Continue below the oldest entry of this page.
		end = "(" + page[len(page)-1].ID
	}
	return out, nil
}
