-- token_bucket: a bucket of `burst` tokens refilled continuously at limit / period; a request takes
-- `cost` tokens. Integer arithmetic only: one token is `period` units, and each millisecond refills
-- `limit` units, so refills are exact and never drift.
--
-- Numbers: limit = tokens refilled per period (the sustained rate); period = the refill period in ms;
-- extra = the bucket's size in tokens, the burst (>= 1; the limit when the policy names no burst).
-- State: the units missing from a full bucket (d) and the time of the last refill in ms, kept modulo a
-- span S = 2^k ms longer than twice the entry's TTL: the integer (d x S + time mod S) x 64 + k, or, when
-- that would not stay below 2^53 (d x S reaches 2^47: a large bucket far from full, an emptied
-- 1,000/day bucket of 1,000), 12 bytes, struct '>I7I5': d, time mod 2^40. (A bucket that is not full
-- is the common case, and its d is small: the integer fits.) TTL (the entry's expiry) = time until the
-- bucket is full again (<= burst x period / limit), after which a missing entry means the same thing as
-- a full bucket. The entry never lives longer than S / 2, so the time since the last refill is exact
-- modulo S; a larger one can only mean that Redis's clock stepped back, and counts as 0 (stricter,
-- never looser).
local function token_bucket(stored, key, now_us, cost, limit, period, extra)
  local refill_ms, burst = period, extra
  local now_ms = floor(now_us / 1000)
  local full = burst * refill_ms
  local units, stamp = bucket_read(stored, now_ms, full)
  local elapsed = now_ms - stamp
  if elapsed < 0 then elapsed = 0 end
  units = units + elapsed * limit
  if units >= full then
    units = full
  end
  -- advance the refill clock by whole milliseconds only, so no partial refill is ever lost
  stamp = stamp + elapsed
  local remaining = floor(units / refill_ms)
  local reset_us = ceil((full - units) / limit) * 1000
  local need = cost * refill_ms
  if cost > burst then
    return false, remaining, reset_us, -1
  end
  if units < need then
    return false, remaining, reset_us, ceil((need - units) / limit) * 1000
  end
  local left = units - need
  local to_full_ms = ceil((full - left) / limit)
  -- the span: the least power of two above twice the TTL (plus a millisecond for Redis's expiry check)
  local _, bits = frexp(to_full_ms + 1)
  bits = bits + 1
  local span = 2 ^ bits
  local value
  local missing = full - left
  if missing * span < 140737488355328 then  -- 2^47: the integer stays below 2^53, exact in Lua
    value = (missing * span + stamp % span) * 64 + bits
  else
    value = pack('>I7I5', missing, stamp % 1099511627776)
  end
  return true, remaining, reset_us, 0, value, to_full_ms * 1000
end
