-- The sorted-set semaphore of npm redis-semaphore ("Semaphore"): one sorted
-- set, holder id -> the time it acquired (ms since the epoch, the client's
-- clock). Release is ZREM key id; a client that is refused retries after
-- its retry interval (10 ms by default).
-- KEYS: the sorted set. ARGV: limit, holder id, lease (ms), now.
-- Returns 1 acquired, 0 full.
local now = tonumber(ARGV[4])
local lease = tonumber(ARGV[3])

-- Holders whose lease ended no longer count.
redis.call('zremrangebyscore', KEYS[1], '-inf', now - lease)

if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('zadd', KEYS[1], now, ARGV[2])
  redis.call('pexpire', KEYS[1], lease)
  return 1
end
return 0
