-- prelude: locals shared by every file of the decision script and by the settling script (scripts.py
-- puts this file first).
-- Each global function reached through its table (math.ceil) costs Redis two table lookups per use;
-- as locals they cost none, and the decision script runs on every request.
local call, ceil, floor, format = redis.call, math.ceil, math.floor, string.format
local byte, sub, rep, frexp = string.byte, string.sub, string.rep, math.frexp
-- (unpack is struct.unpack below; Lua's own unpack, for a table's items, is unpack_list)
local unpack_list, type = unpack, type
local pack, unpack = struct.pack, struct.unpack

-- The decision of a counter per window (fixed_window, calendar_window): the state is the units used x
-- `modulus` + the window's index mod `modulus`, so a count left from another window counts for nothing.
local function count_in_window(stored, window, modulus, reset_us, cost, limit)
  local used = 0
  if stored and stored % modulus == window % modulus then used = floor(stored / modulus) end
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  if cost > limit then
    return false, remaining, reset_us, -1
  end
  if used + cost > limit then
    return false, remaining, reset_us, reset_us
  end
  return true, remaining, reset_us, 0, (used + cost) * modulus + window % modulus, reset_us
end

-- The live entries of an identity's key (decide.lua's "State"): state and expiry by tag, and the
-- latest expiry among all of them, live or not.
local function read_entries(value, now_ms)
  local states, expiries, latest, position = {}, {}, 0, 1
  while position <= #value do
    local tag, expiry, state
    tag, expiry, state, position = unpack('>Bc0I6I4c0', value, position)
    if expiry >= now_ms then states[tag], expiries[tag] = state, expiry end
    if expiry > latest then latest = expiry end
  end
  return states, expiries, latest
end

-- A token bucket's state (token_bucket.lua's "State"): the units in a bucket of `full` units and the
-- time of its last refill (ms).
local function bucket_read(stored, now_ms, full)
  if not stored then return full, now_ms end
  local missing, stamp_mod, span
  if type(stored) == 'number' then
    local bits = stored % 64
    local value = (stored - bits) / 64
    span = 2 ^ bits
    stamp_mod = value % span
    missing = (value - stamp_mod) / span
  else
    missing, stamp_mod = unpack('>I7I5', stored)
    span = 1099511627776
  end
  local units = full - missing
  if units < 0 then units = 0 end
  local since = (now_ms - stamp_mod) % span
  if since < span / 2 then return units, now_ms - since end
  return units, now_ms + span - since
end

-- A sliding window counter's state (sliding_window_counter.lua's "State"): the counts of window
-- `window` and of the one before it.
local function counter_read(stored, window)
  if not stored then return 0, 0 end
  local stored_window, current, previous
  if type(stored) == 'number' then
    stored_window = stored % 4
    local counts = (stored - stored_window) / 4
    previous = counts % 33554432
    current = (counts - previous) / 33554432
  else
    stored_window, current, previous = unpack('>BI4I4', stored)
  end
  if stored_window == window % 4 then return current, previous end
  if stored_window == (window - 1) % 4 then return 0, current end
  return 0, 0
end

