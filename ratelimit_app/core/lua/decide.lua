-- decide: one all-or-nothing decision over several policies. Every policy is checked first; only when
-- all of them allow is the request charged to all of them. A denied request writes nothing.
-- The algorithm files come first (scripts.py makes their functions the branches of one function,
-- check(code, stored, now_us, limit, period_ms, capacity, cost)), then what the registry of
-- algorithms (ratelimit_app/core/algorithms.py) says about kinds of state: SLOTS_CODE and
-- slots_charge (requests in flight: a key of their own) and TEXT_STATE_CODE (a state never read as an
-- integer); this file names no algorithm. The set of scripts is fixed and request data never becomes
-- source.
--
-- ARGV[1]          every number of the call, packed big-endian: a header, struct '>i8BB': cost (units
--                  to charge, >= 1), mode (0 report only, as peek does; 1 charge when allowed, as hit
--                  does; 2 forget the policies' states, as reset does, then report) and m (identities,
--                  >= 1); then for each policy i (n of them, 1 <= n): struct '>i8i8i8i8BBc0': its
--                  algorithm code, limit, period in milliseconds and capacity (integers >= 1; capacity
--                  is the burst for token_bucket and gcra, else the limit), its identity j (1 <= j <= m),
--                  and its tag (the length, then the bytes: the letter of its algorithm and its name,
--                  engine.KEY_LETTERS, unique among the policies of one identity)
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
-- KEYS[j]          the state key of identity j (1 <= j <= m): one string holding an entry for each of
--                  its rate policies (see "State" below); all keys of one identity share a hash tag
-- KEYS[m + i]      policy i's own key (#KEYS is m, or m + n): a concurrency policy's sorted set of
--                  leases (always sent for one), a long sliding log's units (always sent for one: a
--                  policy of LONG_LOG_CODE whose limit is LONG_LOG_UNITS or more; its entry in the
--                  identity's key is a hint, see sliding_window.lua), or a rate policy's key in the
--                  previous release's layout, read only to carry its state over (see "Upgrades" below)
-- Time comes from redis.call('TIME') only: one clock for every app server.
--
-- State: the key of an identity is a string of entries, one per rate policy that has state, each
-- struct '>Bc0I6I4' + its state: the tag (length, bytes), the entry's expiry (ms since the epoch: what
-- a key of its own would have as its TTL; a later entry is no state) and the state's length, then the
-- state in its algorithm's format (see the algorithm's header), an integer as 7 bytes, struct '>I7'
-- (below 2^53: its first byte is below 48, where the decimal integers of the previous release start
-- with a digit; a sliding log, the only other state of 7 bytes, is never an integer). The key expires
-- with its last entry: when a write needs a later expiry than the key has, it is set (PXAT), else the
-- key keeps its TTL (KEEPTTL). A write keeps the live entries of policies that are not part of the call
-- (another route's limits of the same identity) and drops dead ones.
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
-- Upgrades: the previous release kept each policy in a key of its own (KEYS[m + i]), in the format
-- its entry has now. When a rate policy has no entry and such keys are sent, they are read (one
-- EXISTS for all of them, then, when any exists, a GET of the policy's own: never a long log's key in
-- an MGET), so an upgrade neither loses state nor grants extra units. The charge writes only the identity's key;
-- the old keys expire with their TTL (reset deletes them). A long log is read from its key, which has
-- the name and the format of the previous layout's: its upgrade is that read. A log whose limit was
-- lowered below LONG_LOG_UNITS is read from its key the same way (its hint is no short log).
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
local numbers = ARGV[1]
local lease = ARGV[2]
local cost, mode, m = unpack('>i8BB', numbers)
local key_count = #KEYS
if #ARGV > 2 or cost < 1 or mode > 2 or m < 1 or key_count < m then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end
local charge = mode == 1

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = floor(now_us / 1000)

-- 1. read the key of each identity j into identity[5(j-1) + 1..5]: its live entries (state by tag,
-- expiry by tag; false when it has none), the key's expiry (its latest entry's), then the entries
-- this call writes and the latest expiry among all it keeps
local values
if m == 1 then values = {call('GET', KEYS[1])} else values = call('MGET', unpack_list(KEYS, 1, m)) end
local identity = {false, false, 0, '', 0}
for j = 1, m do
  local value, base = values[j], 5 * (j - 1)
  identity[base + 1], identity[base + 2], identity[base + 3], identity[base + 4], identity[base + 5] =
    false, false, 0, '', 0
  if value then
    local states, expiries, latest, position = {}, {}, 0, 1
    while position <= #value do
      local tag, expiry, state
      tag, expiry, state, position = unpack('>Bc0I6I4c0', value, position)
      if expiry >= now_ms then states[tag], expiries[tag] = state, expiry end
      if expiry > latest then latest = expiry end
    end
    identity[base + 1], identity[base + 2], identity[base + 3] = states, expiries, latest
  end
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

