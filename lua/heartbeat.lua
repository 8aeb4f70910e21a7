-- heartbeat.lua: one heartbeat of a live instance (limiter.Registry).
--
-- KEYS[1]  the sorted set <prefix>:instances
-- ARGV[1]  the instance id
-- ARGV[2]  staleness in ms: members whose last heartbeat is older are
--          removed (3 heartbeat intervals)
-- ARGV[3]  "1": remove ARGV[1] instead of heartbeating (shutdown)
--
-- Scores are Redis TIME in ms, so instances with skewed clocks agree. The
-- key gets a TTL of twice the staleness, refreshed by every heartbeat, so
-- it disappears with the last instance.
--
-- Returns the number of live instances (members) after the update.
local key, id = KEYS[1], ARGV[1]
local stale = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', key, id)
  return redis.call('ZCARD', key)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', key, now, id)
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%.0f', now - stale))
redis.call('PEXPIRE', key, 2 * stale)
return redis.call('ZCARD', key)
