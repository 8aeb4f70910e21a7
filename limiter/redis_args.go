package limiter

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/caddy-tollgate/lua"
)

// redisScript is one way of calling one of the store's scripts: its name
// for Observe, and the mode argument of the decide script (nil for the
// others).
type redisScript struct {
	name   string
	script *luaScript
	mode   any
}

// luaScript is one entry point of package lua, both as a script (EVALSHA,
// EVAL) and as the function of lua.Library that runs the same code
// (FCALL). The batcher calls the function where the server has function
// libraries, else the script; a call that bypasses the batchers (noBatch,
// or a cluster slot map that could not be read) uses the script.
type luaScript struct {
	*redis.Script
	// src is the script's source, for SCRIPT LOAD in a pipeline.
	src string
	// fnArg, shaArg and srcArg are the library function's name, the
	// script's digest and its source, boxed once for the commands.
	fnArg, shaArg, srcArg any
}

func newLuaScript(src, entry string) *luaScript {
	s := &luaScript{Script: redis.NewScript(src), src: src, fnArg: lua.Function(entry)}
	s.shaArg, s.srcArg = s.Hash(), src
	return s
}

var (
	decideScript  = newLuaScript(lua.Decide, "decide")
	releaseScript = newLuaScript(lua.Release, "release")
	keepScript    = newLuaScript(lua.Keep, "keep")
	resetScript   = newLuaScript(lua.Reset, "reset")

	// The mode strings are boxed once: converting them to any on every
	// call would allocate.
	scriptDecide = &redisScript{"decide", decideScript, "decide"}
	scriptPeek   = &redisScript{"peek", decideScript, "peek"}
	scriptDry    = &redisScript{"dry", decideScript, "dry"}
	scriptForce  = &redisScript{"force", decideScript, "force"}
	// argForceOnce is the mode of a force call with an id (sc.once).
	argForceOnce any = "force_once"
	// argAcquire is the mode of a decision whose slots are held (hold.go);
	// the release modes of held slots say what a missing record means.
	argAcquire       any = "acquire"
	argReleaseSure   any = "sure"
	argReleaseUnsure any = "unsure"
	scriptRelease        = &redisScript{"release", releaseScript, nil}
	scriptReset          = &redisScript{"reset", resetScript, nil}
	scriptKeep           = &redisScript{"keep", keepScript, nil}
)

// Arguments boxed once: converting them to any on every call would
// allocate.
var (
	argZero   any = "0"
	argShadow     = [2]any{"0", "1"}
	argAlgo   [numAlgorithms]any
)

func init() {
	for i, n := range algorithmNames {
		argAlgo[i] = n
	}
}

// checkArgs is the number of script arguments of one check (CHECK_ARGS in
// lua/common.lua) and checkNums how many of them are numbers.
const (
	checkArgs = 7
	checkNums = 6
)

// appendCheckArgs appends the arguments of the checks idx to sc.args and
// returns their keys.
func (sc *redisScratch) appendCheckArgs(checks []Check, idx []int) []string {
	// nums must not move once pointers into it are taken.
	n := checkNums * len(idx)
	if cap(sc.nums) < n {
		sc.nums = make([]int64, n)
	}
	sc.nums = sc.nums[:n]
	keys := sc.keys
	if len(idx) != len(checks) {
		// A subset (one cluster slot): its own key list. (Never an alias
		// of sc.keys, which it would overwrite.)
		sc.ckeys = sc.ckeys[:0]
		for _, i := range idx {
			sc.ckeys = append(sc.ckeys, sc.keys[i])
		}
		keys = sc.ckeys
	}
	for j, i := range idx {
		c := &checks[i]
		v := sc.nums[checkNums*j : checkNums*j+checkNums]
		v[0] = c.Rate.Limit
		v[1] = micros(c.Rate.Window)
		v[2] = c.Rate.Burst
		v[3] = micros(c.Rate.MinInterval)
		v[4] = min(c.Cost, neverFitsCost)
		shadow := 0
		if c.Shadow {
			shadow = 1
		}
		// *int64 arguments are written by go-redis without boxing the
		// numbers.
		sc.args = append(sc.args, argAlgo[c.Algorithm], &v[0], &v[1], &v[2], &v[3], &v[4])
		if c.Cost < 0 && c.ChargedAt > 0 {
			// A give-back (force mode) carries the instant its units were
			// charged at where the shadow flag would be (decide.lua).
			v[5] = max(c.ChargedAt/int64(time.Microsecond), 2)
			sc.args = append(sc.args, &v[5])
		} else {
			sc.args = append(sc.args, argShadow[shadow])
		}
	}
	return keys
}

// withOnceKey returns keys with the id key of the current call appended,
// as a list of its own (keys is sc.keys or sc.ckeys, which must not grow).
func (sc *redisScratch) withOnceKey(keys []string) []string {
	sc.okeys = append(append(sc.okeys[:0], keys...), sc.once)
	return sc.okeys
}

// parseReply reads {admitted, now, (allowed, remaining, retry_us, reset_us)...}.
// units, when not nil, receives each check's third field as it is (the
// units a force call moved).
func parseReply(reply []int64, idx []int, results []Result, units []int64) (bool, int64, error) {
	var head [2]int64
	if err := parseResults(reply, head[:], idx, results, units); err != nil {
		return false, 0, err
	}
	return head[0] == 1, head[1], nil
}

// parseResults reads a script reply made of len(head) integers, stored in
// head, then (allowed, remaining, retry_us, reset_us) for each check of idx;
// units, when not nil, receives each check's retry_us field unconverted.
func parseResults(reply []int64, head []int64, idx []int, results []Result, units []int64) error {
	h := len(head)
	if len(reply) != h+4*len(idx) {
		return fmt.Errorf("limiter: unexpected reply from the Redis script: %d integers for %d checks", len(reply), len(idx))
	}
	copy(head, reply)
	for j, i := range idx {
		r := reply[h+4*j : h+4+4*j]
		if units != nil {
			units[i] = r[2]
		}
		results[i] = Result{
			Allowed:    r[0] == 1,
			Remaining:  r[1],
			RetryAfter: fromMicros(r[2]),
			Reset:      fromMicros(r[3]),
		}
	}
	return nil
}

// micros converts d to whole microseconds, rounded up.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// fromMicros converts µs to a Duration, clamping negatives to 0.
func fromMicros(us int64) time.Duration {
	if us <= 0 {
		return 0
	}
	if us > int64(1<<63-1)/1000 {
		return 1<<63 - 1
	}
	return time.Duration(us) * time.Microsecond
}
