-- sliding_log.lua: mirrors limiter/slidinglog.go.
--
-- The bucket logs the instant of every admitted unit (a request of cost c
-- logs c units at the same instant) and counts those in the trailing
-- window (now - window, now]. A request of cost c is admitted when
--   count + c <= limit  and  (min_interval = 0 or now - last >= min_interval)
-- where last is the instant of the last admission.
--
-- State {log}: the log is one string of 8-byte little-endian integers
-- (struct.pack('<i8'), µs), oldest first: 8 x limit bytes at most, with no
-- per-entry overhead (a sorted set would cost ~60-100 bytes per entry).
-- The newest entry is the last admission, so no other field is needed.
-- Entries that left the window are dropped whenever a unit is logged, so
-- the log never holds more than limit entries.
ALGORITHMS.sliding_log = function()
  local FMT = '<i8'

  local function at(log, i) -- i-th oldest entry, 0-based
    return (struct.unpack(FMT, log, 8 * i + 1))
  end

  -- first_after returns the index of the oldest entry later than cutoff
  -- (n when there is none).
  local function first_after(log, n, cutoff)
    local lo, hi = 0, n
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if at(log, mid) > cutoff then hi = mid else lo = mid + 1 end
    end
    return lo
  end

  -- result reports remaining and reset when count units are in the window;
  -- the k-th oldest of them is entry first + k - 1.
  local function result(log, first, count, now, r)
    local rem = math.max(r.limit - count, 0)
    local reset = 0
    if count > 0 then
      -- rem + 1 units fit once count + rem + 1 - limit units expired.
      reset = at(log, first + count + rem - r.limit) + r.window - now
    end
    return rem, reset
  end

  return {
    decode = function(raw)
      if type(raw) == 'string' and #raw % 8 == 0 then
        return {log = raw}
      end
      return {log = ''}
    end,

    encode = function(s)
      return s.log
    end,

    eval = function(s, now, r, cost)
      local log, W, L = s.log, r.window, r.limit
      local n = #log / 8
      local first = first_after(log, n, now - W)
      local count = n - first
      local rem, reset = result(log, first, count, now, r)
      if cost == 0 then
        return true, rem, 0, reset, s
      elseif cost > L then
        return false, rem, W, reset, s
      end
      local wait = 0
      if count + cost > L then
        wait = at(log, first + count + cost - L - 1) + W - now
      end
      local last = nil
      if n > 0 then last = at(log, n - 1) end
      if r.minint > 0 and last and now - last < r.minint then
        wait = math.max(wait, last + r.minint - now)
      end
      if wait > 0 then
        return false, rem, wait, reset, s
      end
      -- Keep the log sorted if the clock went back.
      local t = now
      if last and last > t then t = last end
      -- Drop the entries that left the window: count + cost <= limit remain.
      local nlog = string.sub(log, 8 * first + 1) .. string.rep(struct.pack(FMT, t), cost)
      rem, reset = result(nlog, 0, count + cost, now, r)
      return true, rem, 0, reset, {log = nlog}
    end,

    -- ttl: the log is empty once its newest entry left the window, and
    -- min_interval no longer applies after last + min_interval; so at most
    -- max(window, min_interval) from now.
    ttl = function(s, now, r)
      local n = #s.log / 8
      if n == 0 then return 0 end
      return at(s.log, n - 1) + math.max(r.window, r.minint) - now
    end,

    -- refund removes up to cost entries logged at the instant of the
    -- charge, newest first.
    refund = function(s, r, cost, t)
      local log = s.log
      local hi = #log / 8
      while hi > 0 and at(log, hi - 1) > t do hi = hi - 1 end
      local lo = hi
      while lo > 0 and hi - lo < cost and at(log, lo - 1) == t do lo = lo - 1 end
      if lo == hi then return s end
      return {log = string.sub(log, 1, 8 * lo) .. string.sub(log, 8 * hi + 1)}
    end,
  }
end

