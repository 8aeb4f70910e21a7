package fleet

import (
	"bytes"
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Signals out: webhooks. A Notifier takes events from the request path
// and from the instance (fail modes, overrides), makes sure each happens
// once per tenant, policy, threshold and period across the fleet, and
// delivers them, signed, to their destinations, without ever making a
// request wait.
//
// Once per period: the request path first asks an in-process table (a
// map lookup under a lock, bounded), so a tenant near its limit on every
// request enqueues its event once per instance and period; the sender
// then sets a marker in Redis, SET NX with the period's remaining time as
// TTL, <prefix>:notified:{<tenant>}:<policy>:<event>[:<threshold>]:<period
// start>, and delivers only when it set it: one instance of the fleet
// sends. Without Redis the in-process table decides alone.
//
// Delivery: each destination has a bounded queue (notifyQueue events)
// and one sender goroutine; an event that finds its queue full is dropped
// and counted. A sender tries an event up to NotifyOptions.Attempts
// times, each within Timeout, waiting between attempts an exponential
// backoff with full jitter; a 2xx answer is a success, anything else (a
// redirect included: none is followed) a failure. A dead receiver costs
// its queue, bounded, and nothing else.
//
// Targets: a URL that resolves to a private, loopback, link-local or
// unspecified address is refused unless AllowPrivate (the check is made on
// the address dialed, after resolution, so DNS cannot route around it).

// Event is one notification, as it is sent (its JSON is the body).
type Event struct {
	// ID identifies the delivery: the same for every attempt, so a
	// receiver can drop a duplicate.
	ID string `json:"id"`
	// Type is near_limit, exceeded, penalty, fail_mode or override.
	Type string `json:"event"`
	// At is when it happened (RFC 3339).
	At string `json:"at"`
	// Instance is the instance that sent it.
	Instance string `json:"instance"`
	Tenant   string `json:"tenant,omitempty"`
	Policy   string `json:"policy,omitempty"`
	// Threshold is the near_limit fraction crossed.
	Threshold float64 `json:"threshold,omitempty"`
	// Limit, Used and Remaining describe the bucket at the event; Reset
	// is when it has more (RFC 3339).
	Limit     int64  `json:"limit,omitempty"`
	Used      int64  `json:"used,omitempty"`
	Remaining *int64 `json:"remaining,omitempty"`
	Reset     string `json:"reset,omitempty"`
	// PeriodStart and PeriodEnd bound the period the event fires once in
	// (RFC 3339): the limit's window, a calendar period, a penalty box.
	PeriodStart string `json:"period_start,omitempty"`
	PeriodEnd   string `json:"period_end,omitempty"`
	// State is fail_mode's "open" or "closed", override's "set" or
	// "deleted".
	State string `json:"state,omitempty"`
}

// Destination is where a handler's (or a policy's) events go.
type Destination struct {
	// URL receives a POST per event.
	URL string
	// Secret signs the body (Tollgate-Signature).
	Secret string
	// AllowPrivate permits a URL on a private network.
	AllowPrivate bool
}

// NotifyOptions configures a Notifier.
type NotifyOptions struct {
	// Client holds the fleet's markers; nil: this process decides alone.
	Client redis.UniversalClient
	// Prefix starts the marker keys.
	Prefix string
	// Instance names this instance in events.
	Instance string
	// Timeout bounds one attempt (default 5s); Attempts is how many
	// attempts an event gets (default 5); Backoff is the first wait
	// between two (default 1s, doubled each time, at most a minute).
	Timeout  time.Duration
	Attempts int
	Backoff  time.Duration
	// Observe counts deliveries: result sent, failed (an event given
	// up), retried (an attempt that failed and will be tried again),
	// dropped (a full queue, or the notifier closing).
	Observe func(event, result string)
	Logger  *zap.Logger
	// Fired, when not nil, is the table of events already fired that
	// the Notifier shares (see OnceTable); nil: a table of its own.
	Fired *OnceTable
}

// notifyQueue bounds each destination's queue; notifyOnceKeep bounds the
// in-process table of events already fired; notifyMaxDestinations bounds
// the destinations (per-tenant URLs included) a Notifier keeps senders
// for.
const (
	notifyQueue           = 1000
	notifyOnceKeep        = 100000
	notifyMaxDestinations = 256
)

// Notifier sends one handler's events.
type Notifier struct {
	opts NotifyOptions
	// client may dial any address; public refuses private ones.
	client, public *http.Client
	// fired: the events already enqueued or sent.
	fired *OnceTable

	mu      sync.Mutex
	senders map[Destination]*sender
	closed  bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewNotifier returns a Notifier; Close it when done.
func NewNotifier(o NotifyOptions) *Notifier {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	if o.Fired == nil {
		o.Fired = NewOnceTable()
	}
	return &Notifier{opts: o, fired: o.Fired, senders: map[Destination]*sender{}, ctx: ctx, cancel: cancel,
		client: webhookClient(&net.Dialer{Timeout: o.Timeout}),
		public: webhookClient(&net.Dialer{Timeout: o.Timeout, Control: refusePrivate})}
}

// webhookClient is a client that dials with d, through no proxy, and
// follows no redirect (a 3xx is a failed delivery).
func webhookClient(d *net.Dialer) *http.Client {
	return &http.Client{
		Transport:     &http.Transport{Proxy: nil, DialContext: d.DialContext, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// refusePrivate is a dialer's Control hook: it sees the address being
// dialed, after resolution, and refuses a private one.
func refusePrivate(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return err
	}
	if !PublicAddr(ap.Addr()) {
		return fmt.Errorf("%w: %s (allow_private permits it)", ErrPrivateTarget, ap.Addr())
	}
	return nil
}

// ErrPrivateTarget is a webhook URL that reaches a private address
// without allow_private.
var ErrPrivateTarget = errors.New("notify: private address")

// Once reports whether the event named key, of the period that ends at
// end, is new on this instance (and marks it): the request path calls it
// before building an event, so a repeated event costs one map lookup.
func (n *Notifier) Once(key string, end time.Time) bool { return n.fired.Once(key, end) }

// OnceTable is the events a process fired, each until the end of its
// period (Unix ns), at most notifyOnceKeep of them. A Notifier has one of
// its own, which is enough with Redis (the fleet's marker says what was
// sent, across reloads too); without Redis, the handlers of every config
// share one (gate), so a reload does not send again what the config
// before it sent.
type OnceTable struct {
	mu    sync.Mutex
	fired map[string]int64
}

// NewOnceTable returns an empty table.
func NewOnceTable() *OnceTable { return &OnceTable{fired: map[string]int64{}} }

// Once reports whether the event named key, of the period that ends at
// end, is new (and marks it).
func (t *OnceTable) Once(key string, end time.Time) bool {
	now := time.Now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if until, ok := t.fired[key]; ok && until > now {
		return false
	}
	if len(t.fired) >= notifyOnceKeep {
		t.makeRoom(now)
	}
	t.fired[key] = end.UnixNano()
	return true
}

// makeRoom deletes the events whose period ended and, while more than
// nine tenths of the bound are left, others (in map order: at random), so
// that the next tenth of the bound of new events is noted without a scan
// (a scan per event of a full table was 2 ms under the lock).
func (t *OnceTable) makeRoom(now int64) {
	for k, until := range t.fired {
		if until <= now || len(t.fired) > notifyOnceKeep*9/10 {
			delete(t.fired, k)
		}
	}
}

// Forget forgets the event named key.
func (t *OnceTable) Forget(key string) {
	t.mu.Lock()
	delete(t.fired, key)
	t.mu.Unlock()
}

// Send queues ev for dst. With once set, ev is sent only if no instance
// sent the event named once in the period that ends at end (a marker in
// Redis). It never blocks.
func (n *Notifier) Send(dst Destination, ev Event, once string, end time.Time) {
	if dst.URL == "" {
		return
	}
	if ev.ID == "" {
		ev.ID = newEventID()
	}
	if ev.At == "" {
		ev.At = time.Now().UTC().Format(time.RFC3339Nano)
	}
	ev.Instance = n.opts.Instance
	if !n.enqueue(dst, queued{ev: ev, once: once, end: end}) {
		n.observe(ev.Type, "dropped")
	}
}

// enqueue puts q in dst's queue, starting its sender on first use; false
// when the notifier is closed, has too many destinations, or the queue
// is full. It holds n.mu, so a sender that retires (see run) never leaves
// an event in a queue nobody reads.
func (n *Notifier) enqueue(dst Destination, q queued) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	s := n.senders[dst]
	if s == nil {
		if len(n.senders) >= notifyMaxDestinations {
			return false
		}
		s = &sender{dst: dst, queue: make(chan queued, notifyQueue)}
		n.senders[dst] = s
		n.wg.Add(1)
		go n.run(s)
	}
	select {
	case s.queue <- q:
		return true
	default:
		return false
	}
}

func newEventID() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sender is one destination's queue and goroutine.
type sender struct {
	dst   Destination
	queue chan queued
}

type queued struct {
	ev   Event
	once string
	end  time.Time
}

// senderIdle is how long a sender waits for an event before it retires,
// so that destinations used once (a tenant's URL since changed) do not
// keep a goroutine, nor count against notifyMaxDestinations, for good.
var senderIdle = 5 * time.Minute

func (n *Notifier) run(s *sender) {
	defer n.wg.Done()
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	for {
		select {
		case <-idle.C:
			n.mu.Lock()
			if len(s.queue) == 0 {
				delete(n.senders, s.dst)
				n.mu.Unlock()
				return
			}
			n.mu.Unlock()
			idle.Reset(senderIdle)
		case <-n.ctx.Done():
			for range len(s.queue) {
				q := <-s.queue
				n.observe(q.ev.Type, "dropped")
			}
			return
		case q := <-s.queue:
			if q.once != "" && !n.claim(q.once, q.end) {
				continue // another instance sent it
			}
			if !n.deliver(s.dst, q.ev) && q.once != "" {
				n.unclaim(q.once)
			}
			idle.Reset(senderIdle)
		}
	}
}

// claim sets the fleet's marker of the event named key; true when this
// instance set it (or there is no Redis, or Redis fails: better twice
// than never).
func (n *Notifier) claim(key string, end time.Time) bool {
	if n.opts.Client == nil {
		return true
	}
	ttl := time.Until(end)
	if ttl <= 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.opts.Timeout)
	defer cancel()
	ok, err := n.opts.Client.SetNX(ctx, n.opts.Prefix+":notified:"+key, n.opts.Instance, ttl).Result()
	if err != nil {
		n.opts.Logger.Debug("notify: setting the once marker failed; sending anyway", zap.Error(err))
		return true
	}
	return ok
}

// unclaimScript deletes a once marker if it is still this instance's.
var unclaimScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// unclaim forgets the event named key, given up after its last attempt
// (or cut short by Close): in this instance's table and, when this
// instance set it, the fleet's marker, so that the next time the event
// happens in its period an instance sends it, instead of none for the
// rest of the period (a month, for a monthly quota).
func (n *Notifier) unclaim(key string) {
	n.fired.Forget(key)
	if n.opts.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.Timeout)
	defer cancel()
	if err := unclaimScript.Run(ctx, n.opts.Client, []string{n.opts.Prefix + ":notified:" + key}, n.opts.Instance).Err(); err != nil {
		n.opts.Logger.Debug("notify: clearing the once marker of an event given up failed", zap.Error(err))
	}
}

// deliver tries ev on dst up to Attempts times, and reports whether it
// was delivered.
func (n *Notifier) deliver(dst Destination, ev Event) bool {
	body, err := json.Marshal(ev)
	if err != nil {
		n.observe(ev.Type, "failed")
		return false
	}
	wait := n.opts.Backoff
	for attempt := 1; ; attempt++ {
		err := n.post(dst, ev, body)
		if err == nil {
			n.observe(ev.Type, "sent")
			return true
		}
		if attempt >= n.opts.Attempts || n.ctx.Err() != nil {
			n.observe(ev.Type, "failed")
			n.opts.Logger.Warn("notify: giving up on an event", zap.String("event", ev.Type), zap.String("url", dst.URL),
				zap.Int("attempts", attempt), zap.Error(err))
			return false
		}
		n.observe(ev.Type, "retried")
		// Full jitter: anywhere up to the backoff, so a fleet does not
		// retry in step.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(wait)) + 1))
		select {
		case <-n.ctx.Done():
			t.Stop()
			n.observe(ev.Type, "failed")
			return false
		case <-t.C:
		}
		wait = min(2*wait, time.Minute)
	}
}

// post makes one attempt.
func (n *Notifier) post(dst Destination, ev Event, body []byte) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dst.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	t := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Tollgate-Webhook/1")
	req.Header.Set("Tollgate-Event", ev.Type)
	req.Header.Set("Tollgate-Delivery", ev.ID)
	req.Header.Set("Tollgate-Signature", "t="+t+",v1="+Sign(dst.Secret, t, body))
	client := n.public
	if dst.AllowPrivate {
		client = n.client
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("%s answered %d", dst.URL, res.StatusCode)
	}
	return nil
}

