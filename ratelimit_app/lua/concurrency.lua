-- concurrency: requests in flight per identity. Each admitted request holds one slot, a lease that
-- the app server gives back when the response is finished (one ZREM of its token); a lease that is never given
-- back (the worker was killed) frees itself when its time is up, so a crash costs one lease period.
--
-- Called by decide.lua once per policy (this file defines a function; decide.lua is the entry point):
--   key        KEYS[i] of decide.lua: a sorted set, member = lease token, score = lease expiry (us)
--   now_us     Redis TIME in microseconds
--   limit      ARGV: slots, the requests that may be in flight at once (integer >= 1)
--   period_ms  ARGV: lease length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1); ignored: a request takes one slot whatever
--              it costs (costs weigh rate limits, a slot is a request in flight)
-- Returns: allowed (boolean), remaining now (integer: free slots), reset now (us: until the last live
--   lease runs out, 0 when none is live), retry (us, 0 when allowed; when refused 1 s: a slot frees
--   as soon as any request of this identity finishes, which no clock can say), and in place of a
--   string write: concurrency_lease (decide.lua then calls concurrency_charge, which adds the lease
--   named by ARGV[2] of decide.lua), nil, and reset after the charge (us: the lease period).
-- State: one sorted set with at most limit live members; TTL = the longest live lease (>= the lease
--   period after a charge), set on every charge. Expired leases are trimmed when a slot is taken.

-- marks a concurrency policy's write in decide.lua's state table (compared by identity)
local concurrency_lease = {}
local CONCURRENCY_RETRY_US = 1000000

-- the charge: drop leases that ran out, add this request's lease, keep the key while any lease lives
local function concurrency_charge(key, now_us, period_us, token)
  call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_us))
  call('ZADD', key, format('%d', now_us + period_us), token)
  if call('PTTL', key) < period_us / 1000 then
    call('PEXPIRE', key, period_us / 1000)
  end
end

local function concurrency(key, now_us, limit, period_ms, capacity, cost)
  local period_us = period_ms * 1000
  local live_from = format('(%d', now_us)
  local used = call('ZCOUNT', key, live_from, '+inf')
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  local reset_us = 0
  if used > 0 then
    local last = call('ZREVRANGEBYSCORE', key, '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
    reset_us = tonumber(last[2]) - now_us
  end
  if used + 1 > limit then
    return false, remaining, reset_us, CONCURRENCY_RETRY_US
  end
  return true, remaining, reset_us, 0, concurrency_lease, nil, period_us
end
