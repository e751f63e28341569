-- sliding_window_counter: two fixed-window counters (current and previous) weighted by how much of
-- the previous window still overlaps the sliding window. O(1) memory; approximate (assumes the
-- previous window's traffic was evenly spread).
--
-- Numbers: limit = units allowed per window; period = the window's length in ms; extra = 0.
-- State: the current window's count c, the previous window's count p and the current window index
-- mod 4 (w): the integer (c x 2^25 + p) x 4 + w when c < 2^26 and p < 2^25, else 9 bytes, struct
-- '>BI4I4': w, c, p. TTL (the entry's expiry) = end of the next window (<= 2 x period, rounded up to a
-- millisecond), set on every write, because the current count still weighs on the next window. An
-- entry lives at most one millisecond into the window after next, so the window index mod 4 tells
-- this window, the previous one and a stale one apart.
-- Its remaining is the floor of limit - the estimate; its reset, when the estimate decays to 0.
local function sliding_window_counter(stored, key, now_us, cost, limit, period, extra)
  local window_us = period * 1000
  local window = floor(now_us / window_us)
  local elapsed = now_us - window * window_us
  local current, previous = counter_read(stored, window)
  local weight = (window_us - elapsed) / window_us
  local estimate = previous * weight + current
  local remaining = floor(limit - estimate)
  if remaining < 0 then remaining = 0 end
  local reset_us = 0
  if current > 0 then
    reset_us = 2 * window_us - elapsed
  elseif previous > 0 then
    reset_us = window_us - elapsed
  end
  if cost > limit then
    return false, remaining, reset_us, -1
  end
  if estimate + cost > limit then
    local retry_us
    if current + cost <= limit then
      -- fits later in this window, once enough of the previous window has slid out
      retry_us = ceil(window_us - elapsed - (limit - current - cost) * window_us / previous)
    else
      -- fits in the next window, once enough of this window's count has slid out
      retry_us = window_us - elapsed
      if current > 0 then
        local into_next = ceil(window_us - (limit - cost) * window_us / current)
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
  return true, remaining, reset_us, 0, value, 2 * window_us - elapsed
end