-- 2. check every policy; result[8(i-1) + 1..8] holds policy i's results (see the algorithm headers),
-- its tag and its identity. Lua 5.1 has no table.new, but a constructor listing nils allocates that
-- many slots at once (growing a table slot by slot costs Redis more than a policy's arithmetic).
local result = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil}
local legacy  -- whether any key of the previous layout exists (KEYS[m + 1..]: one EXISTS, when first needed)
local all_allowed = true
local n, position = 0, 11
while position <= #numbers do
  local code, limit, period_ms, capacity, j, tag
  code, limit, period_ms, capacity, j, tag, position = unpack('>i8i8i8i8BBc0', numbers, position)
  n = n + 1
  if j > m then return redis.error_reply('ERR ratelimit decide: bad arguments') end
  if owner then j = owner[j] end
  local shadow = code >= 64
  if shadow then code = code - 64 end
  local stored = false
  if code == SLOTS_CODE then
    -- requests in flight (concurrency): a key of its own, a sorted set read by its algorithm
    if key_count == m then return redis.error_reply('ERR ratelimit decide: bad arguments') end
    if charge and not lease then return redis.error_reply('ERR ratelimit decide: no lease token') end
    stored = KEYS[m + n]
  elseif code == LONG_LOG_CODE and limit >= LONG_LOG_UNITS and mode ~= 2 then
    -- a long log: its units are in a key of its own, whose name its algorithm gets as its capacity, and
    -- its entry is a hint of where they start
    if key_count == m then return redis.error_reply('ERR ratelimit decide: bad arguments') end
    local states = identity[5 * j - 4]
    if states then stored = states[tag] or false end
    capacity = KEYS[m + n]
  elseif mode ~= 2 then
    local states = identity[5 * j - 4]
    if states then stored = states[tag] or false end
    if stored and code ~= TEXT_STATE_CODE and #stored == 7 and byte(stored) < 48 then
      stored = unpack('>I7', stored)
    elseif stored and code == LONG_LOG_CODE and #stored % 7 ~= 0 then
      stored = false  -- the hint of a log that was long (its limit was lowered): its units are in its key
    end
    if not stored and key_count > m then
      -- Upgrades: no entry yet; the policy's key in the previous layout may hold its state
      -- (one EXISTS for all of them, then a GET of its own)
      if legacy == nil then legacy = call('EXISTS', unpack_list(KEYS, m + 1, key_count)) > 0 end
      if legacy then stored = call('GET', KEYS[m + n]) end
    end
  end
  local allowed, remaining, reset_us, retry_us, value, charged_reset_us = check(code, stored, now_us, limit,
    period_ms, capacity, cost)
  if allowed == nil then return redis.error_reply('ERR ratelimit decide: unknown algorithm') end
  local base = 8 * (n - 1)
  result[base + 1], result[base + 2], result[base + 3], result[base + 4] = allowed, remaining, reset_us, retry_us
  result[base + 5], result[base + 6], result[base + 7], result[base + 8] = value, charged_reset_us, tag, j
  if not allowed and not shadow then all_allowed = false end
end
if n < 1 or (key_count ~= m and key_count ~= m + n) then
  return redis.error_reply('ERR ratelimit decide: bad arguments')
end

-- 3. charge all of them, or none (or forget them all: mode 2); then reply. An entry charged expires
-- when its state is back to nothing: at the charged reset, rounded up to a millisecond.
local charged = charge and all_allowed
local reply = ''
for i = 1, n do
  local base = 8 * (i - 1)
  local allowed, remaining, reset_us, retry_ms = result[base + 1], result[base + 2], result[base + 3], 0
  local value, tag, j = result[base + 5], result[base + 7], result[base + 8]
  if charged and allowed then
    -- (a shadow policy that would have refused is not charged, so its count stays the enforced one,
    -- and its entry stays as it was)
    reset_us = result[base + 6]
    if value == true then
      slots_charge(KEYS[m + i], now_us, reset_us, lease)
      remaining = remaining - 1  -- a request takes one slot, whatever it costs
    else
      local expiry, at = now_ms + ceil(reset_us / 1000), 5 * j
      if type(value) == 'table' then
        -- a state in a key of its own (a long log): the commands that write it, then its entry
        for command = 2, #value do call(unpack_list(value[command])) end
        value = value[1]
      end
      if type(value) == 'number' then
        identity[at - 1] = identity[at - 1] .. pack('>Bc0I6I4I7', #tag, tag, expiry, 7, value)
      else
        identity[at - 1] = identity[at - 1] .. pack('>Bc0I6I4', #tag, tag, expiry, #value) .. value
      end
      if expiry > identity[at] then identity[at] = expiry end
      if identity[at - 4] then identity[at - 4][tag] = nil end  -- replaced
      remaining = remaining - cost
    end
  elseif not allowed then
    -- refused by policy i; reported for a shadow policy too, although it did not refuse the call
    local retry_us = result[base + 4]
    if retry_us < 0 then retry_ms = -1 else retry_ms = ceil(retry_us / 1000) end
    if retry_ms == 0 then retry_ms = 1 end
  end
  if mode == 2 and identity[5 * j - 4] then identity[5 * j - 4][tag] = nil end  -- forgotten
  reply = reply .. pack('>i8i8i8', remaining, ceil(reset_us / 1000), retry_ms)
end
if charged or mode == 2 then
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
        if values[j] then call('DEL', KEYS[j]) end
      elseif latest > identity[base + 3] then
        call('SET', KEYS[j], value, 'PXAT', format('%d', latest))
      else
        call('SET', KEYS[j], value, 'KEEPTTL')
      end
    end
  end
  if mode == 2 and key_count > m then call('DEL', unpack_list(KEYS, m + 1, key_count)) end
end
return reply
