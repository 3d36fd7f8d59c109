package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;

import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.test.support.AbstractExtensibleLockProviderIntegrationTest;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;

/** ShedLock's own provider test suite (shedlock-test-support) run against a real server. */
@Tag("integration")
class WardenLockProviderIntegrationTest extends AbstractExtensibleLockProviderIntegrationTest {
  private static ProviderFixture f;

  @BeforeAll
  static void start() {
    f = new ProviderFixture();
  }

  @AfterAll
  static void stop() {
    f.close();
  }

  @Override
  protected ExtensibleLockProvider getLockProvider() {
    return f.provider;
  }

  @Override
  protected void assertUnlocked(String lockName) {
    assertThat(f.server.call("LOCK.INFO", f.provider.key(lockName))).isNull();
  }

  @Override
  protected void assertLocked(String lockName) {
    assertThat(f.server.call("LOCK.INFO", f.provider.key(lockName))).isNotNull();
  }
}
