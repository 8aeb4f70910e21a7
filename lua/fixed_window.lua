-- fixed_window.lua: mirrors limiter/fixed_window.go.
--
-- Windows of length W aligned to the Unix epoch; a request of cost c is
-- admitted when n + c <= limit, the count starting from zero each window.
--
-- State {at, n}: at = start of the window, stored as struct.pack('<dd')
-- (16 bytes).
ALGORITHMS.fixed_window = function()
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
      local W = r.window
      local cur = {at = window_start(math.max(now, s.at), W), n = 0}
      if cur.at == s.at then cur.n = s.n end
      local win_end = cur.at + W - now
      local rem, reset = result(cur, win_end, r)
      if cost == 0 then
        return true, rem, 0, reset, cur
      elseif cost > r.limit then
        return false, rem, W, reset, cur
      elseif cur.n + cost > r.limit then
        return false, rem, win_end, reset, cur
      end
      cur.n = cur.n + cost
      rem, reset = result(cur, win_end, r)
      return true, rem, 0, reset, cur
    end,

    -- ttl: the count is forgotten when its window ends (<= window).
    ttl = function(s, now, r)
      if s.n > 0 then return s.at + r.window - now end
      return s.at - now
    end,

    refund = function(s, r, cost, at)
      if s.at == window_start(at, r.window) then
        return {at = s.at, n = math.max(s.n - cost, 0)}
      end
      return s
    end,
  }
end

