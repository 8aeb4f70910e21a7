-- gcra.lua: mirrors limiter/gcra.go.
--
-- Emission interval T = ceil(window / limit) µs, tolerance tau = cap x T.
-- The bucket owes used = max(TAT, now) - now µs; a request of cost n is
-- admitted when used + n x T <= tau, and then TAT = max(TAT, now) + n x T.
-- Integer arithmetic only. (Go computes T in nanoseconds, so when window /
-- limit is not a whole number of µs, T here is up to 1µs per unit longer:
-- never more permissive.)
--
-- State {at}: at = TAT, stored as struct.pack('<d') (8 bytes).
ALGORITHMS.gcra = function()
  -- MAX_TOL is Go's maxTolerance (2^61 ns) in µs.
  local MAX_TOL = 2305843009213693

  local function interval(r)
    local T = math.ceil(r.window / r.limit)
    if T * r.limit < r.window then
      T = T + 1
    elseif T > 1 and (T - 1) * r.limit >= r.window then
      T = T - 1
    end
    if T < 1 then T = 1 end
    return T
  end

  local function result(used, T, tau, c)
    if used <= 0 then return c, 0 end
    if used >= tau then return 0, used - tau + T end
    local free = tau - used
    local q = idiv(free, T)
    return math.min(q, c), T - (free - q * T)
  end

  return {
    decode = function(raw)
      if type(raw) == 'string' and #raw == 8 then
        return {at = (struct.unpack('<d', raw))}
      end
      return {at = 0}
    end,

    encode = function(s)
      return struct.pack('<d', s.at)
    end,

    eval = function(s, now, r, cost)
      local c = r.cap
      local T = interval(r)
      local tau = math.min(c * T, MAX_TOL)
      local used = math.max(s.at, now) - now
      local rem, reset = result(used, T, tau, c)
      if cost == 0 then
        return true, rem, 0, reset, s
      elseif cost > c then
        return false, rem, r.window, reset, s
      end
      local need = cost * T
      if used > tau or need > tau - used then
        return false, rem, need + used - tau, reset, s
      end
      used = used + need
      rem, reset = result(used, T, tau, c)
      return true, rem, 0, reset, {at = now + used}
    end,

    -- ttl: the bucket is full at TAT, at most tau (about cap/limit windows)
    -- after now.
    ttl = function(s, now, r)
      return s.at - now
    end,

    refund = function(s, r, cost, at)
      return {at = s.at - cost * interval(r)}
    end,
  }
end

