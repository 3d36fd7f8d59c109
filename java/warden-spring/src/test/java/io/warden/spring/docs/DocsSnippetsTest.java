package io.warden.spring.docs;

import static org.assertj.core.api.Assertions.assertThat;

import io.warden.spring.boot.WardenAutoConfiguration;
import io.warden.spring.boot.WardenCacheAutoConfiguration;
import io.warden.spring.boot.WardenLockRegistryAutoConfiguration;
import io.warden.spring.cache.WardenCache;
import io.warden.spring.cache.WardenCacheManager;
import io.warden.spring.integration.WardenLockRegistry;
import io.warden.testing.RedisServer;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.cache.autoconfigure.CacheAutoConfiguration;
import org.springframework.boot.data.redis.autoconfigure.DataRedisAutoConfiguration;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Configuration;

/** docs/clients/java-spring.md: its Java blocks are {@link DocsExamples}' code, run here. */
@Tag("integration")
class DocsSnippetsTest {
  private static final Path PAGE = Snippets.root().resolve("docs/clients/java-spring.md");
  private static RedisServer server;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
  }

  @AfterAll
  static void stop() {
    server.close();
  }

  @Test
  void everyJavaBlockOfThePageIsExampleCode() throws Exception {
    List<String> regions =
        Snippets.regions(Paths.get("src/test/java/io/warden/spring/docs/DocsExamples.java"));
    List<String> blocks = Snippets.blocks(PAGE, "java");
    assertThat(blocks).hasSize(3);
    for (String block : blocks) {
      assertThat(regions).contains(block);
    }
  }

  @Test
  void theExamplesRun() throws Exception {
    DocsExamples.redisUri = server.uri();
    DocsExamples.LOADS.set(0);
    try (AnnotationConfigApplicationContext ctx =
        new AnnotationConfigApplicationContext(
            DocsExamples.WardenConfig.class, DocsExamples.ProductService.class)) {
      DocsExamples.ProductService products = ctx.getBean(DocsExamples.ProductService.class);
      assertThat(products.product("7").name()).isEqualTo("product 7");
      assertThat(products.product("7").name()).isEqualTo("product 7");
      assertThat(DocsExamples.LOADS).hasValue(1);
      assertThat((Long) server.call("PTTL", "products::7")).isBetween(1L, 60_000L);

      DocsExamples.Shipping shipping =
          new DocsExamples.Shipping(ctx.getBean(WardenLockRegistry.class));
      assertThat(shipping.shipOnce("42")).isTrue();
      assertThat(server.call("EXISTS", "locks:order:42")).isEqualTo(0L);
    }
  }

  @Configuration(proxyBeanMethods = false)
  @EnableCaching
  static class Caching {}

  @Test
  void thePropertiesOfThePageConfigureBoot() throws Exception {
    List<String> props = new ArrayList<>();
    for (String line : Snippets.blocks(PAGE, "properties").get(0).split("\n")) {
      if (line.startsWith("spring.data.redis.host=")) {
        line = "spring.data.redis.host=127.0.0.1";
      } else if (line.startsWith("spring.data.redis.port=")) {
        line = "spring.data.redis.port=" + server.port();
      }
      props.add(line);
    }
    new ApplicationContextRunner()
        .withConfiguration(
            AutoConfigurations.of(
                DataRedisAutoConfiguration.class,
                WardenAutoConfiguration.class,
                WardenCacheAutoConfiguration.class,
                WardenLockRegistryAutoConfiguration.class,
                CacheAutoConfiguration.class))
        .withUserConfiguration(Caching.class)
        .withPropertyValues(props.toArray(new String[0]))
        .run(
            ctx -> {
              WardenCacheManager manager = ctx.getBean(WardenCacheManager.class);
              assertThat(((WardenCache) manager.getCache("products")).getTtl())
                  .isEqualTo(Duration.ofMinutes(1));
              assertThat(((WardenCache) manager.getCache("other")).getTtl())
                  .isEqualTo(Duration.ofMinutes(10));
              assertThat(ctx.getBean(WardenLockRegistry.class).obtain("k").key())
                  .isEqualTo("locks:k");
            });
  }
}
