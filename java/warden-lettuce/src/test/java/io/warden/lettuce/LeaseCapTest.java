package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.DistributedLock;
import io.warden.Permit;
import io.warden.Warden;
import io.warden.WardenLock;
import io.warden.testing.RedisServer;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * Holds longer than the server's {@code warden.max-lease} (redis.conf.example's 30 s, here 1 s so
 * that renewals run within seconds): without a lease the watchdog renews at the cap until unlock; a
 * lease asked over the cap is granted at the cap and renewed until the lease asked ends.
 */
@Tag("integration")
class LeaseCapTest {
  private static final long CAP_MS = 1000;
  private static RedisServer server;
  private static RedisClient client;
  private static Warden warden;

  @BeforeAll
  static void start() {
    server = RedisServer.start("--warden.max-lease", Long.toString(CAP_MS));
    client = RedisClient.create(server.uri());
    warden = Warden.create(LettuceTransport.create(client));
  }

  @AfterAll
  static void stop() {
    warden.close();
    client.shutdown();
    server.close();
  }

  private static long pttl(String key) {
    return (Long) server.call("PTTL", key);
  }

  private static void waitFor(String what, BooleanSupplier cond, long ms) throws Exception {
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
    while (!cond.getAsBoolean()) {
      assertTrue(System.nanoTime() - end < 0, "timed out waiting for " + what);
      Thread.sleep(10);
    }
  }

  @Test
  void aHoldWithoutALeaseOutlivesMaxLeaseUntilUnlock() throws Exception {
    // The default watchdog lease (30 s) is over the cap: granted at 1 s, renewed every third.
    DistributedLock lock = warden.getLock("cap:dog");
    lock.lock();
    assertTrue(pttl("cap:dog") <= CAP_MS);
    Thread.sleep(3 * CAP_MS); // the work: three leases long
    assertTrue(lock.isHeldByCurrentThread());
    assertNotNull(server.call("LOCK.INFO", "cap:dog"));
    lock.unlock();
    assertNull(server.call("LOCK.INFO", "cap:dog"));
  }

  @Test
  void aLeaseOverMaxLeaseIsCappedRenewedAndEndsWhenAsked() throws Exception {
    // Redisson's tryLock(wait, lease, unit) with a lease of 2.5 caps.
    DistributedLock lock = warden.getLock("cap:lease");
    long asked = System.nanoTime();
    assertTrue(lock.tryLock(100, 2500, TimeUnit.MILLISECONDS));
    assertTrue(pttl("cap:lease") <= CAP_MS);
    waitFor(
        "the lease asked for to end", () -> server.call("LOCK.INFO", "cap:lease") == null, 5000);
    long heldMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - asked);
    assertTrue(heldMs >= 2500 - 50 && heldMs < 2500 + CAP_MS / 2, "held " + heldMs + " ms");
    // The lease ran out before unlock: unlock says so.
    assertThrows(IllegalMonitorStateException.class, lock::unlock);
  }

  @Test
  void extendAndPermitsOverMaxLeaseAreCappedToo() throws Exception {
    WardenLock h = warden.lock("cap:extend").lease(Duration.ofMillis(500)).acquire();
    assertTrue(h.extend(Duration.ofSeconds(2)));
    assertTrue(pttl("cap:extend") <= CAP_MS);
    Thread.sleep(CAP_MS + 300);
    assertTrue(h.isHeld());
    h.release();
    Optional<Permit> p =
        warden.getSemaphore("cap:sem", 2).tryAcquire(1, Duration.ZERO, Duration.ofSeconds(5));
    assertTrue(p.isPresent());
    assertTrue(pttl("cap:sem") <= CAP_MS);
    p.get().release();
  }

  @Test
  void aRenewalThatFindsTheHoldGoneStopsAndTheNextUnlockSaysSo() throws Exception {
    DistributedLock lock = warden.getLock("cap:gone");
    lock.lock();
    server.call("DEL", "cap:gone");
    waitFor("the watchdog to notice", () -> !lock.isHeldByCurrentThread(), 3000);
    assertThrows(IllegalMonitorStateException.class, lock::unlock);
    WardenLock h = warden.lock("cap:gone").acquire();
    server.call("DEL", "cap:gone");
    waitFor("the watchdog to notice", () -> !h.isHeld(), 3000);
    assertFalse(h.extend(Duration.ofSeconds(1)));
    h.release();
    assertEquals(0L, server.call("EXISTS", "cap:gone"));
  }
}
