-- calendar.lua: fixed_window over calendar periods; mirrors
-- limiter/fixed_window.go with a limiter.Calendar.
--
-- A Lua script cannot do time zones, so the Go side (limiter.RedisStore)
-- computes the period boundaries around its own clock and passes them:
-- the start of the previous period, the start and the end of the current
-- one and the end of the next one, four instants in µs. The script picks
-- the period that holds Redis's now. Time stays Redis TIME: instances
-- whose clocks are off by less than a period still decide the same
-- request the same way; an instant outside the three periods (a clock off
-- by more than a period) is an error, decided by the fail mode.
--
-- Arguments: a calendar check is laid out as any other (CHECK_ARGS), with
-- the algorithm name "calendar" and, in place of window_us, the ARGV index
-- of its first boundary; the boundaries of every calendar check follow
-- the checks, four per check.
--
-- State {at, n} as fixed_window's (at = start of the period, '<dd'), under
-- the same key: a policy switched from `window 1d` to `calendar day` (UTC)
-- keeps its count, the UTC day being the epoch-aligned one.
ALGORITHMS.calendar = function()
  -- A key outlives its period by MARGIN: whether a count starts afresh is
  -- decided by comparing its period start with the period that holds now,
  -- never by the key expiring, so instances whose zone databases disagree
  -- about a DST rule (by up to an hour) still find the count.
  local MARGIN = 3600000000

  -- bounds returns the four boundaries of check rate r.
  local function bounds(r)
    local b = r.bounds
    if not b then
      local p = r.window
      b = {tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])}
      r.bounds = b
    end
    return b
  end

  -- period returns the start and the end of the period that holds t, or
  -- nil when t is outside the three periods.
  local function period(r, t)
    local b = bounds(r)
    for i = 1, 3 do
      if b[i] <= t and t < b[i + 1] then return b[i], b[i + 1] end
    end
    return nil
  end

  -- current is the period of a bucket in state s at now: the one that
  -- holds the later of now and the bucket's own start (a clock that goes
  -- back never rolls a bucket back).
  local function current(s, now, r)
    local t = math.max(now, s.at)
    local ps, pe = period(r, t)
    if not ps then
      local b = bounds(r)
      error('tollgate: calendar periods ' .. int(b[1]) .. '..' .. int(b[4]) ..
        ' do not hold the instant ' .. int(t) .. ': the gateway clock is more than a period off Redis TIME')
    end
    return ps, pe
  end

  local function result(cur, win_end, r)
    if cur.n == 0 then return r.limit, 0 end
    return math.max(r.limit - cur.n, 0), win_end
  end

  return {
    decode = function(raw)
      if type(raw) == 'string' and #raw == 16 then
        local at, n = struct.unpack('<dd', raw)
        return {at = at, n = n}
      end
      return {at = 0, n = 0}
    end,

    encode = function(s)
      return struct.pack('<dd', s.at, s.n)
    end,

    eval = function(s, now, r, cost)
      local ps, pe = current(s, now, r)
      local cur = {at = ps, n = 0}
      if cur.at == s.at then cur.n = s.n end
      local win_end = pe - now
      local rem, reset = result(cur, win_end, r)
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > r.limit then
        return false, rem, pe - ps, reset, cur
      elseif cur.n + cost > r.limit then
        return false, rem, win_end, reset, cur
      end
      cur.n = cur.n + cost
      rem, reset = result(cur, win_end, r)
      return true, rem, 0, reset, cur
    end,

    -- ttl: until the period ends, plus MARGIN. A state of a period
    -- outside the bounds gets an over-estimate (three periods are longer
    -- than any one).
    ttl = function(s, now, r)
      if s.n <= 0 then return s.at - now end
      local _, pe = period(r, s.at)
      if pe then return pe - now + MARGIN end
      local b = bounds(r)
      if s.at < b[1] then return b[1] - now + MARGIN end
      return s.at + (b[4] - b[1]) - now + MARGIN
    end,

    refund = function(s, r, cost, at)
      local ps = period(r, at)
      if ps and s.at == ps then
        return {at = s.at, n = math.max(s.n - cost, 0)}
      end
      return s
    end,

    -- lease_end: µs until the end of the period a lease taken now is
    -- charged in (lease.lua cuts leases there).
    lease_end = function(s, now, r)
      local _, pe = current(s, now, r)
      return pe - now
    end,
  }
end
