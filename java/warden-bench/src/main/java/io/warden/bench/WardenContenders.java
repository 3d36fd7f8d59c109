package io.warden.bench;

import io.lettuce.core.RedisClient;
import io.warden.DistributedLock;
import io.warden.DistributedReadWriteLock;
import io.warden.DistributedSemaphore;
import io.warden.Permit;
import io.warden.Warden;
import io.warden.jedis.JedisTransport;
import io.warden.lettuce.LettuceTransport;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import redis.clients.jedis.Connection;

/** warden's Java client, shaped like the Redisson calls it is compared with. */
final class WardenContenders {
  private WardenContenders() {}

  static final long LEASE_MS = Bench.LEASE_MS;

  /** warden on Lettuce (one RedisClient, the transport's default connections). */
  static Contender lettuce(int port, String workload) {
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    Warden warden = Warden.create(LettuceTransport.create(client));
    return of(
        warden,
        workload,
        () -> {
          warden.close();
          client.shutdown();
        });
  }

  /** warden on Jedis: a pooled RedisClient as the shared transport. */
  static Contender jedis(int port, String workload) {
    GenericObjectPoolConfig<Connection> pool = new GenericObjectPoolConfig<>();
    pool.setMaxTotal(Bench.THREADS + 4);
    pool.setMaxIdle(Bench.THREADS + 4);
    redis.clients.jedis.RedisClient client =
        redis.clients.jedis.RedisClient.builder()
            .hostAndPort("127.0.0.1", port)
            .poolConfig(pool)
            .build();
    Warden warden = Warden.create(JedisTransport.create(client));
    return of(
        warden,
        workload,
        () -> {
          warden.close();
          client.close();
        });
  }

  private static Contender of(Warden warden, String workload, Runnable close) {
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        switch (workload) {
          case "lock":
            // One DistributedLock for the JVM's threads, as an RLock is shared.
            DistributedLock lock = warden.getLock(key);
            return new Locker() {
              @Override
              public void acquire() {
                lock.lock(LEASE_MS, TimeUnit.MILLISECONDS);
              }

              @Override
              public void release() {
                lock.unlock();
              }
            };
          case "sem":
            DistributedSemaphore sem = warden.getSemaphore(key, Bench.SEM_LIMIT);
            return new Locker() {
              private Permit permit;

              @Override
              public void acquire() throws InterruptedException {
                permit = sem.acquire(1, Duration.ofMillis(LEASE_MS));
              }

              @Override
              public void release() {
                permit.release();
              }
            };
          case "rw":
            DistributedReadWriteLock rw = warden.getReadWriteLock(key);
            return new Incumbents.Alternating(
                () -> rw.writeLock().lock(LEASE_MS, TimeUnit.MILLISECONDS),
                () -> rw.writeLock().unlock(),
                () -> rw.readLock().lock(LEASE_MS, TimeUnit.MILLISECONDS),
                () -> rw.readLock().unlock(),
                thread);
          default:
            throw new IllegalArgumentException(workload);
        }
      }

      @Override
      public void close() {
        close.run();
      }
    };
  }
}
