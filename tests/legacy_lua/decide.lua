-- decide: one all-or-nothing decision over several policies. Every policy is checked first; only when
-- all of them allow is the request charged to all of them. A denied request writes nothing.
-- The algorithm files are prepended to this one when the engine loads the script, so this file sees
-- their functions as locals; the set of scripts is fixed and request data never becomes source.
--
-- KEYS[i]          state key of policy i (1 <= i <= n, n = #KEYS); all share one hash tag on Redis Cluster
-- ARGV[1]          every number of the call, packed as big-endian signed 64-bit integers
--                  (16 + 32n bytes): cost (units to charge, >= 1), charge (1 to charge when allowed, as
--                  hit does; 0 to only report, as peek does), then for each policy i: its algorithm
--                  code, limit, period in milliseconds and capacity (integers >= 1; capacity is the
--                  burst for token_bucket and gcra, else the limit), struct format '>i8i8' + n x '>i8i8i8i8'
--                  algorithm codes: 1 token_bucket, 2 sliding_window, 3 fixed_window, 4 gcra,
--                  5 sliding_window_counter (engine.ALGORITHM_CODES, checked by tests/test_scripts.py)
-- Time comes from redis.call('TIME') only: one clock for every app server.
--
-- Reply: {allowed, then for each policy i: allowed_i, remaining_i, reset_ms_i, retry_ms_i}
--   allowed, allowed_i   1 or 0
--   remaining_i          units left after this request (hit and allowed) or now (otherwise)
--   reset_ms_i           milliseconds until policy i is back to its full allowance (integer, rounded up)
--   retry_ms_i           0 when policy i allows; else milliseconds until this request would be allowed
--                        by policy i (integer >= 1, rounded up), or -1 when cost exceeds its capacity
-- Speed: this runs on every request, and on Redis the costly steps are conversions between numbers
-- and strings (each decimal argument parsed is a strtod) and the arguments themselves (each one is
-- parsed, then interned as a Lua string). So every number arrives in one binary argument,
-- no closure or table is made per policy (each algorithm returns its result and its write as plain
-- values, kept in one flat table until all have allowed), and strings already formatted are reused.
-- Needs Redis 5 or later, where scripts replicate their effects, so TIME may precede writes.
-- (redis.replicate_commands() is not called: on Redis 7 it is a deprecated no-op that costs about
-- as much as the rest of a one-policy decision.)
local numbers = ARGV[1]
local n = #KEYS
if #ARGV ~= 1 or #numbers ~= 16 + 32 * n then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end
local cost, charge_flag = struct.unpack('>i8i8', numbers)
local charge = charge_flag == 1
if cost < 1 then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- Lua 5.1 has no table.new, but a constructor listing nils allocates that many slots at once; growing
-- a table slot by slot (rehashing at 1, 2, 4, 8, 16) costs Redis more than the arithmetic of a policy.
-- These hold up to 4 policies without growing (more still work); the nils are not part of the reply.
-- 1. check every policy; state[7(i-1) + 1..7] holds policy i's results (see the algorithm headers)
local state = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
local all_allowed = true
for i = 1, n do
  local code, limit, period_ms, capacity = struct.unpack('>i8i8i8i8', numbers, 32 * i - 15)
  local algorithm
  if code == 1 then algorithm = token_bucket
  elseif code == 2 then algorithm = sliding_window
  elseif code == 3 then algorithm = fixed_window
  elseif code == 4 then algorithm = gcra
  elseif code == 5 then algorithm = sliding_window_counter
  else return redis.error_reply('ERR ratelimit decide: unknown algorithm') end
  local allowed, remaining, reset_us, retry_us, value, ttl_ms, charged_reset_us = algorithm(KEYS[i], now_us,
    limit, period_ms, capacity, cost)
  local at = 7 * (i - 1)
  state[at + 1], state[at + 2], state[at + 3], state[at + 4] = allowed, remaining, reset_us, retry_us
  state[at + 5], state[at + 6], state[at + 7] = value, ttl_ms, charged_reset_us
  if not allowed then all_allowed = false end
end

-- 2. charge all of them, or none; then reply
local charged = charge and all_allowed
local reply = {all_allowed and 1 or 0, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
for i = 1, n do
  local at = 7 * (i - 1)
  local allowed, remaining, reset_us, retry_us = state[at + 1], state[at + 2], state[at + 3], state[at + 4]
  if charged then
    local ttl_ms = state[at + 6]
    if ttl_ms then
      call('SET', KEYS[i], state[at + 5], 'PX', ttl_ms)
    else
      sliding_window_charge(KEYS[i], now_us, state[at + 7], state[at + 5], cost)
    end
    reset_us = state[at + 7]
    remaining = remaining - cost
  elseif reset_us == nil then
    reset_us = sliding_window_reset(KEYS[i], now_us, state[at + 7], state[at + 5])
  end
  local out = 4 * i - 2
  reply[out] = allowed and 1 or 0
  reply[out + 1] = remaining
  reply[out + 2] = ceil(reset_us / 1000)
  if allowed then
    reply[out + 3] = 0
  elseif retry_us < 0 then
    reply[out + 3] = -1
  else
    reply[out + 3] = math.max(1, ceil(retry_us / 1000))
  end
end
return reply
