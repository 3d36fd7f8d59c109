package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.DistributedLock;
import io.warden.DistributedSemaphore;
import io.warden.Permit;
import io.warden.Warden;
import io.warden.WardenLock;
import io.warden.testing.RedisServer;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * A grant that waited in the server's queue longer than its lease (here the cap, {@code
 * warden.max-lease} 1 s): the server's lease began at the grant, not when the acquire was sent, so
 * the hold must come back held, be renewed, and be released by its unlock.
 */
@Tag("integration")
class WaitedGrantLeaseTest {
  private static final long CAP_MS = 1000;
  private static final Duration LEASE = Duration.ofMillis(1500);
  private static final long HOLD_A_MS = 1400;
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

  private static <T> T waitedFor(CompletableFuture<T> b) throws Exception {
    return b.get(10, TimeUnit.SECONDS);
  }

  @Test
  void aLockGrantedAfterAWaitLongerThanItsLeaseIsHeldAndReleased() throws Exception {
    String key = "waited:lock";
    WardenLock a = warden.lock(key).lease(LEASE).acquire();
    CompletableFuture<WardenLock> b =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                return warden.lock(key).lease(LEASE).acquire();
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              }
            });
    Thread.sleep(HOLD_A_MS);
    assertTrue(a.isHeld(), "A's capped lease is renewed");
    a.release();
    WardenLock h = waitedFor(b);
    Thread.sleep(200);
    assertTrue(h.isHeld(), "B is held after its grant");
    assertNotNull(server.call("LOCK.INFO", key));
    h.release();
    assertEquals(0L, server.call("EXISTS", key));
  }

  @Test
  void aWatchdogLockGrantedAfterALongWaitIsHeldAndUnlocks() throws Exception {
    // DistributedLock.lock(): the watchdog's 30 s lease, granted at the 1 s cap.
    String key = "waited:dog";
    WardenLock a = warden.lock(key).lease(LEASE).acquire();
    DistributedLock lock = warden.getLock(key);
    CompletableFuture<Boolean> b =
        CompletableFuture.supplyAsync(
            () -> {
              lock.lock();
              try {
                Thread.sleep(200);
                return lock.isHeldByCurrentThread();
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              } finally {
                // Throws IllegalMonitorStateException if the hold was lost.
                lock.unlock();
              }
            });
    Thread.sleep(HOLD_A_MS);
    a.release();
    assertTrue(waitedFor(b), "B is held after its grant");
    assertEquals(0L, server.call("EXISTS", key));
  }

  @Test
  void aPermitGrantedAfterAWaitLongerThanItsLeaseIsHeldAndReleased() throws Exception {
    String key = "waited:sem";
    DistributedSemaphore sem = warden.getSemaphore(key, 1);
    Permit a = sem.acquire(1, LEASE);
    CompletableFuture<Permit> b =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                return sem.acquire(1, LEASE);
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              }
            });
    Thread.sleep(HOLD_A_MS);
    a.release();
    Permit p = waitedFor(b);
    // Past the hold's first renewal tick (a third of the cap): a hold counted as already expired
    // would be lost by now, and would refuse to extend.
    Thread.sleep(500);
    assertTrue(p.extend(LEASE), "B's permit is held after its grant");
    assertNotNull(server.call("SEM.INFO", key));
    p.release();
    assertEquals(1, sem.availablePermits());
  }
}
