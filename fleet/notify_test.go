package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

func TestSignVerify(t *testing.T) {
	body := []byte(`{"event":"exceeded"}`)
	now := time.Unix(1_800_000_000, 0)
	h := "t=1800000000,v1=" + Sign("s3cret", "1800000000", body)
	if err := Verify(h, "s3cret", body, now, 5*time.Minute); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	for name, tc := range map[string]struct {
		header, secret string
		body           []byte
		now            time.Time
	}{
		"other secret": {h, "other", body, now},
		"other body":   {h, "s3cret", []byte(`{"event":"penalty"}`), now},
		"too old":      {h, "s3cret", body, now.Add(6 * time.Minute)},
		"no v1":        {"t=1800000000", "s3cret", body, now},
		"garbage":      {"v1=zz", "s3cret", body, now},
	} {
		if err := Verify(tc.header, tc.secret, tc.body, tc.now, 5*time.Minute); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
}

func TestPublicAddr(t *testing.T) {
	for addr, public := range map[string]bool{
		"127.0.0.1": false, "10.1.2.3": false, "192.168.0.1": false, "172.16.5.4": false, "169.254.169.254": false,
		"100.64.0.1": false, "0.0.0.0": false, "::1": false, "fe80::1": false, "fc00::1": false, "::ffff:127.0.0.1": false,
		"224.0.0.1": false, "93.184.216.34": true, "2606:4700::1111": true, "8.8.8.8": true,
		// IPv6 addresses that carry an IPv4 one are judged by it.
		"64:ff9b::a9fe:a9fe": false, "64:ff9b::7f00:1": false, "64:ff9b::808:808": true,
		"::7f00:1": false, "::808:808": true, "2002:a9fe:a9fe::1": false, "2002:808:808::1": true,
		// Ranges netip does not call private.
		"fec0::1": false, "0.0.0.1": false, "198.18.0.1": false, "192.0.0.170": false, "255.255.255.255": false,
		"198.20.0.1": true, "192.0.1.1": true,
	} {
		if got := PublicAddr(netip.MustParseAddr(addr)); got != public {
			t.Errorf("PublicAddr(%s) = %v, want %v", addr, got, public)
		}
	}
}

// receiver is a webhook receiver: it verifies each delivery and answers
// with fail's status for the first failures, then 204.
type receiver struct {
	secret   string
	fail     int
	status   int
	mu       sync.Mutex
	attempts int
	events   []Event
	bad      int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.attempts++
	if Verify(r.Header.Get("Tollgate-Signature"), rc.secret, body, time.Now(), time.Minute) != nil {
		rc.bad++
	}
	if rc.attempts <= rc.fail {
		w.WriteHeader(rc.status)
		return
	}
	var ev Event
	_ = json.Unmarshal(body, &ev)
	rc.events = append(rc.events, ev)
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) snapshot() (attempts int, events []Event, bad int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.attempts, append([]Event(nil), rc.events...), rc.bad
}

// counts records Observe calls.
type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) observe(event, result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[result]++
}

func (c *counts) get(result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[result]
}

// TestNotifierRetries: a receiver that fails 3 times, then answers, gets
// the event once, signed; the attempts in between are counted as retried.
func TestNotifierRetries(t *testing.T) {
	rc := &receiver{secret: "k", fail: 3, status: http.StatusServiceUnavailable}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	var c counts
	n := NewNotifier(NotifyOptions{Backoff: 10 * time.Millisecond, Observe: c.observe, Instance: "i1"})
	defer n.Close()
	n.Send(Destination{URL: srv.URL, Secret: "k", AllowPrivate: true}, Event{Type: "exceeded", Tenant: "acme", Policy: "api"}, "", time.Time{})
	waitFor(t, func() bool { return c.get("sent") == 1 })
	attempts, events, bad := rc.snapshot()
	if attempts != 4 || len(events) != 1 || bad != 0 || c.get("retried") != 3 || c.get("failed") != 0 {
		t.Fatalf("attempts %d, events %d, bad signatures %d, counts %v", attempts, len(events), bad, c.m)
	}
	if ev := events[0]; ev.Type != "exceeded" || ev.Tenant != "acme" || ev.Instance != "i1" || ev.ID == "" || ev.At == "" {
		t.Fatalf("event %+v", ev)
	}
}

// TestNotifierGivesUp: a receiver that keeps failing gets Attempts
// attempts, then the event is counted failed.
func TestNotifierGivesUp(t *testing.T) {
	rc := &receiver{secret: "k", fail: 1000, status: http.StatusInternalServerError}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	var c counts
	n := NewNotifier(NotifyOptions{Backoff: time.Millisecond, Attempts: 3, Observe: c.observe})
	defer n.Close()
	n.Send(Destination{URL: srv.URL, Secret: "k", AllowPrivate: true}, Event{Type: "penalty"}, "", time.Time{})
	waitFor(t, func() bool { return c.get("failed") == 1 })
	if attempts, _, _ := rc.snapshot(); attempts != 3 || c.get("retried") != 2 {
		t.Fatalf("attempts %d, counts %v", attempts, c.m)
	}
}

