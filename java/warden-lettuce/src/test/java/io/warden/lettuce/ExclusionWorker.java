package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.ScriptOutputType;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.warden.DistributedLock;
import io.warden.Warden;
import io.warden.WardenLock;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicReference;

/**
 * One JVM of {@link ExclusionAcrossJvmsTest}: {@code threads} threads take locks on {@code keys}
 * keys, {@code perThread} times each; inside each hold a script on the server checks that nobody
 * else is inside and that the hold's fence is above every fence the key saw before (what a fenced
 * store checks), counting violations. Even threads use the handle API, odd ones the {@code Lock}
 * facade. Also started by {@code kill9}: {@code hold <port> <key> <leaseMs>} takes the lock, prints
 * "held", and sleeps until killed.
 */
public final class ExclusionWorker {
  /** KEYS: inside, last fence, counters; ARGV: fence. Returns 1, or 0 on a violation. */
  static final String ENTER =
      "local n = redis.call('INCR', KEYS[1]) "
          + "local last = tonumber(redis.call('GET', KEYS[2]) or '0') "
          + "local fence = tonumber(ARGV[1]) "
          + "redis.call('HINCRBY', KEYS[3], 'acquired', 1) "
          + "if fence > last then redis.call('SET', KEYS[2], ARGV[1]) end "
          + "if n ~= 1 or fence <= last then redis.call('HINCRBY', KEYS[3], 'violations', 1) "
          + "return 0 end return 1";

  private ExclusionWorker() {}

  public static void main(String[] args) throws Exception {
    if (args[0].equals("hold")) {
      hold(Integer.parseInt(args[1]), args[2], Long.parseLong(args[3]));
      return;
    }
    int port = Integer.parseInt(args[0]);
    String run = args[1];
    int threads = Integer.parseInt(args[2]);
    int perThread = Integer.parseInt(args[3]);
    int keys = Integer.parseInt(args[4]);
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    try (Warden warden = Warden.create(LettuceTransport.create(client));
        StatefulRedisConnection<String, String> conn = client.connect()) {
      RedisCommands<String, String> redis = conn.sync();
      String sha = redis.scriptLoad(ENTER);
      AtomicReference<Throwable> failure = new AtomicReference<>();
      List<Thread> workers = new ArrayList<>();
      for (int t = 0; t < threads; t++) {
        final boolean facade = t % 2 == 1;
        Thread worker =
            new Thread(
                () -> {
                  try {
                    for (int i = 0; i < perThread; i++) {
                      String key = run + ":lock:" + ThreadLocalRandom.current().nextInt(keys);
                      String[] state = {key + ":inside", key + ":fence", run + ":counts"};
                      if (facade) {
                        DistributedLock lock = warden.getLock(key);
                        lock.lock(10, java.util.concurrent.TimeUnit.SECONDS);
                        try {
                          enter(redis, sha, state, lock.fence());
                        } finally {
                          lock.unlock();
                        }
                      } else {
                        try (WardenLock hold =
                            warden.lock(key).lease(Duration.ofSeconds(10)).acquire()) {
                          enter(redis, sha, state, hold.fence());
                        }
                      }
                    }
                  } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                  }
                });
        workers.add(worker);
        worker.start();
      }
      for (Thread w : workers) {
        w.join();
      }
      if (failure.get() != null) {
        failure.get().printStackTrace();
        System.exit(1);
      }
    } finally {
      client.shutdown();
    }
  }

  private static void enter(
      RedisCommands<String, String> redis, String sha, String[] keys, long fence) {
    Long ok = redis.evalsha(sha, ScriptOutputType.INTEGER, keys, Long.toString(fence));
    if (ok == null || ok != 1) {
      System.out.println("violation on " + keys[0] + " at fence " + fence);
    }
    redis.decr(keys[0]);
  }

  private static void hold(int port, String key, long leaseMs) throws Exception {
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    Warden warden = Warden.create(LettuceTransport.create(client));
    WardenLock hold = warden.lock(key).lease(Duration.ofMillis(leaseMs)).acquire();
    System.out.println("held " + hold.fence());
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }
}
