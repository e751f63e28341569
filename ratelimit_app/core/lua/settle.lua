-- settle: the real usage of an admitted request, set against the usage limits it reserved an estimate
-- of (decide.lua charged the estimate when it admitted the request): the unused part is given back, an
-- overrun is charged. One call per identity, after the response ended (ratelimit_app/core/usage.py).
-- scripts.py puts prelude.lua and the algorithms' codes (FIXED_CODE, LOG_CODE, COUNTER_CODE,
-- BUCKET_CODE, GCRA_CODE, LONG_LOG_UNITS) before this file.
--
-- ARGV[1]      every number, packed big-endian in one string: struct '>i8', the clock shift in ms (as
--              decide.lua's), then for each policy i, struct '>i8i8i8i8i8i8i8Bc0':
--                code, limit, period, extra   as in decide.lua (no shadow flag, no own cost)
--                estimate   the units the request reserved (>= 1)
--                used       the units it used (>= 0)
--                age        us: the time since the reservation was decided, measured by the app server
--                           from before it sent the decision, plus a margin for this call's way to Redis
--                           (usage.AGE_MARGIN_US): the reservation was charged at or after now - age
--                tag        its length, then its bytes (as in decide.lua)
-- KEYS[1]      the identity's state key (decide.lua's KEYS[j])
-- KEYS[1 + i]  policy i's key of its own, "<prefix>:{<digest>}<tag>" (read only for a long sliding log)
-- Reply: the number of policies whose state changed.
--
-- What each algorithm does with `used - estimate` (negative: given back; positive: an overrun, charged):
--   sliding_window            exact count: the given-back units are removed from the log, the oldest
--                             stamped at or after now - age: this request's, or those of a request
--                             admitted just before it (within the margin), which would have left the
--                             window sooner than this one's (stricter, never looser); an overrun's units
--                             are added, stamped now
--   fixed_window              exact while the window of the reservation lasts (given back only when
--                             now - age is in the current window); an overrun counts in the current one
--   sliding_window_counter    the same, with its current window's count
--   token_bucket              exact: tokens put back (up to a full bucket) or taken (down to an empty
--                             bucket: a debt below empty is not kept)
--   gcra                      exact: the arrival time moved back or forward by the units' intervals
-- Any other code (a calendar quota) is left as it is: the request stays charged at its estimate.
-- Every write keeps the rules of decide.lua: an entry expires when its state is back to nothing, the key
-- with its latest entry, a long log's key a period after its newest unit.
local numbers = ARGV[1]
local shift, position = unpack('>i8', numbers)
local time = call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2]) + shift * 1000
local now_ms = floor(now_us / 1000)

local states, expiries, old_latest = read_entries(call('GET', KEYS[1]) or '', now_ms)

-- the index (0-based) of the first unit of `log` stamped above `after`: the log is sorted
local function first_above(log, after)
  local low, high = 0, #log / 7
  while low < high do
    local middle = floor((low + high) / 2)
    if unpack('>I7', log, 7 * middle + 1) > after then high = middle else low = middle + 1 end
  end
  return low
end

