package io.warden.spring.cache;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.spring.ServerInfo;
import io.warden.testing.RedisServer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.cache.Cache;
import org.springframework.data.redis.serializer.RedisSerializer;

/** {@link WardenCache}'s Spring Cache contract on a real server. */
@Tag("integration")
class WardenCacheTest {
  private static RedisServer server;
  private static RedisClient client;
  private static Warden warden;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
    client = RedisClient.create(server.uri());
    warden = Warden.create(LettuceTransport.create(client));
  }

  @AfterAll
  static void stop() {
    warden.close();
    client.shutdown();
    server.close();
  }

  private static WardenCache cache(WardenCacheConfiguration config) {
    return new WardenCache("c-" + UUID.randomUUID(), warden, config);
  }

  private static WardenCache cache() {
    return cache(WardenCacheConfiguration.defaultCacheConfig());
  }

  private static String serverKey(WardenCache cache, String key) {
    return cache.getName() + "::" + key;
  }

  @Test
  void putGetEvict() {
    WardenCache cache = cache();
    assertThat(cache.get("a")).isNull();
    cache.put("a", List.of(1, 2, 3));
    assertThat(cache.get("a").get()).isEqualTo(List.of(1, 2, 3));
    assertThat((Object) cache.get("a", List.class)).isEqualTo(List.of(1, 2, 3));
    assertThat(server.call("EXISTS", serverKey(cache, "a"))).isEqualTo(1L);
    assertThat(cache.evictIfPresent("a")).isTrue();
    assertThat(cache.evictIfPresent("a")).isFalse();
    assertThat(cache.get("a")).isNull();
  }

  @Test
  void entriesLiveForTheConfiguredTtl() {
    WardenCache cache =
        cache(WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofSeconds(60)));
    cache.put("p", "v");
    assertThat((Long) server.call("PTTL", serverKey(cache, "p"))).isBetween(50_000L, 60_000L);
    assertThat(cache.get("g", () -> "loaded")).isEqualTo("loaded");
    assertThat((Long) server.call("PTTL", serverKey(cache, "g"))).isBetween(50_000L, 60_000L);
    WardenCache forever = cache();
    forever.put("p", "v");
    assertThat(server.call("PTTL", serverKey(forever, "p"))).isEqualTo(-1L);
  }

  @Test
  void getWithLoaderLoadsOnceThenServesTheValue() {
    WardenCache cache = cache();
    AtomicInteger loads = new AtomicInteger();
    Callable<String> loader = () -> "v" + loads.incrementAndGet();
    assertThat(cache.get("k", loader)).isEqualTo("v1");
    assertThat(cache.get("k", loader)).isEqualTo("v1");
    assertThat(loads).hasValue(1);
  }

  @Test
  void nullIsCachedUnlessDisabled() {
    WardenCache cache = cache();
    AtomicInteger loads = new AtomicInteger();
    Callable<Object> loader =
        () -> {
          loads.incrementAndGet();
          return null;
        };
    assertThat(cache.get("n", loader)).isNull();
    assertThat(cache.get("n", loader)).isNull();
    assertThat(loads).hasValue(1);
    assertThat(cache.get("n")).isNotNull();
    assertThat(cache.get("n").get()).isNull();

    WardenCache strict =
        cache(WardenCacheConfiguration.defaultCacheConfig().disableCachingNullValues());
    assertThatThrownBy(() -> strict.get("n", loader)).isInstanceOf(IllegalArgumentException.class);
    assertThatThrownBy(() -> strict.put("n", null)).isInstanceOf(IllegalArgumentException.class);
    // The refused load gave its lease back: nothing is left waiting for a fill.
    Map<String, Object> info = ServerInfo.info(server, "CACHE.INFO", serverKey(strict, "n"));
    assertThat(info.get("lease")).isNull();
  }

  @Test
  void aFailingLoaderIsAValueRetrievalExceptionAndAbandonsTheLease() {
    WardenCache cache = cache();
    IllegalStateException boom = new IllegalStateException("boom");
    assertThatThrownBy(
            () ->
                cache.get(
                    "f",
                    () -> {
                      throw boom;
                    }))
        .isInstanceOf(Cache.ValueRetrievalException.class)
        .hasCause(boom);
    Map<String, Object> info = ServerInfo.info(server, "CACHE.INFO", serverKey(cache, "f"));
    assertThat(info.get("lease")).isNull();
    assertThat(info.get("value")).isEqualTo("miss");
    assertThat(cache.get("f", () -> "ok")).isEqualTo("ok");
  }

  @Test
  void putIfAbsentKeepsTheFirstValue() {
    WardenCache cache = cache();
    assertThat(cache.putIfAbsent("k", "first")).isNull();
    assertThat(cache.putIfAbsent("k", "second").get()).isEqualTo("first");
    assertThat(cache.get("k").get()).isEqualTo("first");
  }

  @Test
  void clearInvalidatesThisCachesKeysOnly() {
    WardenCache cache =
        new WardenCache(
            "c*[x]-" + UUID.randomUUID(), warden, WardenCacheConfiguration.defaultCacheConfig());
    WardenCache other = cache();
    for (int i = 0; i < 2500; i++) {
      cache.put("k" + i, i);
    }
    other.put("k1", 1);
    assertThat(cache.invalidate()).isTrue();
    assertThat(cache.get("k1")).isNull();
    assertThat(cache.get("k2499")).isNull();
    assertThat(other.get("k1").get()).isEqualTo(1);
    assertThat(cache.invalidate()).isFalse();
    cache.clear();
  }

  @Test
  void clearWithoutAKeyPrefixIsRefused() {
    WardenCache cache = cache(WardenCacheConfiguration.defaultCacheConfig().disableKeyPrefix());
    cache.put("plain-" + UUID.randomUUID(), "v");
    assertThatThrownBy(cache::clear).isInstanceOf(IllegalStateException.class);
  }

  @Test
  void aRedisSerializerStoresItsOwnBytes() {
    WardenCache cache =
        cache(
            WardenCacheConfiguration.defaultCacheConfig()
                .serializeValuesWith(RedisSerializerAdapter.of(RedisSerializer.string()))
                .prefixCacheNameWith("app:"));
    cache.put("k", "plain text");
    byte[] raw = (byte[]) server.call("GET", "app:" + cache.getName() + "::k");
    assertThat(new String(raw, StandardCharsets.UTF_8)).isEqualTo("plain text");
    assertThat(cache.get("k").get()).isEqualTo("plain text");
  }

  @Test
  void keysAreStringsOfTheirToString() {
    WardenCache cache = cache();
    cache.put(42, "n");
    cache.put(new org.springframework.cache.interceptor.SimpleKey("a", 1), "s");
    assertThat(server.call("EXISTS", serverKey(cache, "42"))).isEqualTo(1L);
    assertThat(cache.get(new org.springframework.cache.interceptor.SimpleKey("a", 1)).get())
        .isEqualTo("s");
    assertThatThrownBy(() -> cache.put(new Object(), "x"))
        .isInstanceOf(IllegalStateException.class);
  }

  @Test
  void manyThreadsOnOneColdKeyLoadOnce() throws Exception {
    WardenCache cache = cache();
    AtomicInteger loads = new AtomicInteger();
    CountDownLatch go = new CountDownLatch(1);
    ExecutorService pool = Executors.newFixedThreadPool(32);
    try {
      List<Future<String>> results =
          java.util.stream.IntStream.range(0, 32)
              .mapToObj(
                  i ->
                      pool.submit(
                          () -> {
                            go.await();
                            return cache.get(
                                "hot",
                                () -> {
                                  loads.incrementAndGet();
                                  Thread.sleep(100);
                                  return "value";
                                });
                          }))
              .toList();
      go.countDown();
      for (Future<String> f : results) {
        assertThat(f.get(30, TimeUnit.SECONDS)).isEqualTo("value");
      }
    } finally {
      pool.shutdownNow();
    }
    assertThat(loads).hasValue(1);
  }

  @Test
  void theManagerMakesCachesWithTheirConfiguration() {
    WardenCacheManager manager =
        WardenCacheManager.builder(warden)
            .cacheDefaults(
                WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofMinutes(10)))
            .withCacheConfiguration(
                "short",
                WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofSeconds(5)))
            .build();
    manager.afterPropertiesSet();
    assertThat(manager.getCacheNames()).containsExactly("short");
    assertThat(((WardenCache) manager.getCache("short")).getTtl()).isEqualTo(Duration.ofSeconds(5));
    assertThat(((WardenCache) manager.getCache("other")).getTtl())
        .isEqualTo(Duration.ofMinutes(10));

    WardenCacheManager fixed =
        WardenCacheManager.builder(warden)
            .initialCacheNames(List.of("only"))
            .disableCreateOnMissingCache()
            .build();
    fixed.afterPropertiesSet();
    assertThat(fixed.getCache("only")).isNotNull();
    assertThat(fixed.getCache("other")).isNull();
  }
}
