//! The Lua scripts users run today instead of warden, written after the
//! patterns of the classic lock and of Redisson's locks.

/// Classic safe release: delete the key only if it still holds our token.
pub const SAFE_RELEASE: &str = include_str!("lua/safe_release.lua");

/// Redisson-style re-entrant acquire: a hash owner -> holds, plus PEXPIRE.
/// ARGV: ttl, owner. Returns nil when acquired, else the remaining ttl.
pub const REENTRANT_ACQUIRE: &str = r#"
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Redisson-style re-entrant release. ARGV: ttl, owner. 1 released, 0 still held, nil not owner.
pub const REENTRANT_RELEASE: &str = r#"
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if counter > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 0
end
redis.call('del', KEYS[1])
return 1
"#;

/// Redisson-style read lock: hash with a mode field and per-owner hold counts,
/// plus one timeout key per reader hold. ARGV: ttl, owner, writer id.
pub const RW_READ: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[1] .. ':' .. ARGV[2] .. ':rwlock_timeout:1', 1, 'px', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[1] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. ind, 1, 'px', ARGV[1])
  local remain = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(remain, tonumber(ARGV[1])))
  return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Redisson-style read unlock: drop one hold and its timeout key, then
/// recompute the key's expiry from the remaining readers' timeout keys.
pub const RW_READ_UNLOCK: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if counter == 0 then
  redis.call('hdel', KEYS[1], ARGV[2])
end
redis.call('del', KEYS[1] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. (counter + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local maxRemain = -3
  for _, key in ipairs(redis.call('hkeys', KEYS[1])) do
    local n = tonumber(redis.call('hget', KEYS[1], key))
    if type(n) == 'number' then
      for i = n, 1, -1 do
        local remain = redis.call('pttl', KEYS[1] .. ':' .. key .. ':rwlock_timeout:' .. i)
        maxRemain = math.max(remain, maxRemain)
      end
    end
  end
  if maxRemain > 0 then
    redis.call('pexpire', KEYS[1], maxRemain)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
return 1
"#;

/// Redisson-style write lock. ARGV: ttl, writer id.
pub const RW_WRITE: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local remain = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], remain + ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])
"#;

/// Redisson-style write unlock. ARGV: ttl, writer id.
pub const RW_WRITE_UNLOCK: &str = r#"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  return 1
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return nil
  end
  local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
  if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[2])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  return 1
end
return nil
"#;
