-- sliding_window.lua: mirrors limiter/slidingwindow.go.
--
-- Windows of length W aligned to the Unix epoch; the bucket counts units
-- of the current window (n) and of the previous one (prev) and weighs prev
-- by how much of it still overlaps the trailing window:
--   weighted = prev x (W - elapsed) / W + n
-- A request of cost c is admitted when weighted + c <= limit; then n += c.
--
-- State {at, n, prev}: at = start of the current window, stored as
-- struct.pack('<ddd') (24 bytes).
ALGORITHMS.sliding_window = function()
  -- roll moves s to the window that holds now (or the stored one when the
  -- clock went back); returns it and the time elapsed in it.
  local function roll(s, now, r)
    local W = r.window
    local t = math.max(now, s.at)
    local ws = window_start(t, W)
    if ws == s.at then
      return s, t - ws
    elseif ws == s.at + W then
      return {at = ws, n = 0, prev = s.n}, t - ws
    end
    return {at = ws, n = 0, prev = 0}, t - ws
  end

  local function prev_weight(cur, e, r)
    if cur.prev <= 0 then return 0 end
    return cur.prev * (r.window - e) / r.window
  end

  -- fits compares pw <= limit - n - c so that a tiny pw is never absorbed
  -- by a large count.
  local function fits(cur, pw, r, c)
    local room = r.limit - cur.n - c
    return room >= 0 and pw <= room
  end

  -- fits_after reports whether s, left alone for w µs after now, admits c
  -- units (settle's test).
  local function fits_after(w, s, now, r, c)
    local c2, e2 = roll(s, now + w, r)
    return fits(c2, prev_weight(c2, e2, r), r, c)
  end

  -- wait returns the µs from now until s, left alone, admits c units.
  local function wait(s, now, r, c)
    local W, L = r.window, r.limit
    local cur, e = roll(s, now, r)
    local base = cur.at + e - now -- > 0 only when the clock went back
    local w = 0
    if cur.n + c <= L then
      if cur.prev > 0 then
        local en = ceil_pos(W - (L - cur.n - c) * W / cur.prev)
        if en > e then w = en - e end
      end
    else
      w = W - e
      if cur.n > L - c then
        w = w + ceil_pos(W - (L - c) * W / cur.n)
      end
    end
    return settle(w + base, fits_after, s, now, r, c)
  end

  local function result(src, cur, pw, now, r)
    local L = r.limit
    local rem = math.min(math.max(L - cur.n - ceil_pos(pw), 0), L)
    local reset = 0
    if rem < L then reset = wait(src, now, r, rem + 1) end
    return rem, reset
  end

  return {
    decode = function(raw)
      if type(raw) == 'string' and #raw == 24 then
        local at, n, prev = struct.unpack('<ddd', raw)
        return {at = at, n = n, prev = prev}
      end
      return {at = 0, n = 0, prev = 0}
    end,

    encode = function(s)
      return struct.pack('<ddd', s.at, s.n, s.prev)
    end,

    eval = function(s, now, r, cost)
      local cur, e = roll(s, now, r)
      local pw = prev_weight(cur, e, r)
      if cost > 0 and cost <= r.limit and fits(cur, pw, r, cost) then
        -- Admitted: only the bucket after the charge is reported (its
        -- reset is the one costly part of a decision; compute it once).
        cur = {at = cur.at, n = cur.n + cost, prev = cur.prev}
        local rem, reset = result(cur, cur, pw, now, r)
        return true, rem, 0, reset, cur
      end
      local rem, reset = result(s, cur, pw, now, r)
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > r.limit then
        return false, rem, r.window, reset, cur
      end
      return false, rem, wait(s, now, r, cost), reset, cur
    end,

    -- ttl: the current window's units count until the end of the next
    -- window (<= 2 x window from now), the previous window's until the end
    -- of the current one.
    ttl = function(s, now, r)
      if s.n > 0 then return s.at + 2 * r.window - now end
      if s.prev > 0 then return s.at + r.window - now end
      return s.at - now
    end,

    refund = function(s, r, cost, at)
      local cw = window_start(at, r.window)
      if s.at == cw then
        return {at = s.at, n = math.max(s.n - cost, 0), prev = s.prev}
      elseif s.at == cw + r.window then
        return {at = s.at, n = s.n, prev = math.max(s.prev - cost, 0)}
      end
      return s
    end,
  }
end

