-- reset.lua: clears a tenant's buckets (limiter.RedisStore Reset).
--
-- KEYS[i]  a bucket key, or a partition index (common.lua, index_part);
--          all in one cluster slot (one tenant)
-- ARGV[i]  "1" when KEYS[i] is a partition index: the bucket keys it lists
--          are deleted with it; "0" for a bucket key
--
-- Deleting a key that does not exist is a no-op, so the caller names every
-- key a policy's buckets may have (one per algorithm) without knowing
-- which exist. Returns {the number of keys deleted}.
local deleted = 0
for i, key in ipairs(KEYS) do
  if ARGV[i] == '1' then
    local members = redis.call('SMEMBERS', key)
    for j = 1, #members, 1000 do
      deleted = deleted + redis.call('DEL', unpack(members, j, math.min(j + 999, #members)))
    end
  end
  deleted = deleted + redis.call('DEL', key)
end
return {deleted}
