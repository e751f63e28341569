-- decide: one all-or-nothing decision over several policies. Every policy is checked first; only when
-- all of them allow is the request charged to all of them. A denied request writes nothing.
-- This header is the contract between the engine (ratelimit_app/core/wire.py) and the script: its
-- arguments, the state it keeps, what each algorithm function is given and returns, and its reply.
-- scripts.py assembles the script: prelude.lua, the kinds of policy this file treats apart (constants
-- named by the registry of algorithms, ratelimit_app/core/algorithms.py: SLOTS_CODE, the requests in
-- flight, whose state is only a key of their own, charged by slots_charge; LOG_CODE, the sliding log,
-- which keeps its units in a key of its own from a limit of LONG_LOG_UNITS on; TEXT_STATE_CODE, whose
-- state is never an integer), the algorithm files (the function each one ends with becomes the branch
-- of its code in one function, check), then this file, which names no algorithm. The set of scripts
-- is fixed and request data never becomes source.
--
-- ARGV[1]        every number of the call, packed big-endian in one string: the call, struct '>i8BBi8':
--                  cost   units to charge (>= 1)
--                  mode   0 report only (peek); 1 charge when every policy allows (hit); 2 forget the
--                         policies' states (reset: nothing is checked, and the reply is all zeros)
--                  m      identities (>= 1)
--                  shift  ms added to Redis TIME: 0, except in tests, whose clock it moves (the test
--                         kit's `advance`; engine.prepare_call)
--                then each policy i (n of them, n >= 1), struct '>i8i8i8i8BBc0':
--                  code   its algorithm's code in the registry (core/algorithms.py, which this file
--                         never names: a new algorithm leaves it as it is); plus 64 for a shadow
--                         policy (wire.SHADOW_FLAG): it is checked like the others and never refuses the
--                         call; it is charged when the call is charged and it allows, and not when it
--                         would have refused, so its count stays what it would be if it were enforced;
--                         plus 128 x its own cost for a policy charged apart from the call's cost (a
--                         usage limit, charged the estimate it reserves; wire.OWN_COST_STEP)
--                  limit, period, extra   the policy's numbers (integers), as its algorithm's file
--                         says: limit is its units (or slots) per period; period the period's length
--                         in ms (a calendar quota's calendar rule); extra a bucket's size (the burst of
--                         token_bucket and gcra), a calendar quota's clock shift in ms (0 outside
--                         tests), or 0
--                  j      its identity (1 <= j <= m)
--                  tag    its length, then its bytes: the letter of its algorithm and the policy's
--                         name (keys.KEY_LETTERS), unique among the policies of one identity
-- ARGV[2]        the lease token of this request, only when it charges a concurrency policy: the
--                member its slot is held under, which the app server removes when the response ends
-- KEYS[j]        the state key of identity j (1 <= j <= m), "<prefix>:{<digest>}": its entries (State)
-- KEYS[m + k]    the key of its own of the k-th policy that has one, in policy order: every policy of
--                SLOTS_CODE (its sorted set of leases) and of LOG_CODE (its units, once its limit is
--                LONG_LOG_UNITS or more), "<prefix>:{<digest>}<tag>": all the keys of one identity share
--                its hash tag. #KEYS is m plus the number of such policies.
-- Time comes from redis.call('TIME') only (plus the call's shift): one clock for every app server.
--
-- State: the key of an identity is a string of entries, one per rate policy that has state, each
-- struct '>Bc0I6I4' + its state: the tag (length, bytes), the entry's expiry (ms since the epoch: what
-- a key of its own would have as its TTL; a later entry is no state) and the state's length, then the
-- state in its algorithm's format (its file's "State"): an integer state as 7 bytes, struct '>I7'
-- (below 2^53), any other state as its bytes. The key expires with its last entry: when a write needs
-- a later expiry than the key has, it is set (PXAT), else the key keeps its TTL (KEEPTTL). A write
-- keeps the live entries of policies that are not part of the call (another route's limits of the
-- same identity) and drops dead ones.
--
-- The algorithms: check(code, stored, key, now_us, cost, limit, period, extra) runs the branch of
-- `code` (without the shadow flag) for one policy. Its inputs: stored, the policy's state (its entry's:
-- an integer state as a number, another as its bytes; false when it has none), key, the name of its
-- key of its own (KEYS[m + k]; false for a policy without one), now_us (Redis TIME in microseconds),
-- cost and the policy's numbers from ARGV[1]; each algorithm decodes them into named locals at the top
-- of its function. It returns: allowed (boolean), remaining now (units, or free slots), reset now (us
-- until the policy is back to its full allowance), retry (us: 0 when allowed; -1 when cost exceeds
-- what it can ever grant), and, when it allows, the write that charges the request, as data (run only
-- when every policy allows), and the reset after the charge (us), which is also when its entry
-- expires. The write is the new state (a number or bytes), or a table (the new state, then commands
-- for its key of its own: a long log), or true (a slot: slots_charge adds the lease to its key).
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
--
-- Speed: this runs on every request. Each redis.call costs Redis thousands of instructions (its
-- arguments become Redis objects, its reply Lua values), a new key with a TTL most (two dictionary
-- entries): so all the rate policies of an identity live in one key, read by one GET (MGET for several
-- identities) and written by one SET. The Lua around the calls costs more still (docs/algorithms.md):
-- every number of the call arrives in one binary argument (each decimal argument would be a strtod);
-- numbers sent to Redis are formatted as integers (a Lua number becomes a string through '%.17g',
-- several times dearer); no closure or table is made per policy (each algorithm returns its result and
-- its write as plain values, kept in flat tables until all have allowed); and all the algorithms are
-- one function, check, since Redis runs the whole script on every call and each function it defines is
-- a closure made anew every time.
-- Needs Redis 6.2 or later (SET ... KEEPTTL / PXAT; scripts replicate their effects, so TIME may precede
-- writes). (redis.replicate_commands() is not called: on Redis 7 it is a deprecated no-op.)
local numbers, lease = ARGV[1], ARGV[2]
local cost, mode, m, shift = unpack('>i8BBi8', numbers)
local key_count = #KEYS
if #ARGV > 2 or cost < 1 or mode > 2 or m < 1 or key_count < m then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end
local charge, forget = mode == 1, mode == 2

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2]) + shift * 1000
local now_ms = floor(now_us / 1000)

