-- Release of one permit of the Redisson-style semaphore: drop its id, give
-- the permit back to the counter and announce the free permits.
-- KEYS: counter, channel, sorted set of permits.
-- ARGV: permit id, permits it stands for (1), now.
-- Returns 1 when released in time, 0 when unknown or its lease had ended.
local lease_end = redis.call('zscore', KEYS[3], ARGV[1])
if redis.call('zrem', KEYS[3], ARGV[1]) ~= 1 then
  return 0
end
local free = redis.call('incrby', KEYS[1], ARGV[2])
redis.call('publish', KEYS[2], free)
if tonumber(lease_end) <= tonumber(ARGV[3]) then
  return 0
end
return 1
