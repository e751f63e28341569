-- sliding_window: the exact sliding window log. One string holds the admission time of every unit
-- still in the window, oldest first, each as a 7-byte big-endian integer of microseconds (struct
-- '>I7'); a unit counts while it is younger than the period. 7 bytes per unit of limit, where a sorted
-- set member costs about 118.
--
-- Numbers: limit = units allowed in any window of `period` ms; period = the window's length in ms;
-- extra = 0. Its key of its own (decide.lua: every policy of LOG_CODE is sent one) holds the log once
-- the limit is LONG_LOG_UNITS or more (a long log, below).
-- State: the log, one string of at most 7 x limit bytes (a long log's: a hint, below); TTL (the entry's
-- expiry) = period, set on every write, so the entry expires with its newest unit. Units that left the
-- window are dropped whenever the log is written (a long log drops them less often). A new unit is
-- stamped no earlier than the newest one, so the log stays sorted even if Redis's clock steps back
-- (such a unit counts a little longer: stricter, never looser).
-- Its reset is when the newest unit leaves the window (0 when none is live); the reset after a charge,
-- the period.
--
-- A long log keeps its units in its key of its own, in the same format, so that a hit appends its
-- units (APPEND) instead of rewriting the whole log: the cost of a hit no longer grows with the units
-- in the window. Its entry in the identity's key is a 20-byte hint, struct '>c1I6I7I6': 'L', `head`
-- (the units at the front of the key known to have left the window), the newest unit, and the expiry
-- the key was given (ms). 20 is never a multiple of 7, so a hint is never taken for a short log's
-- units, nor the other way round. A decision reads the key's length and one chunk of units from the
-- hint on (STRLEN, GETRANGE). Units that left the window stay at the front of the key until they are as
-- many as the live ones (and at least LONG_LOG_TRIM), when a charge rewrites the key with the live
-- ones: the key holds at most about twice the limit, and a unit is copied a bounded number of times.
-- The key's expiry moves only when its newest unit would outlive it, to a period after that unit's:
-- once per period. The hint is checked against the key (it must fit the key's length; the unit just
-- before `head` must have left the window, the last one must be live when the hint says so), and the
-- log is read whole, as a short log is, when it does not fit or is missing. A log whose limit moves
-- across LONG_LOG_UNITS keeps its count: raised, its short log is read from its entry (and written to
-- its key); lowered, its units are read from its key (and written to its entry). Its write, when
-- long, is a table: its new entry (the hint), then the commands that write its key.
-- (All of it is in the one function below: each function of the script is a closure made anew on every
-- call, whatever the call decides.)
local LONG_LOG_TRIM = 64

local function sliding_window(stored, key, now_us, cost, limit, period, extra)
  local window_ms, log_key = period, limit >= LONG_LOG_UNITS and key  -- log_key: only a long log's
  local window_us = window_ms * 1000
  local since = now_us - window_us  -- a unit admitted at t is live while t > since
  if not log_key and stored and #stored % 7 ~= 0 then
    -- the hint of a log that was long (its limit was lowered): its units are in its key
    stored = call('GET', key)
  end
  -- where the log stands: its units (count), the first live one (0-based; false until known), the newest;
  -- `log` is the whole log when it was read whole (a short log, or a long one without a usable hint)
  local log, count, first, newest, head, key_expiry = false, 0, false, 0, 0, 0
  if log_key then
    if stored and #stored == 20 then
      -- the hint: where the live units start, read in chunks that double from there (the first chunk
      -- starts one unit before it, which must have left the window)
      local _
      _, head, newest, key_expiry = unpack('>c1I6I7I6', stored)
      count = call('STRLEN', log_key) / 7
      if count > 0 and count == floor(count) and head <= count then
        if newest <= since then
          first = count
        else
          local from, step = head, 16
          if from > 0 then from = from - 1 end
          while true do
            local to = from + step
            if to > count then to = count end
            local chunk = call('GETRANGE', log_key, 7 * from, 7 * to - 1)
            if #chunk ~= 7 * (to - from) or (from < head and unpack('>I7', chunk, 1) > since) then break end
            if unpack('>I7', chunk, #chunk - 6) > since then
              local low, high = 0, to - from - 1
              while low < high do
                local middle = floor((low + high) / 2)
                if unpack('>I7', chunk, 7 * middle + 1) > since then high = middle else low = middle + 1 end
              end
              first = from + low
              break
            end
            if to == count then break end  -- the hint's newest unit is not in the key
            from, step = to, step * 2
          end
        end
      end
    end
    -- no usable hint: the log is read whole, from the short log of its entry (its limit was raised) or
    -- from its key
    if not first and (not stored or #stored % 7 ~= 0) then stored = call('GET', log_key) end
  end
  if not first then
    log = stored or ''
    count = floor(#log / 7)
    -- first live unit (0-based), by binary search: the log is sorted
    local last = count
    first = 0
    while first < last do
      local middle = floor((first + last) / 2)
      if unpack('>I7', log, 7 * middle + 1) > since then last = middle else first = middle + 1 end
    end
    newest = 0
    if count > first then newest = unpack('>I7', log, 7 * count - 6) end
  end
  local used = count - first
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  local reset_us = 0
  if used > 0 then reset_us = newest + window_us - now_us end
  if cost > limit then
    return false, remaining, reset_us, -1
  end
  if used + cost > limit then
    -- the request fits once the (used + cost - limit) oldest live units have left the window
    local at = first + used + cost - limit - 1
    local oldest
    if log then oldest = unpack('>I7', log, 7 * at + 1) else
      oldest = unpack('>I7', call('GETRANGE', log_key, 7 * at, 7 * at + 6))
    end
    return false, remaining, reset_us, oldest + window_us - now_us
  end
  local stamp = now_us
  if newest > stamp then stamp = newest end
  local added = rep(pack('>I7', stamp), cost)
  if log and (first > 0 or #log ~= 7 * count) then log = sub(log, 7 * first + 1, 7 * count) end
  if not log_key then
    return true, remaining, reset_us, 0, log .. added, window_us
  end
  -- a long log's write: its key, then its hint
  local needed = ceil(stamp / 1000) + window_ms  -- when the newest unit leaves the window (ms)
  local write
  if log or (first >= LONG_LOG_TRIM and 2 * first >= count) then
    -- read whole, or as many units left the window as are live: the key is written with the live ones
    if not log then log = call('GETRANGE', log_key, 7 * first, -1) end
    key_expiry, first = needed + window_ms, 0
    write = {false, {'SET', log_key, log .. added, 'PXAT', format('%d', key_expiry)}}
  else
    write = {false, {'APPEND', log_key, added}}
    if key_expiry < needed then
      key_expiry = needed + window_ms
      write[3] = {'PEXPIREAT', log_key, format('%d', key_expiry)}
    end
  end
  write[1] = pack('>c1I6I7I6', 'L', first, stamp, key_expiry)
  return true, remaining, reset_us, 0, write, window_us
end
