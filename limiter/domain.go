package limiter

import (
	"errors"
	"fmt"
	"time"
)

// The numeric domain. Every number that reaches a store is inside it, so
// that every store (Go int64 nanoseconds, Lua doubles in microseconds)
// computes the same exact answer. Configuration and the admin API refuse
// values outside it; a request whose cost is outside it can never be
// admitted (see Check.Cost).
const (
	// MaxCount bounds limits, bursts, costs and lease sizes: 2^53 - 1,
	// the largest integer n for which n + 1 is still exact in a Lua
	// number (a double). Redis scripts compare a cost with a capacity; a
	// cost of 2^53 + 1 would round to 2^53 there and pass.
	MaxCount int64 = 1<<53 - 1
	// MinWindow is the shortest window: Redis counts time in whole
	// microseconds, and a window of a few nanoseconds would make a policy
	// unlimited in all but name.
	MinWindow = time.Millisecond
	// MaxWindow bounds windows (and min_interval) so that arithmetic in
	// nanoseconds, and in Redis microseconds, cannot overflow and keys never
	// live for years.
	MaxWindow = 366 * 24 * time.Hour
	// MinDelay and MaxDelay bound a Rate's Delay (0 is no delay). Redis
	// counts waits in whole microseconds, and a wait of a few nanoseconds
	// is no wait; a request held for more than an hour has long been given
	// up by its client and every proxy in between, and holds its
	// connection meanwhile.
	MinDelay = time.Millisecond
	MaxDelay = time.Hour
)

// ErrOutOfRange wraps every error of CheckCount and CheckWindow.
var ErrOutOfRange = errors.New("out of range")

// CheckCount reports whether n is a count from least to MaxCount (least is
// 0 or 1); the error names the allowed range.
func CheckCount(n, least int64) error {
	if n < least || n > MaxCount {
		return fmt.Errorf("%d is %w (allowed: %d to %d)", n, ErrOutOfRange, least, MaxCount)
	}
	return nil
}

// CheckWindow reports whether d is a window from MinWindow to MaxWindow;
// the error names the allowed range.
func CheckWindow(d time.Duration) error {
	if d < MinWindow || d > MaxWindow {
		return fmt.Errorf("%s is %w (allowed: %s to %s)", d, ErrOutOfRange, MinWindow, windowLimitText)
	}
	return nil
}

// CheckInterval reports whether d is a min_interval: 0 (none) up to
// MaxWindow.
func CheckInterval(d time.Duration) error {
	if d < 0 || d > MaxWindow {
		return fmt.Errorf("%s is %w (allowed: 0 to %s)", d, ErrOutOfRange, windowLimitText)
	}
	return nil
}

// CheckDelay reports whether d is a delay: 0 (none), or MinDelay to
// MaxDelay.
func CheckDelay(d time.Duration) error {
	if d != 0 && (d < MinDelay || d > MaxDelay) {
		return fmt.Errorf("%s is %w (allowed: %s to %s; 0 never waits)", d, ErrOutOfRange, MinDelay, delayLimitText)
	}
	return nil
}

// windowLimitText and delayLimitText are MaxWindow and MaxDelay as people
// write them.
const (
	windowLimitText = "366d"
	delayLimitText  = "1h"
)
