package io.warden.spring.docs;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.spring.cache.WardenCacheConfiguration;
import io.warden.spring.cache.WardenCacheManager;
import io.warden.spring.integration.WardenLockRegistry;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.Lock;
import org.springframework.cache.annotation.Cacheable;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * The code of docs/clients/java-spring.md: each {@code docs:begin NAME} / {@code docs:end} region
 * is a block of the page, word for word ({@link DocsSnippetsTest} checks it and runs it).
 */
final class DocsExamples {
  private DocsExamples() {}

  static final AtomicInteger LOADS = new AtomicInteger();

  record Product(String id, String name) implements java.io.Serializable {}

  static Product loadFromDatabase(String id) {
    LOADS.incrementAndGet();
    return new Product(id, "product " + id);
  }

  static void ship(String orderId) {}

  // docs:begin cacheable
  public static class ProductService {
    // One load per cold id across every JVM of the application.
    @Cacheable(cacheNames = "products", sync = true)
    public Product product(String id) {
      return loadFromDatabase(id);
    }
  }

  // docs:end

  // docs:begin lock-registry
  public static class Shipping {
    private final LockRegistry<?> locks;

    public Shipping(LockRegistry<?> locks) {
      this.locks = locks;
    }

    public boolean shipOnce(String orderId) throws InterruptedException {
      Lock lock = locks.obtain("order:" + orderId);
      if (!lock.tryLock(5, TimeUnit.SECONDS)) { // waits in the server's queue
        return false;
      }
      try {
        ship(orderId);
        return true;
      } finally {
        lock.unlock();
      }
    }
  }

  // docs:end

  static String redisUri;

  // docs:begin without-boot
  @Configuration
  @EnableCaching
  public static class WardenConfig {
    @Bean(destroyMethod = "shutdown")
    RedisClient redisClient() {
      return RedisClient.create(redisUri); // "redis://localhost:6379"
    }

    @Bean(destroyMethod = "close")
    Warden warden(RedisClient redisClient) {
      return Warden.create(LettuceTransport.create(redisClient));
    }

    @Bean
    WardenCacheManager cacheManager(Warden warden) {
      return WardenCacheManager.builder(warden)
          .cacheDefaults(
              WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofMinutes(10)))
          .withCacheConfiguration(
              "products",
              WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofMinutes(1)))
          .build();
    }

    @Bean
    WardenLockRegistry lockRegistry(Warden warden) {
      return new WardenLockRegistry(warden, "locks");
    }
  }
  // docs:end
}
