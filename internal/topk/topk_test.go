package topk

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestTopKSpaceSaving: any key more frequent than total/capacity is
// counted, and counts overestimate by at most err.
func TestTopKSpaceSaving(t *testing.T) {
	tk := New[struct{}](0, 50, nil)
	tk.rebalance = 1 << 60 // no decay: check the plain algorithm
	rng := rand.New(rand.NewPCG(3, 4))
	counts := map[string]uint64{}
	const total = 100_000
	for range total {
		var key string
		if rng.IntN(10) < 3 {
			key = fmt.Sprintf("hot-%d", rng.IntN(5)) // 6% each
		} else {
			key = fmt.Sprintf("cold-%d", rng.IntN(20_000))
		}
		counts[key]++
		tk.Observe(key, func(string, *struct{}) {})
	}
	if len(tk.entries) > 50 || len(tk.heap) > 50 {
		t.Fatalf("%d entries, %d in heap; capacity 50", len(tk.entries), len(tk.heap))
	}
	for key, c := range counts {
		e := tk.entries[key]
		if c > total/50 && e == nil {
			t.Errorf("%s (%d > %d) is not counted", key, c, total/50)
		}
		if e != nil && (e.count < c || e.count-e.err > c) {
			t.Errorf("%s: count %d err %d, true count %d", key, e.count, e.err, c)
		}
	}
}

// TestTopKFollowsTraffic: a tenant that stops sending loses its place to
// one that starts, releasing its value; near-ties do not flap.
func TestTopKFollowsTraffic(t *testing.T) {
	var released []string
	tk := New(2, 16, func(key string, v *int) {
		released = append(released, key)
		if *v != 1 {
			t.Errorf("release(%s): value %d, want 1", key, *v)
		}
	})
	visit := func(key string, v *int) {
		if v != nil {
			*v = 1
		}
	}
	send := func(key string, n int) {
		for range n {
			tk.Observe(key, visit)
		}
	}
	send("old-a", 10)
	send("old-b", 10)
	send("new", 10)
	if got := tk.Top(); !slices.Equal(got, []string{"old-a", "old-b"}) {
		t.Fatalf("members %v, want the first two", got)
	}
	// old-a goes quiet; new and old-b keep sending. Within a few
	// rebalances new replaces old-a.
	for range 5 * tk.rebalance / 2 {
		tk.Observe("new", visit)
		tk.Observe("old-b", visit)
	}
	if got := tk.Top(); !slices.Equal(got, []string{"new", "old-b"}) {
		t.Errorf("members %v, want [new old-b]", got)
	}
	if !slices.Equal(released, []string{"old-a"}) {
		t.Errorf("released %v, want [old-a]", released)
	}
	// Three equally busy tenants for two places: after the first
	// rebalance sorts them out, membership stays put.
	released = nil
	for range 3 * tk.rebalance {
		tk.Observe("new", visit)
		tk.Observe("old-b", visit)
		tk.Observe("third", visit)
	}
	if len(released) > 1 {
		t.Errorf("near-ties flapped: released %v", released)
	}
	tk.Reset()
	if got := tk.Top(); got != nil {
		t.Errorf("after reset: %v", got)
	}
}

// TestTopKConcurrent hammers one top-k from several goroutines (run with
// -race): members never exceed n, and visit always sees a consistent key.
func TestTopKConcurrent(t *testing.T) {
	tk := New[int](3, 20, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 5000 {
				key := fmt.Sprintf("t%d", rng.IntN(50))
				tk.Observe(key, func(k string, v *int) {
					if k != key {
						t.Errorf("visit got %q for %q", k, key)
					}
					if v != nil {
						*v++
					}
				})
			}
		})
	}
	wg.Wait()
	if got := tk.Top(); len(got) > 3 {
		t.Errorf("%d members: %v", len(got), got)
	}
}
