package limiter

import (
	"sync"
	"testing"
	"time"
)

// fakePeers reports a fixed usage for every bucket and records charges.
type fakePeers struct {
	mu      sync.Mutex
	usage   PeerUsage
	charged []string
}

func (p *fakePeers) Usage(c *Check, now time.Time) PeerUsage {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.usage.Count > 0 && p.usage.Oldest.Add(c.Rate.Window).After(now) {
		return p.usage
	}
	return PeerUsage{}
}

func (p *fakePeers) Charged(c *Check, _ time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.charged = append(p.charged, c.Tenant+"/"+c.Policy)
}

func logCheck(cost int64) Check {
	return Check{Algorithm: SlidingLog, Tenant: "k", Policy: "z", Rate: Rate{Limit: 10, Window: time.Minute}, Cost: cost}
}

// The cases of caddy-ratelimit's distributed test, on the engine: peer
// usage inside the window, before it, local usage, and both.
func TestPeerStoreCombinesLocalAndPeerUsage(t *testing.T) {
	cases := []struct {
		name       string
		peer       int64
		peerAge    time.Duration
		local      int64
		wantDenied bool
		wantRetry  time.Duration
	}{
		{"peer usage in window", 10, 0, 0, true, time.Minute},
		{"peer usage before window", 10, time.Minute + time.Second, 0, false, 0},
		{"local usage", 0, 0, 10, true, time.Minute},
		{"both", 5, 0, 5, true, time.Minute},
		{"both under the limit", 4, 0, 5, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem, clock := newTestStore(t, MemoryOptions{})
			start := clock.Now()
			peers := &fakePeers{}
			if tc.peer > 0 {
				peers.usage = PeerUsage{Count: tc.peer, Oldest: start.Add(-tc.peerAge)}
			}
			s := NewPeerStore(mem, peers, clock)
			for range tc.local {
				if ok, _ := mustDecide(t, s, logCheck(1)); !ok {
					t.Fatal("local request denied")
				}
			}
			ok, res := mustDecide(t, s, logCheck(1))
			if ok == tc.wantDenied {
				t.Fatalf("admitted = %v, want %v", ok, !tc.wantDenied)
			}
			if tc.wantDenied && res[0].RetryAfter != tc.wantRetry {
				t.Errorf("RetryAfter = %v, want %v", res[0].RetryAfter, tc.wantRetry)
			}
			if !tc.wantDenied && res[0].Remaining != 10-tc.local-1-peers.Usage(&Check{Rate: logCheck(1).Rate}, clock.Now()).Count {
				t.Errorf("Remaining = %d", res[0].Remaining)
			}
		})
	}
}

// A denial caused by peers charges nothing locally, and admitted charges
// are reported for publishing.
func TestPeerStoreDeniedChargesNothing(t *testing.T) {
	mem, clock := newTestStore(t, MemoryOptions{})
	peers := &fakePeers{usage: PeerUsage{Count: 8, Oldest: clock.Now()}}
	s := NewPeerStore(mem, peers, clock)
	for i := range 2 {
		if ok, _ := mustDecide(t, s, logCheck(1)); !ok {
			t.Fatalf("request %d denied", i+1)
		}
	}
	if ok, _ := mustDecide(t, s, logCheck(1)); ok {
		t.Fatal("third request admitted past 8 peer + 2 local of 10")
	}
	if got := LocalUsage(logCheck(0).Rate, mustPeek(t, mem, logCheck(0))[0], clock.Now()).Count; got != 2 {
		t.Errorf("local count %d, want 2 (the denied request charged nothing)", got)
	}
	if len(peers.charged) != 2 {
		t.Errorf("charged reported %d times, want 2", len(peers.charged))
	}
	// Peers' usage ages out: the local log alone decides.
	clock.Advance(time.Minute)
	if ok, _ := mustDecide(t, s, logCheck(1)); !ok {
		t.Error("denied once the peers' units left the window")
	}
}
