-- held.lua: the leases of concurrency slots held under an id (limiter
-- hold.go), shared by decide.lua (mode "acquire", through concurrency.lua),
-- keep.lua, release.lua and reset.lua.
--
-- A slot taken under a hold is leased for SLOT_LEASE_MS
-- (limiter.RedisSlotLease): the acquire lists it in its bucket's held
-- index, a sorted set whose members are "<units>|<hold key>" and whose
-- scores are the instants (ms, Redis TIME) their leases end; a request
-- still running renews its lease (keep.lua) and its release takes it out
-- (release.lua). An acquire first gives back the slots of its bucket whose
-- lease ended (concurrency.lua, reclaim): their instance died, or has not
-- been heard from for a whole lease. Without the leases, the counter
-- would keep a dead instance's slots for as long as other acquires kept
-- setting its TTL again.
local SLOT_LEASE_MS = 60000
-- The held index lives as long as its counter (CONCURRENCY_TTL_MS,
-- concurrency.lua): every acquire that charges the counter (hold_slots)
-- and every renewal (keep.lua) set both TTLs at the same instant, so the
-- index never expires first. (An index gone before its counter would take
-- a dead instance's leases with it, and later acquires would keep the
-- counter alive with those slots in it.)
local HELD_INDEX_TTL_MS = 600000

-- held_index returns the held index of a concurrency bucket key,
-- <prefix>:held:{<tenant>}:<policy>[:<key>]: the bucket key with its
-- algorithm segment replaced (limiter's appendHeldKey). It is derived
-- rather than passed, as index_part (common.lua) derives a partition
-- index: the same {<tenant>} tag, so the same cluster slot.
local function held_index(key)
  local a = string.find(key, ':', 1, true)
  local b = string.find(key, ':', a + 1, true)
  return string.sub(key, 1, a) .. 'held' .. string.sub(key, b)
end

-- held_member is a slot's member in its bucket's held index: the units it
-- holds and its hold key (limiter's appendHeldMember).
local function held_member(units, hold)
  return units .. '|' .. hold
end

-- give_back takes units off the concurrency counter bucket, when it
-- exists (one expired or reset is left alone), and deletes it once
-- nothing is left in flight, a fresh bucket. DECRBY keeps its TTL. It
-- reports whether the bucket existed.
local function give_back(bucket, units)
  if redis.call('EXISTS', bucket) == 0 then return false end
  if redis.call('DECRBY', bucket, units) <= 0 then
    redis.call('DEL', bucket)
  end
  return true
end

-- is_concurrency reports whether key is a concurrency bucket key.
local function is_concurrency(key)
  local a = string.find(key, ':', 1, true)
  return a ~= nil and string.sub(key, a + 1, a + 13) == 'concurrency:{'
end
