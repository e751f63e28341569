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
--   window; nil when allowed, since a charged hit never reports it), retry (us, 0 when allowed, -1 when
--   cost > capacity: never), apply (function committing the hit and returning reset in us), and when
--   allowed, reset_now (function returning reset now, for a hit that another policy refused).
-- State: one sorted set with at most limit live members; TTL = period, set on every write. Members are
-- unique even when several requests share one microsecond (ZADD NX, then the next free suffix).
local function sliding_window(key, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local window_start = now_us - period_us
  -- string.format('%d'): concatenating a number would print it with 14 significant digits, which
  -- rounds a microsecond timestamp to about 100 us
  local live_from = string.format('(%d', window_start)
  local used = redis.call('ZCOUNT', key, live_from, '+inf')
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  -- reset now: until the newest live unit leaves the window (an extra read, so only when reported)
  local function reset_now()
    if used == 0 then return 0 end
    local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
    return tonumber(newest[2]) + period_us - now_us
  end
  if cost > capacity then
    return false, remaining, reset_now(), -1, nil
  end
  if used + cost > limit then
    -- the request fits once the (used + cost - limit) oldest live units have left the window
    local oldest = redis.call('ZRANGEBYSCORE', key, live_from, '+inf', 'WITHSCORES', 'LIMIT',
      used + cost - limit - 1, 1)
    return false, remaining, reset_now(), tonumber(oldest[2]) + period_us - now_us, nil
  end
  return true, remaining, nil, 0, function()
    redis.call('ZREMRANGEBYSCORE', key, '-inf', window_start)
    local suffix = 0
    for _ = 1, cost do
      while redis.call('ZADD', key, 'NX', now_us, string.format('%d:%d', now_us, suffix)) == 0 do
        suffix = suffix + 1
      end
      suffix = suffix + 1
    end
    redis.call('PEXPIRE', key, period_ms)
    return period_us
  end, reset_now
end
