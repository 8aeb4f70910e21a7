-- keep.lua: renews the leases of a running request's concurrency slots
-- (limiter.RedisStore keepSlots, every limiter.KeepSlotsEvery; held.lua;
-- the time from common.lua's now_us).
--
-- KEYS[i]  a concurrency bucket key (all in one cluster slot)
-- ARGV[1]  "0", or an instant in µs that replaces Redis TIME (tests only)
-- ARGV[1 + i]  the hold of the request's slot in KEYS[i], as the bucket's
--          held index lists it ("<units>|<hold key>"), or "" (a slot
--          taken without a hold: nothing to renew)
--
-- A slot still leased is leased for SLOT_LEASE_MS from now. One whose
-- lease ended and was given back by an acquire (the instance was cut off
-- from Redis, or paused, for a whole lease) stays given back: ZADD XX
-- adds nothing. The bucket and its index get their TTL again.
--
-- Returns {the number of leases renewed}.
local now_ms = math.floor(now_us(ARGV[1]) / 1000)
local kept = 0
for i, key in ipairs(KEYS) do
  local idx = held_index(key)
  if ARGV[1 + i] ~= '' then
    kept = kept + redis.call('ZADD', idx, 'XX', 'CH', now_ms + SLOT_LEASE_MS, ARGV[1 + i])
  end
  redis.call('PEXPIRE', key, HELD_INDEX_TTL_MS)
  redis.call('PEXPIRE', idx, HELD_INDEX_TTL_MS)
end
return {kept}
