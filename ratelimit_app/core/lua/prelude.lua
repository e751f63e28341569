-- prelude: locals shared by every file of the decision script (scripts.py puts this file first).
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
