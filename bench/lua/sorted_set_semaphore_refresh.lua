-- Lease renewal of the sorted-set semaphore (redis-semaphore refreshes every
-- 0.8 x the lease while it holds): a holder still in the set is scored now,
-- and the set's expiry pushed back.
-- KEYS: the sorted set. ARGV: holder id, lease (ms), now.
-- Returns 1 renewed, 0 lost.
local now = tonumber(ARGV[3])
local lease = tonumber(ARGV[2])

redis.call('zremrangebyscore', KEYS[1], '-inf', now - lease)

if redis.call('zscore', KEYS[1], ARGV[1]) then
  redis.call('zadd', KEYS[1], now, ARGV[1])
  redis.call('pexpire', KEYS[1], lease)
  return 1
end
return 0
