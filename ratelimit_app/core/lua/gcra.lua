-- gcra: the generic cell rate algorithm. One timestamp, the theoretical arrival time (TAT): a request
-- of `cost` moves it `cost` emission intervals into the future and is allowed while the TAT stays
-- within capacity intervals of now. Same admission as a token bucket, a third of its state.
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     the policy's state (its entry in the identity's key, or, after an upgrade, the value
--              of its key in the previous release's layout, in the same format; false when missing):
--              the TAT in microseconds since the epoch
--   now_us     Redis TIME in microseconds
--   limit      ARGV: requests per period (integer >= 1): the sustained rate
--   period_ms  ARGV: period in milliseconds (integer >= 1)
--   capacity   ARGV: burst tolerance in requests (integer >= 1)
--   cost       units this request wants (integer >= 1)
-- Returns: allowed (boolean), remaining now (integer), reset now (us), retry (us, 0 when allowed,
--   -1 when cost > capacity: never), and the write that charges the hit, as data (decide.lua runs it
--   only when every policy allows): the new value, and reset after the charge (us), which is also
--   when the entry expires.
-- State: one integer; TTL (the entry's expiry) = TAT - now (<= capacity x
-- period / limit), after which a missing entry means the same thing as an idle client. The emission
-- interval is rounded up to whole microseconds, which can only make the limit stricter (by under 1 us
-- per request), never looser.
local function gcra(stored, now_us, limit, period_ms, capacity, cost)
  local interval = ceil(period_ms * 1000 / limit)
  local tolerance = capacity * interval
  local tat = tonumber(stored or 0) or 0
  if tat < now_us then tat = now_us end
  local reset_us = tat - now_us
  local remaining = floor((tolerance - reset_us) / interval)
  if remaining < 0 then remaining = 0 end
  if cost > capacity then
    return false, remaining, reset_us, -1
  end
  local new_tat = tat + cost * interval
  if new_tat - now_us > tolerance then
    return false, remaining, reset_us, new_tat - now_us - tolerance
  end
  return true, remaining, reset_us, 0, new_tat, new_tat - now_us
end
