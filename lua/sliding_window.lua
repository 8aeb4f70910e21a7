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
  -- roll finds the window that holds now (or the stored one when the
  -- clock went back): it returns that window's start, its count, the
  -- previous window's count and the time elapsed in it. It returns
  -- numbers, not a state table: a decision rolls its bucket several times
  -- (each reset tries instants near its estimate), and a table per roll
  -- costs Redis more than the rest of the arithmetic.
  local floor, max = math.floor, math.max
  local function roll(s, now, W)
    local t = max(now, s.at)
    -- window_start(t, W), without its guards where they cannot apply: for
    -- integers t < 2^53 and W >= 1, the float t / W is never rounded up
    -- to the next integer, so its floor is exact.
    local ws
    if t < MAX_SAFE then ws = floor(t / W) * W else ws = window_start(t, W) end
    if ws == s.at then
      return ws, s.n, s.prev, t - ws
    elseif ws == s.at + W then
      return ws, 0, s.n, t - ws
    end
    return ws, 0, 0, t - ws
  end

  local function prev_weight(prev, e, W)
    if prev <= 0 then return 0 end
    return prev * (W - e) / W
  end

  -- fits compares pw <= limit - n - c so that a tiny pw is never absorbed
  -- by a large count.
  local function fits(n, pw, L, c)
    local room = L - n - c
    return room >= 0 and pw <= room
  end

  -- fits_after reports whether s, left alone for w µs after now, admits c
  -- units (settle's test): fits and prev_weight, inlined (settle calls it
  -- at least twice per reset).
  local function fits_after(w, s, now, r, c)
    local W = r.window
    local _, n, prev, e = roll(s, now + w, W)
    local room = r.limit - n - c
    if room < 0 then return false end
    return prev <= 0 or prev * (W - e) / W <= room
  end

  -- wait returns the µs from now until s, left alone, admits c units; at,
  -- n, prev and e are roll(s, now, r.window), which its callers have.
  local function wait(s, now, r, c, at, n, prev, e)
    local W, L = r.window, r.limit
    local base = at + e - now -- > 0 only when the clock went back
    local w = 0
    if n + c <= L then
      if prev > 0 then
        local en = ceil_pos(W - (L - n - c) * W / prev)
        if en > e then w = en - e end
      end
    else
      w = W - e
      if n > L - c then
        w = w + ceil_pos(W - (L - c) * W / n)
      end
    end
    return settle(w + base, fits_after, s, now, r, c)
  end

  -- result reports remaining and reset of src at now (at, n, prev and e
  -- are roll(src, now, r.window); pw is the previous window's weight).
  local function result(src, now, r, at, n, prev, e, pw)
    local L = r.limit
    local rem = math.min(max(L - n - ceil_pos(pw), 0), L)
    local reset = 0
    if rem < L then reset = wait(src, now, r, rem + 1, at, n, prev, e) end
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
      local at, n, prev, e = roll(s, now, r.window)
      local pw = prev_weight(prev, e, r.window)
      if cost > 0 and cost <= r.limit and fits(n, pw, r.limit, cost) then
        -- Admitted: only the bucket after the charge is reported (its
        -- reset is the one costly part of a decision; compute it once).
        local cur = {at = at, n = n + cost, prev = prev}
        local rem, reset = result(cur, now, r, at, n + cost, prev, e, pw)
        return true, rem, 0, reset, cur
      end
      local cur = s
      if at ~= s.at then cur = {at = at, n = n, prev = prev} end
      local rem, reset = result(s, now, r, at, n, prev, e, pw)
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > r.limit then
        return false, rem, r.window, reset, cur
      end
      return false, rem, wait(s, now, r, cost, at, n, prev, e), reset, cur
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

