package io.warden.spring.boot3;

import static org.assertj.core.api.Assertions.assertThat;

import io.warden.Warden;
import io.warden.WardenLock;
import io.warden.spring.boot.WardenAutoConfiguration;
import io.warden.spring.boot.WardenCacheAutoConfiguration;
import io.warden.spring.boot.WardenLockRegistryAutoConfiguration;
import io.warden.spring.cache.WardenCacheManager;
import io.warden.testing.RedisServer;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.context.annotation.ImportCandidates;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.cache.Cache;
import org.springframework.cache.CacheManager;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.context.annotation.Configuration;

/**
 * warden-spring on Spring Boot 3.5: the Warden bean from Boot 3's settings, warden-spring's cache
 * auto-configuration on it, and warden-spring's Boot 4 classes backing off.
 */
@Tag("integration")
class WardenBoot3AutoConfigurationTest {
  private static RedisServer server;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
  }

  @AfterAll
  static void stop() {
    server.close();
  }

  /** Every auto-configuration the two jars list, as Boot 3 loads them. */
  private static List<String> listed() {
    return ImportCandidates.load(
            org.springframework.boot.autoconfigure.AutoConfiguration.class,
            WardenBoot3AutoConfigurationTest.class.getClassLoader())
        .getCandidates();
  }

  /** An application as Boot 3 runs one: every auto-configuration the class path lists. */
  @Configuration(proxyBeanMethods = false)
  @EnableAutoConfiguration
  @EnableCaching
  static class Application {}

  @Test
  void theWardenAndTheCacheComeFromBoot3Settings() {
    assertThat(listed())
        .contains(
            WardenBoot3AutoConfiguration.class.getName(),
            WardenAutoConfiguration.class.getName(),
            WardenCacheAutoConfiguration.class.getName(),
            WardenLockRegistryAutoConfiguration.class.getName());
    new ApplicationContextRunner()
        .withUserConfiguration(Application.class)
        .withPropertyValues(
            "spring.data.redis.host=127.0.0.1",
            "spring.data.redis.port=" + server.port(),
            "spring.data.redis.database=2")
        .run(
            ctx -> {
              assertThat(ctx).hasNotFailed();
              assertThat(ctx).hasSingleBean(Warden.class);
              assertThat(ctx).hasSingleBean(WardenBoot3AutoConfiguration.class);
              // Boot 4's class and the Spring Integration 7 registry back off on Boot 3.
              assertThat(ctx).doesNotHaveBean(WardenAutoConfiguration.class);
              assertThat(ctx).doesNotHaveBean(WardenLockRegistryAutoConfiguration.class);
              Warden warden = ctx.getBean(Warden.class);
              try (WardenLock lock =
                  warden.lock("boot3:lock").lease(Duration.ofSeconds(10)).acquire()) {
                assertThat(server.call("SELECT", "2")).isNotNull();
                assertThat(lock.fence()).isPositive();
              }
              CacheManager cacheManager = ctx.getBean(CacheManager.class);
              assertThat(cacheManager).isInstanceOf(WardenCacheManager.class);
              Cache cache = cacheManager.getCache("users");
              AtomicInteger loads = new AtomicInteger();
              for (int i = 0; i < 2; i++) {
                assertThat(cache.get("42", () -> "ada" + loads.incrementAndGet()))
                    .isEqualTo("ada1");
              }
            });
  }
}
