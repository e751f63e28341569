-- decide: one all-or-nothing decision over several policies. Every policy is checked first; only when
-- all of them allow is the request charged to all of them. A denied request writes nothing.
-- The algorithm files are prepended to this one when the engine loads the script, so this file sees
-- their functions as locals; the set of scripts is fixed and request data never becomes source.
--
-- KEYS[i]          state key of policy i (1 <= i <= n); all share one hash tag on Redis Cluster
-- ARGV[1]          cost: units to charge (integer >= 1)
-- ARGV[2]          "1" to charge when allowed (hit), "0" to only report (peek)
-- ARGV[3]          n: number of policies
-- ARGV[4 + 4(i-1)] algorithm of policy i: fixed_window | sliding_window | sliding_window_counter |
--                  token_bucket | gcra
-- ARGV[5 + 4(i-1)] limit of policy i (integer >= 1)
-- ARGV[6 + 4(i-1)] period of policy i in milliseconds (integer >= 1)
-- ARGV[7 + 4(i-1)] capacity of policy i (integer >= 1): the burst for token_bucket and gcra, else limit
-- Time comes from redis.call('TIME') only: one clock for every app server.
--
-- Reply: {allowed, then for each policy i: allowed_i, remaining_i, reset_ms_i, retry_ms_i}
--   allowed, allowed_i   1 or 0
--   remaining_i          units left after this request (hit and allowed) or now (otherwise)
--   reset_ms_i           milliseconds until policy i is back to its full allowance (integer, rounded up)
--   retry_ms_i           0 when policy i allows; else milliseconds until this request would be allowed
--                        by policy i (integer >= 1, rounded up), or -1 when cost exceeds its capacity
-- Needs Redis 5 or later, where scripts replicate their effects, so TIME may precede writes.
-- (redis.replicate_commands() is not called: on Redis 7 it is a deprecated no-op that costs about
-- as much as the rest of a one-policy decision.)
local algorithms = {
  fixed_window = fixed_window,
  sliding_window = sliding_window,
  sliding_window_counter = sliding_window_counter,
  token_bucket = token_bucket,
  gcra = gcra,
}

local cost = tonumber(ARGV[1])
local charge = ARGV[2] == '1'
local n = tonumber(ARGV[3])
if cost == nil or cost < 1 or n == nil or n ~= #KEYS then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

local checks = {}
local all_allowed = true
for i = 1, n do
  local base = 4 * (i - 1) + 4
  local algorithm = algorithms[ARGV[base]]
  if algorithm == nil then
    return redis.error_reply('ERR ratelimit decide: unknown algorithm')
  end
  local allowed, remaining, reset_us, retry_us, apply, reset_now = algorithm(KEYS[i], now_us,
    tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), cost)
  checks[i] = {allowed = allowed, remaining = remaining, reset_us = reset_us, retry_us = retry_us,
    apply = apply, reset_now = reset_now}
  if not allowed then all_allowed = false end
end

local reply = {all_allowed and 1 or 0}
for i = 1, n do
  local check = checks[i]
  local remaining, reset_us, retry_ms = check.remaining, check.reset_us, 0
  if charge and all_allowed then
    reset_us = check.apply()
    remaining = remaining - cost
  elseif reset_us == nil then
    reset_us = check.reset_now()  -- an algorithm that reads "reset now" only when it is reported
  end
  if not check.allowed then
    if check.retry_us < 0 then
      retry_ms = -1
    else
      retry_ms = math.max(1, math.ceil(check.retry_us / 1000))
    end
  end
  reply[#reply + 1] = check.allowed and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = math.ceil(reset_us / 1000)
  reply[#reply + 1] = retry_ms
end
return reply
