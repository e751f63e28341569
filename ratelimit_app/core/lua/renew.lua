-- renew: set when the live slots of one lease token end. Sent for a request behind a gateway with no
-- end-of-request hook: the authorization takes its slots (decide.lua), then this shortens them to a
-- short first lease; when the request reaches the service, the service confirms it and this extends
-- them to their full lease. A request whose client went away never reaches the service, so its slots
-- free themselves at the end of the first lease. Only a live lease is moved (its member's score is
-- above now): one given back (no member), cancelled (a negative score: cancel.lua) or run out stays
-- as it is, so a late confirmation never takes a slot again (it is reported, not counted twice).
-- KEYS     the sorted sets of leases (see concurrency.lua) of one identity's concurrency policies:
--          all share its hash tag
-- ARGV[1]  the lease token
-- ARGV[1 + i]  the lease's new length for KEYS[i], in milliseconds (integer >= 1)
-- Returns how many of KEYS held a live lease under the token (each now ends ARGV[1 + i] ms from now).
-- Time comes from redis.call('TIME'), as in every script of the limiter.
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local token, live = ARGV[1], 0
if #ARGV ~= #KEYS + 1 then
  return redis.error_reply('ERR ratelimit renew: bad arguments')
end
for i, key in ipairs(KEYS) do
  local lease_ms = tonumber(ARGV[i + 1])
  if not lease_ms or lease_ms < 1 then
    return redis.error_reply('ERR ratelimit renew: bad arguments')
  end
  local score = redis.call('ZSCORE', key, token)
  if score and tonumber(score) > now_us then
    redis.call('ZADD', key, 'XX', string.format('%d', now_us + lease_ms * 1000), token)
    -- the key lives as long as its longest lease (a shorter lease leaves its TTL alone)
    if redis.call('PTTL', key) < lease_ms then
      redis.call('PEXPIRE', key, lease_ms)
    end
    live = live + 1
  end
end
return live
