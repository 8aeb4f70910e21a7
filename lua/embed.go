// Package lua holds Tollgate's Redis scripts.
//
// Each algorithm lives in its own file (token_bucket.lua, gcra.lua,
// sliding_window.lua, fixed_window.lua, sliding_log.lua, concurrency.lua,
// calendar.lua: fixed_window over calendar periods, and delay.lua:
// token_bucket and gcra with requests that wait for their turn)
// as a table of pure functions that mirror the Go functions of package
// limiter, in microseconds. The scripts that Redis runs are assembled from
// them: common.lua (shared helpers), every algorithm file, then an entry
// point. So a request whose policies use different algorithms is still one
// EVALSHA.
//
// The same code is also assembled as one Redis 7 function library
// (library.go), which the store prefers where Redis has functions: it is
// loaded once, so its definitions are not rebuilt on every call.
//
// The argument and reply layouts are documented at the top of decide.lua,
// lease.lua, release.lua, keep.lua, reset.lua and heartbeat.lua; held.lua
// holds what the scripts that touch concurrency slots share.
package lua

import _ "embed"

var (
	//go:embed common.lua
	common string
	//go:embed token_bucket.lua
	tokenBucket string
	//go:embed gcra.lua
	gcra string
	//go:embed sliding_window.lua
	slidingWindow string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed sliding_log.lua
	slidingLog string
	//go:embed concurrency.lua
	concurrency string
	//go:embed calendar.lua
	calendar string
	//go:embed delay.lua
	delay string
	//go:embed decide.lua
	decide string
	//go:embed lease.lua
	lease string
	//go:embed release.lua
	release string
	//go:embed heartbeat.lua
	heartbeat string
	//go:embed reset.lua
	reset string
	//go:embed held.lua
	held string
	//go:embed keep.lua
	keep string
)

// algorithms is common.lua and held.lua followed by every algorithm file
// (delay.lua: token_bucket and gcra requests that may wait for their
// turn).
var algorithms = common + held + tokenBucket + gcra + slidingWindow + fixedWindow + slidingLog + concurrency + calendar + delay

// The assembled scripts.
var (
	// Decide decides (or peeks at, or dry-runs) the checks of one request
	// atomically: common.lua, the algorithms and decide.lua.
	Decide = algorithms + decide
	// Lease gives back what is left of a lease and takes a new one:
	// common.lua, the algorithms and lease.lua.
	Lease = algorithms + lease
	// Release gives back concurrency slots: held.lua and release.lua.
	Release = held + release
	// Keep renews the leases of a running request's concurrency slots:
	// common.lua (its clock), held.lua and keep.lua.
	Keep = common + held + keep
	// Reset deletes a tenant's buckets, those listed in its partition
	// indexes too: held.lua and reset.lua.
	Reset = held + reset
	// Heartbeat registers a live instance in the <prefix>:instances sorted
	// set and counts the live ones: heartbeat.lua.
	Heartbeat = heartbeat
)
