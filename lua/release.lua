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
-- With a hold key, each slot is given back once, and only while its
-- bucket counts it: exactly when its lease is listed in the bucket's held
-- index (held.lua). The acquire that charged the slot listed it; the
-- first release takes it out and gives the slot back; an acquire that
-- found its lease ended took it out and gave the slot back already; a
-- reset deleted the index with the counter, and a counter made since
-- does not count the slot. So a release may be retried, and sent for an
-- acquire whose reply was lost, whether or not it ran, and a release
-- after a reset takes nothing off the new counter. The acquire's record
-- under the hold key is for acquires: a sure release (the caller saw its
-- acquire admitted, first attempt) deletes it; an unsure one records
-- "gone" for GONE_TTL_MS (limiter.IdempotencyTTL), so that an acquire
-- still on its way charges nothing when it runs.
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
    give = redis.call('ZREM', held_index(key), held_member(ARGV[i], hold)) == 1
    if sure then
      redis.call('DEL', hold)
    else
      redis.call('SET', hold, 'gone', 'PX', GONE_TTL_MS)
    end
  end
  if give and give_back(key, ARGV[i]) then
    released = released + 1
  end
end
return {released}
