package io.warden.bench;

import org.springframework.integration.redis.util.RedisLockRegistry.RedisLockType;

/** The contenders by name; a name's suffix (-lock, -sem, -rw) is its workload. */
final class Contenders {
  private Contenders() {}

  static Contender open(String name, int port) throws Exception {
    switch (name) {
      case "warden-lettuce-lock":
        return WardenContenders.lettuce(port, "lock");
      case "warden-lettuce-sem":
        return WardenContenders.lettuce(port, "sem");
      case "warden-lettuce-rw":
        return WardenContenders.lettuce(port, "rw");
      case "warden-jedis-lock":
        return WardenContenders.jedis(port, "lock");
      case "redisson-lock":
        return Incumbents.redissonLock(port);
      case "redisson-sem":
        return Incumbents.redissonSemaphore(port, Bench.SEM_LIMIT);
      case "redisson-rw":
        return Incumbents.redissonReadWrite(port);
      case "registry-spin-lock":
        return Incumbents.lockRegistry(port, RedisLockType.SPIN_LOCK);
      case "registry-pubsub-lock":
        return Incumbents.lockRegistry(port, RedisLockType.PUB_SUB_LOCK);
      case "jedis-setnx-lock":
        return Incumbents.jedisSetNx(port);
      default:
        throw new IllegalArgumentException("unknown contender " + name);
    }
  }
}
