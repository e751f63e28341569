-- token_bucket: a bucket of `capacity` tokens refilled continuously at limit / period; a request takes
-- `cost` tokens. Integer arithmetic only: one token is period_ms units, and each millisecond refills
-- `limit` units, so refills are exact and never drift.
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     the policy's state (its entry in the identity's key, or, after an upgrade, the value
--              of its key in the previous release's layout, in the same format; false when missing):
--              the units missing from a full bucket (d)
--              and the time of the last refill in ms, kept modulo a span S = 2^k ms longer than twice
--              the entry's TTL, either as the integer (d x S + time mod S) x 64 + k, or (when that would
--              not stay below 2^53) as 12 bytes, struct '>I7I5': d, time mod 2^40. An integer starts
--              with a digit; the 12 bytes start with a byte below 32 (d < 2^53): they never mix up.
--              (A bucket that is not full is the common case, and its d is small: the integer fits.)
--   now_us     Redis TIME in microseconds
--   limit      ARGV: tokens refilled per period (integer >= 1): the sustained rate
--   period_ms  ARGV: refill period in milliseconds (integer >= 1)
--   capacity   ARGV: bucket size, the burst (integer >= 1)
--   cost       tokens this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us), retry (us, 0 when allowed,
--   -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, and reset after the charge (us), which is also
--   when the entry expires.
-- State: one integer, or a 12-byte string when d x S reaches 2^47 (a large bucket far from full: an
-- emptied 1,000/day bucket of 1,000); TTL (the entry's expiry) = time until the bucket is full again
-- (<= capacity x period / limit), after which a missing entry means the same thing as a full bucket.
-- The entry never lives longer than S / 2, so the time since the last refill is exact modulo S; a
-- larger one can only mean that Redis's clock stepped back, and counts as 0 (stricter, never looser).
local function token_bucket(stored, now_us, limit, period_ms, capacity, cost)
  local now_ms = floor(now_us / 1000)
  local full = capacity * period_ms
  local units, stamp
  if stored then
    local span, stamp_mod
    local missing
    if type(stored) == 'string' and #stored == 12 and byte(stored) < 32 then
      missing, stamp_mod = unpack('>I7I5', stored)
      span = 1099511627776
    else
      local value = tonumber(stored)
      if value then
        local bits = value % 64
        value = (value - bits) / 64
        span = 2 ^ bits
        stamp_mod = value % span
        missing = (value - stamp_mod) / span
      end
    end
    if missing then
      units = full - missing
      if units < 0 then units = 0 end
      local since = (now_ms - stamp_mod) % span
      if since < span / 2 then stamp = now_ms - since else stamp = now_ms + span - since end
    end
  end
  if units == nil or stamp == nil then
    units, stamp = full, now_ms
  end
  local elapsed = now_ms - stamp
  if elapsed < 0 then elapsed = 0 end
  units = units + elapsed * limit
  if units >= full then
    units = full
  end
  -- advance the refill clock by whole milliseconds only, so no partial refill is ever lost
  stamp = stamp + elapsed
  local remaining = floor(units / period_ms)
  local reset_us = ceil((full - units) / limit) * 1000
  local need = cost * period_ms
  if cost > capacity then
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
