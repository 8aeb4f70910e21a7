-- token_bucket.lua: mirrors limiter/token_bucket.go.
--
-- The bucket holds at most cap tokens (burst, else limit) and refills
-- continuously at limit tokens per window; it starts full. A request of
-- cost n is admitted when the bucket holds n tokens and takes them.
--
-- State {at, f}: at = instant of the last update, f = deficit (tokens
-- missing from a full bucket), stored as struct.pack('<dd') (16 bytes).
-- The zero state is a full bucket.
ALGORITHMS.token_bucket = function()
  local mfloor, ceil = math.floor, math.ceil

  local function deficit(s, t, r)
    local d = s.f - (t - s.at) * r.limit / r.window
    if d ~= d or d <= 0 then return 0 end
    return d
  end

  -- search is the wait search (common.lua) for the test "the bucket with
  -- deficit g at t, left alone until base + w, holds n of its c tokens"
  -- (with c = n = 0: is full), written inline: the smallest w near the
  -- estimate w for which it holds (L, W: r's limit and window).
  local function search(w, g, base, t, L, W, c, n)
    local d = g - ((base + w) - t) * L / W
    if d ~= d or d <= 0 then d = 0 end
    if c - d >= n then
      for _ = 1, 8 do
        if w <= 0 then break end
        d = g - ((base + (w - 1)) - t) * L / W
        if d ~= d or d <= 0 then d = 0 end
        if c - d < n then break end
        w = w - 1
      end
      return w
    end
    local step, i = 1, 0
    repeat
      if w >= MAX_SAFE then return MAX_SAFE end
      w = w + step
      if i >= 4 then step = step + step end
      i = i + 1
      d = g - ((base + w) - t) * L / W
      if d ~= d or d <= 0 then d = 0 end
    until c - d >= n
    return w
  end

  -- wait returns the µs from now until s, left alone, holds n tokens.
  local function wait(s, now, r, n)
    local t = math.max(now, s.at)
    local need = n - (r.cap - deficit(s, t, r))
    if need <= 0 then return t - now end
    local w = (t - now) + ceil_pos(need * r.window / r.limit)
    return search(w, s.f, now, s.at, r.limit, r.window, r.cap, n)
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

  -- The admitted path (every decision of a tenant within its limit) runs
  -- a flat version of result and wait: Redis's Lua pays more for
  -- function calls, math.* lookups and reads of the state and rate
  -- tables than for the arithmetic (bench/scripts.sh). The arithmetic is
  -- the same, operation for operation, so every answer is the same to the
  -- microsecond (the conformance tests compare the answers with the Go
  -- side's).

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
      local t = s.at
      if now > t then t = now end
      local L, W = r.limit, r.window
      local f = s.f - (t - s.at) * L / W -- deficit(s, t, r)
      if f ~= f or f <= 0 then f = 0 end
      if cost > 0 and cost <= c and c - f >= cost then
        -- Admitted: only the bucket after the charge is reported
        -- (result(cur, g, now, r), flat).
        local g = f + cost
        local rem, reset = c - g, 0
        if rem ~= rem or rem <= 0 then
          rem = 0
        elseif rem >= c then
          rem = c
        else
          rem = mfloor(rem)
        end
        if rem < c then
          -- wait({at = t, f = g}, now, r, rem + 1), for t >= now, g > 0.
          local need = rem + 1 - (c - g)
          if need <= 0 then
            reset = t - now
          else
            local x = need * W / L
            if x >= MAX_SAFE then x = MAX_SAFE else x = ceil(x) end
            reset = search((t - now) + x, g, now, t, L, W, c, rem + 1)
          end
        end
        return true, rem, 0, reset, {at = t, f = g}
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
    -- cap/limit windows after the last update (<= window when burst is
    -- unset): the first instant at which its deficit is 0. The estimate
    -- ceil(f x W / L) is taken when one test shows the bucket full there,
    -- so the key never expires before that instant; the search runs only
    -- when the estimate falls short. The TTL is never more than that
    -- instant plus the estimate's rounding, and was that instant exactly
    -- for every one of 300 000 random buckets compared with the search's
    -- answer; the search's two or three tests cost Redis about a fifth
    -- of a decision's Lua.
    ttl = function(s, now, r)
      local f, at = s.f, s.at
      if f <= 0 then return at - now end
      local L, W = r.limit, r.window
      local w = ceil(f * W / L)
      if w < MAX_SAFE and f - ((at + w) - at) * L / W <= 0 then
        return at + w - now
      end
      return at + search(ceil_pos(f * W / L), f, at, at, L, W, 0, 0) - now
    end,

    refund = function(s, r, cost, at)
      return {at = s.at, f = math.max(s.f - cost, 0)}
    end,
  }
end
