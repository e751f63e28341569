-- sliding_window_counter: two fixed-window counters (current and previous) weighted by how much of
-- the previous window still overlaps the sliding window. O(1) memory; approximate (assumes the
-- previous window's traffic was evenly spread).
--
-- Called by decide.lua once per policy (this file defines a function; decide.lua is the entry point):
--   key        KEYS[i] of decide.lua: a string "<current window index>:<its count>:<previous count>"
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed per window (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer, floor of limit - estimate), reset now (us: until
--   the estimate decays to 0), retry (us, 0 when allowed, -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, its TTL in ms, and reset after the charge (us).
-- State: one string (one GET, one SET); TTL = end of the next window (<= 2 x period), set on every write, because the
-- current count still weighs on the next window.
local function sliding_window_counter(key, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local window = floor(now_us / period_us)
  local elapsed = now_us - window * period_us
  local current, previous = 0, 0
  local stored = call('GET', key)
  if stored then
    local first = string.find(stored, ':', 1, true)
    local second = first and string.find(stored, ':', first + 1, true)
    if second then
      local stored_window = tonumber(string.sub(stored, 1, first - 1))
      if stored_window == window then
        current = tonumber(string.sub(stored, first + 1, second - 1)) or 0
        previous = tonumber(string.sub(stored, second + 1)) or 0
      elseif stored_window == window - 1 then
        previous = tonumber(string.sub(stored, first + 1, second - 1)) or 0
      end
    end
  end
  local weight = (period_us - elapsed) / period_us
  local estimate = previous * weight + current
  local remaining = floor(limit - estimate)
  if remaining < 0 then remaining = 0 end
  local reset_us = 0
  if current > 0 then
    reset_us = 2 * period_us - elapsed
  elseif previous > 0 then
    reset_us = period_us - elapsed
  end
  if cost > capacity then
    return false, remaining, reset_us, -1
  end
  if estimate + cost > limit then
    local retry_us
    if current + cost <= limit then
      -- fits later in this window, once enough of the previous window has slid out
      retry_us = ceil(period_us - elapsed - (limit - current - cost) * period_us / previous)
    else
      -- fits in the next window, once enough of this window's count has slid out
      retry_us = period_us - elapsed
      if current > 0 then
        local into_next = ceil(period_us - (limit - cost) * period_us / current)
        if into_next > 0 then retry_us = retry_us + into_next end
      end
    end
    if retry_us < 1 then retry_us = 1 end
    return false, remaining, reset_us, retry_us
  end
  return true, remaining, reset_us, 0, format('%d:%d:%d', window, current + cost, previous),
    ceil((2 * period_us - elapsed) / 1000), 2 * period_us - elapsed
end
