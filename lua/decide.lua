-- decide.lua: the entry point of the decide script (limiter.RedisStore
-- Decide, Peek and Charge). One call decides one request, all or nothing.
--
-- KEYS[i]  the bucket key of check i (all in one cluster slot); in mode
--          "force_once", one more key last: the call's id (common.lua)
-- ARGV[1]  mode: "decide" (charge if admitted), "peek" (never charge; each
--          check alone against the stored state), "dry" (evaluate as
--          decide, then answer as for a request that was not admitted),
--          "force" (move units without deciding: see below) or
--          "force_once" (force, applied once per id) or "acquire"
--          (decide, for a request that holds concurrency slots: see below)
-- ARGV[2]  "0", or an instant in µs that replaces Redis TIME (tests only)
-- ARGV[3 + 7(i-1) ...] check i: algorithm, limit, window_us, burst,
--          min_interval_us, cost, shadow ("1"/"0")
--
-- Returns {admitted (1/0), now_us, then per check: allowed (1/0),
-- remaining, retry_after_us, reset_us}. An allowed check with
-- retry_after_us > 0 waits that long for its turn (delay.lua).
--
-- Semantics (limiter.Store): every check is evaluated at the same instant,
-- in order; two checks of one key are chained, the second seeing the first
-- as charged when that one allows. The request is admitted when every
-- non-shadow check allows; then every check that allows (shadow ones too)
-- is charged and each written key gets a TTL. Otherwise nothing is written,
-- and the checks that allowed report their bucket as it is.
--
-- Acquire (limiter.RedisStore.Decide of a request with concurrency
-- checks that carry an id, limiter.Check.Hold): KEYS holds, after the
-- checks' keys, one hold key per concurrency check of positive cost, in
-- order (<prefix>:once:{<tenant>}:<hold id>). The call decides as
-- "decide", and each such check it charges records its hold key as
-- "held" for HOLD_TTL_MS and lists the slot's lease in its bucket's held
-- index (held.lua), which release.lua takes it out of to give the slot
-- back once. A hold recorded "gone" is release.lua's record of a
-- release that came first (the caller gave up on this call's reply and
-- released it before the call ran): then nothing is charged and the call
-- answers as for a request that was not admitted. A hold recorded "held"
-- means this very call ran already (sent again by the client library
-- after a broken connection): nothing is charged again, and the call
-- answers admitted, each check as a cost-0 check sees its bucket.
--
-- Force (limiter.RedisStore.Charge: settlements, recovery charges,
-- give-backs of turns, of cancelled requests and, on a Cluster, of what a
-- request charged in one slot before another denied it): every check
-- moves units in order, whatever the others do. A
-- positive cost charges min(cost, remaining) units: the bucket is driven
-- at most down to its empty under the check's rate, never further (token
-- bucket: deficit at most the capacity; GCRA: TAT at most now + tolerance;
-- sliding and fixed windows and sliding log: at most limit units counted),
-- so a caller that wants debt sends a rate with room for it;
-- min_interval is ignored and concurrency buckets are never charged. A
-- negative cost gives -cost units back to a token bucket or GCRA bucket
-- that exists (never beyond full). For a negative cost the shadow argument
-- may instead hold the instant (µs, > 1) the units were charged at: a
-- window or log bucket that exists then gives them back to the window or
-- log entry that holds them (alg.refund; nothing when that window is
-- gone). Other give-backs leave the bucket alone (concurrency ones
-- always). The
-- reply's admitted is 1, and each check's retry_after_us field holds the
-- units moved (negative for a give-back; allowed is 1 when any moved);
-- remaining and reset describe the bucket afterwards.
local mode = ARGV[1]
local n = #KEYS
local once, holds
if mode == 'force_once' then
  once, n, mode = KEYS[n], n - 1, 'force'
  local prev = once_get(once)
  if prev then return prev end
elseif mode == 'acquire' then
  holds, n, mode = acquire_holds(n)
end
local now = now_us(ARGV[2])
if holds and (holds.released or holds.ran) then
  local out = {holds.ran and 1 or 0, now}
  for i = 1, n do
    local j = 3 + 4 * (i - 1)
    out[j], out[j + 1], out[j + 2], out[j + 3] = 0, 0, 0, 0
    if holds.ran then
      -- Allowed as the first run allowed: a check with a hold only when
      -- its slot was taken (a shadow one may have been refused).
      local alg, r = parse_check(i, 2)
      local _, rem, _, reset = alg.eval((load(alg, KEYS[i])), now, r, 0)
      local took = not holds[i] or holds.state[i] == 'held'
      out[j], out[j + 1], out[j + 3] = took and 1 or 0, rem, math.max(reset, 0)
    end
  end
  return out
