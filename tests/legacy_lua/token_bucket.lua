-- token_bucket: a bucket of `capacity` tokens refilled continuously at limit / period; a request takes
-- `cost` tokens. Integer arithmetic only: one token is period_ms units, and each millisecond refills
-- `limit` units, so refills are exact and never drift.
--
-- Called by decide.lua once per policy (this file defines a function; decide.lua is the entry point):
--   key        KEYS[i] of decide.lua: a string "<tokens in units>:<time of the last refill, ms>"
--   now_us     Redis TIME in microseconds
--   limit      ARGV: tokens refilled per period (integer >= 1): the sustained rate
--   period_ms  ARGV: refill period in milliseconds (integer >= 1)
--   capacity   ARGV: bucket size, the burst (integer >= 1)
--   cost       tokens this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us), retry (us, 0 when allowed,
--   -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, its TTL in ms, and reset after the charge (us).
-- State: one string (cheaper than a hash: one GET and one SET); TTL = time until the bucket is full
-- again (<= capacity x period / limit), after which a missing key means the same thing as a full bucket.
local function token_bucket(key, now_us, limit, period_ms, capacity, cost)
  local now_ms = floor(now_us / 1000)
  local full = capacity * period_ms
  local units, stamp
  local stored = call('GET', key)
  if stored then
    local separator = string.find(stored, ':', 1, true)
    if separator then
      units = tonumber(string.sub(stored, 1, separator - 1))
      stamp = tonumber(string.sub(stored, separator + 1))
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
  return true, remaining, reset_us, 0, format('%d:%d', left, stamp), to_full_ms, to_full_ms * 1000
end