// PublicAddr reports whether a may be dialed without allow_private: not
// loopback, private, link-local, multicast, unspecified, shared (CGNAT),
// "this network", benchmarking, IETF protocol assignments, broadcast,
// nor IPv6 site-local; and an IPv6 address that carries an IPv4 one
// (IPv4-mapped or -compatible, NAT64, 6to4) is judged by that one, so
// 64:ff9b::a9fe:a9fe does not reach 169.254.169.254 through a NAT64
// gateway.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a), v4compat.Contains(a) && a != netip.IPv6Unspecified():
			return PublicAddr(netip.AddrFrom4([4]byte(b[12:16])))
		case sixToFour.Contains(a):
			return PublicAddr(netip.AddrFrom4([4]byte(b[2:6])))
		case siteLocal.Contains(a):
			return false
		}
	}
	switch {
	case a.IsLoopback(), a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(),
		a.IsInterfaceLocalMulticast(), a.IsMulticast(), a.IsUnspecified():
		return false
	}
	for _, p := range notPublic4 {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// The ranges PublicAddr refuses beyond netip's predicates.
var (
	notPublic4 = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),          // this network
		netip.MustParsePrefix("100.64.0.0/10"),      // shared (CGNAT)
		netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
		netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
		netip.MustParsePrefix("255.255.255.255/32"), // broadcast
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	v4compat  = netip.MustParsePrefix("::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	siteLocal = netip.MustParsePrefix("fec0::/10")
)

// Sign is the v1 signature of body sent at t (Unix seconds, as text):
// hex(HMAC-SHA256(secret, t + "." + body)).
func Sign(secret, t string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(t))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// ErrBadSignature is a signature that does not verify.
var ErrBadSignature = errors.New("bad signature")

// Verify checks a Tollgate-Signature header against body and secret, and
// that its time is within tolerance of now: what a receiver does.
func Verify(header, secret string, body []byte, now time.Time, tolerance time.Duration) error {
	var t, v1 string
	for _, part := range strings.Split(header, ",") {
		switch {
		case len(part) > 2 && part[:2] == "t=":
			t = part[2:]
		case len(part) > 3 && part[:3] == "v1=":
			v1 = part[3:]
		}
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v1 == "" {
		return ErrBadSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %s is outside the tolerance", ErrBadSignature, t)
	}
	want := Sign(secret, t, body)
	if !hmac.Equal([]byte(want), []byte(v1)) {
		return ErrBadSignature
	}
	return nil
}

func (n *Notifier) observe(event, result string) {
	if n.opts.Observe != nil {
		n.opts.Observe(event, result)
	}
}

// Close stops the senders: queued events are dropped (and counted), an
// attempt in flight is cancelled, and the kept-alive connections to the
// receivers are closed (with their goroutines) rather than left to time
// out after a reload.
func (n *Notifier) Close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	n.client.CloseIdleConnections()
	n.public.CloseIdleConnections()
}
