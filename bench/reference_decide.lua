-- The measuring stick of the decision script (not shipped): a hand-written script that makes the
-- benchmark request's decision, and nothing else. It takes decide.lua's exact KEYS and ARGV for one
-- call shape, the HTTP benchmark's request: identity 1, the client IP, under one sliding_window_counter
-- policy; identity 2, the API key, under the enterprise tier's token_bucket, exact sliding log (a long
-- log: its units in KEYS[3]) and fixed_window, in that order. It reads the policies' numbers from
-- ARGV[1] (so tests may give it other limits), assumes the shape (it checks no code, no identity, no
-- mode but a hit), and keeps its own state in its own format: a few numbers per identity, no tags, no
-- entry expiries, nothing kept for other policies. It replies what decide.lua replies (see its header),
-- and is checked to decide the same by tests/core/test_reference_script.py.
-- KEYS[1] the IP's key, KEYS[2] the API key's key, KEYS[3] the API key's log
local floor, ceil, pack, unpack, call = math.floor, math.ceil, struct.pack, struct.unpack, redis.call
local cost, _, _, shift, _, ip_limit, ip_period, _, _, _, _, tb_limit, tb_period, tb_burst, _, _,
  _, log_limit, log_period, _, _, _, _, fw_limit, fw_period = unpack(
  '>i8BBi8i8i8i8i8BBc0i8i8i8i8BBc0i8i8i8i8BBc0i8i8i8i8BBc0', ARGV[1])

local time = call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2]) + shift * 1000
local now_ms = floor(now_us / 1000)
local values = call('MGET', KEYS[1], KEYS[2])

-- the IP: a sliding window counter; state: window index, its count, the previous window's count
local ip_window_us = ip_period * 1000
local ip_window = floor(now_us / ip_window_us)
local ip_elapsed = now_us - ip_window * ip_window_us
local current, previous = 0, 0
if values[1] then
  local window, count, before = unpack('>I6I6I6', values[1])
  if window == ip_window then current, previous = count, before elseif window == ip_window - 1 then previous = count end
end
local estimate = previous * (ip_window_us - ip_elapsed) / ip_window_us + current
local ip_remaining = floor(ip_limit - estimate)
if ip_remaining < 0 then ip_remaining = 0 end
local ip_reset = 0
if current > 0 then ip_reset = 2 * ip_window_us - ip_elapsed elseif previous > 0 then ip_reset = ip_window_us - ip_elapsed end
local ip_retry = 0
if cost > ip_limit then
  ip_retry = -1
elseif estimate + cost > ip_limit then
  if current + cost <= ip_limit then
    ip_retry = ceil(ip_window_us - ip_elapsed - (ip_limit - current - cost) * ip_window_us / previous)
  else
    ip_retry = ip_window_us - ip_elapsed
    if current > 0 then
      local into_next = ceil(ip_window_us - (ip_limit - cost) * ip_window_us / current)
      if into_next > 0 then ip_retry = ip_retry + into_next end
    end
  end
  if ip_retry < 1 then ip_retry = 1 end
end

-- the API key: token bucket (units missing, last refill ms), log hint (first unit maybe live, units in
-- the log, its key's expiry), fixed window (window index, count)
local missing, stamp, head, count, log_expiry, fw_window, fw_count = 0, now_ms, 0, 0, 0, -1, 0
if values[2] then missing, stamp, head, count, log_expiry, fw_window, fw_count = unpack('>I6I6I4I4I6I6I6', values[2]) end

local full = tb_burst * tb_period
local units = full - missing
local elapsed = now_ms - stamp
if elapsed < 0 then elapsed = 0 end
units = units + elapsed * tb_limit
if units > full then units = full end
stamp = stamp + elapsed
local tb_remaining = floor(units / tb_period)
local tb_reset = ceil((full - units) / tb_limit) * 1000
local need = cost * tb_period
local tb_retry = 0
if cost > tb_burst then tb_retry = -1 elseif units < need then tb_retry = ceil((need - units) / tb_limit) * 1000 end

local log_window_us = log_period * 1000
local since = now_us - log_window_us
local log, first, newest = '', 0, 0
if count > head then
  log = call('GETRANGE', KEYS[3], 7 * head, -1)
  local last = count - head
  while first < last do
    local middle = floor((first + last) / 2)
    if unpack('>I7', log, 7 * middle + 1) > since then last = middle else first = middle + 1 end
  end
  newest = unpack('>I7', log, #log - 6)
end
local used = count - head - first
local log_remaining = log_limit - used
if log_remaining < 0 then log_remaining = 0 end
local log_reset = 0
if used > 0 then log_reset = newest + log_window_us - now_us end
local log_retry = 0
if cost > log_limit then
  log_retry = -1
elseif used + cost > log_limit then
  log_retry = unpack('>I7', log, 7 * (first + used + cost - log_limit - 1) + 1) + log_window_us - now_us
end

local fw_window_us = fw_period * 1000
local window = floor(now_us / fw_window_us)
local fw_reset = (window + 1) * fw_window_us - now_us
if fw_window ~= window then fw_count = 0 end
local fw_remaining = fw_limit - fw_count
if fw_remaining < 0 then fw_remaining = 0 end
local fw_retry = 0
if cost > fw_limit then fw_retry = -1 elseif fw_count + cost > fw_limit then fw_retry = fw_reset end

if ip_retry ~= 0 or tb_retry ~= 0 or log_retry ~= 0 or fw_retry ~= 0 then
  local function ms(retry) if retry > 0 then return ceil(retry / 1000) end return retry end
  return pack('>i8i8i8i8i8i8i8i8i8i8i8i8', ip_remaining, ceil(ip_reset / 1000), ms(ip_retry),
    tb_remaining, ceil(tb_reset / 1000), ms(tb_retry), log_remaining, ceil(log_reset / 1000), ms(log_retry),
    fw_remaining, ceil(fw_reset / 1000), ms(fw_retry))
end

-- every policy allows: charge them all
ip_reset = 2 * ip_window_us - ip_elapsed
call('SET', KEYS[1], pack('>I6I6I6', ip_window, current + cost, previous), 'PX', string.format('%d', ceil(ip_reset / 1000)))

local left = units - need
local tb_charged = ceil((full - left) / tb_limit)
local stamp_us = now_us
if newest > now_us then stamp_us = newest end
local added = string.rep(pack('>I7', stamp_us), cost)
if count > 0 and log_expiry >= ceil(stamp_us / 1000) + log_period then
  call('APPEND', KEYS[3], added)
  count = count + cost
  head = head + first
else
  -- a new log, or one whose key must live longer: rewritten with its live units
  log_expiry = ceil(stamp_us / 1000) + 2 * log_period
  call('SET', KEYS[3], string.sub(log, 7 * first + 1) .. added, 'PXAT', string.format('%d', log_expiry))
  head, count = 0, used + cost
end
-- the key lives as long as its longest state
local expiry = now_ms + ceil(fw_reset / 1000)
if log_expiry > expiry then expiry = log_expiry end
if now_ms + tb_charged > expiry then expiry = now_ms + tb_charged end
call('SET', KEYS[2], pack('>I6I6I4I4I6I6I6', full - left, stamp, head, count, log_expiry, window, fw_count + cost),
  'PXAT', string.format('%d', expiry))
return pack('>i8i8i8i8i8i8i8i8i8i8i8i8', ip_remaining - cost, ceil(ip_reset / 1000), 0,
  tb_remaining - cost, tb_charged, 0, log_remaining - cost, log_period, 0,
  fw_remaining - cost, ceil(fw_reset / 1000), 0)
