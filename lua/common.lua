-- common.lua: helpers shared by every Tollgate script. The scripts are
-- assembled by embed.go: this file first, then one file per algorithm, then
-- the entry point (decide.lua or lease.lua). Everything is local: Redis
-- forbids globals in scripts.
--
-- Units: instants and durations are integer microseconds (Redis TIME);
-- counts are integers. Lua numbers are doubles, exact up to 2^53, which
-- the Go side guarantees for every argument. The arithmetic mirrors the Go
-- functions of package limiter (which work in nanoseconds) step by step.

local MAX_SAFE = 9007199254740992 -- 2^53

-- ALGORITHMS maps an algorithm name to a constructor of its
-- implementation, a table of
--   decode(raw)              -> state       raw is the stored value or false
--   encode(state)            -> string
--   eval(s, now, r, cost)    -> allowed, remaining, retry_us, reset_us, next
--   ttl(s, now, r)           -> µs until s equals a fresh bucket (<= 0: fresh)
--   refund(s, r, cost, at)   -> state with cost units charged at `at` given back
-- and, for an algorithm whose state is not one string value, instead of
-- decode, encode and ttl:
--   load(key)                -> state, exists   read the state of key
--   save(key, s, r, now)     write state s of key (with its TTL), or delete
--                            the key when s equals a fresh bucket
-- (sliding_log keeps a list and reads only what a call needs; its refund
-- writes the key itself and returns the state read again).
-- r is a rate: {limit, window, burst, minint, cap} (see parse_check).
-- Redis runs the whole script on every call and keeps nothing between
-- calls, so an algorithm's functions are only built when a call uses it
-- (see algorithm): a one-check call does not pay for all six.
local ALGORITHMS = {}
local BUILT = {}

-- algorithm returns the implementation of the algorithm called name, or
-- raises an error for an unknown name.
local function algorithm(name)
  local alg = BUILT[name]
  if alg then return alg end
  local build = ALGORITHMS[name]
  if not build then
    error('tollgate: unknown algorithm ' .. tostring(name))
  end
  alg = build()
  BUILT[name] = alg
  return alg
end

-- ceil_pos rounds a non-negative float up; 0 for x <= 0 or NaN.
local function ceil_pos(x)
  if x ~= x or x <= 0 then return 0 end
  if x >= MAX_SAFE then return MAX_SAFE end
  return math.ceil(x)
end

-- floor_units clamps x to [0, m] and rounds it down.
local function floor_units(x, m)
  if x ~= x or x <= 0 then return 0 end
  if x >= m then return m end
  return math.floor(x)
end

-- idiv is floor(a / b) for integers a >= 0, b > 0, exact even where the
-- float quotient rounds to the wrong side of an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- window_start is the start of the window of length w that holds t, windows
-- being aligned to the Unix epoch.
local function window_start(t, w)
  return idiv(t, w) * w
end

-- The wait search (settle in limiter/algorithms.go). A wait (Retry-After,
-- Reset) starts from a float estimate w and is checked against the
-- admission test itself, so that it is never earlier than the quota
-- really frees: when the test holds at w, walk down one µs at a time
-- while it still holds, at most 8 times; when it does not, walk up by
-- steps of 1 µs that double after the fourth, until it holds (stopping
-- at MAX_SAFE). Each algorithm that needs it runs this search with its
-- own test written inline (token_bucket.lua's search, sliding_window.lua's
-- wait): a test function called per evaluation, with its data in
-- tables, cost Redis more than the arithmetic.

-- int formats an integer-valued number for a Redis argument (tostring
-- would print 1e+15).
local function int(x)
  return string.format('%.0f', x)
end

-- Calls applied once. A call that may be retried or replayed (a
-- settlement, a recovery charge, a refund, a lease give-back) carries an
-- id, sent as its last key: <prefix>:once:{<tenant>}:<id>, in the hash
-- slot of the buckets it changes. The first run of the call records its
-- reply there for ONCE_TTL_MS (limiter.IdempotencyTTL); a run that finds
-- the key changes nothing and answers the recorded reply.
local ONCE_TTL_MS = 600000

