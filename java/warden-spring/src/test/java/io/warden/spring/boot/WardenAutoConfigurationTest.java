package io.warden.spring.boot;

import static org.assertj.core.api.Assertions.assertThat;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.spring.cache.WardenCache;
import io.warden.spring.cache.WardenCacheManager;
import io.warden.spring.integration.WardenLockRegistry;
import io.warden.testing.RedisServer;
import io.warden.testing.RespClient;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.cache.autoconfigure.CacheAutoConfiguration;
import org.springframework.boot.context.annotation.ImportCandidates;
import org.springframework.boot.data.redis.autoconfigure.DataRedisAutoConfiguration;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.cache.CacheManager;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.cache.concurrent.ConcurrentMapCacheManager;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.integration.support.locks.DefaultLockRegistry;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * The Boot auto-configuration: beans from {@code spring.data.redis.*}, backing off for the user's.
 */
@Tag("integration")
class WardenAutoConfigurationTest {
  private static RedisServer server;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
  }

  @AfterAll
  static void stop() {
    server.close();
  }

  private ApplicationContextRunner runner() {
    return new ApplicationContextRunner()
        .withConfiguration(
            AutoConfigurations.of(
                DataRedisAutoConfiguration.class,
                WardenAutoConfiguration.class,
                WardenCacheAutoConfiguration.class,
                WardenLockRegistryAutoConfiguration.class,
                CacheAutoConfiguration.class))
        .withPropertyValues(
            "spring.data.redis.host=127.0.0.1", "spring.data.redis.port=" + server.port());
  }

  @Configuration(proxyBeanMethods = false)
  @EnableCaching
  static class Caching {}

  @Test
  void theBeansComeFromSpringDataRedisSettings() {
    runner()
        .withUserConfiguration(Caching.class)
        .withPropertyValues("spring.data.redis.database=3", "spring.data.redis.client-name=shop")
        .run(
            ctx -> {
              assertThat(ctx).hasSingleBean(Warden.class);
              assertThat(ctx).hasSingleBean(WardenLockRegistry.class);
              assertThat(ctx.getBean(CacheManager.class)).isInstanceOf(WardenCacheManager.class);

              Lock lock = ctx.getBean(WardenLockRegistry.class).obtain("order-42");
              lock.lock();
              try (RespClient c = server.client()) {
                // The database and client name of spring.data.redis.* are warden's too.
                c.call("SELECT", "3");
                assertThat(c.call("LOCK.INFO", "lock:order-42")).isNotNull();
                String clients =
                    new String((byte[]) c.call("CLIENT", "LIST"), StandardCharsets.UTF_8);
                assertThat(clients).contains("name=shop");
              } finally {
                lock.unlock();
              }

              WardenCache cache = (WardenCache) ctx.getBean(CacheManager.class).getCache("users");
              assertThat(cache.get("1", () -> "Ada")).isEqualTo("Ada");
              try (RespClient c = server.client()) {
                c.call("SELECT", "3");
                assertThat(c.call("EXISTS", "users::1")).isEqualTo(1L);
              }
            });
  }

  @Test
  void cacheSettingsComeFromWardenProperties() {
    runner()
        .withUserConfiguration(Caching.class)
        .withPropertyValues(
            "spring.cache.type=warden",
            "warden.cache.time-to-live=10m",
            "warden.cache.time-to-live-by-cache.users=1m",
            "warden.lock.registry-key=locks",
            "warden.lock.expire-after=20s")
        .run(
            ctx -> {
              WardenCacheManager manager = ctx.getBean(WardenCacheManager.class);
              assertThat(((WardenCache) manager.getCache("users")).getTtl())
                  .isEqualTo(Duration.ofMinutes(1));
              assertThat(((WardenCache) manager.getCache("orders")).getTtl())
                  .isEqualTo(Duration.ofMinutes(10));
              WardenLockRegistry.WardenRegistryLock lock =
                  ctx.getBean(WardenLockRegistry.class).obtain("k");
              assertThat(lock.key()).isEqualTo("locks:k");
              lock.lock();
              try {
                assertThat((Long) server.call("PTTL", "locks:k")).isBetween(1L, 20_000L);
              } finally {
                lock.unlock();
              }
            });
  }

  @Configuration(proxyBeanMethods = false)
  @EnableCaching
  static class OwnBeans {
    @Bean(destroyMethod = "shutdown")
    RedisClient myClient() {
      return RedisClient.create(server.uri());
    }

    @Bean
    Warden myWarden(RedisClient myClient) {
      return Warden.create(LettuceTransport.create(myClient));
    }

    @Bean
    CacheManager myCacheManager() {
      return new ConcurrentMapCacheManager();
    }

    @Bean
    LockRegistry<?> myLockRegistry() {
      return new DefaultLockRegistry();
    }
  }

  @Test
  void eachBeanBacksOffWhenTheApplicationDefinesItsOwn() {
    runner()
        .withUserConfiguration(OwnBeans.class)
        .run(
            ctx -> {
              assertThat(ctx).hasSingleBean(Warden.class).hasBean("myWarden");
              assertThat(ctx).hasSingleBean(CacheManager.class).hasBean("myCacheManager");
              assertThat(ctx).hasSingleBean(LockRegistry.class).hasBean("myLockRegistry");
              assertThat(ctx).doesNotHaveBean(WardenCacheManager.class);
            });
  }

  @Test
  void anotherSpringCacheTypeKeepsItsCacheManager() {
    runner()
        .withUserConfiguration(Caching.class)
        .withPropertyValues("spring.cache.type=simple")
        .run(
            ctx -> {
              assertThat(ctx).hasSingleBean(Warden.class);
              assertThat(ctx).doesNotHaveBean(WardenCacheManager.class);
              assertThat(ctx.getBean(CacheManager.class))
                  .isInstanceOf(ConcurrentMapCacheManager.class);
            });
  }

  @Test
  void aClusterIsRefusedWithAMessage() {
    runner()
        .withPropertyValues("spring.data.redis.cluster.nodes=127.0.0.1:" + server.port())
        .run(
            ctx ->
                assertThat(ctx)
                    .getFailure()
                    .rootCause()
                    .hasMessageContaining("define a Warden bean"));
  }

  @Test
  void theStarterListsItsAutoConfigurations() {
    List<String> candidates =
        ImportCandidates.load(AutoConfiguration.class, getClass().getClassLoader()).getCandidates();
    assertThat(candidates)
        .contains(
            WardenAutoConfiguration.class.getName(),
            WardenCacheAutoConfiguration.class.getName(),
            WardenLockRegistryAutoConfiguration.class.getName());
  }
}
