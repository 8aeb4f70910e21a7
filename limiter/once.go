package limiter

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strconv"
	"sync/atomic"
	"time"
)

// Charges applied once. A Redis call whose reply is lost (a timeout, a
// connection that broke after the write, a paused server that runs it
// when it resumes) may or may not have run. A call that only decides a
// request is never retried: a lost admission is decided again by the
// fail mode. A call that moves units the tenant already used or that the
// store already granted (a settlement, a recovery charge, the refund of a
// turn given back, a lease give-back) must land exactly once, so it
// carries an id: the script records its reply under
//
//	<prefix>:once:{<tenant>}:<id>
//
// in the slot of the buckets it changes, for IdempotencyTTL, and a call
// that finds the id recorded changes nothing and answers the same. A call
// that fails is kept by the Recorder and retried with the same id until
// Redis answers it.
//
// What it costs: one GET and one SET of that key per id'd call, and the
// key's memory for IdempotencyTTL (docs/fleet.md gives the measured
// figures). Decisions carry no id and pay nothing, but for the slots of
// concurrency checks, which are held under ids of their own (hold.go).

// IdempotencyTTL is how long Redis remembers the id of a call it ran: a
// retry within it is answered from the record, never applied twice. It is
// the value of ONCE_TTL_MS in lua/common.lua. Retries come within a
// breaker cooldown of Redis answering again, so only a call that ran just
// before Redis became unreachable for longer than this (killed and
// restarted from its append-only file, say) could be applied twice.
const IdempotencyTTL = 10 * time.Minute

// onceSegment is the key segment of ids, in place of an algorithm name
// (no algorithm is called "once", so Reset never deletes an id).
const onceSegment = "once"

// chargeIDs makes the ids of this process: a random prefix, then a
// counter.
var chargeIDs struct {
	prefix string
	n      atomic.Uint64
}

func init() {
	var b [9]byte
	_, _ = rand.Read(b[:])
	chargeIDs.prefix = base64.RawURLEncoding.EncodeToString(b[:]) + "."
}

// NewChargeID returns an id no other call of any process will carry (a
// random 72-bit process prefix and a counter), for a call that must be
// applied once: pass it again with every retry of the same call.
func NewChargeID() string {
	return chargeIDs.prefix + strconv.FormatUint(chargeIDs.n.Add(1), 36)
}

// appendOnceKey appends the id key of a call to the buckets of tenant:
// <prefix>:once:{<tenant>}:<id>.
func appendOnceKey(dst []byte, prefix, tenant, id string) []byte {
	return appendTenantKey(dst, prefix, onceSegment, tenant, id, "")
}

// NotSent reports whether err is a failure of a call that never reached
// the store (a breaker that refused it, a call shed from this instance's
// queue, or failed there behind a batch Redis left unanswered), which
// therefore did not run.
func NotSent(err error) bool {
	return errors.Is(err, ErrBreakerOpen) || errors.Is(err, ErrQueueTimeout) || errors.Is(err, errBehindStalled)
}

// mayHaveRun reports whether a call that failed with err may still have
// run in the store: it was sent, or may have been, and its reply lost.
func mayHaveRun(err error) bool {
	return err != nil && !NotSent(err) && !errors.Is(err, ErrInvalidCheck) && !errors.Is(err, ErrLeaseUnsupported)
}
