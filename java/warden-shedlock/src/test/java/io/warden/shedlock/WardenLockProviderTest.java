package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.WardenServerException;
import io.warden.lettuce.LettuceTransport;
import io.warden.testing.RedisServer;
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

  private static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
    return new LockConfiguration(ClockProvider.now(), name, atMost, atLeast);
  }

  private static String name() {
    return "job-" + UUID.randomUUID();
  }

  private static long pttl(String name) {
    return (Long) server.call("PTTL", provider.key(name));
  }

  @Test
  void lockAtMostForIsTheLease() {
    String name = name();
    SimpleLock lock =
        provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    assertThat(pttl(name)).isBetween(1L, 30_000L).isGreaterThan(20_000L);
    lock.unlock();
    assertThat(server.call("EXISTS", provider.key(name))).isEqualTo(0L);
  }

  @Test
  void unlockBeforeLockAtLeastForShortensTheLeaseToWhatRemains() {
    String name = name();
    SimpleLock lock =
        provider.lock(config(name, Duration.ofSeconds(60), Duration.ofSeconds(5))).orElseThrow();
    lock.unlock();
    // Still held, for what remains of the 5 s, no longer than that.
    assertThat(pttl(name)).isBetween(1L, 5_000L);
    assertThat(provider.lock(config(name, Duration.ofSeconds(60), Duration.ZERO))).isEmpty();
  }

  @Test
  void unlockAfterLockAtLeastForReleases() throws InterruptedException {
    String name = name();
    SimpleLock lock =
        provider.lock(config(name, Duration.ofSeconds(60), Duration.ofMillis(20))).orElseThrow();
    Thread.sleep(40);
    lock.unlock();
    assertThat(server.call("EXISTS", provider.key(name))).isEqualTo(0L);
  }

  @Test
  void aBusyLockIsNotWaitedFor() {
    String name = name();
    SimpleLock lock =
        provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    Optional<SimpleLock> second =
        provider.lock(config(name, Duration.ofSeconds(30), Duration.ZERO));
    assertThat(second).isEmpty();
    @SuppressWarnings("unchecked")
    List<Object> info = (List<Object>) server.call("LOCK.INFO", provider.key(name));
    assertThat(info.get(info.size() - 1)).isEqualTo(0L); // waiters
    lock.unlock();
  }

  @Test
  void extendResetsTheLease() {
    String name = name();
    SimpleLock lock =
        provider.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)).orElseThrow();
    SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ZERO).orElseThrow();
    assertThat(pttl(name)).isGreaterThan(5_000L);
    extended.unlock();
    assertThat(server.call("EXISTS", provider.key(name))).isEqualTo(0L);
  }

  @Test
  void aKeyOfAnotherTypeIsTheServersError() {
    String name = name();
    server.call("SET", provider.key(name), "not a lock");
    assertThatThrownBy(() -> provider.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)))
        .isInstanceOf(WardenServerException.class)
        .hasMessageStartingWith("WRONGTYPE");
  }

  @Test
  void theKeyPrefixIsConfigurable() {
    WardenLockProvider other = new WardenLockProvider(warden, "jobs:");
    String name = name();
    SimpleLock lock = other.lock(config(name, Duration.ofSeconds(5), Duration.ZERO)).orElseThrow();
    assertThat(server.call("EXISTS", "jobs:" + name)).isEqualTo(1L);
    lock.unlock();
  }
}
