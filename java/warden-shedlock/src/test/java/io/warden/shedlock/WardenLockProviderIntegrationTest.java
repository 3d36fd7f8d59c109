package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.testing.RedisServer;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.test.support.AbstractExtensibleLockProviderIntegrationTest;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;

/** ShedLock's own provider test suite (shedlock-test-support) run against a real server. */
@Tag("integration")
class WardenLockProviderIntegrationTest extends AbstractExtensibleLockProviderIntegrationTest {
  private static RedisServer server;
  private static RedisClient client;
  private static Warden warden;
  private static WardenLockProvider provider;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
    client = RedisClient.create(server.uri());
    warden = Warden.create(LettuceTransport.create(client));
    provider = new WardenLockProvider(warden);
  }

  @AfterAll
  static void stop() {
    warden.close();
    client.shutdown();
    server.close();
  }

  @Override
  protected ExtensibleLockProvider getLockProvider() {
    return provider;
  }

  @Override
  protected void assertUnlocked(String lockName) {
    assertThat(server.call("LOCK.INFO", provider.key(lockName))).isNull();
  }

  @Override
  protected void assertLocked(String lockName) {
    assertThat(server.call("LOCK.INFO", provider.key(lockName))).isNotNull();
  }
}
