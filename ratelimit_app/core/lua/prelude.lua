-- prelude: locals shared by every file of the decision script (scripts.py puts this file first).
-- Each global function reached through its table (math.ceil) costs Redis two table lookups per use;
-- as locals they cost none, and the decision script runs on every request.
local call, ceil, floor, format = redis.call, math.ceil, math.floor, string.format
local byte, sub, rep, frexp = string.byte, string.sub, string.rep, math.frexp
-- (unpack is struct.unpack below; Lua's own unpack, for a table's items, is unpack_list)
local unpack_list, type = unpack, type
local pack, unpack = struct.pack, struct.unpack
