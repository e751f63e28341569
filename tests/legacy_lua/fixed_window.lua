-- fixed_window: a counter per window; windows are aligned to the Unix epoch (a daily limit resets at
-- 00:00 UTC), so every app server agrees on where a window starts.
--
-- Called by decide.lua once per policy (this file defines a function; decide.lua is the entry point):
--   key        KEYS[i] of decide.lua: a string "<window index>:<units used in that window>"
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed per window (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us), retry (us, 0 when allowed,
--   -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, its TTL in ms, and reset after the charge (us).
-- State: one string; TTL = time to the end of the window (<= period), set on every write. The window
-- index is stored with the count, so a key that outlives its window by a millisecond counts for nothing.
local function fixed_window(key, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local window = floor(now_us / period_us)
  local reset_us = (window + 1) * period_us - now_us
  local used = 0
  local stored = call('GET', key)
  if stored then
    local separator = string.find(stored, ':', 1, true)
    if separator and tonumber(string.sub(stored, 1, separator - 1)) == window then
      used = tonumber(string.sub(stored, separator + 1)) or 0
    end
  end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  if cost > capacity then
    return false, remaining, reset_us, -1
  end
  if used + cost > limit then
    return false, remaining, reset_us, reset_us
  end
  return true, remaining, reset_us, 0, format('%d:%d', window, used + cost), ceil(reset_us / 1000),
    reset_us
end