-- 1. read the key of each identity j into identity[5(j-1) + 1..5]: its live entries (state by tag,
-- expiry by tag; false when it has none), the key's expiry (its latest entry's), then the entries
-- this call writes and the latest expiry among all it keeps
-- (one identity, the common case, is read by GET: no table of values is made for it)
local values = false
if m > 1 then values = call('MGET', unpack_list(KEYS, 1, m)) end
local identity = {false, false, 0, '', 0}
for j = 1, m do
  local value, base = false, 5 * (j - 1)
  if values then value = values[j] else value = call('GET', KEYS[1]) end
  identity[base + 1], identity[base + 2], identity[base + 3], identity[base + 4], identity[base + 5] =
    false, false, 0, '', 0
  if value then identity[base + 1], identity[base + 2], identity[base + 3] = read_entries(value, now_ms) end
end
-- one identity decided twice in a call (its per-IP limit and its tier, say) has one key: owner[j] is
-- the first identity with identity j's key, whose entries both share
local owner = false
if m > 1 then
  owner = {}
  for j = 1, m do
    owner[j] = j
    for k = 1, j - 1 do
      if KEYS[k] == KEYS[j] then owner[j] = k break end
    end
  end
end

-- 2. check every policy; result[10(i-1) + 1..10] holds policy i's results (see "The algorithms"), its
-- tag, its identity, its key of its own and its cost. Lua 5.1 has no table.new, but a constructor listing nils
-- allocates that many slots at once (growing a table slot by slot costs Redis more than a policy's
-- arithmetic).
local result = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
local all_allowed = true
local n, keyed, position = 0, 0, 19
while position <= #numbers do
  local code, limit, period, extra, j, tag
  code, limit, period, extra, j, tag, position = unpack('>i8i8i8i8BBc0', numbers, position)
  n = n + 1
  if j > m then return redis.error_reply('ERR ratelimit decide: bad arguments') end
  if owner then j = owner[j] end
  local own = cost
  if code >= 128 then own, code = floor(code / 128), code % 128 end
  local shadow = code >= 64
  if shadow then code = code - 64 end
  local key = false
  if code == SLOTS_CODE or code == LOG_CODE then
    keyed = keyed + 1
    key = KEYS[m + keyed]
    if not key then return redis.error_reply('ERR ratelimit decide: bad arguments') end
    if code == SLOTS_CODE and charge and not lease then
      return redis.error_reply('ERR ratelimit decide: no lease token')
    end
  end
  local allowed, remaining, reset_us, retry_us, write, charged_reset_us = true, 0, 0, 0, false, 0
  if not forget then
    local states, stored = identity[5 * j - 4], false
    if states then
      stored = states[tag] or false
      if stored and #stored == 7 and code ~= TEXT_STATE_CODE then stored = unpack('>I7', stored) end
    end
    allowed, remaining, reset_us, retry_us, write, charged_reset_us = check(code, stored, key, now_us, own,
      limit, period, extra)
    if allowed == nil then return redis.error_reply('ERR ratelimit decide: unknown algorithm') end
  end
  local base = 10 * (n - 1)
  result[base + 1], result[base + 2], result[base + 3], result[base + 4] = allowed, remaining, reset_us, retry_us
  result[base + 5], result[base + 6], result[base + 7], result[base + 8] = write, charged_reset_us, tag, j
  result[base + 9], result[base + 10] = key, own
  if not allowed and not shadow then all_allowed = false end
