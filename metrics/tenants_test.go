package metrics

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// tenantLabelValues lists the tenant label values exported for policy.
func tenantLabelValues(t testing.TB, policy string) []string {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() {
		collectors.tenantRequests.Collect(ch)
		close(ch)
	}()
	var out []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, lp := range pb.Label {
			labels[lp.GetName()] = lp.GetValue()
		}
		if labels["policy"] == policy && !slices.Contains(out, labels["tenant"]) {
			out = append(out, labels["tenant"])
		}
	}
	slices.Sort(out)
	return out
}

// heaviest returns the k keys with the largest counts.
func heaviest(counts map[string]int, k int) []string {
	keys := make([]string, 0, len(counts))
	for key := range counts {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	return keys[:min(k, len(keys))]
}

// TestTenantCardinalityBounded: 10 000 tenants with Zipf-skewed traffic
// never produce more than n+1 tenant label values, and the heavy hitters
// have their own series.
func TestTenantCardinalityBounded(t *testing.T) {
	const n, tenants, requests = 10, 10_000, 200_000
	policies := []string{"card_a", "card_b"}
	tr := newTenantTracker(n, policies)
	defer tr.Destruct()

	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, tenants-1)
	// Shuffle ranks to names so heavy tenants are not simply the first
	// ones seen.
	names := make([]string, tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%05d", i)
	}
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })

	counts := map[string]int{}
	for i := range requests {
		tenant := names[zipf.Uint64()]
		counts[tenant]++
		p := i % len(policies)
		tr.counter(p, tenant, decisionLabel(i%int(numDecisions))).Inc()
		if i%20_000 == 0 {
			for _, p := range policies {
				if got := tenantLabelValues(t, p); len(got) > n+1 {
					t.Fatalf("after %d requests, %s has %d tenant values: %v", i, p, len(got), got)
				}
			}
		}
	}
	if len(counts) < 5000 {
		t.Fatalf("only %d distinct tenants; the test needs a long tail", len(counts))
	}
	for _, p := range policies {
		got := tenantLabelValues(t, p)
		if len(got) > n+1 {
			t.Errorf("%s: %d tenant values, want at most %d: %v", p, len(got), n+1, got)
		}
		if !slices.Contains(got, otherTenant) {
			t.Errorf("%s: no %s series", p, otherTenant)
		}
		for _, heavy := range heaviest(counts, 5) {
			if !slices.Contains(got, heavy) {
				t.Errorf("%s: heavy hitter %s (%d requests) has no series; series: %v", p, heavy, counts[heavy], got)
			}
		}
	}

	// Destruct deletes every series of the tracker.
	tr.Destruct()
	for _, p := range policies {
		if got := tenantLabelValues(t, p); got != nil {
			t.Errorf("%s after Destruct: %v", p, got)
		}
	}
}

// TestTenantTrackerConcurrent hammers one tenant tracker from several
// goroutines (run with -race).
func TestTenantTrackerConcurrent(t *testing.T) {
	tr := newTenantTracker(3, []string{"concurrent"})
	defer tr.Destruct()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 5000 {
				tr.counter(0, fmt.Sprintf("t%d", rng.IntN(50)), decisionAllowed).Inc()
			}
		})
	}
	wg.Wait()
	if got := tenantLabelValues(t, "concurrent"); len(got) > 4 {
		t.Errorf("%d tenant values: %v", len(got), got)
	}
}
