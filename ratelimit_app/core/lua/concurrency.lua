-- concurrency: requests in flight per identity. Each admitted request holds one slot, a lease that
-- the app server gives back when the response is finished (one ZREM of its token); a lease that is never given
-- back (the worker was killed) frees itself when its time is up, so a crash costs one lease period.
--
-- Called by decide.lua once per policy, through check(code, ...): scripts.py makes the function this file
-- ends with the branch of its algorithm code, so it must keep that name and these parameters:
--   stored     (here: key) the policy's own key (KEYS[m + i] of decide.lua; its name, not its value): a sorted
--              set, member = lease token, score = lease expiry (us); the same key in the previous release
--   now_us     Redis TIME in microseconds
--   limit      ARGV: slots, the requests that may be in flight at once (integer >= 1)
--   period_ms  ARGV: lease length in milliseconds (integer >= 1)
--   capacity   ARGV: equal to limit for this algorithm
--   cost       units this request wants (integer >= 1); ignored: a request takes one slot whatever
--              it costs (costs weigh rate limits, a slot is a request in flight)
-- Returns: allowed (boolean), remaining now (integer: free slots), reset now (us: when refused, until
--   the last live lease runs out; when allowed, the lease period if any lease is live, else 0), retry
--   (us, 0 when allowed; when refused 1 s: a slot frees as soon as any request of this identity
--   finishes, which no clock can say), and in place of a string write: true (decide.lua
--   then calls concurrency_charge, which adds the lease named by ARGV[2] of decide.lua), and reset
--   after the charge (us: the lease period).
-- State: one sorted set with at most limit live members; TTL = the lease period, set on every charge.
--   Leases that ran out are trimmed when a slot is taken.

local CONCURRENCY_RETRY_US = 1000000

-- the charge: drop leases that ran out, add this request's lease, keep the key one lease period (the
-- newest lease's; a lease taken before the period was shortened may go with the key a little early,
-- which frees its slot early, never late)
local function concurrency_charge(key, now_us, period_us, token)
  call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_us))
  call('ZADD', key, format('%d', now_us + period_us), token)
  call('PEXPIRE', key, period_us / 1000)
end

local function concurrency(stored, now_us, limit, period_ms, capacity, cost)
  local key = stored
  local period_us = period_ms * 1000
  local live_from = format('(%d', now_us)
  local used = call('ZCOUNT', key, live_from, '+inf')
  local remaining = limit - used
  if remaining < 0 then remaining = 0 end
  if used + 1 > limit then
    local last = call('ZREVRANGEBYSCORE', key, '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
    return false, remaining, tonumber(last[2]) - now_us, CONCURRENCY_RETRY_US
  end
  -- allowed: the last live lease runs out within one lease period (the bound is reported, not looked up)
  return true, remaining, used > 0 and period_us or 0, 0, true, period_us
end
