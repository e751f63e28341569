-- concurrency: requests in flight per identity. Each admitted request holds one slot, a lease that
-- the app server gives back when the response is finished (one ZREM of its token); a lease that is
-- never given back (the worker was killed) frees itself when its time is up, so a crash costs one lease
-- period.
--
-- Numbers: limit = slots, the requests that may be in flight at once; period = the lease's length in
-- ms; extra = 0. A request takes one slot whatever its cost (costs weigh rate limits, a slot is a
-- request in flight).
-- State: no entry: its key of its own (decide.lua: SLOTS_CODE), a sorted set, member = lease token,
-- score = lease expiry (us), with at most limit live members; TTL = the lease period, set on every
-- charge. Leases that ran out are trimmed when a slot is taken. A member with a negative score is a
-- cancelled lease (cancel.lua: a token whose decision's reply was lost), score -(its end in us): it
-- holds no slot, and a charge under its token adds nothing (ZADD NX) until it ends and is trimmed.
-- Its remaining is the free slots; its reset, when refused, until the last live lease runs out, when
-- allowed, the lease period if any lease is live, else 0; its retry, when refused, 1 s (a slot frees as
-- soon as any request of this identity finishes, which no clock can say). Its write is true: decide.lua
-- then calls slots_charge (concurrency_charge), which adds the lease named by ARGV[2].

local CONCURRENCY_RETRY_US = 1000000

-- the charge: drop leases and cancelled leases that ran out, add this request's lease unless its token
-- was cancelled, keep the key one lease period (the newest lease's; a lease taken before the period was
-- shortened may go with the key a little early, which frees its slot early, never late)
local function concurrency_charge(key, now_us, lease_us, token)
  call('ZREMRANGEBYSCORE', key, format('%d', -now_us), format('%d', now_us))
  call('ZADD', key, 'NX', format('%d', now_us + lease_us), token)
  call('PEXPIRE', key, lease_us / 1000)
end

local function concurrency(stored, key, now_us, cost, limit, period, extra)
  local slots, lease_us = limit, period * 1000
  local live_from = format('(%d', now_us)
  local used = call('ZCOUNT', key, live_from, '+inf')
  local remaining = slots - used
  if remaining < 0 then remaining = 0 end
  if used + 1 > slots then
    local last = call('ZREVRANGEBYSCORE', key, '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
    return false, remaining, tonumber(last[2]) - now_us, CONCURRENCY_RETRY_US
  end
  -- allowed: the last live lease runs out within one lease period (the bound is reported, not looked up)
  return true, remaining, used > 0 and lease_us or 0, 0, true, lease_us
end
