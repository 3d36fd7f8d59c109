package io.warden.bench;

import java.util.List;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;
import org.springframework.integration.redis.util.RedisLockRegistry;
import redis.clients.jedis.Connection;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.params.SetParams;

/** What Java teams run today, each with its defaults except the lease. */
final class Incumbents {
  private Incumbents() {}

  static final long LEASE_MS = Bench.LEASE_MS;

  static RedissonClient redisson(int port) {
    Config config = new Config();
    config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
    return Redisson.create(config);
  }

  /** Redisson's RLock: lock(lease)/unlock(), one RLock shared by the JVM's threads. */
  static Contender redissonLock(int port) {
    RedissonClient client = redisson(port);
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        RLock lock = client.getLock(key);
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
      }

      @Override
      public void close() {
        client.shutdown();
      }
    };
  }

  /** RPermitExpirableSemaphore: permits with an id and a lease, like warden's. */
  static Contender redissonSemaphore(int port, int limit) {
    RedissonClient client = redisson(port);
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        RPermitExpirableSemaphore sem = client.getPermitExpirableSemaphore(key);
        sem.trySetPermits(limit);
        return new Locker() {
          private String permit;

          @Override
          public void acquire() throws InterruptedException {
            permit = sem.acquire(LEASE_MS, TimeUnit.MILLISECONDS);
          }

          @Override
          public void release() {
            sem.release(permit);
          }
        };
      }

      @Override
      public void close() {
        client.shutdown();
      }
    };
  }

  /** RReadWriteLock: every RW_WRITE_EVERY-th hold a write, the others reads. */
  static Contender redissonReadWrite(int port) {
    RedissonClient client = redisson(port);
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        RReadWriteLock rw = client.getReadWriteLock(key);
        return new Alternating(
            () -> rw.writeLock().lock(LEASE_MS, TimeUnit.MILLISECONDS),
            () -> rw.writeLock().unlock(),
            () -> rw.readLock().lock(LEASE_MS, TimeUnit.MILLISECONDS),
            () -> rw.readLock().unlock(),
            thread);
      }

      @Override
      public void close() {
        client.shutdown();
      }
    };
  }

  /**
   * Spring Integration's RedisLockRegistry on a LettuceConnectionFactory, lease (expireAfter)
   * LEASE_MS, its defaults otherwise: SPIN_LOCK retries every 100 ms, PUB_SUB_LOCK waits for the
   * unlock message.
   */
  static Contender lockRegistry(int port, RedisLockRegistry.RedisLockType type) {
    LettuceConnectionFactory factory =
        new LettuceConnectionFactory(new RedisStandaloneConfiguration("127.0.0.1", port));
    factory.afterPropertiesSet();
    factory.start();
    RedisLockRegistry registry = new RedisLockRegistry(factory, "bench", LEASE_MS);
    registry.setRedisLockType(type);
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        Lock lock = registry.obtain(key);
        return new Locker() {
          @Override
          public void acquire() {
            lock.lock();
          }

          @Override
          public void release() {
            lock.unlock();
          }
        };
      }

      @Override
      public void close() {
        registry.destroy();
        factory.destroy();
      }
    };
  }

  static final String COMPARE_AND_DELETE =
      "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
          + "else return 0 end";

  /**
   * The SETNX lock from blog posts: SET key token NX PX lease, sleeping a random 1-5 ms between
   * tries; released with the compare-and-delete script (EVAL).
   */
  static Contender jedisSetNx(int port) {
    GenericObjectPoolConfig<Connection> pool = new GenericObjectPoolConfig<>();
    pool.setMaxTotal(Bench.THREADS + 4);
    pool.setMaxIdle(Bench.THREADS + 4);
    RedisClient client =
        RedisClient.builder().hostAndPort("127.0.0.1", port).poolConfig(pool).build();
    return new Contender() {
      @Override
      public Locker locker(String key, int thread) {
        String token = UUID.randomUUID().toString();
        SetParams nxPx = SetParams.setParams().nx().px(LEASE_MS);
        return new Locker() {
          @Override
          public void acquire() throws InterruptedException {
            while (!"OK".equals(client.set(key, token, nxPx))) {
              Thread.sleep(ThreadLocalRandom.current().nextInt(1, 6));
            }
          }

          @Override
          public void release() {
            client.eval(COMPARE_AND_DELETE, List.of(key), List.of(token));
          }
        };
      }

      @Override
      public void close() {
        client.close();
      }
    };
  }

  /** A read-write workload: every RW_WRITE_EVERY-th hold of a thread is a write. */
  static final class Alternating implements Contender.Locker {
    interface Step {
      void run() throws Exception;
    }

    private final Step writeLock;
    private final Step writeUnlock;
    private final Step readLock;
    private final Step readUnlock;
    private long n;
    private boolean writing;

    Alternating(Step writeLock, Step writeUnlock, Step readLock, Step readUnlock, int thread) {
      this.writeLock = writeLock;
      this.writeUnlock = writeUnlock;
      this.readLock = readLock;
      this.readUnlock = readUnlock;
      this.n = thread; // threads start at different phases so writes are spread
    }

    @Override
    public void acquire() throws Exception {
      writing = n++ % Bench.RW_WRITE_EVERY == 0;
      (writing ? writeLock : readLock).run();
    }

    @Override
    public void release() throws Exception {
      (writing ? writeUnlock : readUnlock).run();
    }

    boolean writing() {
      return writing;
    }
  }
}
