-- refund.lua: the entry point of the refund script. RedisStore uses it only
-- in Redis Cluster, when the checks of one request span several slots and
-- a later slot denied the request after an earlier one was charged: it
-- gives the earlier charges back (see limiter.RedisStore).
--
-- KEYS[i]  the bucket key of check i (all in one cluster slot)
-- ARGV[1]  "0", or an instant in µs that replaces Redis TIME (tests only)
-- ARGV[2]  the instant (µs) the decide script charged at
-- ARGV[3 + 7(i-1) ...] check i, laid out as for decide.lua: each one was
--          charged cost units at ARGV[2]
--
-- Returns {0, now_us, then per check: 1, remaining, 0, reset_us}, the
-- bucket after the refund as a cost-0 check sees it.
local now = now_us(ARGV[1])
local at = tonumber(ARGV[2])
local n = #KEYS

local buckets, algs, rates = {}, {}, {}
for i = 1, n do
  local alg, r, cost = parse_check(i, 2)
  local key = KEYS[i]
  local b = buckets[key]
  if not b then
    local s, exists = load(alg, key)
    b = {exists = exists, s = s}
    buckets[key] = b
  end
  algs[i], rates[i] = alg, r
  -- A bucket that expired or was reset meanwhile has nothing to give back.
  if b.exists then
    b.s = alg.refund(b.s, r, cost, at)
    b.last = i
  end
end

for key, b in pairs(buckets) do
  if b.last then save(key, algs[b.last], b.s, rates[b.last], now) end
end

local out = {0, now}
for i = 1, n do
  local _, rem, _, reset = algs[i].eval(buckets[KEYS[i]].s, now, rates[i], 0)
  local j = 3 + 4 * (i - 1)
  out[j], out[j + 1], out[j + 2], out[j + 3] = 1, rem, 0, math.max(reset, 0)
end
return out
