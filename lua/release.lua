-- release.lua: gives back concurrency slots (limiter.RedisStore Release).
--
-- KEYS[i]  a concurrency bucket key (all in one cluster slot)
-- ARGV[i]  the units to give back to KEYS[i]
-- KEYS[#ARGV + i], when present: the hold key of KEYS[i], recorded by
--          the acquire (decide.lua, mode "acquire"); then ARGV[#ARGV] is
--          not units (a number) but the mode: "sure" (the caller saw its acquire
--          admitted, and this is its first attempt) or "unsure" (a retry,
--          or the release of an acquire whose reply was lost)
--
-- The count never goes below zero: releasing a bucket that expired or was
-- reset (it does not exist) is a no-op, and a bucket back at zero is
-- deleted (a fresh bucket). The key keeps its TTL.
--
-- With a hold key, each slot is given back once: when its acquire's
-- record says "held", the slot is given back and the record deleted (an
-- unsure release records "gone" instead, for a sure one that may still
-- be on its way). A
-- record that says "gone" was released already. No record at all: a sure
-- release gives the slot back (the record expired, or was evicted, while
-- the request held its slot); an unsure one cannot tell an acquire that
-- has not run (or was denied) from a release that ran already, so it
-- gives nothing back and records "gone" for GONE_TTL_MS
-- (limiter.IdempotencyTTL): an acquire still on its way then charges
-- nothing when it runs. A release may therefore be retried, and sent for
-- an acquire whose reply was lost, whether or not it ran.
--
-- Returns {the number of keys released} (a list, as every script this
-- store calls answers).
local GONE_TTL_MS = 600000 -- limiter.IdempotencyTTL, as ONCE_TTL_MS (common.lua)
local n = #ARGV
local sure
local mode = ARGV[n]
if mode == 'sure' or mode == 'unsure' then
  n = n - 1
  sure = mode == 'sure'
end
local released = 0
for i = 1, n do
  local key, hold = KEYS[i], KEYS[n + i]
  local give = true
  if hold then
    local v = redis.call('GET', hold)
    if v == 'held' then
      if sure then
        redis.call('DEL', hold)
      else
        -- The request's own release may still arrive (sent before this
        -- retry, late): it must find the slot released.
        redis.call('SET', hold, 'gone', 'PX', GONE_TTL_MS)
      end
    elseif v or not sure then
      give = false
      if not v then redis.call('SET', hold, 'gone', 'PX', GONE_TTL_MS) end
    end
    -- Its lease ends with it (held.lua); a slot already given back by an
    -- acquire that found its lease ended is no longer listed.
    redis.call('ZREM', held_index(key), held_member(ARGV[i], hold))
  end
  if give and give_back(key, ARGV[i]) then
    released = released + 1
  end
end
return {released}
