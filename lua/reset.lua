-- reset.lua: clears a tenant's buckets (limiter.RedisStore Reset).
--
-- KEYS[i]  a bucket key, or a partition index (common.lua, index_part);
--          all in one cluster slot (one tenant)
-- ARGV[1]  the most members taken from the partition indexes in this
--          call: a call blocks Redis for every other client, so a tenant
--          with many parts is reset over several calls
-- ARGV[1 + i]  "1" when KEYS[i] is a partition index: members it lists
--          (bucket keys) are taken from it and deleted; "0" for a bucket
--          key, deleted
--
-- A concurrency bucket's held index (held.lua) goes with it: a lease
-- left behind would give back, when it ended, slots of a counter made
-- since.
--
-- Deleting a key that does not exist is a no-op, so the caller names every
-- key a policy's buckets may have (one per algorithm) without knowing
-- which exist, and may send the same call again. Returns {the number of
-- keys deleted, the number of members left in the indexes}: the caller
-- calls again until none is left.
local budget = tonumber(ARGV[1])
local deleted, left = 0, 0
for i, key in ipairs(KEYS) do
  if ARGV[1 + i] == '1' then
    if budget > 0 then
      local members = redis.call('SPOP', key, budget)
      budget = budget - #members
      for j = 1, #members, 1000 do
        deleted = deleted + redis.call('UNLINK', unpack(members, j, math.min(j + 999, #members)))
      end
      for _, member in ipairs(members) do
        if is_concurrency(member) then redis.call('UNLINK', held_index(member)) end
      end
    end
    left = left + redis.call('SCARD', key)
  else
    deleted = deleted + redis.call('UNLINK', key)
    if is_concurrency(key) then redis.call('UNLINK', held_index(key)) end
  end
end
return {deleted, left}
