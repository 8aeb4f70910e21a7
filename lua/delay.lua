-- delay.lua: requests that wait for their turn (`delay <max_wait>`);
-- mirrors limiter/delay.go.
--
-- A check whose request may wait is laid out as any other (CHECK_ARGS),
-- with the algorithm name token_bucket_delay or gcra_delay and, in the
-- min_interval slot (which token_bucket and gcra never use), the longest
-- wait in µs. It is its base algorithm (same state, key, TTL and refund)
-- with one more rule: a request the bucket denies, whose turn comes within
-- the longest wait, is admitted with that turn reserved. It is charged now
-- (a token bucket goes into debt; a GCRA TAT moves past now + tolerance),
-- and eval returns allowed with the wait in place of retry_after: the
-- entry points copy it into the reply, where an allowed check with
-- retry_after_us > 0 must wait that long. A turn further away is the base
-- algorithm's denial, retry_after_us the turn. Only decide.lua (decide,
-- dry and peek) is sent such checks.

-- with_delay builds the delay variant of the algorithm called name;
-- reserve(eval, s, now, r, cost, wait, cur) returns the state that holds
-- the reservation (nil: none), cur being the state of the denial.
local function with_delay(name, reserve)
  return function()
    local base = algorithm(name)
    local eval = base.eval
    return {
      decode = base.decode,
      encode = base.encode,
      ttl = base.ttl,
      refund = base.refund,
      eval = function(s, now, r, cost)
        local ok, rem, retry, reset, cur = eval(s, now, r, cost)
        if ok or cost > r.cap or retry > r.minint then
          return ok, rem, retry, reset, cur
        end
        local turn = reserve(eval, s, now, r, cost, retry, cur)
        if not turn then
          return ok, rem, retry, reset, cur
        end
        local _, rem2, _, reset2 = eval(turn, now, r, 0)
        return true, rem2, retry, reset2, turn
      end,
    }
  end
end

-- token_bucket: the denial's state is the bucket refilled up to now; the
-- cost is taken from it, beyond empty.
ALGORITHMS.token_bucket_delay = with_delay('token_bucket', function(_, _, _, _, cost, _, cur)
  return {at = cur.at, f = cur.f + cost}
end)

-- gcra: the state the request leaves at its turn (TAT moves by the cost
-- from where it stands now).
ALGORITHMS.gcra_delay = with_delay('gcra', function(eval, s, now, r, cost, wait)
  local ok, _, _, _, nxt = eval(s, now + wait, r, cost)
  if ok then return nxt end
end)
