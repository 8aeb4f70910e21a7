-- sliding_log.lua: mirrors limiter/sliding_log.go.
--
-- The bucket logs the instant of every admitted unit (a request of cost c
-- logs c units at the same instant) and counts those in the trailing
-- window (now - window, now]. A request of cost c is admitted when
--   count + c <= limit  and  (min_interval = 0 or now - last >= min_interval)
-- where last is the instant of the last admission.
--
-- Layout: the key is a Redis list of integers
--   [base, ts1, cum1, ts2, cum2, ..., tsn, cumn]
-- with one (ts, cum) pair per admission, oldest first (admissions at the
-- same instant share one): ts is its instant (µs) and cum the number of
-- units logged in the bucket up to and including it; base is the cum of
-- the last admission that left the log. Entry j holds cum_j - cum_(j-1)
-- units (cum_0 = base), the log cum_n - base, and the k-th oldest unit
-- after entry e belongs to the first entry j with cum_j - cum_e >= k.
-- A listpack stores each integer in 2 to 10 bytes, so an admission costs
-- about 16 bytes of Redis memory whatever its cost.
--
-- cums are kept modulo 2^53 (MAX_SAFE), so they stay exact in Lua numbers
-- however many units a busy bucket logs over its life, with no rewrite of
-- the list: only differences of cums are used, and the log never holds
-- more than 2^53 units (the largest limit), so the difference of two cums
-- is the true count modulo 2^53, 0 standing for 2^53 (span below).
--
-- A call reads only near the ends of the list: LRANGE 0 6 (base and the
-- three oldest entries), LLEN and LRANGE -2 -1 when the key is opened,
-- then LINDEX probes galloping from the head (1, 2, 4, 8 ... entries) for
-- the admissions that left the window and the oldest units in it. Dropping the k
-- oldest entries is LTRIM key 2k -1 (element 2k, cum_k, becomes the new
-- base); an admission is RPUSH ts cum, or LSET -1 when the newest entry
-- has the same instant. Entries that left the window are dropped when an
-- admission is written; peeks and denials write nothing.
--
-- A key written by an older Tollgate holds a string of 8-byte
-- little-endian timestamps, one per unit, oldest first; it is converted to
-- the list on first use (upgrade below), keeping its TTL.
ALGORITHMS.sliding_log = function()
  local M = MAX_SAFE

  -- addmod is (a + b) mod 2^53 for 0 <= a < 2^53, 0 <= b <= 2^53, without
  -- leaving the exact range of doubles.
  local function addmod(a, b)
    if a >= M - b then return a - (M - b) end
    return a + b
  end

  -- submod is (a - b) mod 2^53 in [0, 2^53).
  local function submod(a, b)
    local d = a - b
    if d < 0 then d = d + M end
    return d
  end

  -- span is the number of units between two cums c after b: in [1, 2^53].
  local function span(c, b)
    local d = submod(c, b)
    if d == 0 then return M end
    return d
  end

  -- first returns the smallest j in [lo, hi] for which ok(j) holds, ok
  -- being false then true for good and true at hi (never called there): it
  -- probes lo, lo+1, lo+3, lo+7, ... then bisects, so an answer d entries
  -- after lo costs O(log d) probes.
  local function first(lo, hi, ok)
    local a, j, step = lo - 1, lo, 1
    while j < hi and not ok(j) do
      a = j
      j = math.min(j + step, hi)
      step = step + step
    end
    -- ok(j) (or j == hi); not ok(a)
    while j - a > 1 do
      local mid = math.floor((a + j) / 2)
      if ok(mid) then j = mid else a = mid end
    end
    return j
  end

  -- A view reads the list of one key lazily and caches what it read:
  -- v.n entries, v.t[j] = ts_j, v.c[j] = cum_j (v.c[0] = base).
  local function ts(v, j)
    local x = v.t[j]
    if not x then
      x = tonumber(redis.call('LINDEX', v.key, 2 * j - 1))
      v.t[j] = x
    end
    return x
  end

  local function cum(v, j)
    local x = v.c[j]
    if not x then
      x = tonumber(redis.call('LINDEX', v.key, 2 * j))
      v.c[j] = x
    end
    return x
  end

  -- upgrade converts the old layout of key (a string of 8-byte
  -- little-endian µs timestamps, one per unit, oldest first) to the list,
  -- one entry per distinct timestamp, keeping the key's TTL.
  local function upgrade(key)
    local raw = redis.call('GET', key)
    local pttl = redis.call('PTTL', key)
    redis.call('DEL', key)
    if #raw % 8 ~= 0 or #raw == 0 then return end
    local items, c = {0}, 0
    for i = 0, #raw / 8 - 1 do
      local t = struct.unpack('<i8', raw, 8 * i + 1)
      c = c + 1
      if #items > 1 and items[#items - 1] == int(t) then
        items[#items] = int(c)
      else
        items[#items + 1] = int(t)
        items[#items + 1] = int(c)
      end
    end
    for i = 1, #items, 4000 do
      redis.call('RPUSH', key, unpack(items, i, math.min(i + 3999, #items)))
    end
    if pttl > 0 then redis.call('PEXPIRE', key, pttl) end
  end

  -- HEAD is how many elements open reads from the head: base and the
  -- three oldest entries, which are the ones a call usually needs.
  local HEAD = 7

  -- open reads the ends of the list of key: its HEAD first elements, and
  -- the newest entry and the length when the list is longer.
  local function open(key)
    local v = {key = key, n = 0, t = {}, c = {[0] = 0}}
    local head = redis.pcall('LRANGE', key, 0, HEAD - 1)
    if head.err then
      -- Anything but a list: only the string of an older Tollgate is
      -- expected (another type fails the call, as it always did).
      if redis.call('TYPE', key).ok ~= 'string' then error(head.err) end
      upgrade(key)
      head = redis.call('LRANGE', key, 0, HEAD - 1)
    end
    if #head < 3 then
      -- No entry: a missing key (or a bare base, never left behind).
      v.stale = #head > 0
      return v
    end
    if #head < HEAD then
      v.n = (#head - 1) / 2
    else
      v.n = (redis.call('LLEN', key) - 1) / 2
      local tail = redis.call('LRANGE', key, -2, -1)
      v.t[v.n], v.c[v.n] = tonumber(tail[1]), tonumber(tail[2])
    end
    v.c[0] = tonumber(head[1])
    for j = 1, math.min(v.n, (HEAD - 1) / 2) do
      v.t[j], v.c[j] = tonumber(head[2 * j]), tonumber(head[2 * j + 1])
    end
    return v
  end

  -- expired returns how many entries are at or before cutoff: all of
  -- them when the newest is (an idle bucket), without a search.
  local function expired(v, cutoff)
    local n = v.n
    if n == 0 or ts(v, n) <= cutoff then return n end
    return first(1, n, function(j) return ts(v, j) > cutoff end) - 1
  end

  -- units returns the number of units in the entries after entry e.
  local function units(v, e)
    if e >= v.n then return 0 end
    return span(cum(v, v.n), cum(v, e))
  end

  -- A state is {v = view, p = units pending at the instant of this call,
  -- logged when the state is saved}: checks of one key chained in one
  -- call see each other's charges before anything is written.

  -- last returns the instant of the last admission of s (nil: none).
  local function last(s)
    local v = s.v
    local t = nil
    if v.n > 0 then t = ts(v, v.n) end
    if s.p > 0 and (not t or s.now > t) then t = s.now end
    return t
  end

  -- window returns the entries that left the window, the units logged
  -- after them and in all (with the pending ones).
  local function window(s, now, r)
    local e = expired(s.v, now - r.window)
    local logged = units(s.v, e)
    return e, logged, logged + s.p
  end

  -- expiry returns the instant the k-th oldest unit in the window leaves
  -- it (1 <= k <= count).
  local function expiry(s, e, logged, k, r)
    if k <= logged then
      local v, c = s.v, cum(s.v, e)
      local j = first(e + 1, v.n, function(j) return span(cum(v, j), c) >= k end)
      return ts(v, j) + r.window
    end
    return last(s) + r.window
  end

  -- result returns remaining and reset when count units are in the window.
  local function result(s, e, logged, count, now, r)
    local rem = math.max(r.limit - count, 0)
    local reset = 0
    if count > 0 then
      -- rem + 1 units fit once count + rem + 1 - limit units expired.
      local k = 1
      if count > r.limit then k = count - r.limit + 1 end
      reset = expiry(s, e, logged, k, r) - now
    end
    return rem, reset
  end

  -- save writes the state s of key: the entries that left the window are
  -- dropped and the pending units logged, then the TTL set to the newest
  -- entry + max(window, min_interval); an empty log is deleted. Without
  -- pending units (after a refund) nothing is dropped, so that the newest
  -- entry, which min_interval needs, stays.
  local function save(key, s, r, now)
    local v = s.v
    local t = last(s)
    if s.p > 0 then
      local n = v.n
      local e = expired(v, now - r.window)
      local c = cum(v, n)
      local merge = n > 0 and ts(v, n) == t
      if n == 0 then
        if v.stale then redis.call('DEL', key) end
        redis.call('RPUSH', key, 0, int(t), int(addmod(0, s.p)))
      else
        if e > 0 then redis.call('LTRIM', key, int(2 * e), -1) end
        if merge then
          redis.call('LSET', key, -1, int(addmod(c, s.p)))
        else
          redis.call('RPUSH', key, int(t), int(addmod(c, s.p)))
        end
      end
    end
    local ttl = 0
    if t then ttl = t + math.max(r.window, r.minint) - now end
    if ttl <= 0 then
      redis.call('DEL', key)
      return
    end
    local ms = math.ceil(ttl / 1000)
    redis.call('PEXPIRE', key, int(ms))
    index_part(key, ms)
  end

  return {
    load = function(key)
      local v = open(key)
      return {v = v, p = 0}, v.n > 0
    end,

    save = save,

    eval = function(s, now, r, cost)
      s.now = now
      local e, logged, count = window(s, now, r)
      local rem, reset = result(s, e, logged, count, now, r)
      if cost == 0 then
        return true, rem, 0, reset, s
      elseif cost > r.limit then
        return false, rem, r.window, reset, s
      end
      local wait = 0
      if cost > r.limit - count then
        wait = expiry(s, e, logged, cost - (r.limit - count), r) - now
      end
      local t = last(s)
      if r.minint > 0 and t and now - t < r.minint then
        wait = math.max(wait, t + r.minint - now)
      end
      if wait > 0 then
        return false, rem, wait, reset, s
      end
      local nxt = {v = s.v, p = s.p + cost, now = now}
      rem, reset = result(nxt, e, logged, count + cost, now, r)
      return true, rem, 0, reset, nxt
    end,

    -- refund removes up to cost units logged at the instant at, newest
    -- first: from the newest entry at or before at when it was logged at
    -- at. It writes the list at once (only a give-back calls it: decide.lua,
    -- mode "force", a negative cost with its instant) and
    -- returns the state read again.
    refund = function(s, r, cost, at)
      local v = s.v
      local n = v.n
      if n == 0 then return s end
      -- The entry of at is the newest one or close to it: search from the
      -- tail.
      local d = first(0, n, function(d) return d == n or ts(v, n - d) <= at end)
      local j = n - d
      if j == 0 or ts(v, j) ~= at then return s end
      local u = span(cum(v, j), cum(v, j - 1))
      local take = math.min(cost, u)
      -- Rewrite entries j..n: entry j keeps u - take units (or goes), and
      -- every later cum drops by take.
      local tail = redis.call('LRANGE', v.key, int(2 * j - 1), -1)
      redis.call('LTRIM', v.key, 0, int(2 * j - 2))
      local items = {}
      for i = 1, #tail, 2 do
        if i > 1 or take < u then
          items[#items + 1] = tail[i]
          items[#items + 1] = int(submod(tonumber(tail[i + 1]), take))
        end
      end
      if #items > 0 then
        redis.call('RPUSH', v.key, unpack(items))
      elseif j == 1 then
        redis.call('DEL', v.key)
      end
      return {v = open(v.key), p = 0}
    end,
  }
end
