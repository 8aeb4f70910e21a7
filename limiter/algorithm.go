package limiter

import (
	"fmt"
	"time"
)

// Algorithm names how a bucket counts requests.
type Algorithm uint8

// The algorithms. SlidingWindow is the zero value because it is the default.
const (
	// SlidingWindow weighs the previous fixed window by how much of it still
	// overlaps the trailing window: O(1) memory, no boundary burst.
	SlidingWindow Algorithm = iota
	// TokenBucket refills Limit tokens per Window continuously up to Burst.
	TokenBucket
	// GCRA is the generic cell rate algorithm: a token bucket stored as one
	// timestamp (the theoretical arrival time).
	GCRA
	// FixedWindow counts per window aligned to the Unix epoch; it admits up
	// to 2 x Limit around a window boundary.
	FixedWindow
	// SlidingLog logs every admission in the window: exact, memory per
	// admission (not per unit) in the window.
	SlidingLog
	// Concurrency limits requests in flight; a slot is held until Release.
	Concurrency

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	SlidingWindow: "sliding_window",
	TokenBucket:   "token_bucket",
	GCRA:          "gcra",
	FixedWindow:   "fixed_window",
	SlidingLog:    "sliding_log",
	Concurrency:   "concurrency",
}

// AlgorithmNames lists every valid algorithm name, for error messages.
const AlgorithmNames = "token_bucket, gcra, sliding_window, fixed_window, sliding_log, concurrency"

// String returns the configuration name of a.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm turns a configuration name into an Algorithm. The empty
// string means the default, SlidingWindow.
func ParseAlgorithm(name string) (Algorithm, error) {
	if name == "" {
		return SlidingWindow, nil
	}
	for i, n := range algorithmNames {
		if n == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (allowed: %s)", name, AlgorithmNames)
}

// SupportsLease reports whether units of a can be prefetched and served from
// a local lease. A sliding log must record each request's own timestamp and a
// concurrency slot must be released by the request that took it, so neither
// can be leased.
func (a Algorithm) SupportsLease() bool {
	return a != SlidingLog && a != Concurrency
}

// Refills reports whether a's buckets refill continuously (token bucket,
// GCRA): a unit means the same whenever it was charged, so a settlement
// may give units back at any time, and what recovery owes decays as the
// bucket refills. A window's or log's units belong to the instant they
// were charged at: a lower real cost leaves them charged.
func (a Algorithm) Refills() bool { return a == TokenBucket || a == GCRA }

// UsesBurst reports whether a has a capacity separate from its rate.
func (a Algorithm) UsesBurst() bool { return a == TokenBucket || a == GCRA }

// CheckBurst reports why a may not have a separate burst (capacity), nil
// when it may or burst is 0 (the limit).
func (a Algorithm) CheckBurst(burst int64) error {
	if burst > 0 && !a.UsesBurst() {
		return fmt.Errorf("applies only to token_bucket and gcra, not %s", a)
	}
	return nil
}

// SupportsDelay reports whether a request of a may wait for its turn
// (Rate.Delay): only a bucket that refills continuously knows when a unit
// comes back, and can hand out turns ahead of it.
func (a Algorithm) SupportsDelay() bool { return a == TokenBucket || a == GCRA }

// DelayAlgorithms names the algorithms that SupportsDelay, for error
// messages.
const DelayAlgorithms = "token_bucket, gcra"

// CheckDelay reports why a request of a may not wait for its turn, nil
// when it may or d is 0.
func (a Algorithm) CheckDelay(d time.Duration) error {
	if d > 0 && !a.SupportsDelay() {
		return fmt.Errorf("applies only to %s, not %s (a request can wait for a turn only in a bucket that refills continuously)", DelayAlgorithms, a)
	}
	return nil
}

// CheckMinInterval reports why a may not have a min_interval, nil when it
// may or d is 0.
func (a Algorithm) CheckMinInterval(d time.Duration) error {
	if d > 0 && a != SlidingLog {
		return fmt.Errorf("applies only to sliding_log, not %s", a)
	}
	return nil
}

// CheckLease reports why a may not lease, nil when it may or max is 0
// (leasing off).
func (a Algorithm) CheckLease(max int64) error {
	if max > 0 && !a.SupportsLease() {
		return fmt.Errorf("%s cannot lease units (every request must reach the store); remove lease or use lease 0", a)
	}
	return nil
}