local function sliding_window(stored, key, delta, since_us, limit, period)
  local window_us = period * 1000
  local long = limit >= LONG_LOG_UNITS
  local log = stored or ''
  if #log % 7 ~= 0 or (long and not stored) then log = call('GET', key) or '' end
  log = sub(log, 7 * first_above(log, now_us - window_us) + 1)
  if delta < 0 then
    local from = first_above(log, since_us - 1)
    local take = -delta
    if take > #log / 7 - from then take = #log / 7 - from end
    log = sub(log, 1, 7 * from) .. sub(log, 7 * (from + take) + 1)
  else
    local stamp = now_us
    if #log > 0 and unpack('>I7', log, #log - 6) > stamp then stamp = unpack('>I7', log, #log - 6) end
    log = log .. rep(pack('>I7', stamp), delta)
  end
  if #log == 0 then
    if long then call('DEL', key) end
    return false
  end
  local newest = unpack('>I7', log, #log - 6)
  local expiry = ceil((newest + window_us) / 1000)
  if not long then return log, expiry end
  local key_expiry = expiry + period
  call('SET', key, log, 'PXAT', format('%d', key_expiry))
  return pack('>c1I6I7I6', 'L', 0, newest, key_expiry), expiry
end

local function fixed_window(stored, delta, since_us, period)
  local window_us = period * 1000
  local window = floor(now_us / window_us)
  if delta < 0 and floor(since_us / window_us) ~= window then return nil end
  local count = 0
  if stored and stored % 4 == window % 4 then count = floor(stored / 4) end
  count = count + delta
  if count <= 0 then return false end
  return count * 4 + window % 4, ceil((window + 1) * window_us / 1000)
end

local function sliding_window_counter(stored, delta, since_us, period)
  local window_us = period * 1000
  local window = floor(now_us / window_us)
  if delta < 0 and floor(since_us / window_us) ~= window then return nil end
  local current, previous = counter_read(stored, window)
  current = current + delta
  if current < 0 then current = 0 end
  if current == 0 and previous == 0 then return false end
  local expiry = ceil((window + 2) * window_us / 1000)
  if current < 67108864 and previous < 33554432 then
    return (current * 33554432 + previous) * 4 + window % 4, expiry
  end
  return pack('>BI4I4', window % 4, current, previous), expiry
end

local function token_bucket(stored, delta, limit, period, burst)
  local full = burst * period
  local units, stamp = bucket_read(stored, now_ms, full)
  if now_ms > stamp then
    units = units + (now_ms - stamp) * limit
    stamp = now_ms
  end
  units = units - delta * period
  if units < 0 then units = 0 end
  if units >= full then return false end
  local missing = full - units
  local to_full_ms = ceil(missing / limit)
  local _, bits = frexp(to_full_ms + 1)
  bits = bits + 1
  local span = 2 ^ bits
  if missing * span < 140737488355328 then
    return (missing * span + stamp % span) * 64 + bits, now_ms + to_full_ms
  end
  return pack('>I7I5', missing, stamp % 1099511627776), now_ms + to_full_ms
end

local function gcra(stored, delta, limit, period)
  local interval = ceil(period * 1000 / limit)
  local tat = stored or now_us
  if tat < now_us then tat = now_us end
  tat = tat + delta * interval
  if tat <= now_us then return false end
  return tat, now_ms + ceil((tat - now_us) / 1000)
end

local changed, latest, key_index = 0, 0, 1
while position <= #numbers do
  local code, limit, period, extra, estimate, used, age, tag
  code, limit, period, extra, estimate, used, age, tag, position =
    unpack('>i8i8i8i8i8i8i8Bc0', numbers, position)
  key_index = key_index + 1
  local delta = used - estimate
  if estimate < 1 or used < 0 or age < 0 or not KEYS[key_index] then
    return redis.error_reply('ERR ratelimit settle: bad arguments')
  end
  if delta ~= 0 then
    local stored = states[tag] or false
    if stored and #stored == 7 and code ~= LOG_CODE then stored = unpack('>I7', stored) end
    local state, expiry = nil, 0
    if code == LOG_CODE then
      state, expiry = sliding_window(stored, KEYS[key_index], delta, now_us - age, limit, period)
    elseif code == FIXED_CODE then
      state, expiry = fixed_window(stored, delta, now_us - age, period)
    elseif code == COUNTER_CODE then
      state, expiry = sliding_window_counter(stored, delta, now_us - age, period)
    elseif code == BUCKET_CODE then
      state, expiry = token_bucket(stored, delta, limit, period, extra)
    elseif code == GCRA_CODE then
      state, expiry = gcra(stored, delta, limit, period)
    end
    if state == false then
      if states[tag] then states[tag], changed = nil, changed + 1 end
    elseif state ~= nil then
      if type(state) == 'number' then state = pack('>I7', state) end
      states[tag], expiries[tag], changed = state, expiry, changed + 1
    end
  end
end
if #KEYS ~= key_index then return redis.error_reply('ERR ratelimit settle: bad arguments') end

if changed > 0 then
  local written = ''
  for tag, state in pairs(states) do
    local expiry = expiries[tag]
    written = written .. pack('>Bc0I6I4', #tag, tag, expiry, #state) .. state
    if expiry > latest then latest = expiry end
  end
  if written == '' then
    call('DEL', KEYS[1])
  elseif latest > old_latest then
    call('SET', KEYS[1], written, 'PXAT', format('%d', latest))
  else
    call('SET', KEYS[1], written, 'KEEPTTL')
  end
end
return changed
