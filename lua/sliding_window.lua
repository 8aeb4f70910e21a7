-- sliding_window.lua: mirrors limiter/sliding_window.go.
--
-- Windows of length W aligned to the Unix epoch; the bucket counts units
-- of the current window (n) and of the previous one (prev) and weighs prev
-- by how much of it still overlaps the trailing window:
--   weighted = prev x (W - elapsed) / W + n
-- A request of cost c is admitted when weighted + c <= limit; then n += c.
--
-- State {at, n, prev}: at = start of the current window, stored as
-- struct.pack('<ddd') (24 bytes).
--
-- This is the default algorithm, so its decision is written for Redis's
-- time: a reset tests the bucket at instants near an estimate, and Redis's
-- Lua pays more for a function call, a table read or a math.* lookup per
-- test than for the arithmetic itself. So the tests and the roll run
-- inline, on numbers rather than state and rate tables; the arithmetic is
-- the same, operation for operation, as the straightforward form it
-- replaced, so every answer is the same to the microsecond (the
-- conformance tests compare the answers with the Go side's).
ALGORITHMS.sliding_window = function()
  local floor, ceil = math.floor, math.ceil

  -- wait returns the µs from now until the bucket (at, n, prev), rolled
  -- to now (at starts the window that holds now, e µs ago), admits c units
  -- under limit L and window W if left alone: a float estimate, then the
  -- wait search (common.lua) with its test written inline.
  local function wait(now, at, n, prev, e, L, W, c)
    local w = 0
    if n + c <= L then
      if prev > 0 then
        -- When the previous window's weight has fallen to L - n - c.
        local en = W - (L - n - c) * W / prev
        if en > e then w = ceil(en) - e end
      end
    else
      -- In the next window, when this one's weight has fallen to L - c.
      w = W - e
      if n > L - c then w = w + ceil(W - (L - c) * W / n) end
    end
    w = w + (at + e - now) -- > 0 only when the clock went back
    -- The test rolls the bucket to now + w by subtraction, since at
    -- starts a window: in this window the previous one weighs prev against
    -- room L - n - c; in the next one this one weighs n against room
    -- L - c; after that nothing counts. It compares the weight with the
    -- room, not weight + n + c with the limit, so that a tiny weight is
    -- never absorbed by a large count.
    local d, room_this, room_next = now - at, L - n - c, L - c
    local down, step, i = nil, 1, 0
    while true do
      local x, ok = d + w, room_next >= 0
      if x < W then
        if x < 0 then x = 0 end -- the clock went back: the window's start
        ok = room_this >= 0 and (prev <= 0 or prev * (W - x) / W <= room_this)
      elseif x < W + W then
        ok = ok and (n <= 0 or n * (W - (x - W)) / W <= room_next)
      end
      -- The walk: down from an estimate that admits, up from one that
      -- does not (common.lua).
      if down == nil then down = ok end
      if down then
        if not ok then return w + 1 end
        if i >= 8 or w <= 0 then return w end
        w, i = w - 1, i + 1
      else
        if ok then return w end
        if w >= MAX_SAFE then return MAX_SAFE end
        w = w + step
        if i >= 4 then step = step + step end
        i = i + 1
      end
    end
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
      local L, W = r.limit, r.window
      -- Roll the bucket to the window that holds now (the stored one when
      -- the clock went back). window_start(t, W) without its guards where
      -- they cannot apply: for integers t < 2^53 and W >= 1, the float
      -- t / W is never rounded up to the next integer, so its floor is
      -- exact.
      local at, n, prev, t = s.at, s.n, s.prev, now
      if t < at then t = at end
      local ws
      if t < MAX_SAFE then ws = floor(t / W) * W else ws = window_start(t, W) end
      if ws ~= at then
        if ws == at + W then n, prev = 0, n else n, prev = 0, 0 end
        at = ws
      end
      local e = t - ws
      local pw = 0 -- the previous window's weight
      if prev > 0 then pw = prev * (W - e) / W end
      local room = L - n - cost
      local ok = cost > 0 and cost <= L and room >= 0 and pw <= room
      if ok then n = n + cost end
      -- Remaining and reset of the bucket reported: after the charge when
      -- admitted (the reset is the one costly part of a decision; it is
      -- computed once).
      local rem, reset = L - n, 0
      if pw > 0 then rem = rem - ceil(pw) end
      if rem >= L then
        rem = L
      else
        if rem < 0 then rem = 0 end
        reset = wait(now, at, n, prev, e, L, W, rem + 1)
      end
      if ok then
        return true, rem, 0, reset, {at = at, n = n, prev = prev}
      end
      local cur = s
      if at ~= s.at then cur = {at = at, n = n, prev = prev} end
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > L then
        return false, rem, W, reset, cur
      end
      return false, rem, wait(now, at, n, prev, e, L, W, cost), reset, cur
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