end
if n < 1 or key_count ~= m + keyed then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end

-- 3. charge all of them, or none (or forget them all: mode 2); then reply. An entry charged expires
-- when its state is back to nothing: at the charged reset, rounded up to a millisecond.
local charged = charge and all_allowed
local reply = ''
for i = 1, n do
  local base = 10 * (i - 1)
  local allowed, remaining, reset_us, retry_ms = result[base + 1], result[base + 2], result[base + 3], 0
  local write, tag, j = result[base + 5], result[base + 7], result[base + 8]
  if charged and allowed then
    -- (a shadow policy that would have refused is not charged, so its count stays the enforced one,
    -- and its entry stays as it was)
    reset_us = result[base + 6]
    if write == true then
      slots_charge(result[base + 9], now_us, reset_us, lease)
      remaining = remaining - 1  -- a request takes one slot, whatever it costs
    else
      local expiry, at = now_ms + ceil(reset_us / 1000), 5 * j
      if type(write) == 'table' then
        -- a state in a key of its own (a long log): the commands that write it, then its entry
        for command = 2, #write do call(unpack_list(write[command])) end
        write = write[1]
      end
      if type(write) == 'number' then
        identity[at - 1] = identity[at - 1] .. pack('>Bc0I6I4I7', #tag, tag, expiry, 7, write)
      else
        identity[at - 1] = identity[at - 1] .. pack('>Bc0I6I4', #tag, tag, expiry, #write) .. write
      end
      if expiry > identity[at] then identity[at] = expiry end
      if identity[at - 4] then identity[at - 4][tag] = nil end  -- replaced
      remaining = remaining - result[base + 10]
    end
  elseif not allowed then
    -- refused by policy i; reported for a shadow policy too, although it did not refuse the call
    local retry_us = result[base + 4]
    if retry_us < 0 then retry_ms = -1 else retry_ms = ceil(retry_us / 1000) end
    if retry_ms == 0 then retry_ms = 1 end
  end
  if forget and identity[5 * j - 4] then identity[5 * j - 4][tag] = nil end  -- forgotten
  reply = reply .. pack('>i8i8i8', remaining, ceil(reset_us / 1000), retry_ms)
end
if charged or forget then
  -- the identity's key: the entries written, then the live ones kept (other policies'); it expires
  -- with the latest of them
  for j = 1, m do
    local base = 5 * (j - 1)
    -- (an identity decided twice is written once, with its owner's entries)
    if not owner or owner[j] == j then
      local states, expiries, value, latest = identity[base + 1], identity[base + 2], identity[base + 4],
        identity[base + 5]
      if states then
        for tag, state in pairs(states) do
          local expiry = expiries[tag]
          value = value .. pack('>Bc0I6I4', #tag, tag, expiry, #state) .. state
          if expiry > latest then latest = expiry end
        end
      end
      if value == '' then
        if identity[base + 3] > 0 then call('DEL', KEYS[j]) end  -- (the key had entries)
      elseif latest > identity[base + 3] then
        call('SET', KEYS[j], value, 'PXAT', format('%d', latest))
      else
        call('SET', KEYS[j], value, 'KEEPTTL')
      end
    end
  end
  if forget and key_count > m then call('DEL', unpack_list(KEYS, m + 1, key_count)) end
end
return reply
