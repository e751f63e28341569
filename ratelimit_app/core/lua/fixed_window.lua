-- fixed_window: a counter per window; windows are aligned to the Unix epoch (a daily limit resets at
-- 00:00 UTC), so every app server agrees on where a window starts.
--
-- Numbers: limit = units allowed per window; period = the window's length in ms; extra = 0.
-- State: the integer 4 x units used + window index mod 4; TTL (the entry's expiry) = time to the end of
-- the window (<= period, rounded up to a millisecond), set on every write. An entry lives at most one
-- millisecond into the next window, so the window index mod 4 tells a count of this window from a
-- stale one: an entry that outlives its window counts for nothing.
local function fixed_window(stored, key, now_us, cost, limit, period, extra)
  local window_us = period * 1000
  local window = floor(now_us / window_us)
  local reset_us = (window + 1) * window_us - now_us
  return count_in_window(stored, window, 4, reset_us, cost, limit)
end
