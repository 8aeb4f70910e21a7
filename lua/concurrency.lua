-- concurrency.lua: mirrors limiter/concurrency.go.
--
-- The bucket counts units in flight. A request of cost c is admitted when
-- inflight + c <= limit and holds c units until release.lua gives them back.
-- RetryAfter of a denial (and Reset while anything is in flight) is 1s, a
-- guess: nothing tells when a request in flight will finish.
--
-- State {n}: stored as a decimal integer string (Redis keeps it as an int).
--
-- TTL: a counter has no window, so it gets a safety TTL of CONCURRENCY_TTL_MS
-- (10 minutes, limiter.RedisConcurrencyTTL), set again on every acquire
-- and by each renewal of a running request's lease (keep.lua, every 20 s),
-- so an idle bucket goes. The slots of an instance that died without
-- releasing them are given back by their leases (held.lua, reclaim below),
-- a minute after their last renewal, even while other acquires keep the
-- counter alive.
ALGORITHMS.concurrency = function()
  local CONCURRENCY_TTL_MS = 600000
  local RETRY_US = 1000000

  local function result(n, r)
    local reset = 0
    if n > 0 then reset = RETRY_US end
    return math.max(r.limit - n, 0), reset
  end

  return {
    decode = function(raw)
      return {n = tonumber(raw) or 0}
    end,

    encode = function(s)
      return int(s.n)
    end,

    eval = function(s, now, r, cost)
      local rem, reset = result(s.n, r)
      if cost == 0 then
        return true, rem, 0, reset, s
      elseif cost > r.limit or s.n > r.limit - cost then
        return false, rem, RETRY_US, reset, s
      end
      local nxt = {n = s.n + cost}
      rem, reset = result(nxt.n, r)
      return true, rem, 0, reset, nxt
    end,

    ttl = function(s, now, r)
      if s.n > 0 then return CONCURRENCY_TTL_MS * 1000 end
      return 0
    end,

    refund = function(s, r, cost, at)
      return {n = math.max(s.n - cost, 0)}
    end,
  }
end

-- Holds: the record of each acquire that carries an id (decide.lua, mode
-- "acquire"; release.lua), so that an acquire runs once, and not after a
-- release that came first (its reply was lost, and the release was sent
-- blindly). Whether a release gives a slot back is the slot's lease's
-- to say, listed in the held index (held.lua), not the record's. A
-- record is deleted by its release; HOLD_TTL_MS (24 hours) bounds how
-- long the records of requests an instance never released (it died)
-- stay. A request that holds its slot longer still gives it back: its
-- lease is still listed.
local HOLD_TTL_MS = 86400000

-- acquire_holds reads the hold keys at the end of KEYS (n keys in all):
-- one per concurrency check of positive cost, in order. It returns the
-- holds ({[check] = hold key}, with released = true when a release came
-- first and recorded "gone", ran = true when this very call ran already
-- and recorded "held": a client library that sent it again after its
-- connection broke), and the number of checks.
local function acquire_holds(n)
  local m, h = 0, 0
  local of, units, index = {}, {}, {}
  while m + h < n do
    m = m + 1
    local b = 2 + CHECK_ARGS * (m - 1)
    if ARGV[b + 1] == 'concurrency' and tonumber(ARGV[b + 6]) > 0 then
      h = h + 1
      of[m] = h
      units[m] = ARGV[b + 6]
      index[m] = held_index(KEYS[m])
    end
  end
  local holds = {state = {}, units = units, index = index}
  for i, j in pairs(of) do
    holds[i] = KEYS[m + j]
    local v = redis.call('GET', holds[i])
    holds.state[i] = v
    if v == 'gone' then
      holds.released = true
    elseif v then
      holds.ran = true
    end
  end
  return holds, m, 'decide'
end

-- hold_slots records the hold of each of the n checks that was charged,
-- and leases its slot from now (µs) in its bucket's held index (held.lua).
local function hold_slots(holds, n, charged, now)
  for i = 1, n do
    if charged[i] and holds[i] then
      redis.call('SET', holds[i], 'held', 'PX', HOLD_TTL_MS)
      local idx = holds.index[i]
      redis.call('ZADD', idx, math.floor(now / 1000) + SLOT_LEASE_MS, held_member(holds.units[i], holds[i]))
      redis.call('PEXPIRE', idx, HELD_INDEX_TTL_MS)
    end
  end
end

-- RECLAIM_MAX bounds the slots one acquire gives back per bucket (the rest
-- wait for the next acquire), so a call stays short whatever died.
local RECLAIM_MAX = 16

-- reclaim gives back, before an acquire decides, the slots of the buckets
-- of its holds whose lease ended at now (µs) or before (held.lua), and
-- takes their leases out of the index: a release that comes after all
-- (the instance was only paused) finds none and gives nothing back a
-- second time (release.lua). Each one's hold is recorded "gone" for
-- HOLD_TTL_MS, as long as a "held" record would have lived.
local function reclaim(holds, now)
  local now_ms = math.floor(now / 1000)
  for i, idx in pairs(holds.index) do
    local ended = redis.call('ZRANGEBYSCORE', idx, '-inf', now_ms, 'LIMIT', 0, RECLAIM_MAX)
    for _, member in ipairs(ended) do
      -- A member not made by held_member (none is) is dropped, rather
      -- than failing every acquire of the bucket.
      local bar = string.find(member, '|', 1, true)
      if bar then
        local hold = string.sub(member, bar + 1)
        redis.call('SET', hold, 'gone', 'PX', HOLD_TTL_MS)
        give_back(KEYS[i], string.sub(member, 1, bar - 1))
      end
      redis.call('ZREM', idx, member)
    end
  end
end

