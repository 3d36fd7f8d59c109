package io.warden.spring.cache;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.springframework.cache.CacheManager;
import org.springframework.cache.annotation.Cacheable;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.data.redis.cache.RedisCacheManager;
import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;

/**
 * One JVM of the multi-JVM {@code @Cacheable(sync = true)} run: a Spring context whose cached
 * method counts its loads with {@code INCR} on the server; {@code threads} threads call it for
 * {@code keys} keys each (in their own random order) once every JVM is ready.
 *
 * <p>{@code main(mode, port, run, jvms, threads, keys)}; mode {@code warden} or {@code redis}
 * (spring-data-redis {@code RedisCacheManager}).
 */
public final class CacheLoadWorker {
  static String mode;
  static int port;
  static String run;

  /** The cached method. */
  public static class Catalog {
    private final StatefulRedisConnection<String, String> counter;

    Catalog(StatefulRedisConnection<String, String> counter) {
      this.counter = counter;
    }

    @Cacheable(cacheNames = "items", sync = true)
    public String item(String id) throws InterruptedException {
      counter.sync().incr(run + ":loads");
      Thread.sleep(20); // a slow database: the window in which other callers miss too
      return "item-" + id;
    }
  }

  @Configuration(proxyBeanMethods = false)
  @EnableCaching
  static class App {
    @Bean(destroyMethod = "shutdown")
    RedisClient redisClient() {
      return RedisClient.create("redis://127.0.0.1:" + port);
    }

    @Bean(destroyMethod = "close")
    StatefulRedisConnection<String, String> counter(RedisClient client) {
      return client.connect();
    }

    @Bean
    Catalog catalog(StatefulRedisConnection<String, String> counter) {
      return new Catalog(counter);
    }

    @Bean(destroyMethod = "close")
    Warden warden(RedisClient client) {
      return Warden.create(LettuceTransport.create(client));
    }

    @Bean
    LettuceConnectionFactory connectionFactory() {
      return new LettuceConnectionFactory(new RedisStandaloneConfiguration("127.0.0.1", port));
    }

    @Bean
    CacheManager cacheManager(Warden warden, LettuceConnectionFactory connectionFactory) {
      return mode.equals("warden")
          ? new WardenCacheManager(warden)
          : RedisCacheManager.create(connectionFactory);
    }
  }

  public static void main(String[] args) throws Exception {
    run(args);
    System.exit(0);
  }

  static void run(String... args) throws Exception {
    mode = args[0];
    port = Integer.parseInt(args[1]);
    run = args[2];
    int jvms = Integer.parseInt(args[3]);
    int threads = Integer.parseInt(args[4]);
    int keys = Integer.parseInt(args[5]);
    try (AnnotationConfigApplicationContext ctx =
        new AnnotationConfigApplicationContext(App.class)) {
      Catalog catalog = ctx.getBean(Catalog.class);
      @SuppressWarnings("unchecked")
      StatefulRedisConnection<String, String> counter =
          (StatefulRedisConnection<String, String>) ctx.getBean("counter");
      counter.sync().incr(run + ":ready");
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (Long.parseLong(counter.sync().get(run + ":ready")) < jvms) {
        if (System.nanoTime() > end) {
          throw new IllegalStateException("the other JVMs did not start");
        }
        Thread.sleep(5);
      }
      ExecutorService pool = Executors.newFixedThreadPool(threads);
      try {
        List<Future<?>> done = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
          long seed = t * 31L + ProcessHandle.current().pid();
          done.add(
              pool.submit(
                  () -> {
                    List<Integer> order = new ArrayList<>();
                    for (int k = 0; k < keys; k++) {
                      order.add(k);
                    }
                    Collections.shuffle(order, new Random(seed));
                    for (int k : order) {
                      String v = catalog.item("k" + k);
                      if (!v.equals("item-k" + k)) {
                        throw new IllegalStateException("k" + k + " -> " + v);
                      }
                    }
                    return null;
                  }));
        }
        for (Future<?> f : done) {
          f.get(120, TimeUnit.SECONDS);
        }
      } finally {
        pool.shutdownNow();
      }
    }
  }
}