end
if holds then reclaim(holds, now) end

-- One check in decide mode, the common request: the same semantics as the
-- loop below without its per-check tables (each table costs Redis about
-- 0.1 µs, a tenth of a GET).
if n == 1 and mode == 'decide' then
  local alg, r, cost, shadow = parse_check(1, 2)
  local key = KEYS[1]
  local ok, rem, retry, reset, nxt = alg.eval((load(alg, key)), now, r, cost)
  if ok and cost > 0 then
    save(key, alg, nxt, r, now)
    if holds then hold_slots(holds, 1, {true}, now) end
  end
  return {(ok or shadow) and 1 or 0, now, ok and 1 or 0, rem, math.max(retry, 0), math.max(reset, 0)}
end

local buckets = {} -- key -> {orig = stored state, cur = tentative state}
local algs, rates, costs, charged = {}, {}, {}, {}
local allowed, rem, retry, reset = {}, {}, {}, {}
local forced = {} -- force: units charged per check
local admitted = true

for i = 1, n do
  local alg, r, cost, shadow = parse_check(i, 2)
  local key = KEYS[i]
  local b = buckets[key]
  if not b then
    local s, exists = load(alg, key)
    b = {orig = s, cur = s, exists = exists}
    buckets[key] = b
  end
  algs[i], rates[i], costs[i] = alg, r, cost
  local ok, nxt
  if mode == 'peek' then
    ok, rem[i], retry[i], reset[i] = alg.eval(b.orig, now, r, cost)
    if ok and cost > 0 then
      ok, rem[i], retry[i], reset[i] = alg.eval(b.orig, now, r, 0)
    end
  elseif mode == 'force' then
    -- Charge what fits, without min_interval; never a concurrency slot.
    -- Give back to a token bucket or GCRA bucket that still exists.
    local fr = {limit = r.limit, window = r.window, burst = r.burst, minint = 0, cap = r.cap}
    local name = ARGV[3 + CHECK_ARGS * (i - 1)]
    local units = 0
    if cost < 0 then
      local at = tonumber(ARGV[3 + CHECK_ARGS * (i - 1) + 6]) or 0
      if b.exists and (name == 'token_bucket' or name == 'gcra') then
        units = cost
        nxt = alg.refund(b.cur, fr, -cost, now)
      elseif b.exists and at > 1 and name ~= 'concurrency' then
        units = cost
        nxt = alg.refund(b.cur, fr, -cost, at)
      end
    elseif name ~= 'concurrency' then
      local _, avail = alg.eval(b.cur, now, fr, 0)
      units = math.min(cost, avail)
    end
    ok = false
    if units < 0 then
      ok, rem[i], retry[i], reset[i] = alg.eval(nxt, now, fr, 0)
    elseif units > 0 then
      ok, rem[i], retry[i], reset[i], nxt = alg.eval(b.cur, now, fr, units)
    end
    if ok then
      b.cur, b.exists = nxt, true
      charged[i] = true
      forced[i] = units
    else
      forced[i] = 0
      local _
      _, rem[i], retry[i], reset[i] = alg.eval(b.cur, now, fr, 0)
    end
    shadow = true -- force never refuses the call
  else
    ok, rem[i], retry[i], reset[i], nxt = alg.eval(b.cur, now, r, cost)
    if ok and cost > 0 then
      b.cur = nxt
      charged[i] = true
    end
  end
  allowed[i] = ok
  if not ok and not shadow then admitted = false end
end

if (mode == 'decide' and admitted) or mode == 'force' then
  -- Write each charged key once, with the rate of its last charged check.
  local last = {}
  for i = 1, n do
    if charged[i] then last[KEYS[i]] = i end
  end
  for key, i in pairs(last) do
    save(key, algs[i], buckets[key].cur, rates[i], now)
  end
  if holds then hold_slots(holds, n, charged, now) end
elseif mode ~= 'peek' then
  -- Not admitted (or a dry run): nothing was charged.
  for i = 1, n do
    if charged[i] then
      allowed[i], rem[i], retry[i], reset[i] = algs[i].eval(buckets[KEYS[i]].orig, now, rates[i], 0)
    end
  end
end

local out = {admitted and 1 or 0, now}
for i = 1, n do
  local j = 3 + 4 * (i - 1)
  out[j] = allowed[i] and 1 or 0
  out[j + 1] = rem[i]
  if mode == 'force' then
    out[j + 2] = forced[i]
  else
    out[j + 2] = math.max(retry[i], 0)
  end
  out[j + 3] = math.max(reset[i], 0)
end
if once then once_put(once, out) end
return out
