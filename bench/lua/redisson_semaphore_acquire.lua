-- A semaphore after Redisson's RPermitExpirableSemaphore: a counter of free
-- permits, a sorted set of the permits handed out (permit id -> lease end,
-- ms since the epoch) and a channel on which freed permits are announced.
-- KEYS: counter, sorted set of permits, channel.
-- ARGV: permits asked for, lease end, now, the "no lease" score, permit ids.
-- Returns 'OK' when granted; else ':<earliest lease end>' (when to try again)
-- or nil when no permit has a lease end.

-- Leases that ended give their permits back, and whoever waits hears of it.
local ended = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
if #ended > 0 then
  redis.call('zrem', KEYS[2], unpack(ended))
  local free = redis.call('incrby', KEYS[1], #ended)
  if free > 0 then
    redis.call('publish', KEYS[3], free)
  end
end

local wanted = tonumber(ARGV[1])
local free = tonumber(redis.call('get', KEYS[1]) or '0')
if free >= wanted then
  redis.call('decrby', KEYS[1], wanted)
  for i = 5, #ARGV do
    redis.call('zadd', KEYS[2], ARGV[2], ARGV[i])
  end
  local ttl = redis.call('pttl', KEYS[1])
  if ttl > 0 then
    redis.call('pexpire', KEYS[2], ttl)
  end
  return 'OK'
end

local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[1] and first[2] ~= ARGV[4] then
  return ':' .. first[2]
end
return nil
