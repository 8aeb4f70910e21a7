-- token_bucket.lua: mirrors limiter/tokenbucket.go.
--
-- The bucket holds at most cap tokens (burst, else limit) and refills
-- continuously at limit tokens per window; it starts full. A request of
-- cost n is admitted when the bucket holds n tokens and takes them.
--
-- State {at, f}: at = instant of the last update, f = deficit (tokens
-- missing from a full bucket), stored as struct.pack('<dd') (16 bytes).
-- The zero state is a full bucket.
ALGORITHMS.token_bucket = function()
  local function deficit(s, t, r)
    local d = s.f - (t - s.at) * r.limit / r.window
    if d ~= d or d <= 0 then return 0 end
    return d
  end

  -- holds reports whether s, left alone for w µs after now, holds n
  -- tokens (settle's test).
  local function holds(w, s, now, r, n)
    return r.cap - deficit(s, now + w, r) >= n
  end

  -- wait returns the µs from now until s, left alone, holds n tokens.
  local function wait(s, now, r, n)
    local t = math.max(now, s.at)
    local need = n - (r.cap - deficit(s, t, r))
    if need <= 0 then return t - now end
    local w = (t - now) + ceil_pos(need * r.window / r.limit)
    return settle(w, holds, s, now, r, n)
  end

  -- result reports remaining and reset for deficit d at now; the wait is
  -- computed from src, the state as stored.
  local function result(src, d, now, r)
    local c = r.cap
    local rem = floor_units(c - d, c)
    local reset = 0
    if rem < c then reset = wait(src, now, r, rem + 1) end
    return rem, reset
  end

  -- full reports whether s is a full bucket w µs after its last update
  -- (settle's test).
  local function full(w, s, r)
    return deficit(s, s.at + w, r) == 0
  end

  return {
    decode = function(raw)
      if type(raw) == 'string' and #raw == 16 then
        local at, f = struct.unpack('<dd', raw)
        return {at = at, f = f}
      end
      return {at = 0, f = 0}
    end,

    encode = function(s)
      return struct.pack('<dd', s.at, s.f)
    end,

    eval = function(s, now, r, cost)
      local c = r.cap
      local t = math.max(now, s.at)
      local f = deficit(s, t, r)
      if cost > 0 and cost <= c and c - f >= cost then
        -- Admitted: only the bucket after the charge is reported.
        local cur = {at = t, f = f + cost}
        local rem, reset = result(cur, cur.f, now, r)
        return true, rem, 0, reset, cur
      end
      local cur = {at = t, f = f}
      local rem, reset = result(s, f, now, r)
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > c then
        return false, rem, r.window, reset, cur
      end
      return false, rem, wait(s, now, r, cost), reset, cur
    end,

    -- ttl: the bucket is full again once the deficit has refilled, at most
    -- cap/limit windows after the last update (<= window when burst is unset).
    ttl = function(s, now, r)
      if s.f <= 0 then return s.at - now end
      local w = settle(ceil_pos(s.f * r.window / r.limit), full, s, r)
      return s.at + w - now
    end,

    refund = function(s, r, cost, at)
      return {at = s.at, f = math.max(s.f - cost, 0)}
    end,
  }
end