// TestNotifierNoPrivateTarget: without allow_private, a loopback URL is
// never reached (checked on the address dialed); a redirect is never
// followed.
func TestNotifierNoPrivateTarget(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	var c counts
	n := NewNotifier(NotifyOptions{Backoff: time.Millisecond, Attempts: 2, Observe: c.observe})
	defer n.Close()
	n.Send(Destination{URL: srv.URL, Secret: "k"}, Event{Type: "exceeded"}, "", time.Time{})
	waitFor(t, func() bool { return c.get("failed") == 1 })
	if hits.Load() != 0 {
		t.Fatalf("a private target was reached %d times", hits.Load())
	}

	var followed atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { followed.Add(1) }))
	defer target.Close()
	redirect := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusFound))
	defer redirect.Close()
	n.Send(Destination{URL: redirect.URL, Secret: "k", AllowPrivate: true}, Event{Type: "exceeded"}, "", time.Time{})
	waitFor(t, func() bool { return c.get("failed") == 2 })
	if followed.Load() != 0 {
		t.Fatal("a redirect was followed")
	}
}

// TestNotifierDeadReceiver: a receiver that never answers costs the
// sender's queue, bounded: Send never blocks, and what does not fit is
// dropped and counted; Close ends the attempt in flight.
func TestNotifierDeadReceiver(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	var c counts
	n := NewNotifier(NotifyOptions{Timeout: time.Hour, Observe: c.observe})
	start := time.Now()
	for range 3 * notifyQueue {
		n.Send(Destination{URL: srv.URL, Secret: "k", AllowPrivate: true}, Event{Type: "exceeded"}, "", time.Time{})
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("%d sends took %v", 3*notifyQueue, d)
	}
	// One is in flight, notifyQueue wait, the rest were dropped.
	waitFor(t, func() bool { return c.get("dropped") >= 2*notifyQueue-1 })
	n.Close()
	if got := c.get("dropped") + c.get("failed"); got != 3*notifyQueue {
		t.Fatalf("dropped %d + failed %d, want all %d", c.get("dropped"), c.get("failed"), 3*notifyQueue)
	}
}

// TestNotifierOnceFleet: two notifiers (two instances) on one Redis
// send an event named once, in its period, from only one of them; the
// marker expires with the period.
func TestNotifierOnceFleet(t *testing.T) {
	rs := redistest.StartStandalone(t, redistest.Options{})
	client := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer client.Close()
	rc := &receiver{secret: "k"}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	var c counts
	var ns []*Notifier
	for _, id := range []string{"a", "b"} {
		n := NewNotifier(NotifyOptions{Client: client, Prefix: "nt", Instance: id, Observe: c.observe})
		defer n.Close()
		ns = append(ns, n)
	}
	end := time.Now().Add(time.Second)
	dst := Destination{URL: srv.URL, Secret: "k", AllowPrivate: true}
	for i := range 10 {
		ns[i%2].Send(dst, Event{Type: "near_limit", Threshold: 0.8}, "{acme}:api:near_limit:0.8:1", end)
	}
	waitFor(t, func() bool { return c.get("sent") >= 1 })
	time.Sleep(200 * time.Millisecond)
	if _, events, _ := rc.snapshot(); len(events) != 1 {
		t.Fatalf("%d deliveries of one event, want 1", len(events))
	}
	ttl, err := client.PTTL(context.Background(), "nt:notified:{acme}:api:near_limit:0.8:1").Result()
	if err != nil || ttl <= 0 || ttl > time.Second {
		t.Fatalf("marker TTL %v, %v", ttl, err)
	}
	// In-process, an event of a period is enqueued once.
	if !ns[0].Once("k1", end) || ns[0].Once("k1", end) || !ns[0].Once("k2", end) {
		t.Error("Once")
	}
}

