-- calendar_window: a fixed window whose boundaries are calendar days, weeks (from Monday) or months in
-- a time zone: "10,000 per month, resetting at 00:00 on the 1st". The local time comes from Redis TIME
-- and the zone's UTC offset; the offset, its next change (DST) and the offset after it arrive in one
-- integer, the rule (ratelimit_app/core/calendars.py builds it from the zone database):
--   rule = ((unit * 128 + offset_now_q + 64) * 128 + offset_next_q + 64) * 2^27 + change_minute
--   unit 1 day, 2 week, 3 month; offsets in quarter hours; change_minute since the epoch (UTC)
--
-- Numbers: limit = units allowed per calendar period; period = the rule above (a calendar period has
-- no fixed length); extra = a shift of the clock in ms (0 except in tests, which use it to stand just
-- before a boundary and just after it without waiting).
-- State: the integer 65536 x units used + period index mod 65536 (the local day number, or year * 12 +
-- month); TTL (the entry's expiry) = time to the start of the next period, set on every write. An entry
-- lives about one period, never 65536 of them, so one that outlives its period (a shifted clock in
-- tests, or a DST rule that changed) counts for nothing.
local function calendar_window(stored, key, now_us, cost, limit, period, extra)
  local rule, shift_ms = period, extra
  -- (the helpers are made only when a calendar quota is decided)
  local function days_from_civil(y, m, d)
    if m <= 2 then y = y - 1 end
    local era = floor(y / 400)
    local yoe = y - era * 400
    local mp = (m > 2) and (m - 3) or (m + 9)
    local doy = floor((153 * mp + 2) / 5) + d - 1
    local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
    return era * 146097 + doe - 719468
  end

  local function civil_from_days(days)
    local z = days + 719468
    local era = floor(z / 146097)
    local doe = z - era * 146097
    local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
    local mp = floor((5 * doy + 2) / 153)
    local m = (mp < 10) and (mp + 3) or (mp - 9)
    local y = yoe + era * 400
    if m <= 2 then y = y + 1 end
    return y, m
  end

  now_us = now_us + shift_ms * 1000
  local change_s = (rule % 134217728) * 60
  local rest = floor(rule / 134217728)
  local offset_next = (rest % 128 - 64) * 900
  rest = floor(rest / 128)
  local offset_now = (rest % 128 - 64) * 900
  local unit = floor(rest / 128)
  local now_s = floor(now_us / 1000000)
  local offset = offset_now
  if now_s >= change_s then offset = offset_next end
  local day = floor((now_s + offset) / 86400)
  local window, next_day
  if unit == 1 then
    window, next_day = day, day + 1
  elseif unit == 2 then
    window = day - (day + 3) % 7  -- 1970-01-01 was a Thursday: the Monday on or before `day`
    next_day = window + 7
  else
    local y, m = civil_from_days(day)
    window = y * 12 + m - 1
    if m == 12 then next_day = days_from_civil(y + 1, 1, 1) else next_day = days_from_civil(y, m + 1, 1) end
  end
  -- the next period starts at local midnight of next_day, in UTC with the offset in force then
  local next_s = next_day * 86400 - offset_now
  if next_s >= change_s then next_s = next_day * 86400 - offset_next end
  local reset_us = next_s * 1000000 - now_us
  if reset_us < 1000 then reset_us = 1000 end
  return count_in_window(stored, window, 65536, reset_us, cost, limit)
end
