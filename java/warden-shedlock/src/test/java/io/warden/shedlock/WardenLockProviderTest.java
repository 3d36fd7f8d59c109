package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.warden.WardenServerException;
import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/** What the provider sends the server: the lease, lockAtLeastFor on unlock, never a wait. */
@Tag("integration")
class WardenLockProviderTest {
  private static ProviderFixture f;

  @BeforeAll
  static void start() {
    f = new ProviderFixture();
  }

  @AfterAll
  static void stop() {
    f.close();
  }

  private static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
    return new LockConfiguration(ClockProvider.now(), name, atMost, atLeast);
  }

  private static String name() {
    return "job-" + UUID.randomUUID();
  }

  private static long pttl(String name) {
    return (Long) f.server.call("PTTL", f.provider.key(name));
  }

  @Test
  void lockAtMostForIsTheLease() {
    String name = name();
    SimpleLock lock =
        f.provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    assertThat(pttl(name)).isBetween(1L, 30_000L).isGreaterThan(20_000L);
    lock.unlock();
    assertThat(f.server.call("EXISTS", f.provider.key(name))).isEqualTo(0L);
  }

  @Test
  void unlockBeforeLockAtLeastForShortensTheLeaseToWhatRemains() {
    String name = name();
    SimpleLock lock =
        f.provider.lock(config(name, Duration.ofSeconds(60), Duration.ofSeconds(5))).orElseThrow();
    lock.unlock();
    // Still held, for what remains of the 5 s, no longer than that.
    assertThat(pttl(name)).isBetween(1L, 5_000L);
    assertThat(f.provider.lock(config(name, Duration.ofSeconds(60), Duration.ZERO))).isEmpty();
  }

  @Test
  void unlockAfterLockAtLeastForReleases() throws InterruptedException {
    String name = name();
    SimpleLock lock =
        f.provider.lock(config(name, Duration.ofSeconds(60), Duration.ofMillis(20))).orElseThrow();
    Thread.sleep(40);
    lock.unlock();
    assertThat(f.server.call("EXISTS", f.provider.key(name))).isEqualTo(0L);
  }

  @Test
  void aBusyLockIsNotWaitedFor() {
    String name = name();
    SimpleLock lock =
        f.provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    Optional<SimpleLock> second =
        f.provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO));
    assertThat(second).isEmpty();
    @SuppressWarnings("unchecked")
    List<Object> info = (List<Object>) f.server.call("LOCK.INFO", f.provider.key(name));
    assertThat(info.get(info.size() - 1)).isEqualTo(0L); // waiters
    lock.unlock();
  }

  @Test
  void extendResetsTheLease() {
    String name = name();
    SimpleLock lock =
        f.provider.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)).orElseThrow();
    SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ZERO).orElseThrow();
    assertThat(pttl(name)).isGreaterThan(5_000L);
    extended.unlock();
    assertThat(f.server.call("EXISTS", f.provider.key(name))).isEqualTo(0L);
  }

  @Test
  void aKeyOfAnotherTypeIsTheServersError() {
    String name = name();
    f.server.call("SET", f.provider.key(name), "not a lock");
    assertThatThrownBy(() -> f.provider.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)))
        .isInstanceOf(WardenServerException.class)
        .hasMessageStartingWith("WRONGTYPE");
  }

  @Test
  void theKeyPrefixIsConfigurable() {
    WardenLockProvider other = new WardenLockProvider(f.warden, "jobs:");
    String name = name();
    SimpleLock lock = other.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)).orElseThrow();
    assertThat(f.server.call("EXISTS", "jobs:" + name)).isEqualTo(1L);
    lock.unlock();
  }
}