// TestNotifyGivenUpIsUnclaimed: an event given up after its last attempt
// leaves no mark: the fleet's marker is deleted (if still this
// instance's) and the instance's own table forgets it, so the next time
// the event happens in its period it is sent, by another instance or
// this one. (The marker stayed for the rest of the period: a receiver
// down for seconds lost a monthly quota's event for the month.)
func TestNotifyGivenUpIsUnclaimed(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	c := srv.Client(t)
	rc := &receiver{secret: "s", fail: 2, status: http.StatusServiceUnavailable}
	ts := httptest.NewServer(rc)
	defer ts.Close()
	dst := Destination{URL: ts.URL, Secret: "s", AllowPrivate: true}
	const key = "{acme}:api:near_limit:0.8:0"
	end := time.Now().Add(time.Hour)
	a := NewNotifier(NotifyOptions{Client: c, Prefix: "un", Instance: "a", Attempts: 2, Backoff: 10 * time.Millisecond})
	if !a.Once(key, end) {
		t.Fatal("a new event is not new")
	}
	a.Send(dst, Event{Type: "near_limit", Tenant: "acme"}, key, end)
	waitFor(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return rc.attempts == 2 })
	waitFor(t, func() bool { return c.Exists(context.Background(), "un:notified:"+key).Val() == 0 })
	if !a.Once(key, end) {
		t.Error("the instance that gave the event up still counts it as sent")
	}
	a.Close()
	// Another instance sends it, the receiver being back.
	b := NewNotifier(NotifyOptions{Client: c, Prefix: "un", Instance: "b", Attempts: 2, Backoff: 10 * time.Millisecond})
	defer b.Close()
	b.Send(dst, Event{Type: "near_limit", Tenant: "acme"}, key, end)
	waitFor(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.events) == 1 })
	// A marker another instance holds is left alone.
	c.Set(context.Background(), "un:notified:other", "b", time.Hour)
	a2 := NewNotifier(NotifyOptions{Client: c, Prefix: "un", Instance: "a"})
	a2.unclaim("other")
	a2.Close()
	if c.Get(context.Background(), "un:notified:other").Val() != "b" {
		t.Error("unclaim deleted another instance's marker")
	}
}

// TestOnceTableBound: a full table of events not yet ended makes room
// for a tenth of its bound at once (so not every new event scans it),
// keeps at most its bound, and still answers for the events it kept.
func TestOnceTableBound(t *testing.T) {
	tb := NewOnceTable()
	end := time.Now().Add(time.Hour)
	for i := range notifyOnceKeep {
		tb.Once(strconv.Itoa(i), end)
	}
	if len(tb.fired) != notifyOnceKeep {
		t.Fatalf("%d events kept, want %d", len(tb.fired), notifyOnceKeep)
	}
	tb.Once("new", end)
	if n := len(tb.fired); n != notifyOnceKeep*9/10+1 {
		t.Fatalf("%d events kept after making room, want %d", n, notifyOnceKeep*9/10+1)
	}
	if tb.Once("new", end) {
		t.Error("an event just noted is new again")
	}
	for i := range notifyOnceKeep / 10 {
		tb.Once("more"+strconv.Itoa(i), end)
	}
	if n := len(tb.fired); n > notifyOnceKeep {
		t.Errorf("%d events kept, over the bound %d", n, notifyOnceKeep)
	}
}

// TestNotifierSendersRetire: a destination's sender retires once idle,
// so destinations used once (tenants' URLs since changed) do not take
// the notifier's places for good: after notifyMaxDestinations of them
// went idle, a new destination still gets its events. (Every further
// destination was dropped until a reload.)
func TestNotifierSendersRetire(t *testing.T) {
	defer func(d time.Duration) { senderIdle = d }(senderIdle)
	senderIdle = 50 * time.Millisecond
	rc := &receiver{secret: "s"}
	ts := httptest.NewServer(rc)
	defer ts.Close()
	n := NewNotifier(NotifyOptions{Attempts: 1})
	defer n.Close()
	for i := range notifyMaxDestinations {
		n.Send(Destination{URL: ts.URL + "/" + strconv.Itoa(i), Secret: "s", AllowPrivate: true}, Event{Type: "exceeded"}, "", time.Time{})
	}
	waitFor(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.events) == notifyMaxDestinations })
	waitFor(t, func() bool { n.mu.Lock(); defer n.mu.Unlock(); return len(n.senders) == 0 })
	n.Send(Destination{URL: ts.URL + "/new", Secret: "s", AllowPrivate: true}, Event{Type: "exceeded"}, "", time.Time{})
	waitFor(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.events) == notifyMaxDestinations+1 })
}

// TestNotifierCloseLeavesNoConnections: Close closes the kept-alive
// connections to the receivers, with their goroutines, instead of
// leaving them for the idle timeout (30 s) after each reload.
func TestNotifierCloseLeavesNoConnections(t *testing.T) {
	rc := &receiver{secret: "s"}
	ts := httptest.NewServer(rc)
	defer ts.Close()
	before := goleak.IgnoreCurrent()
	n := NewNotifier(NotifyOptions{Attempts: 1})
	n.Send(Destination{URL: ts.URL, Secret: "s", AllowPrivate: true}, Event{Type: "exceeded"}, "", time.Time{})
	waitFor(t, func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return len(rc.events) == 1 })
	n.Close()
	// The receiver's side of the connection is the server's to close.
	goleak.VerifyNone(t, before, goleak.IgnoreAnyFunction("net/http.(*conn).serve"))
}
