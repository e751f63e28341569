-- cancel: make sure a lease token holds no slot of one concurrency policy, now or later. Sent for a
-- decision whose reply was lost (a timeout, a connection that broke, a cancelled call): Redis may have
-- run it and taken the slot, may run it later still (a paused server runs the commands waiting in its
-- sockets when it resumes), or never. The token's member gets a negative score, -(now + the lease
-- period): a live lease is given back at once (only a positive score above now counts), and a charge
-- that runs later under this token adds nothing (concurrency.lua: ZADD NX), until the cancelled lease
-- ends and a charge trims it. Running it again only moves that end.
-- KEYS[1]  the policy's sorted set of leases (see concurrency.lua)
-- ARGV[1]  the lease token
-- ARGV[2]  the lease period in milliseconds (integer >= 1)
-- Returns 1.
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local period_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', -(now_us + period_ms * 1000)), ARGV[1])
if redis.call('PTTL', KEYS[1]) < period_ms then
  redis.call('PEXPIRE', KEYS[1], period_ms)
end
return 1
