-- fixed_window: a counter per window; windows are aligned to the Unix epoch (a daily limit resets at
-- 00:00 UTC), so every app server agrees on where a window starts.
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     the policy's state (its entry in the identity's key, or, after an upgrade, the value
--              of its key in the previous release's layout, in the same format; false when missing):
--              the integer 4 x units used + window index mod 4
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed per window (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us), retry (us, 0 when allowed,
--   -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, and reset after the charge (us), which is also
--   when the entry expires.
-- State: one integer; TTL (the entry's expiry) = time to the end of the window (<= period, rounded up
-- to a millisecond), set on every write. An entry lives at most one millisecond into the next window,
-- so the window index mod 4 tells a count of this window from a stale one: an entry that outlives its
-- window counts for nothing.
local function fixed_window(stored, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local window = floor(now_us / period_us)
  local reset_us = (window + 1) * period_us - now_us
  local used = 0
  if stored then
    local value = tonumber(stored) or 0
    if value % 4 == window % 4 then used = floor(value / 4) end
  end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  if cost > capacity then
    return false, remaining, reset_us, -1
  end
  if used + cost > limit then
    return false, remaining, reset_us, reset_us
  end
  return true, remaining, reset_us, 0, (used + cost) * 4 + window % 4, reset_us
end
