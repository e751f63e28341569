-- sliding_window: the exact sliding window log. A sorted set holds one member per unit admitted,
-- scored by its admission time in microseconds; a unit counts while it is younger than the period.
--
-- Called by decide.lua once per policy (this file defines a function; decide.lua is the entry point):
--   key        KEYS[i] of decide.lua: a sorted set, member "<now_us>:<n>", score now_us
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed in any window of period_ms (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us: until the newest unit leaves the
--   window; nil when allowed, since a charged hit reports the period instead: decide.lua asks
--   sliding_window_reset only when the hit is not charged), retry (us, 0 when allowed, -1 when
--   cost > capacity: never), then in place of a string write: the live bound "(<window start us>"
--   below which units are trimmed (false when no unit is live: then there is nothing to trim and reset
--   now is 0) and nil (decide.lua passes them to sliding_window_charge, which writes the log), and
--   reset after the charge (us: the period).
-- State: one sorted set with at most limit live members; TTL = period, set on every write. Members are
-- unique even when several requests share one microsecond (ZADD NX, then the next free suffix).

-- reset now: until the newest live unit leaves the window (0 when none is live)
local function sliding_window_reset(key, now_us, period_us, live_from)
  local newest = call('ZREVRANGEBYSCORE', key, '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
  if newest[2] == nil then return 0 end
  return tonumber(newest[2]) + period_us - now_us
end

-- the charge: drop the units that left the window, log `cost` new ones, keep the key for one period.
-- Scores and members are formatted once with '%d' (concatenating a number would print it with 14
-- significant digits, which rounds a microsecond timestamp to about 100 us).
local function sliding_window_charge(key, now_us, period_us, live_from, cost)
  if live_from then call('ZREMRANGEBYSCORE', key, '-inf', live_from) end
  local score = format('%d', now_us)
  local suffix = 0
  for _ = 1, cost do
    while call('ZADD', key, 'NX', score, suffix == 0 and score .. ':0' or score .. ':' .. suffix) == 0 do
      suffix = suffix + 1
    end
    suffix = suffix + 1
  end
  call('PEXPIRE', key, period_us / 1000)
end

local function sliding_window(key, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local live_from = format('(%d', now_us - period_us)
  local used = call('ZCOUNT', key, live_from, '+inf')
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  if cost > capacity then
    return false, remaining, sliding_window_reset(key, now_us, period_us, live_from), -1
  end
  if used + cost > limit then
    -- the request fits once the (used + cost - limit) oldest live units have left the window
    local oldest = call('ZRANGEBYSCORE', key, live_from, '+inf', 'WITHSCORES', 'LIMIT',
      used + cost - limit - 1, 1)
    return false, remaining, sliding_window_reset(key, now_us, period_us, live_from),
      tonumber(oldest[2]) + period_us - now_us
  end
  if used == 0 then
    -- no live unit: the log is empty or expiring (its TTL is one period from its newest unit), so
    -- nothing needs trimming when it is charged, and reset now is 0
    return true, remaining, 0, 0, false, nil, period_us
  end
  return true, remaining, nil, 0, live_from, nil, period_us
end
