-- gcra: the generic cell rate algorithm. One timestamp, the theoretical arrival time (TAT): a request
-- of `cost` moves it `cost` emission intervals into the future and is allowed while the TAT stays
-- within `burst` intervals of now. Same admission as a token bucket, a third of its state.
--
-- Numbers: limit = requests per period (the sustained rate); period = its length in ms; extra = the
-- burst tolerance in requests (>= 1; the limit when the policy names no burst).
-- State: the integer TAT in microseconds since the epoch; TTL (the entry's expiry) = TAT - now
-- (<= burst x period / limit), after which a missing entry means the same thing as an idle client. The
-- emission interval is rounded up to whole microseconds, which can only make the limit stricter (by
-- under 1 us per request), never looser.
local function gcra(stored, key, now_us, cost, limit, period, extra)
  local burst = extra
  local interval = ceil(period * 1000 / limit)
  local tolerance = burst * interval
  local tat = stored or now_us
  if tat < now_us then tat = now_us end
  local reset_us = tat - now_us
  local remaining = floor((tolerance - reset_us) / interval)
  if remaining < 0 then remaining = 0 end
  if cost > burst then
    return false, remaining, reset_us, -1
  end
  local new_tat = tat + cost * interval
  if new_tat - now_us > tolerance then
    return false, remaining, reset_us, new_tat - now_us - tolerance
  end
  return true, remaining, reset_us, 0, new_tat, new_tat - now_us
end