-- once_get returns the reply recorded under id key, or nil.
local function once_get(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local out = {}
  for v in string.gmatch(raw, '[^,]+') do out[#out + 1] = tonumber(v) end
  return out
end

-- once_put records reply out (a list of integers) under id key.
local function once_put(key, out)
  local parts = {}
  for i = 1, #out do parts[i] = int(out[i]) end
  redis.call('SET', key, table.concat(parts, ','), 'PX', ONCE_TTL_MS)
end

-- now_us returns the instant of the call: Redis TIME, read once per script.
-- override (an argument) replaces it only in tests; production passes "0".
local function now_us(override)
  local t = tonumber(override)
  if t and t > 0 then return t end
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end

-- CHECK_ARGS is the number of arguments of one check, after the script's
-- own leading arguments: algorithm, limit, window_us, burst, min_interval_us,
-- cost, shadow ("1" or "0").
local CHECK_ARGS = 7

-- RATES keeps the rate tables parse_check built, by their arguments
-- (limit, window, burst, min_interval: RATES[limit][window][burst][minint]),
-- in the function library only (library.go sets it; a script run by
-- EVALSHA starts from nothing on every call, so there it stays nil). Redis
-- keeps a library's Lua state between calls, so a decision finds its
-- rate with four lookups of strings Redis has already made, instead of
-- four conversions and a new table: about 5% of a token bucket decision
-- (bench/scripts.sh's method). A rate table is never changed after it is
-- built, except by calendar, whose rate holds its call's period bounds
-- and is built afresh every time. RATES holds at most RATES_MAX rates (a
-- fleet has a few per policy and tier; overrides can make one per
-- tenant): past that it starts afresh, so Redis's Lua memory stays
-- bounded whatever the rates, at about 2 MB (a rate costs about 1 KB
-- there: TestRedisFunctionRatesBounded). With more rates than that in
-- use, the memo only churns: a decision then builds its rate as a script
-- does, and a few tables more.
local RATES, RATES_N = nil, 0
local RATES_MAX = 2048

-- new_rate builds the rate of a check from its arguments' strings.
local function new_rate(sl, sw, sb, sm)
  local limit, burst = tonumber(sl), tonumber(sb)
  local cap = limit
  if burst > 0 then cap = burst end
  -- Every field in the constructor: a field added later grows the
  -- table's hash part, which costs Redis more than building it.
  return {
    limit = limit,
    window = tonumber(sw),
    burst = burst,
    minint = tonumber(sm),
    cap = cap,
  }
end

-- parse_check reads check i whose arguments start after ARGV[base]. It
-- returns the algorithm implementation, the rate, the cost and the shadow
-- flag.
local function parse_check(i, base)
  local b = base + (i - 1) * CHECK_ARGS
  local name = ARGV[b + 1]
  local alg = algorithm(name)
  local sl, sw, sb, sm = ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local r
  if RATES and name ~= 'calendar' then
    if RATES_N >= RATES_MAX then RATES, RATES_N = {}, 0 end
    local t = RATES[sl]
    if not t then t = {}; RATES[sl] = t end
    local u = t[sw]
    if not u then u = {}; t[sw] = u end
    local v = u[sb]
    if not v then v = {}; u[sb] = v end
    r = v[sm]
    if not r then
      r = new_rate(sl, sw, sb, sm)
      v[sm] = r
      RATES_N = RATES_N + 1
    end
  else
    r = new_rate(sl, sw, sb, sm)
  end
  return alg, r, tonumber(ARGV[b + 6]), ARGV[b + 7] == '1'
end

-- Partition indexes. A policy with a key inside a tenant keeps one bucket
-- per part, <prefix>:<algo>:{<tenant>}:<policy>:<part>, whose parts only
-- the requests know. So that a reset can find them without scanning the
-- keyspace, the set <prefix>:parts:{<tenant>}:<policy> (the index of the
-- tenant's parts of the policy) lists every such bucket, and lives at
-- least as long as the longest-lived of them: every write of a bucket adds
-- it (an idempotent SADD, so a bucket written before its index existed,
-- or whose index was evicted, is listed again by its next write), and a
-- write whose TTL outlasts the index's gives the index twice that TTL, so
-- most writes of a live part cost an SADD and a PTTL. A member whose
-- bucket has expired stays until a later addition draws it (two random
-- members are checked per new member), so the set holds about twice the
-- live parts at most. The index
-- key is derived from the bucket key rather than passed: it is in the
-- same hash slot (the same {<tenant>} tag), and a decision pays no
-- argument for it. An unpartitioned key costs one string search.
local function index_part(key, ttl_ms)
  local c = string.find(key, '}:', 1, true)
  if not c then return end
  local p = string.find(key, ':', c + 2, true)
  if not p then return end
  local a = string.find(key, ':', 1, true)
  local b = string.find(key, ':', a + 1, true)
  local idx = string.sub(key, 1, a) .. 'parts' .. string.sub(key, b, p - 1)
  if redis.call('SADD', idx, key) == 1 then
    local drawn = redis.call('SRANDMEMBER', idx, 2)
    for i = 1, #drawn do
      if drawn[i] ~= key and redis.call('EXISTS', drawn[i]) == 0 then
        redis.call('SREM', idx, drawn[i])
      end
    end
  end
  if redis.call('PTTL', idx) < ttl_ms then
    redis.call('PEXPIRE', idx, 2 * ttl_ms)
  end
end

-- store writes state s of key with a TTL that ends when s equals a fresh
-- bucket (rounded up to the millisecond), or deletes the key when s already
-- does: an expired key and a fresh bucket mean the same thing.
local function store(key, alg, s, r, now)
  local ttl = alg.ttl(s, now, r)
  if ttl <= 0 then
    redis.call('DEL', key)
    return
  end
  -- A number argument is formatted by Redis itself, exactly for integers
  -- this small (string.format would cost more than the SET).
  local ms = math.ceil(ttl / 1000)
  redis.call('SET', key, alg.encode(s), 'PX', ms)
  index_part(key, ms)
end


-- load reads the state of key for alg, and whether the key exists.
local function load(alg, key)
  if alg.load then return alg.load(key) end
  local raw = redis.call('GET', key)
  return alg.decode(raw), raw ~= false
end

-- save writes state s of key for alg (see store).
local function save(key, alg, s, r, now)
  if alg.save then
    alg.save(key, s, r, now)
  else
    store(key, alg, s, r, now)
  end
end
