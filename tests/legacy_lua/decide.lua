-- decide: one all-or-nothing decision over several policies. Every policy is checked first; only when
-- all of them allow is the request charged to all of them. A denied request writes nothing.
-- The algorithm files are prepended to this one when the engine loads the script, so this file sees
-- their functions as locals; the set of scripts is fixed and request data never becomes source.
--
-- ARGV[1]          every number of the call, packed as big-endian signed 64-bit integers
--                  (16 + 32n bytes for n policies): cost (units to charge, >= 1), charge (1 to charge
--                  when allowed, as hit does; 0 to only report, as peek does), then for each policy i:
--                  its algorithm code, limit, period in milliseconds and capacity (integers >= 1;
--                  capacity is the burst for token_bucket and gcra, else the limit), struct format
--                  '>i8i8' + n x '>i8i8i8i8'
--                  algorithm codes: 1 token_bucket, 2 sliding_window, 3 fixed_window, 4 gcra,
--                  5 sliding_window_counter, 6 concurrency (engine.ALGORITHM_CODES, checked by
--                  tests/test_scripts.py);
--                  32 calendar_window (a fixed window over calendar days, weeks or months: its period
--                  slot carries the calendar rule and its capacity slot a clock shift in ms, 0 outside
--                  tests; engine.CALENDAR_CODE, see calendar_window.lua);
--                  64 added to the code marks a shadow (dry-run) policy (engine.SHADOW_FLAG): it is
--                  checked like the others, never refuses the call, is charged when the call is charged
--                  and it allows, and is not charged when it would have refused (so its count stays
--                  what it would be if it were enforced)
-- ARGV[2]          the lease token of this request (only when it charges a concurrency policy: the
--                  member its slot is held under, which the app server removes when the response ends)
-- KEYS[i]          state key of policy i (1 <= i <= n); all keys share one hash tag on Redis Cluster
-- KEYS[n + i]      optional (#KEYS is n or 2n): the key that held policy i's state in the previous
--                  release's layout, read only to carry that state over (see "Upgrades" below); a
--                  concurrency policy's is never read (the previous release had no such policy)
-- Time comes from redis.call('TIME') only: one clock for every app server.
--
-- Reply: one string of 24n bytes, for each policy i three big-endian signed 64-bit integers (struct
-- '>i8i8i8'; one string costs Redis far less to return than 1 + 4n integers):
--   remaining_i          units left after this request (hit and allowed) or now (otherwise)
--   reset_ms_i           milliseconds until policy i is back to its full allowance (rounded up)
--   retry_ms_i           0 when policy i allows; else milliseconds until this request would be allowed
--                        by policy i (>= 1, rounded up), or -1 when cost exceeds its capacity
-- The request is allowed (and, for a hit, charged) when every retry_ms_i of a policy that is not a
-- shadow policy is 0. A shadow policy's triple is its own verdict (retry_ms_i > 0 or -1: it would have
-- refused); the reply carries no flag for it, since the caller sent the codes and knows which policies
-- are shadows (engine.parse_reply sets them apart).
-- Upgrades: a policy whose key is missing starts from its previous-release key when one is given and
-- exists (same meaning, older encoding), so an upgrade neither loses state nor grants extra units.
-- The charge writes only the new key; the old one expires with its TTL (reset deletes both).
-- Concurrency policies are new in this release: their key is a sorted set (MGET reads it as nil, so
-- it never counts as missing state) and their previous-layout key is ignored.
-- Speed: this runs on every request, and on Redis each redis.call costs about as much as the rest of a
-- policy's work (the command's arguments become Redis objects, its reply becomes Lua values). So every
-- state is one string and all of them are read by one MGET; each charge is one SET with its TTL; every
-- number of the call arrives in one binary argument (each decimal argument would be a strtod); and no
-- closure or table is made per policy (each algorithm returns its result and its write as plain values,
-- kept in one flat table until all have allowed).
-- Needs Redis 5 or later, where scripts replicate their effects, so TIME may precede writes.
-- (redis.replicate_commands() is not called: on Redis 7 it is a deprecated no-op that costs about
-- as much as the rest of a one-policy decision.)
local numbers = ARGV[1]
local n = (#numbers - 16) / 32
local key_count = #KEYS
local lease = ARGV[2]
if #ARGV > 2 or n < 1 or n ~= floor(n) or (key_count ~= n and key_count ~= 2 * n) then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end
local cost, charge_flag = unpack('>i8i8', numbers)
local charge = charge_flag == 1
if cost < 1 then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local values = call('MGET', unpack_list(KEYS, 1, n))
-- Upgrades: the previous layout's keys are read only when a state key is missing and one of them
-- exists (one EXISTS for all of them; a sorted set, which MGET reads as nil, is read by its algorithm).
local legacy_values = false
if key_count > n then
  for i = 1, n do
    if not values[i] and unpack('>i8', numbers, 32 * i - 15) % 64 ~= 6 then
      if call('EXISTS', unpack_list(KEYS, n + 1, key_count)) > 0 then
        legacy_values = call('MGET', unpack_list(KEYS, n + 1, key_count))
      end
      break
    end
  end
end

-- Lua 5.1 has no table.new, but a constructor listing nils allocates that many slots at once; growing
-- a table slot by slot (rehashing at 1, 2, 4, 8, 16) costs Redis more than the arithmetic of a policy.
-- These hold up to 4 policies without growing (more still work); the nils are not part of the reply.
-- 1. check every policy; state[6(i-1) + 1..6] holds policy i's results (see the algorithm headers)
local state = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
local all_allowed = true
for i = 1, n do
  local code, limit, period_ms, capacity = unpack('>i8i8i8i8', numbers, 32 * i - 15)
  local shadow = code >= 64
  if shadow then code = code - 64 end
  local stored, legacy = values[i], false
  if code == 6 then
    -- concurrency: a sorted set, read by its algorithm through its key; no previous layout
    if charge and not lease then return redis.error_reply('ERR ratelimit decide: no lease token') end
    stored = KEYS[i]
  elseif legacy_values and not stored then
    -- a previous-release sliding window is a sorted set: its algorithm gets the key instead
    if code == 2 then legacy = KEYS[n + i] else legacy = legacy_values[i] end
  end
  local algorithm
  if code == 1 then algorithm = token_bucket
  elseif code == 2 then algorithm = sliding_window
  elseif code == 3 then algorithm = fixed_window
  elseif code == 4 then algorithm = gcra
  elseif code == 5 then algorithm = sliding_window_counter
  elseif code == 6 then algorithm = concurrency
  elseif code == 32 then algorithm = calendar_window
  else return redis.error_reply('ERR ratelimit decide: unknown algorithm') end
  local allowed, remaining, reset_us, retry_us, value, charged_reset_us = algorithm(stored, legacy, now_us,
    limit, period_ms, capacity, cost)
  local at = 6 * (i - 1)
  state[at + 1], state[at + 2], state[at + 3] = allowed, remaining, reset_us
  state[at + 4], state[at + 5], state[at + 6] = retry_us, value, charged_reset_us
  if not allowed and not shadow then all_allowed = false end
end

-- 2. charge all of them, or none; then reply. A charged key expires when its state is back to
-- nothing: at the charged reset, rounded up to a millisecond.
local charged = charge and all_allowed
local reply = {nil, nil, nil, nil}
for i = 1, n do
  local at = 6 * (i - 1)
  local remaining, reset_us, retry_ms = state[at + 2], state[at + 3], 0
  if charged and state[at + 1] then
    -- (a shadow policy that would have refused is not charged, so its count stays the enforced one)
    reset_us = state[at + 6]
    local value = state[at + 5]
    if value == concurrency_lease then
      concurrency_charge(KEYS[i], now_us, reset_us, lease)
      remaining = remaining - 1  -- a request takes one slot, whatever it costs
    else
      call('SET', KEYS[i], value, 'PX', ceil(reset_us / 1000))
      remaining = remaining - cost
    end
  elseif not state[at + 1] then
    -- refused by policy i; reported for a shadow policy too, although it did not refuse the call
    local retry_us = state[at + 4]
    if retry_us < 0 then retry_ms = -1 else retry_ms = ceil(retry_us / 1000) end
    if retry_ms == 0 then retry_ms = 1 end
  end
  reply[i] = pack('>i8i8i8', remaining, ceil(reset_us / 1000), retry_ms)
end
return table.concat(reply)
