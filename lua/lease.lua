-- lease.lua: the entry point of the lease script (limiter.RedisStore
-- Lease). One call gives back what is left of an instance's previous lease
-- of a set of buckets and takes a new one: up to `want` requests' worth of
-- units from every bucket at once, all or nothing.
--
-- KEYS[i]  the bucket key of check i (all in one cluster slot, all distinct);
--          when ARGV[7] is not "0", one more key last: the call's id
--          (common.lua)
-- ARGV[1]  "0", or an instant in µs that replaces Redis TIME (tests only)
-- ARGV[2]  want: how many requests the lease should cover (0: only give back)
-- ARGV[3]  live instances sharing the budget (>= 1)
-- ARGV[4]  lease ttl in µs
-- ARGV[5]  give back: requests' worth of units left from the previous lease
-- ARGV[6]  the instant (µs) the previous lease was charged at
-- ARGV[7]  "0": no id; "1": applied once per id; "2": a retry of the call
--          with this id, whose reply was lost (see below)
-- ARGV[8 + 7(i-1) ...] check i, laid out as for decide.lua; cost is one
--          request's units. Only token_bucket, gcra, sliding_window,
--          fixed_window and calendar may lease; shadow is ignored.
--
-- Returns {granted, now_us, expires_us, then per check: allowed (1/0),
-- remaining, retry_after_us, reset_us}.
--
-- Size: granted is the largest k <= want such that every bucket can take
-- k x cost now, and no bucket gives more than remaining / (2 x instances)
-- of itself (at least one request's worth while it has that much), so a
-- bucket close to empty hands out leases of one request and the fleet
-- admits exactly its limit. Granted units are charged like k admitted
-- requests; remaining reports the bucket after the charge.
--
-- granted = 0 is a denial of one request: nothing is charged and each
-- check reports what a one-request decide would (retry_after of the
-- buckets that deny).
--
-- expires_us is how long the granted units may be served: the ttl, cut at
-- the end of the current window for sliding and fixed windows, and of the
-- current period for calendar ones (units of a window spent in the next
-- one would be counted in the wrong window).
--
-- Ids: a call with an id records {granted, now_us, undone} under it. A
-- call that finds its id recorded gives nothing back again and takes
-- nothing; it answers the recorded grant and instant. A retry ("2", sent
-- with want 0) makes the call's outcome what a give-back alone would have
-- been: when the lost call ran, the units it granted (which nobody will
-- serve) go back; when it did not, its give-back is made now. Either way
-- once.
local now = now_us(ARGV[1])
local want = tonumber(ARGV[2])
local instances = math.max(tonumber(ARGV[3]), 1)
local expires = tonumber(ARGV[4])
local back = tonumber(ARGV[5])
local back_at = tonumber(ARGV[6])
local n = #KEYS
local once, record, replay
if ARGV[7] ~= '0' then
  once, n = KEYS[n], n - 1
  local prev = once_get(once)
  if prev then
    want, back = 0, 0
    if ARGV[7] == '1' then
      -- The same call again (a client that re-sent it): the same grant.
      replay = prev
    elseif prev[3] == 0 and prev[1] > 0 then
      -- The lost call ran: give back what it granted.
      back, back_at = prev[1], prev[2]
      record = {prev[1], prev[2], 1}
    end
  elseif ARGV[7] == '2' then
    want = 0
    record = {0, now, 1}
  else
    record = {0, now, 0}
  end
end

local algs, rates, costs, states, dirty = {}, {}, {}, {}, {}
for i = 1, n do
  local alg, r, cost = parse_check(i, 7)
  local name = ARGV[8 + CHECK_ARGS * (i - 1)]
  if name ~= 'token_bucket' and name ~= 'gcra' and name ~= 'sliding_window' and name ~= 'fixed_window' and name ~= 'calendar' then
    error('tollgate: ' .. name .. ' cannot lease')
  end
  local raw = redis.call('GET', KEYS[i])
  local s = alg.decode(raw)
  -- Give back first. A bucket that expired or was reset meanwhile has
  -- nothing to give back to; refund ignores units of a window that ended.
  if back > 0 and cost > 0 and raw then
    s = alg.refund(s, r, back * cost, back_at)
    dirty[i] = true
  end
  algs[i], rates[i], costs[i], states[i] = alg, r, cost, s
  if name == 'sliding_window' or name == 'fixed_window' then
    expires = math.min(expires, window_start(now, r.window) + r.window - now)
  elseif name == 'calendar' then
    expires = math.min(expires, alg.lease_end(s, now, r))
  end
end

-- How many requests every bucket can cover, and may hand to one instance.
local k = want
for i = 1, n do
  if costs[i] > 0 and k > 0 then
    local _, avail = algs[i].eval(states[i], now, rates[i], 0)
    local fits = math.floor(avail / costs[i])
    local share = math.floor(avail / (2 * instances) / costs[i])
    k = math.min(k, math.min(fits, math.max(share, 1)))
  end
end

local out = {0, now, math.max(expires, 0)}
local res = {}
if k > 0 then
  local nxt = {}
  for i = 1, n do
    local ok, rem, retry, reset, s = algs[i].eval(states[i], now, rates[i], k * costs[i])
    if not ok then k = 0 break end
    res[i] = {1, rem, 0, reset}
    nxt[i] = s
  end
  if k > 0 then
    for i = 1, n do
      if costs[i] > 0 then
        states[i] = nxt[i]
        dirty[i] = true
      end
    end
  end
end
if k == 0 and want > 0 then
  -- Denied: what one request would be told.
  for i = 1, n do
    local ok, rem, retry, reset = algs[i].eval(states[i], now, rates[i], costs[i])
    if ok and costs[i] > 0 then
      ok, rem, retry, reset = algs[i].eval(states[i], now, rates[i], 0)
    end
    res[i] = {ok and 1 or 0, rem, math.max(retry, 0), reset}
  end
elseif k == 0 then
  for i = 1, n do
    local _, rem, _, reset = algs[i].eval(states[i], now, rates[i], 0)
    res[i] = {1, rem, 0, reset}
  end
end

for i = 1, n do
  if dirty[i] then store(KEYS[i], algs[i], states[i], rates[i], now) end
end

out[1] = k
if replay then out[1], out[2] = replay[1], replay[2] end
if record then
  if record[3] == 0 then record[1] = k end
  once_put(once, record)
end
for i = 1, n do
  local j = 4 + 4 * (i - 1)
  out[j], out[j + 1], out[j + 2], out[j + 3] = res[i][1], res[i][2], res[i][3], math.max(res[i][4], 0)
end
return out
