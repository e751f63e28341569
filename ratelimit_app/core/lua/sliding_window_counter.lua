-- sliding_window_counter: two fixed-window counters (current and previous) weighted by how much of
-- the previous window still overlaps the sliding window. O(1) memory; approximate (assumes the
-- previous window's traffic was evenly spread).
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     the policy's state (its entry in the identity's key, or, after an upgrade, the value
--              of its key in the previous release's layout, in the same format; false when missing):
--              the current window's count c, the previous
--              window's count p and the current window index mod 4 (w), either as the integer
--              (c x 2^25 + p) x 4 + w (when c < 2^26 and p < 2^25), or as 9 bytes, struct '>BI4I4':
--              w, c, p. An integer starts with a digit, the 9 bytes with w (a byte below 4).
--   now_us     Redis TIME in microseconds
--   limit      ARGV: units allowed per window (integer >= 1)
--   period_ms  ARGV: window length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer, floor of limit - estimate), reset now (us: until
--   the estimate decays to 0), retry (us, 0 when allowed, -1 when cost > capacity: never), and the
--   write that charges the hit, as data (decide.lua runs it only when every policy allows): the new
--   value, and reset after the charge (us), which is also when the entry expires.
-- State: one integer, or a 9-byte string for counts of 2^25 and more; TTL (the entry's expiry) = end of
-- the next window (<= 2 x period, rounded up to a millisecond), set on
-- every write, because the current count still weighs on the next window. A key lives at most one
-- millisecond into the window after next, so the window index mod 4 tells this window, the previous
-- one and a stale one apart.
local function sliding_window_counter(stored, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local window = floor(now_us / period_us)
  local elapsed = now_us - window * period_us
  local current, previous = 0, 0
  if stored then
    local stored_window, stored_current, stored_previous
    local value = tonumber(stored)
    if value then
      stored_window = value % 4
      value = (value - stored_window) / 4
      stored_previous = value % 33554432
      stored_current = (value - stored_previous) / 33554432
    elseif #stored == 9 then
      stored_window, stored_current, stored_previous = unpack('>BI4I4', stored)
    end
    if stored_window == window % 4 then
      current, previous = stored_current, stored_previous
    elseif stored_window == (window - 1) % 4 then
      previous = stored_current
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
  local value
  if current + cost < 67108864 and previous < 33554432 then  -- the integer stays below 2^53
    value = ((current + cost) * 33554432 + previous) * 4 + window % 4
  else
    value = pack('>BI4I4', window % 4, current + cost, previous)
  end
  return true, remaining, reset_us, 0, value, 2 * period_us - elapsed
end
