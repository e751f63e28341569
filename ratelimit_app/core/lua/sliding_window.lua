-- sliding_window: the exact sliding window log. One string holds the admission time of every unit
-- still in the window, oldest first, each as a 7-byte big-endian integer of microseconds (struct
-- '>I7'); a unit counts while it is younger than the period. 7 bytes per unit of limit, where a sorted
-- set member costs about 118.
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     the policy's state (its entry in the identity's key, or, after an upgrade, the value of
--              its key in the previous release's layout, which has the same format; false when
--              missing): the log
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed in any window of period_ms (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us: until the newest unit leaves the
--   window, 0 when none is live), retry (us, 0 when allowed, -1 when cost > capacity: never), and the
--   write that charges the hit, as data (decide.lua runs it only when every policy allows): the new
--   log (the live units, then `cost` new ones), and reset after the charge (us: the period), which
--   is also when the entry expires.
-- State: one string of at most 7 x limit bytes; TTL (the entry's expiry) = period, set on every write,
-- so the entry expires with its newest unit. Units that left the window are dropped whenever the log is written. A new
-- unit is stamped no earlier than the newest one, so the log stays sorted even if Redis's clock steps
-- back (such a unit counts a little longer: stricter, never looser).

local function sliding_window(stored, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local since = now_us - period_us  -- a unit admitted at t is live while t > since
  local log = stored or ''
  local count = floor(#log / 7)
  -- first live unit (0-based), by binary search: the log is sorted
  local first, last = 0, count
  while first < last do
    local middle = floor((first + last) / 2)
    if unpack('>I7', log, 7 * middle + 1) > since then last = middle else first = middle + 1 end
  end
  local used = count - first
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  local newest = 0
  local reset_us = 0
  if used > 0 then
    newest = unpack('>I7', log, 7 * count - 6)
    reset_us = newest + period_us - now_us
  end
  if cost > capacity then
    return false, remaining, reset_us, -1
  end
  if used + cost > limit then
    -- the request fits once the (used + cost - limit) oldest live units have left the window
    local oldest = unpack('>I7', log, 7 * (first + used + cost - limit - 1) + 1)
    return false, remaining, reset_us, oldest + period_us - now_us
  end
  local stamp = now_us
  if newest > stamp then stamp = newest end
  local added = rep(pack('>I7', stamp), cost)
  if first > 0 or #log ~= 7 * count then log = sub(log, 7 * first + 1, 7 * count) end
  return true, remaining, reset_us, 0, log .. added, period_us
end
