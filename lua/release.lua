-- release.lua: gives back concurrency slots (limiter.RedisStore Release).
--
-- KEYS[i]  a concurrency bucket key (all in one cluster slot)
-- ARGV[i]  the units to give back to KEYS[i]
--
-- The count never goes below zero: releasing a bucket that expired or was
-- reset (it does not exist) is a no-op, and a bucket back at zero is
-- deleted (a fresh bucket). The key keeps its TTL. Returns {the number of
-- keys released} (a list, as every script this store calls answers).
local released = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    -- DECRBY keeps the key's TTL.
    if redis.call('DECRBY', key, ARGV[i]) <= 0 then
      redis.call('DEL', key)
    end
    released = released + 1
  end
end
return {released}
